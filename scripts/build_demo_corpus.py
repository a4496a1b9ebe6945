"""Regenerate the embedded demo corpus in src/speedrun/assets/demo/.

    python scripts/build_demo_corpus.py [--source /work/shared/demo/classics.jsonl.xz]

The 11 public-domain novels are cut into ~8 KB documents at paragraph
boundaries (so one training sequence holds several EOT-prefixed documents, as
with FineWeb). The documents are then shuffled with a fixed seed: the source
is in book order, and split in that order val is the opening of one novel
while a short run trains on the rest of it and then on other authors, so val
loss rises as training drifts away from val's book. Shuffled, val and every
stretch of training are the same mixture of all 11 books. The shuffled
documents are tokenised with speedrun's own corpus code and split into:
- demo_val_000000.bin: whole documents from the start of the shuffled order,
  at least 65,537 tokens, enough for val_tokens=65536 at any val sequence
  length dividing it (up to 8192 x 8 ranks, or 65536 x 1);
- demo_train_000000.bin: every other document (no overlap with val).
Each is stored xz-compressed (preset 9, extreme). Output is deterministic:
same source, same tokenizer, byte-identical shards (xz output too). The
shuffle orders the documents by SHA-256 of the seed and their position, not
by a random generator, whose algorithms Python and NumPy may change.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import lzma
import tempfile
from pathlib import Path

from speedrun.data.corpus import read_documents, split_document, tokenize_files

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_SOURCE = Path("/work/shared/demo/classics.jsonl.xz")
OUT = ROOT / "src" / "speedrun" / "assets" / "demo"
VAL_TOKENS = 65_536
SPLIT_CHARS = 8_192
SHUFFLE_SEED = 0


def shuffled_documents(source: Path, seed: int = SHUFFLE_SEED) -> list[str]:
    """The source's ~8 KB documents, in an order fixed by `seed` that mixes the books."""
    docs = [piece for book in read_documents(source) for piece in split_document(book, SPLIT_CHARS)]
    order = sorted(range(len(docs)), key=lambda i: hashlib.sha256(f"{seed}:{i}".encode()).digest())
    return [docs[i] for i in order]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--source", type=Path, default=DEFAULT_SOURCE)
    ap.add_argument("--out", type=Path, default=OUT)
    ap.add_argument("--seed", type=int, default=SHUFFLE_SEED, help="document shuffle seed")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        # tokenize_files keeps its inputs' order, so it reads the shuffled documents from one file
        mixed = Path(tmp) / "mixed.jsonl"
        with mixed.open("w", encoding="utf-8") as f:
            for doc in shuffled_documents(args.source, args.seed):
                f.write(json.dumps({"text": doc}) + "\n")
        summary = tokenize_files([mixed], Path(tmp) / "shards", prefix="demo", val_tokens=VAL_TOKENS,
                                 shard_tokens=10_000_000, force=True)
        for path in map(Path, summary["files"]):
            data = path.read_bytes()
            packed = lzma.compress(data, preset=9 | lzma.PRESET_EXTREME)
            (args.out / f"{path.name}.xz").write_bytes(packed)
            print(f"{path.name}: {len(data) // 2 - 512:,} tokens, {len(packed):,} bytes xz, "
                  f"sha256 {hashlib.sha256(data).hexdigest()[:16]}")
    print(f"{summary['documents']} documents, val {summary['val_tokens']:,} tokens, "
          f"train {summary['train_tokens']:,} tokens")


if __name__ == "__main__":
    main()
