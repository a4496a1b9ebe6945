"""The distributed training loader and the validation reader.

Why it is built this way:
- Every rank computes the whole step plan (all `batch_seqs` start positions)
  from the same memory-mapped shard and keeps only its own sequences
  (rank r, micro-step a gets global sequence a*W + r). Planning is a numpy
  scan over at most a few MB, so doing it everywhere is cheaper than any
  communication, and the global batch of a step does not depend on W: a run
  resumed on a different number of GPUs sees the same data.
- BOS alignment (spec, "Data"): starts are EOT tokens; from the cursor, the
  first EOT is a start, each next start is the first EOT at least seq_len
  tokens after the previous one; batch_seqs starts plus one more EOT that
  confirms the last sequence; the cursor moves to that confirming EOT. The
  scan covers 2*batch_seqs*seq_len tokens and continues window by window
  only if that is not enough (documents longer than a sequence).
- A background thread plans and slices the next `prefetch` steps into CPU
  tensors (pinned when the target is CUDA, so copies are asynchronous). Each
  queued step carries the loader position *after* it, and the loader only
  adopts that position when the step is handed out, so `state_dict()` is the
  exact position of the next step not yet returned, whatever the thread did.
"""

from __future__ import annotations

import queue
import threading
import warnings
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from speedrun.errors import ConfigError, DataError
from speedrun.data.shards import read_header, read_shard, require_tokens
from speedrun.data.tokenizer import EOT

STATE_VERSION = 1


def bos_starts(tokens: np.ndarray, pos: int, seq_len: int, count: int, window: int) -> list[int] | None:
    """`count` BOS-aligned starts from `pos`, plus the confirming EOT; None if the shard runs out."""
    n, hi, nxt = tokens.size, pos, pos
    bos = np.empty(0, dtype=np.int64)
    starts: list[int] = []
    while len(starts) <= count:
        i = int(np.searchsorted(bos, nxt))
        if i < bos.size:
            starts.append(int(bos[i]))
            nxt = starts[-1] + seq_len
            continue
        if hi >= n:
            return None
        new_hi = min(n, hi + window)
        found = np.flatnonzero(tokens[hi:new_hi] == EOT).astype(np.int64) + hi
        bos, hi = np.concatenate([bos, found]), new_hi
    return starts


def contiguous_starts(n: int, pos: int, seq_len: int, count: int) -> list[int] | None:
    """`count` back-to-back starts from `pos` plus the next cursor; None if fewer than count*T+1 tokens remain."""
    if pos + count * seq_len + 1 > n:
        return None
    return [pos + j * seq_len for j in range(count + 1)]


class TrainLoader:
    """This rank's sequences, step by step, from a list of shards (see module docstring)."""

    def __init__(self, files: list[Path], seq_len: int, batch_seqs: int, rank: int, world_size: int,
                 device: torch.device | str = "cpu", bos_align: bool = True, prefetch: int = 2):
        if not files:
            raise DataError("no training shards given to the loader")
        if seq_len <= 0 or batch_seqs <= 0 or world_size <= 0 or batch_seqs % world_size:
            raise ConfigError(f"loader: batch_seqs={batch_seqs} must be a positive multiple of world "
                              f"size {world_size}, and seq_len={seq_len} > 0")
        if not 0 <= rank < world_size:
            raise ConfigError(f"loader: rank {rank} is outside world size {world_size}")
        self.files = [Path(f) for f in files]
        for f in self.files:
            read_header(f)  # fail now, not mid-run
        self.seq_len, self.batch_seqs, self.bos_align = seq_len, batch_seqs, bos_align
        self.rank, self.world_size = rank, world_size
        self.device = torch.device(device)
        self.pin = self.device.type == "cuda"
        self.prefetch = max(0, int(prefetch))
        self._state = {"shard": 0, "pos": 0, "passes": 0}
        self._open: tuple[int, np.ndarray] | None = None
        self._warned = False
        self._thread: threading.Thread | None = None
        self._queue: queue.Queue | None = None
        self._stop = threading.Event()

    @property
    def passes(self) -> int:
        return self._state["passes"]

    # ---- planning (pure function of the position; identical on every rank) ----
    def _tokens(self, shard: int) -> np.ndarray:
        if self._open is None or self._open[0] != shard:
            self._open = (shard, read_shard(self.files[shard]))
        return self._open[1]

    def _starts(self, tokens: np.ndarray, pos: int) -> list[int] | None:
        if self.bos_align:
            window = 2 * self.batch_seqs * self.seq_len
            return bos_starts(tokens, pos, self.seq_len, self.batch_seqs, window)
        return contiguous_starts(tokens.size, pos, self.seq_len, self.batch_seqs)

    def _plan(self, state: dict) -> tuple[np.ndarray, list[int], dict]:
        shard, pos, passes = state["shard"], state["pos"], state["passes"]
        for _ in range(len(self.files) + 1):
            tokens = self._tokens(shard)
            starts = self._starts(tokens, pos)
            if starts is not None:
                return tokens, starts[:-1], {"shard": shard, "pos": starts[-1], "passes": passes}
            shard, pos = shard + 1, 0
            if shard == len(self.files):
                shard, passes = 0, passes + 1
        need = "sequences starting at <|endoftext|>" if self.bos_align else "tokens"
        raise DataError(f"{self.files[0].parent}: no shard holds one step of {self.batch_seqs} x "
                        f"{self.seq_len + 1} {need}; the training data is too small for this batch")

    def _make_step(self, state: dict) -> tuple[list[tuple[Tensor, Tensor]], dict]:
        tokens, starts, after = self._plan(state)
        out = []
        for s in starts[self.rank::self.world_size]:
            buf = torch.from_numpy(tokens[s:s + self.seq_len + 1].astype(np.int64))
            x, y = buf[:-1].to(torch.int32), buf[1:].clone()
            out.append((x.pin_memory(), y.pin_memory()) if self.pin else (x, y))
        return out, after

    # ---- background prefetch ----
    @staticmethod
    def _put(q: queue.Queue, item, stop: threading.Event) -> None:
        while not stop.is_set():
            try:
                q.put(item, timeout=0.1)
                return
            except queue.Full:
                continue

    def _produce(self, state: dict, q: queue.Queue, stop: threading.Event) -> None:
        try:
            while not stop.is_set():
                item = self._make_step(state)
                state = item[1]
                self._put(q, item, stop)
        except BaseException as e:  # handed to the consumer, raised there
            self._put(q, e, stop)

    def _start_thread(self) -> None:
        self._stop = threading.Event()
        self._queue = queue.Queue(maxsize=self.prefetch)
        self._thread = threading.Thread(target=self._produce, args=(dict(self._state), self._queue, self._stop),
                                        name=f"TrainLoader-rank{self.rank}", daemon=True)
        self._thread.start()

    def _stop_thread(self) -> None:
        if self._thread is not None:
            self._stop.set()
            self._thread.join()
        self._thread, self._queue = None, None

    # ---- public interface ----
    def next_step(self) -> list[tuple[Tensor, Tensor]]:
        """This rank's batch_seqs // world_size (inputs int32, targets int64) pairs for one step."""
        if self.prefetch == 0:
            item = self._make_step(self._state)
        else:
            if self._thread is None:
                self._start_thread()
            item = self._queue.get()
            if isinstance(item, BaseException):
                self._stop_thread()
                raise item
        pairs, after = item
        if after["passes"] > self._state["passes"] and not self._warned:
            self._warned = True
            warnings.warn(f"training data wrapped around: all {len(self.files)} shard(s) used, starting pass "
                          f"{after['passes'] + 1} from the first shard (sequences will repeat)", stacklevel=2)
        self._state = after
        nb = self.pin
        return [(x.to(self.device, non_blocking=nb), y.to(self.device, non_blocking=nb)) for x, y in pairs]

    def state_dict(self) -> dict:
        """Position of the next step not yet returned (JSON-serialisable)."""
        return {"version": STATE_VERSION, **self._state, "files": [f.name for f in self.files],
                "seq_len": self.seq_len, "batch_seqs": self.batch_seqs, "bos_align": self.bos_align}

    def load_state_dict(self, state: dict) -> None:
        """Continue from a `state_dict()` (possibly saved with another world size)."""
        for key, mine in (("seq_len", self.seq_len), ("batch_seqs", self.batch_seqs),
                          ("bos_align", self.bos_align), ("files", [f.name for f in self.files])):
            if key in state and state[key] != mine:
                raise DataError(f"loader state does not match this run: {key} was {state[key]!r}, now {mine!r}")
        shard, pos = int(state["shard"]), int(state["pos"])
        if not (0 <= shard < len(self.files) and 0 <= pos <= read_header(self.files[shard])):
            raise DataError(f"loader state points outside the data: shard {shard}, position {pos}")
        self._stop_thread()
        self._state = {"shard": shard, "pos": pos, "passes": int(state.get("passes", 0))}

    def close(self) -> None:
        self._stop_thread()
        self._open = None

    def __enter__(self) -> TrainLoader:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def val_batches(file: Path, val_tokens: int, seq_len: int, rank: int, world_size: int,
                device="cpu") -> Iterator[tuple[Tensor, Tensor]]:
    """Contiguous validation sequences: step k, rank r reads [k*W*L + r*L, ... + L + 1)."""
    span = world_size * seq_len
    if val_tokens <= 0 or seq_len <= 0 or val_tokens % span:
        raise ConfigError(f"val_tokens={val_tokens} must be a positive multiple of world size x "
                          f"val seq_len = {world_size} x {seq_len}")
    tokens = require_tokens(file, val_tokens + 1, "validation")
    device = torch.device(device)
    for k in range(val_tokens // span):
        s = k * span + rank * seq_len
        buf = torch.from_numpy(tokens[s:s + seq_len + 1].astype(np.int64))
        x, y = buf[:-1].to(torch.int32), buf[1:].clone()
        if device.type == "cuda":
            x, y = x.pin_memory(), y.pin_memory()
        yield x.to(device, non_blocking=True), y.to(device, non_blocking=True)
