"""Tokenise a text corpus into FineWeb-format shards.

Inputs, each optionally `.gz` or `.xz` compressed (folders are searched for
these):
- JSON lines (`.jsonl`, `.ndjson`, `.json`): one document per line, its text
  in the `text` field;
- plain text (`.txt`): the whole file is ONE document, except that a line
  holding only `<|endoftext|>` separates documents. Blank lines are not
  separators because ordinary prose is full of them.

`split_chars > 0` cuts long documents at paragraph boundaries (`\\n\\n`) into
pieces of about that many characters, each its own document. Books need it:
a training sequence then holds several documents, each starting with EOT, as
FineWeb sequences do.

Output, matching the trainer's default patterns: every document is EOT
followed by its tokens. The validation split comes first and is made of whole
documents, at least `val_tokens + 1` tokens (the trainer reads val_tokens
inputs plus one shifted target), so no document is in both splits. The rest
fills `<prefix>_train_NNNNNN.bin` shards of exactly `shard_tokens` tokens
(the last one shorter), a document running on into the next shard as in the
public FineWeb shards.

Encoding runs on all cores: documents are grouped into chunks of ~256 KB of
text and mapped over a process pool with ordered `imap`, so the output is
the same for any number of workers.
"""

from __future__ import annotations

import gzip
import json
import lzma
import os
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from multiprocessing import get_context
from pathlib import Path

import numpy as np
from tqdm import tqdm

from speedrun.errors import DataError
from speedrun.data.shards import write_shard
from speedrun.data.tokenizer import EOT, EOT_TEXT, encode, get_encoding

JSON_SUFFIXES = (".jsonl", ".ndjson", ".json")
TEXT_SUFFIXES = (".txt",)
COMPRESSED = {".gz": gzip.open, ".xz": lzma.open}
CHUNK_CHARS = 1 << 18


def _kind(path: Path) -> tuple[str | None, str | None]:
    """(format, compression) from the file name, e.g. ('json', '.xz')."""
    suffixes = [s.lower() for s in path.suffixes]
    comp = suffixes.pop() if suffixes and suffixes[-1] in COMPRESSED else None
    last = suffixes[-1] if suffixes else ""
    fmt = "json" if last in JSON_SUFFIXES else "text" if last in TEXT_SUFFIXES else None
    return fmt, comp


def expand_inputs(inputs: Iterable[str | os.PathLike]) -> list[Path]:
    """Files given, plus supported files found (recursively, sorted) in folders given."""
    files: list[Path] = []
    for item in inputs:
        p = Path(item).expanduser()
        if p.is_dir():
            found = sorted(f for f in p.rglob("*") if f.is_file() and _kind(f)[0])
            if not found:
                raise DataError(f"{p}: folder holds no .txt/.jsonl files (optionally .gz/.xz)")
            files += found
        elif not p.is_file():
            raise DataError(f"{p}: input file not found")
        elif _kind(p)[0] is None:
            raise DataError(f"{p}: unsupported input type; use .txt, .jsonl/.json (optionally .gz or .xz)")
        else:
            files.append(p)
    return files


def _open_text(path: Path):
    opener = COMPRESSED.get(_kind(path)[1], open)
    return opener(path, "rt", encoding="utf-8")


def _json_docs(path: Path, f) -> Iterator[str]:
    for lineno, line in enumerate(f, 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            raise DataError(f"{path}:{lineno}: not valid JSON ({e.msg})") from None
        if not isinstance(obj, dict) or not isinstance(obj.get("text"), str):
            raise DataError(f"{path}:{lineno}: JSON line has no string 'text' field")
        yield obj["text"]


def _text_docs(f) -> Iterator[str]:
    doc: list[str] = []
    for line in f:
        if line.strip() == EOT_TEXT:
            yield "".join(doc)
            doc = []
        else:
            doc.append(line)
    yield "".join(doc)


def read_documents(path: Path) -> Iterator[str]:
    """The documents of one input file, in order (empty ones dropped)."""
    try:
        with _open_text(path) as f:
            docs = _json_docs(path, f) if _kind(path)[0] == "json" else _text_docs(f)
            yield from (d for d in docs if d.strip())
    except (OSError, EOFError, lzma.LZMAError, UnicodeDecodeError) as e:
        raise DataError(f"{path}: cannot read ({type(e).__name__}: {e})") from None


def split_document(text: str, split_chars: int) -> list[str]:
    """Cut at paragraph boundaries into pieces of >= split_chars chars (the last may be shorter)."""
    if split_chars <= 0 or len(text) <= split_chars:
        return [text]
    pieces, current, size = [], [], 0
    for para in text.split("\n\n"):
        current.append(para)
        size += len(para) + 2
        if size >= split_chars:
            pieces.append("\n\n".join(current))
            current, size = [], 0
    if current:
        pieces.append("\n\n".join(current))
    return [p for p in pieces if p.strip()]


def _chunks(docs: Iterable[str], chunk_chars: int = CHUNK_CHARS) -> Iterator[list[str]]:
    chunk, size = [], 0
    for d in docs:
        chunk.append(d)
        size += len(d)
        if size >= chunk_chars:
            yield chunk
            chunk, size = [], 0
    if chunk:
        yield chunk


def encode_chunk(docs: list[str]) -> tuple[np.ndarray, np.ndarray, int]:
    """Encode documents: (EOT-prefixed tokens concatenated, per-document lengths, UTF-8 bytes)."""
    parts = [np.array([EOT, *encode(d)], dtype=np.uint16) for d in docs]
    lengths = np.array([p.size for p in parts], dtype=np.int64)
    return np.concatenate(parts), lengths, sum(len(d.encode("utf-8")) for d in docs)


@dataclass
class ShardWriter:
    """Accumulate tokens: first a whole-document val split, then fixed-size train shards."""

    out_dir: Path
    prefix: str
    val_needed: int  # 0 = no val shard
    shard_tokens: int
    val: list = field(default_factory=list)
    val_count: int = 0
    buf: np.ndarray | None = None
    fill: int = 0
    written: list = field(default_factory=list)

    def add(self, tokens: np.ndarray, lengths: np.ndarray) -> None:
        start = 0
        for n in lengths:
            if self.val_count >= self.val_needed:
                break
            self.val.append(tokens[start:start + n])
            self.val_count += int(n)
            start += int(n)
        if start < tokens.size:
            self._add_train(tokens[start:])

    def _add_train(self, tokens: np.ndarray) -> None:
        if self.buf is None:
            self.buf = np.empty(self.shard_tokens, dtype=np.uint16)
        while tokens.size:
            take = min(tokens.size, self.shard_tokens - self.fill)
            self.buf[self.fill:self.fill + take] = tokens[:take]
            self.fill += take
            tokens = tokens[take:]
            if self.fill == self.shard_tokens:
                self._flush_train()

    def _flush_train(self) -> None:
        n = sum(1 for p in self.written if "_train_" in p.name)
        path = self.out_dir / f"{self.prefix}_train_{n:06d}.bin"
        self.written.append(write_shard(path, self.buf[:self.fill]))
        self.fill = 0

    def finish(self) -> list[Path]:
        if self.val_needed and self.val_count < self.val_needed:
            raise DataError(f"corpus has only {self.val_count} tokens, fewer than the {self.val_needed} "
                            f"needed for the validation split (lower --val-tokens)")
        if self.fill:
            self._flush_train()
        if not any("_train_" in p.name for p in self.written):
            raise DataError(f"corpus has {self.val_count} tokens, all taken by the validation split; "
                            f"nothing left to train on (lower --val-tokens)")
        if self.val_needed:
            path = self.out_dir / f"{self.prefix}_val_000000.bin"
            self.written.insert(0, write_shard(path, np.concatenate(self.val)))
        return self.written


def _prepare_out_dir(out_dir: Path, prefix: str, force: bool) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    old = sorted(out_dir.glob(f"{prefix}_*.bin"))
    if old and not force:
        raise DataError(f"{out_dir}: already holds {len(old)} {prefix}_*.bin shards; "
                        f"pass --force to replace them or choose another --out/--prefix")
    for p in old:
        p.unlink()


def _encoded(chunks: Iterator[list[str]], workers: int):
    if workers <= 1:
        yield from map(encode_chunk, chunks)
        return
    get_encoding()  # built once here; forked workers inherit it instead of each rebuilding it
    with get_context("fork" if os.name == "posix" else "spawn").Pool(workers) as pool:
        yield from pool.imap(encode_chunk, chunks)


def tokenize_files(inputs: Iterable[str | os.PathLike], out_dir: str | os.PathLike, *,
                   prefix: str = "fineweb", val_tokens: int = 10_485_760,
                   shard_tokens: int = 100_000_000, split_chars: int = 0,
                   workers: int | None = None, force: bool = False, progress: bool = True) -> dict:
    """Tokenise `inputs` into shards in `out_dir`; returns a summary dict."""
    if shard_tokens <= 0 or val_tokens < 0:
        raise DataError(f"--shard-tokens must be > 0 and --val-tokens >= 0 "
                        f"(got {shard_tokens} and {val_tokens})")
    files = expand_inputs(inputs)
    out, workers = Path(out_dir).expanduser(), workers or os.cpu_count() or 1
    _prepare_out_dir(out, prefix, force)
    docs = (piece for f in files for d in read_documents(f) for piece in split_document(d, split_chars))
    writer = ShardWriter(out, prefix, val_tokens + 1 if val_tokens else 0, shard_tokens)
    t0, n_bytes, n_docs = time.perf_counter(), 0, 0
    with tqdm(total=None, unit="B", unit_scale=True, desc="tokenising", leave=False,
              disable=not progress) as bar:
        for tokens, lengths, nb in _encoded(_chunks(docs), workers):
            writer.add(tokens, lengths)
            n_bytes, n_docs = n_bytes + nb, n_docs + lengths.size
            bar.update(nb)
    written = writer.finish()
    secs = time.perf_counter() - t0
    return {"files": [str(p) for p in written], "documents": n_docs, "text_bytes": n_bytes,
            "val_tokens": writer.val_count, "seconds": secs, "workers": workers,
            "train_tokens": sum(int(os.path.getsize(p) - 1024) // 2 for p in written if "_train_" in p.name)}
