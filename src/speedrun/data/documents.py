"""The 2026-07 record's document loader: BOS-aligned, truncated, 1-D packed pieces, and its validation chunks.

Spec: `record-2026-07.md`, sections "Data" and "Validation and timing".

Why it is built this way:
- A piece set (one rank's micro-batch) is a run of documents taken from the shard's BOS positions:
  each piece runs from its BOS to the earliest of the next BOS, BOS + L_max, or the point where the
  buffer holds n_loc + 1 tokens. With the prefix sums C of the capped lengths min(gap, L_max), the
  set that starts at BOS number i ends at the first k with C[k] >= C[i] + n_loc + 1: one
  `searchsorted` per set instead of a Python loop over documents, and the cursor (the BOS after the
  last one used) is that k. The prefix sums depend on L_max, so each shard keeps one array per
  L_max it has seen (two in the record).
- Every rank plans every piece set of a step from the same shard index and keeps only its own
  (micro-step m, rank r takes set m*W + r), as the record does: planning is index arithmetic, far
  cheaper than communication, and it makes the global batch the same for W = 1, 2, 4, 8. A
  micro-step's W sets come from one shard: when the shard holds fewer, the micro-step is taken
  whole from the next shard's first BOS. That is the record's behaviour and the one place where W
  matters (W = 8 moves the whole step; W < 8 keeps the earlier micro-steps on the old shard).
- The N_max check runs over all W sets of each micro-step, not only this rank's, so a batch fails
  the same way on every world size. N_max only pads cu_seqlens and changes no math; the record's
  64 / 96 / 128 fit FineWeb, and `DocumentConfig.max_docs_mult` scales them for corpora of shorter
  documents (the proxy corpus needs 4), so the error names that setting.
- A step is planned whole before the position moves, so a step that raises (N_max, no data) leaves
  the loader where it was, and `state_dict()` is always the position of the next step. The
  position is stored as a token offset (the next BOS, or the shard's size when none is left), which
  does not depend on how the index is built; batch size and L_max are per-step arguments, so a
  resumed run or a stage change carries the cursor over unchanged.
- Running out of shards wraps to the first shard's first BOS with one warning (the record stops
  instead); shards are read through `shards.read_shard` (a memmap) and found with `paths`.
- Validation is not BOS-aligned: the first val_tokens (+1 for the shifted targets) of the val shards,
  read as one sequence, in contiguous chunks; chunk k*W + r goes to rank r at val step k.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import numpy as np
import torch
from torch import Tensor

from speedrun.data.paths import discover_files
from speedrun.data.shards import read_header, read_shard
from speedrun.errors import ConfigError, DataError

STATE_VERSION = 1


@dataclass(frozen=True)
class DocumentConfig:
    """The document loader's constants (spec record-2026-07.md, "Data" and "Validation and timing")."""

    bos: int = 50256
    sets_per_step: int = 8  # piece sets (rank micro-batches) per step, whatever the world size
    max_docs_table: tuple[tuple[int, int], ...] = ((16_384, 64), (32_768, 96), (49_152, 128))
    max_docs_tokens_per_doc: int = 300  # other n_loc: floor(n_loc / 300) rounded up to a multiple of ...
    max_docs_round: int = 128  # ... 128 (at least 128)
    max_docs_mult: int = 1  # the setting that raises every bound: 1 for FineWeb, 4 for the proxy corpus
    val_tokens: int = 10_485_760
    val_chunk: int = 262_144
    val_max_docs: int = 896


class DocBatch(NamedTuple):
    """One rank's micro-batch: inputs int32 (n), targets int64 (n), cu_seqlens int32 (N_max)."""

    inputs: Tensor
    targets: Tensor
    cu_seqlens: Tensor


class PieceSet(NamedTuple):
    """Where one micro-batch's pieces lie in a shard: starts are BOS positions, lengths sum to n + 1."""

    tokens: np.ndarray
    starts: np.ndarray
    lengths: np.ndarray


def train_max_docs(n_loc: int, cfg: DocumentConfig = DocumentConfig()) -> int:
    """N_max for a micro-batch of n_loc tokens: the record's table, else the rounded fallback, times the setting."""
    table = dict(cfg.max_docs_table)
    if n_loc in table:
        base = table[n_loc]
    else:
        r = cfg.max_docs_round
        base = max(r, -(-(n_loc // cfg.max_docs_tokens_per_doc) // r) * r)
    return base * cfg.max_docs_mult


def val_max_docs(cfg: DocumentConfig = DocumentConfig()) -> int:
    """cu_seqlens entries of a validation chunk (896 in the record), times the same setting."""
    return cfg.val_max_docs * cfg.max_docs_mult


def local_tokens(batch_tokens: int, cfg: DocumentConfig = DocumentConfig()) -> int:
    """n_loc = batch_tokens / 8: the tokens of every rank micro-batch, whatever the world size."""
    if batch_tokens <= 0 or batch_tokens % cfg.sets_per_step:
        raise ConfigError(f"batch_tokens={batch_tokens} must be a positive multiple of {cfg.sets_per_step}")
    return batch_tokens // cfg.sets_per_step


def grad_accum_steps(world_size: int, cfg: DocumentConfig = DocumentConfig()) -> int:
    """Micro-steps per step on each rank (8 / W), so that every W runs the same global batch."""
    if world_size <= 0 or cfg.sets_per_step % world_size:
        raise ConfigError(f"world size {world_size} must divide {cfg.sets_per_step} (1, 2, 4 or 8 GPUs)")
    return cfg.sets_per_step // world_size


def bos_positions(tokens: np.ndarray, bos: int, chunk: int = 1 << 24) -> np.ndarray:
    """Positions of `bos` in `tokens` (int64), scanned in chunks so a memmapped shard needs no full-size mask."""
    found = [np.flatnonzero(tokens[s:s + chunk] == bos) + s for s in range(0, tokens.size, chunk)]
    return np.concatenate(found).astype(np.int64) if found else np.zeros(0, np.int64)


def capped_prefix_sums(starts: np.ndarray, size: int, l_max: int) -> np.ndarray:
    """C[0] = 0, C[j+1] = C[j] + min(next BOS (or shard end) - BOS j, l_max): piece lengths before the buffer cap."""
    gaps = np.diff(np.append(starts, size))
    return np.concatenate([[0], np.cumsum(np.minimum(gaps, l_max))]).astype(np.int64)


def piece_set_end(cum: np.ndarray, first: int, n_loc: int) -> int | None:
    """The BOS number after the last piece of the set starting at BOS `first`; None if the shard runs out."""
    k = int(np.searchsorted(cum, cum[first] + n_loc + 1, side="left"))
    return k if k < cum.size else None


def set_lengths(cum: np.ndarray, first: int, stop: int, n_loc: int) -> np.ndarray:
    """Piece lengths of BOS first..stop-1, the last cut so that they sum to n_loc + 1."""
    lengths = np.diff(cum[first:stop + 1])
    lengths[-1] = n_loc + 1 - (cum[stop - 1] - cum[first])
    return lengths


def pack(pieces: PieceSet, n_max: int) -> DocBatch:
    """Concatenate the pieces: inputs = buffer[:-1], targets = buffer[1:], cu_seqlens padded with n by repeating it."""
    buf = np.concatenate([pieces.tokens[s:s + n] for s, n in zip(pieces.starts, pieces.lengths)]).astype(np.int64)
    bounds = np.cumsum(pieces.lengths)
    bounds[-1] -= 1  # the last piece gives its final token to the targets only
    cu = np.full(n_max, bounds[-1], dtype=np.int32)
    cu[0] = 0
    cu[1:bounds.size + 1] = bounds
    return DocBatch(torch.from_numpy(buf[:-1].astype(np.int32)), torch.from_numpy(buf[1:].copy()), torch.from_numpy(cu))


def check_pieces(count: int, n_max: int, n_loc: int, what: str = "training micro-batch") -> None:
    """One-line error when cu_seqlens (n_max entries) cannot hold `count` pieces."""
    if count > n_max - 1:
        raise DataError(f"a {what} of {n_loc} tokens needs {count} documents but cu_seqlens holds at most "
                        f"N_max - 1 = {n_max - 1}; raise the documents-per-batch bound "
                        f"DocumentConfig.max_docs_mult (the proxy corpus needs 4); it changes no math")


def concat(batches: Sequence[DocBatch]) -> DocBatch:
    """Piece sets end to end as one batch: inputs and targets joined, each set's document bounds
    offset by the tokens before it, so its padding repeats become empty documents between the sets
    (the model then needs `sets=len(batches)` to restart what the spec restarts at each set)."""
    if len(batches) == 1:
        return batches[0]
    offsets = np.cumsum([0] + [b.inputs.numel() for b in batches[:-1]])
    cu = torch.cat([b.cu_seqlens + int(o) for b, o in zip(batches, offsets)])
    return DocBatch(torch.cat([b.inputs for b in batches]), torch.cat([b.targets for b in batches]), cu)


def to_device(batch: DocBatch, device: torch.device) -> DocBatch:
    """Move a batch, asynchronously from pinned memory when the target is a GPU."""
    if device.type == "cpu":
        return batch
    pin = device.type == "cuda"
    return DocBatch(*((t.pin_memory() if pin else t).to(device, non_blocking=pin) for t in batch))


class ShardIndex:
    """One shard's tokens (memmap), its BOS positions and the capped prefix sums per L_max."""

    def __init__(self, number: int, path: Path, bos: int):
        self.number = number
        self.tokens = read_shard(path)
        self.starts = bos_positions(self.tokens, bos)
        self._cum: dict[int, np.ndarray] = {}

    def prefix_sums(self, l_max: int) -> np.ndarray:
        if l_max not in self._cum:
            self._cum[l_max] = capped_prefix_sums(self.starts, self.tokens.size, l_max)
        return self._cum[l_max]

    def cursor_of(self, pos: int) -> int:
        """BOS number of the first BOS at or after token `pos`."""
        return int(np.searchsorted(self.starts, pos, side="left"))

    def position_of(self, cursor: int) -> int:
        """Token offset of BOS number `cursor`, the shard's size past the last one."""
        return int(self.starts[cursor]) if cursor < self.starts.size else int(self.tokens.size)


class Position(NamedTuple):
    shard: int
    cursor: int  # BOS number in that shard
    passes: int


class DocumentLoader:
    """This rank's micro-batches of BOS-aligned, truncated, packed documents, step by step (module docstring)."""

    def __init__(self, files: Sequence[str | os.PathLike], rank: int, world_size: int,
                 cfg: DocumentConfig = DocumentConfig(), device: torch.device | str = "cpu"):
        if not files:
            raise DataError("no training shards given to the document loader")
        self.grad_accum = grad_accum_steps(world_size, cfg)
        if not 0 <= rank < world_size:
            raise ConfigError(f"document loader: rank {rank} is outside world size {world_size}")
        self.files = [Path(f) for f in files]
        for f in self.files:
            read_header(f)  # fail now, not mid-run
        self.rank, self.world_size, self.cfg = rank, world_size, cfg
        self.device = torch.device(device)
        self._pos = Position(0, 0, 0)
        self._open: ShardIndex | None = None
        self._warned = False

    @classmethod
    def from_folder(cls, data_dir: str | os.PathLike, rank: int, world_size: int,
                    pattern: str = "fineweb_train_*.bin", **kwargs) -> DocumentLoader:
        """The train shards of a folder, in sorted name order (paths.discover_files)."""
        return cls(discover_files(data_dir, pattern, "train"), rank, world_size, **kwargs)

    @property
    def passes(self) -> int:
        return self._pos.passes

    def _index(self, shard: int) -> ShardIndex:
        if self._open is None or self._open.number != shard:
            self._open = ShardIndex(shard, self.files[shard], self.cfg.bos)
        return self._open

    def _sets_in_shard(self, index: ShardIndex, cursor: int, n_loc: int, l_max: int) -> list[PieceSet] | None:
        """W consecutive piece sets from BOS `cursor`, or None when the shard holds fewer."""
        cum, sets = index.prefix_sums(l_max), []
        for _ in range(self.world_size):
            stop = piece_set_end(cum, cursor, n_loc)
            if stop is None:
                return None
            sets.append(PieceSet(index.tokens, index.starts[cursor:stop], set_lengths(cum, cursor, stop, n_loc)))
            cursor = stop
        return sets

    def _micro_step(self, pos: Position, n_loc: int, l_max: int) -> tuple[list[PieceSet], Position]:
        """One micro-step's W sets: from the cursor, else from the first BOS of the next shard that holds them."""
        shard, cursor, passes = pos
        for _ in range(len(self.files) + 1):
            index = self._index(shard)
            sets = self._sets_in_shard(index, cursor, n_loc, l_max)
            if sets is not None:
                return sets, Position(shard, cursor + sum(s.starts.size for s in sets), passes)
            shard, cursor = shard + 1, 0
            if shard == len(self.files):
                shard, passes = 0, passes + 1
        raise DataError(f"{self.files[0].parent}: no shard holds {self.world_size} micro-batches of {n_loc + 1} "
                        f"tokens from BOS-aligned documents; the training data is too small for this batch")

    def next_step(self, n_loc: int, l_max: int, n_max: int | None = None) -> list[DocBatch]:
        """This rank's grad_accum micro-batches of one step (n_loc tokens each, pieces of at most l_max)."""
        n_max = train_max_docs(n_loc, self.cfg) if n_max is None else n_max
        if n_loc <= 0 or l_max <= 0 or n_max < 2:
            raise ConfigError(f"document loader: n_loc={n_loc} and l_max={l_max} must be > 0, n_max={n_max} >= 2")
        pos, mine = self._pos, []
        for _ in range(self.grad_accum):
            sets, pos = self._micro_step(pos, n_loc, l_max)
            for s in sets:
                check_pieces(s.starts.size, n_max, n_loc)
            mine.append(sets[self.rank])
        self._commit(pos)
        return [to_device(pack(s, n_max), self.device) for s in mine]

    def _commit(self, pos: Position) -> None:
        if pos.passes > self._pos.passes and not self._warned:
            self._warned = True
            warnings.warn(f"training data wrapped around: all {len(self.files)} shard(s) used, starting pass "
                          f"{pos.passes + 1} from the first shard's first document (documents will repeat)",
                          stacklevel=3)
        self._pos = pos

    def state_dict(self) -> dict:
        """Position of the next step (JSON-serialisable): shard number, token offset of the next BOS, passes."""
        shard, cursor, passes = self._pos
        return {"version": STATE_VERSION, "shard": shard, "pos": self._index(shard).position_of(cursor),
                "passes": passes, "files": [f.name for f in self.files]}

    def load_state_dict(self, state: dict) -> None:
        """Continue from a `state_dict()`, saved with any world size, batch size or L_max."""
        names = [f.name for f in self.files]
        if "files" in state and state["files"] != names:
            raise DataError(f"loader state does not match this run: files were {state['files']!r}, now {names!r}")
        shard, pos = int(state["shard"]), int(state["pos"])
        if not (0 <= shard < len(self.files) and 0 <= pos <= read_header(self.files[shard])):
            raise DataError(f"loader state points outside the data: shard {shard}, position {pos}")
        self._pos = Position(shard, self._index(shard).cursor_of(pos), int(state.get("passes", 0)))


def read_prefix(files: Sequence[str | os.PathLike], count: int) -> np.ndarray:
    """The first `count` tokens of the shards read as one sequence, in the given order."""
    parts, have = [], 0
    for f in files:
        if have == count:
            break
        tokens = read_shard(f)
        parts.append(np.asarray(tokens[:count - have]))
        have += parts[-1].size
    if have < count:
        raise DataError(f"validation shards {[Path(f).name for f in files]} hold {have} tokens, fewer than the "
                        f"{count} asked of them")
    return np.concatenate(parts)


def val_chunk(tokens: np.ndarray, start: int, chunk: int, n_max: int, bos: int) -> DocBatch:
    """One chunk: inputs tokens[start:start+chunk], targets shifted by one, cu_seqlens = [0, BOS positions, chunk...]."""
    buf = tokens[start:start + chunk + 1].astype(np.int64)
    found = np.flatnonzero(buf[:-1] == bos)
    check_pieces(found.size, n_max, chunk, what="validation chunk")
    cu = np.full(n_max, chunk, dtype=np.int32)
    cu[0] = 0
    cu[1:found.size + 1] = found
    return DocBatch(torch.from_numpy(buf[:-1].astype(np.int32)), torch.from_numpy(buf[1:].copy()), torch.from_numpy(cu))


def val_batches(files: Sequence[str | os.PathLike], rank: int, world_size: int,
                cfg: DocumentConfig = DocumentConfig(), device: torch.device | str = "cpu") -> Iterator[DocBatch]:
    """This rank's validation chunks: at val step k, chunk k*W + r of the first cfg.val_tokens tokens."""
    span = world_size * cfg.val_chunk
    if cfg.val_tokens <= 0 or cfg.val_chunk <= 0 or cfg.val_tokens % span or not 0 <= rank < world_size:
        raise ConfigError(f"val_tokens={cfg.val_tokens} must be a positive multiple of world size x chunk = "
                          f"{world_size} x {cfg.val_chunk}, and rank {rank} inside the world size")
    tokens = read_prefix(files, cfg.val_tokens + 1)
    n_max, device = val_max_docs(cfg), torch.device(device)
    for k in range(cfg.val_tokens // span):
        yield to_device(val_chunk(tokens, (k * world_size + rank) * cfg.val_chunk, cfg.val_chunk, n_max, cfg.bos),
                        device)


def val_files(data_dir: str | os.PathLike, pattern: str = "fineweb_val_*.bin") -> list[Path]:
    """The val shards of a folder, in sorted name order (paths.discover_files)."""
    return discover_files(data_dir, pattern, "val")
