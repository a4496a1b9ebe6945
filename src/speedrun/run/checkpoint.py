"""Model files, and the resumable checkpoints of a run.

A folder holding `model.safetensors` and `config.json` is a model that
`speedrun sample`, `speedrun export hf` and `speedrun eval` can load; every
finished run folder is one, and so is every checkpoint folder.

Resumable checkpoints live in `RUN/checkpoints/step_000123/` and hold, besides
the model files, `rank{r}.pt` per rank (that rank's optimiser state, which is
its shard when W > 1, its loader position and its RNG states) and
`trainer.json` (step, training time, counters, version, preset, config hash).
Why it is built this way:
- A checkpoint is complete or absent: everything is written (and fsynced)
  into `.tmp-step_000123/`, which is renamed to its final name only when all
  ranks' files are there, and only then is the `latest` pointer replaced
  (atomically). A crash or a full disk mid-write leaves the previous
  checkpoint and `latest` untouched; the last `KEEP` checkpoints are kept.
- Writing must not stall training. The training thread only copies tensors
  to the host (into reused pinned buffers on CUDA, asynchronously, then one
  stream sync); a background thread serialises and commits. At most one
  write is in flight: a new checkpoint first waits for the previous one.
- With several ranks the commit needs all ranks' files. A barrier from the
  writer thread would race the training thread's collectives on the same
  process group, so rank 0's writer instead waits for the other ranks'
  `rank{r}.pt` (or `rank{r}.failed`) files to appear in the shared folder.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import re
import shutil
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

import torch

from speedrun.config import AnyConfig, RecordRunConfig, RunConfig, from_dict
from speedrun.errors import ConfigError
from speedrun.run.rundir import atomic_write_text

WEIGHTS = "model.safetensors"
CONFIG = "config.json"


def save_model_files(model: torch.nn.Module, cfg: AnyConfig, folder: Path) -> None:
    """Write weights (atomically: temp file then rename) and the config."""
    from safetensors.torch import save_file

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().contiguous().cpu() for k, v in model.state_dict().items()}
    tmp = folder / f".{WEIGHTS}.tmp"
    save_file(state, str(tmp), metadata={"format": "pt", "preset": cfg.name})
    tmp.replace(folder / WEIGHTS)
    atomic_write_text(folder / CONFIG, json.dumps(cfg.to_dict(), indent=2, sort_keys=True) + "\n")


def load_config(folder: Path) -> AnyConfig:
    return from_dict(load_config_dict(folder))


def load_config_dict(folder: Path) -> dict:
    """The folder's config.json as written (fields of later code versions absent, not defaulted)."""
    path = Path(folder) / CONFIG
    if not path.exists():
        raise ConfigError(f"{folder}: no {CONFIG} (expected a run or checkpoint folder)")
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise ConfigError(f"{path}: not valid JSON ({e.msg})") from None


def load_model(folder: Path, device: str | torch.device = "cpu"):
    """(model in eval mode, its config) from a model folder: a GPT with float32 weights for a
    RunConfig, a RecordGPT with the weights as trained for a RecordRunConfig."""
    from safetensors.torch import load_file

    from speedrun.model.gpt import GPT

    folder = Path(folder)
    cfg = load_config(folder)
    path = folder / WEIGHTS
    if not path.exists():
        raise ConfigError(f"{folder}: no {WEIGHTS} (the run did not finish, or this is not a model folder)")
    state = load_file(str(path))
    if isinstance(cfg, RecordRunConfig):
        return _record_model(state, cfg, path).to(device).eval(), cfg
    n_scalars = state["scalars"].numel() if "scalars" in state else 1
    model = GPT(cfg.model, cfg.attention, kernels=cfg.train.kernels)
    if "scalars" in state:
        model.scalars.data = torch.ones(n_scalars)
    missing, unexpected = model.load_state_dict(state, strict=False)
    if missing or unexpected:
        raise ConfigError(f"{path}: weights do not match {CONFIG} (missing {missing[:3]}, unexpected {unexpected[:3]})")
    return model.to(device).eval(), cfg


def _record_model(state: dict, cfg: RecordRunConfig, path: Path):
    """The RecordGPT the weights fit: its bank pads tell the world size that trained it."""
    from speedrun.model.record import RecordGPT

    pads = state["qk_bank"].shape[0] - cfg.model.qk_matrices if "qk_bank" in state else -1
    sizes = [w for w in (1, 2, 4, 8) if cfg.model.bank_pads(w)[0] == pads]
    if not sizes:
        raise ConfigError(f"{path}: weights do not match {CONFIG} (qk_bank holds no bank of this model)")
    with torch.device("meta"):
        model = RecordGPT(cfg.model, sizes[0])
    try:
        model.load_state_dict(state, strict=True, assign=True)
    except RuntimeError as e:
        raise ConfigError(f"{path}: weights do not match {CONFIG} ({str(e).splitlines()[0]})") from None
    model.tied = False  # whatever the run's tie, the weights now are two tensors
    return model


# ---------------------------------------------------------------- resumable checkpoints

FORMAT = 1
CHECKPOINTS = "checkpoints"
LATEST = "latest"
TRAINER = "trainer.json"
KEEP = 2
COMMIT_TIMEOUT_S = 900.0
_NAME = re.compile(r"^step_(\d+)(?:-r(\d+))?$")


def checkpoint_name(step: int, recoveries: int = 0) -> str:
    """`step_000123`, or `step_000123-r1` for a checkpoint re-written after a roll-back."""
    return f"step_{step:06d}" + (f"-r{recoveries}" if recoveries else "")


def rank_file(rank: int) -> str:
    return f"rank{rank}.pt"


def config_hash(cfg: RunConfig | dict, ignore: tuple[str, ...] = ()) -> str:
    """Short hash of the config (or of its `to_dict()` form as read back from config.json), leaving out
    the fields named in `ignore`."""
    d = json.loads(json.dumps(cfg if isinstance(cfg, dict) else cfg.to_dict(), default=str))
    for path in ignore:
        section, name = path.split(".", 1)
        d.get(section, {}).pop(name, None)
    return hashlib.sha256(json.dumps(d, sort_keys=True, default=str).encode()).hexdigest()[:16]


# ---- host copies (training thread) ----

class HostCopier:
    """Copies nested state (dicts/lists of tensors) to the host for the writer.

    On CUDA the copies go into pinned buffers that are reused from one
    checkpoint to the next (the writer is done with them by then), issued
    non_blocking, then one stream synchronisation. On CPU it is a clone, as
    training keeps updating the live tensors in place.
    """

    def __init__(self):
        self._buffers: dict[str, torch.Tensor] = {}

    def copy(self, obj, device: torch.device):
        out = self._copy(obj, "")
        if device.type == "cuda":
            torch.cuda.current_stream(device).synchronize()
        return out

    def _copy(self, obj, key: str):
        if isinstance(obj, torch.Tensor):
            return self._tensor(obj.detach(), key)
        if isinstance(obj, dict):
            return {k: self._copy(v, f"{key}/{k}") for k, v in obj.items()}
        if isinstance(obj, (list, tuple)):
            return type(obj)(self._copy(v, f"{key}/{i}") for i, v in enumerate(obj))
        return obj

    def _tensor(self, t: torch.Tensor, key: str) -> torch.Tensor:
        if t.device.type != "cuda":
            return t.clone()
        buf = self._buffers.get(key)
        if buf is None or buf.shape != t.shape or buf.dtype != t.dtype:
            buf = self._buffers[key] = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
        buf.copy_(t, non_blocking=True)
        return buf


def rng_state() -> dict:
    """Every random generator a run may touch, in torch.load(weights_only=True)-safe types."""
    np_state = np.random.get_state()
    return {
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
        "python": random.getstate(),
        "numpy": [np_state[0], torch.from_numpy(np_state[1].astype(np.int64)), *np_state[2:]],
    }


def set_rng_state(s: dict) -> None:
    torch.set_rng_state(s["torch"])
    if s["cuda"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(s["cuda"])
    version, internal, gauss = s["python"]
    random.setstate((version, tuple(internal), gauss))
    name, keys, *rest = s["numpy"]
    np.random.set_state((name, keys.numpy().astype(np.uint32), *rest))


# ---- files ----

def _fsync_file(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_dir(path: Path) -> None:
    try:
        _fsync_file(path)
    except OSError:  # some file systems cannot fsync a directory
        pass


def _write_torch(obj, path: Path) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    torch.save(obj, tmp)
    _fsync_file(tmp)
    os.replace(tmp, path)


def _write_model(state: dict, cfg: RunConfig, folder: Path) -> None:
    from safetensors.torch import save_file

    tmp = folder / f".{WEIGHTS}.tmp"
    save_file(state, str(tmp), metadata={"format": "pt", "preset": cfg.name})
    _fsync_file(tmp)
    os.replace(tmp, folder / WEIGHTS)
    atomic_write_text(folder / CONFIG, json.dumps(cfg.to_dict(), indent=2, sort_keys=True) + "\n")


def committed(root: Path) -> list[Path]:
    """Complete checkpoint folders under RUN/checkpoints, oldest first."""
    if not root.is_dir():
        return []
    found = [(int(m[1]), int(m[2] or 0), p) for p in root.iterdir() if p.is_dir() and (m := _NAME.match(p.name))]
    return [p for *_, p in sorted(found)]


def latest_checkpoint(run: Path) -> Path | None:
    """The folder `latest` names, else the newest complete one, else None."""
    root = Path(run) / CHECKPOINTS
    pointer = root / LATEST
    if pointer.exists():
        target = root / pointer.read_text().strip()
        if _NAME.match(target.name) and (target / TRAINER).exists():
            return target
    done = committed(root)
    return done[-1] if done else None


def remove_partial(run: Path) -> None:
    """Delete `.tmp-*` folders left by a crash mid-write (rank 0, before any write)."""
    root = Path(run) / CHECKPOINTS
    if root.is_dir():
        for p in root.glob(".tmp-*"):
            shutil.rmtree(p, ignore_errors=True)


def remove_checkpoints(run: Path) -> None:
    """Delete a finished run's checkpoints (its model files stay beside them)."""
    shutil.rmtree(Path(run) / CHECKPOINTS, ignore_errors=True)


def _prune(root: Path, keep: int) -> None:
    latest = (root / LATEST).read_text().strip() if (root / LATEST).exists() else None
    for old in committed(root)[:-keep]:
        if old.name != latest:
            shutil.rmtree(old, ignore_errors=True)


@dataclass
class Snapshot:
    """One checkpoint's content, already on the host."""

    name: str
    cfg: RunConfig
    trainer: dict  # trainer.json (rank 0)
    rank_state: dict  # this rank's rank{r}.pt
    model: dict | None  # model state dict (rank 0)


@dataclass
class WriteResult:
    name: str
    path: Path | None
    error: BaseException | None
    seconds: float


class CheckpointWriter:
    """Writes snapshots from a background thread and commits them (rank 0)."""

    def __init__(self, run: Path, rank: int, world_size: int, keep: int = KEEP):
        self.root = Path(run) / CHECKPOINTS
        self.rank, self.world_size, self.keep = rank, world_size, keep
        self._thread: threading.Thread | None = None
        self._result: WriteResult | None = None

    def start(self, snap: Snapshot) -> WriteResult | None:
        """Wait for the write in flight (returned), then start writing `snap`."""
        previous = self.wait()
        self._thread = threading.Thread(target=self._run, args=(snap,), name="CheckpointWriter", daemon=True)
        self._thread.start()
        return previous

    def wait(self) -> WriteResult | None:
        """Finish the write in flight, if any; its result (once)."""
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        result, self._result = self._result, None
        return result

    def _run(self, snap: Snapshot) -> None:
        t0 = time.perf_counter()
        tmp = self.root / f".tmp-{snap.name}"
        try:
            path = self.write(snap, tmp)
            self._result = WriteResult(snap.name, path, None, time.perf_counter() - t0)
        except BaseException as e:  # reported by wait(); the previous checkpoint stays
            self._fail(tmp)
            self._result = WriteResult(snap.name, None, e, time.perf_counter() - t0)

    def write(self, snap: Snapshot, tmp: Path) -> Path | None:
        tmp.mkdir(parents=True, exist_ok=True)
        _write_torch(snap.rank_state, tmp / rank_file(self.rank))
        if self.rank != 0:
            return None
        _write_model(snap.model, snap.cfg, tmp)
        atomic_write_text(tmp / TRAINER, json.dumps(snap.trainer, indent=2, sort_keys=True) + "\n")
        self._wait_for_ranks(tmp)
        return self._commit(tmp, snap.name)

    def _wait_for_ranks(self, tmp: Path) -> None:
        deadline = time.monotonic() + COMMIT_TIMEOUT_S
        for r in range(1, self.world_size):
            while not (tmp / rank_file(r)).exists():
                if (tmp / f"rank{r}.failed").exists():
                    raise OSError(f"rank {r} could not write its part of the checkpoint")
                if time.monotonic() > deadline:
                    raise TimeoutError(f"rank {r} did not write its part of the checkpoint")
                time.sleep(0.02)

    def _commit(self, tmp: Path, name: str) -> Path:
        _fsync_dir(tmp)
        final = self.root / name
        if final.exists():  # a stale folder of the same name (never the one `latest` names)
            shutil.rmtree(final)
        os.rename(tmp, final)
        atomic_write_text(self.root / LATEST, name + "\n")
        _fsync_dir(self.root)
        _prune(self.root, self.keep)
        return final

    def _fail(self, tmp: Path) -> None:
        try:
            if self.rank == 0:
                shutil.rmtree(tmp, ignore_errors=True)
            elif tmp.is_dir():
                (tmp / f"rank{self.rank}.failed").touch()
        except OSError:
            pass


@dataclass
class Loaded:
    path: Path
    trainer: dict
    rank_state: dict
    model: dict


def read_trainer(folder: Path) -> dict:
    path = Path(folder) / TRAINER
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise ConfigError(f"{path}: cannot read the checkpoint's trainer state ({e})") from None


def load_checkpoint(folder: Path, rank: int) -> Loaded:
    """Everything rank `rank` needs to continue from `folder`, on the CPU
    (load_state_dict moves it to the parameters' device)."""
    from safetensors.torch import load_file

    folder = Path(folder)
    trainer = read_trainer(folder)
    rank_path = folder / rank_file(rank)
    if not rank_path.exists():
        raise ConfigError(f"{folder}: no {rank_path.name}; it was written by {trainer.get('world_size')} rank(s)")
    rank_state = torch.load(rank_path, map_location="cpu", weights_only=True)
    model = load_file(str(folder / WEIGHTS))
    return Loaded(folder, trainer, rank_state, model)
