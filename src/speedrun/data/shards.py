"""The token shard format, and nothing else.

A shard is a 256 x int32 little-endian header (`[0]` magic 20240520, `[1]`
version 1, `[2]` number of tokens) followed by that many uint16 GPT-2 ids.
This is the format of the public FineWeb shards, so shards written here and
shards downloaded are read by one code path. Shards written here also record
the largest id plus one in `[3]` (the public shards leave it 0), so training
refuses an id past the model's vocabulary before its first step by reading
a header, and scans only shards that lack the field.

Reading is a `numpy.memmap`: a 100M-token shard is opened in microseconds and
only the pages the loader touches are read. Every fault a user can cause
(missing file, wrong magic, truncated download, ids past the vocabulary)
raises `DataError` with one line naming the file and the fault, because the
alternative is a shape error deep inside training.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from speedrun.errors import DataError

MAGIC = 20240520
VERSION = 1
HEADER_INTS = 256
HEADER_BYTES = HEADER_INTS * 4
TOKEN_BYTES = 2
DEFAULT_VOCAB = 50257
_CHECK_CHUNK = 1 << 24  # tokens per chunk when scanning ids (32 MB)


def write_shard(path: str | os.PathLike, tokens) -> Path:
    """Write `tokens` (ids < 65536) as one shard, atomically (temp + rename)."""
    path = Path(path)
    arr = np.asarray(tokens)
    if arr.ndim != 1:
        raise DataError(f"{path}: tokens must be a 1-D sequence, got shape {arr.shape}")
    if arr.size and (arr.min() < 0 or arr.max() >= 1 << 16):
        raise DataError(f"{path}: token ids must be in [0, 65535] to fit uint16")
    header = np.zeros(HEADER_INTS, dtype="<i4")
    header[:4] = (MAGIC, VERSION, arr.size, int(arr.max()) + 1 if arr.size else 0)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "wb") as f:
        f.write(header.tobytes())
        f.write(arr.astype("<u2", copy=False).tobytes())
    os.replace(tmp, path)
    return path


def read_header(path: str | os.PathLike) -> int:
    """Check the header and file size; return the number of tokens."""
    path = Path(path)
    if not path.is_file():
        raise DataError(f"{path}: shard file not found")
    size = path.stat().st_size
    if size < HEADER_BYTES:
        raise DataError(f"{path}: file is {size} bytes, shorter than the {HEADER_BYTES}-byte shard header")
    with open(path, "rb") as f:
        header = np.frombuffer(f.read(HEADER_BYTES), dtype="<i4")
    if header[0] != MAGIC:
        raise DataError(f"{path}: wrong magic number {int(header[0])} (expected {MAGIC}); not a token shard")
    if header[1] != VERSION:
        raise DataError(f"{path}: unknown shard version {int(header[1])} (this reader knows version {VERSION})")
    n = int(header[2])
    expected = HEADER_BYTES + TOKEN_BYTES * n
    if n < 0 or size != expected:
        kind = "shorter" if size < expected else "longer"
        raise DataError(f"{path}: file is {size} bytes, {kind} than the {expected} its header "
                        f"promises for {n} tokens (truncated or corrupt; re-create or re-download it)")
    return n


def shard_num_tokens(path: str | os.PathLike) -> int:
    """Number of tokens in a shard (header and size checked, ids not scanned)."""
    return read_header(path)


def read_shard(path: str | os.PathLike) -> np.ndarray:
    """The shard's tokens as a read-only uint16 memmap (no copy)."""
    n = read_header(path)
    if n == 0:
        return np.zeros(0, dtype=np.uint16)
    return np.memmap(path, dtype="<u2", mode="r", offset=HEADER_BYTES, shape=(n,))


def validate_shard(path: str | os.PathLike, vocab_size: int = DEFAULT_VOCAB, what: str = "--vocab-size") -> int:
    """Full check: header, size and every id < vocab_size (`what` names where that bound comes from).
    Returns the token count."""
    tokens = read_shard(path)
    for start in range(0, tokens.size, _CHECK_CHUNK):
        chunk = tokens[start:start + _CHECK_CHUNK]
        top = int(chunk.max())
        if top >= vocab_size:
            where = start + int(np.argmax(chunk >= vocab_size))
            raise DataError(f"{path}: token id {int(tokens[where])} at position {where} is outside "
                            f"the vocabulary of {vocab_size} ({what})")
    return tokens.size


def id_bound(path: str | os.PathLike) -> int | None:
    """The largest token id plus one, as the header records it; None where it is not recorded."""
    read_header(path)
    with open(path, "rb") as f:
        bound = int(np.frombuffer(f.read(16), dtype="<i4")[3])
    return bound or None


def check_vocab(paths, vocab_size: int, what: str = "model.vocab_size") -> None:
    """Refuse any shard holding an id >= vocab_size: from the header where the shard records its
    largest id, else by a scan (the public FineWeb shards)."""
    for path in paths:
        bound = id_bound(path)
        if bound is None:
            validate_shard(path, vocab_size, what)
        elif bound > vocab_size:
            raise DataError(f"{path}: holds token id {bound - 1}, outside the vocabulary of {vocab_size} ({what})")


def require_tokens(path: str | os.PathLike, needed: int, what: str = "validation") -> np.ndarray:
    """Open a shard that must hold at least `needed` tokens (e.g. val_tokens + 1)."""
    tokens = read_shard(path)
    if tokens.size < needed:
        raise DataError(f"{path}: {what} shard has {tokens.size} tokens, fewer than the {needed} asked of it")
    return tokens
