"""Regenerate the embedded demo corpus in src/speedrun/assets/demo/.

    python scripts/build_demo_corpus.py [--source /work/shared/demo/classics.jsonl.xz]

The 11 public-domain novels are cut into ~8 KB documents at paragraph
boundaries (so one training sequence holds several EOT-prefixed documents, as
with FineWeb), tokenised with speedrun's own corpus code, and split into:
- demo_val_000000.bin: whole documents from the start of the corpus, at least
  65,537 tokens, enough for val_tokens=65536 at any val sequence length
  dividing it (up to 8192 x 8 ranks, or 65536 x 1);
- demo_train_000000.bin: every other document (no overlap with val).
Each is stored xz-compressed (preset 9, extreme). Output is deterministic:
same source, same tokenizer, byte-identical shards (xz output too).
"""

from __future__ import annotations

import argparse
import hashlib
import lzma
import tempfile
from pathlib import Path

from speedrun.corpus import tokenize_files

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_SOURCE = Path("/work/shared/demo/classics.jsonl.xz")
OUT = ROOT / "src" / "speedrun" / "assets" / "demo"
VAL_TOKENS = 65_536
SPLIT_CHARS = 8_192


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--source", type=Path, default=DEFAULT_SOURCE)
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        summary = tokenize_files([args.source], tmp, prefix="demo", val_tokens=VAL_TOKENS,
                                 shard_tokens=10_000_000, split_chars=SPLIT_CHARS, force=True)
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
