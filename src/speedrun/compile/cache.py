"""A portable compile cache: `speedrun warm`, and loading it at the start of a run.

`torch.compiler.save_cache_artifacts()` serialises every compiler artifact
this process produced or hit (Inductor FX-graph cache entries with their
Triton kernels, AOTAutograd entries, autotuning results);
`torch.compiler.load_cache_artifacts(bytes)` puts them back into the local
on-disk caches, so the next compilation of the same graphs is a cache hit.
That turns the cold start of a fresh machine into a warm one.

The file is `cache_root()/compile/<key>.bin`. The key hashes everything that
can make an artifact wrong for this run:

- torch, Triton, CUDA and Python versions; the GPU's name and compute
  capability (CPU: the machine type);
- speedrun's version AND a hash of every source file of the speedrun
  package. Inductor's own cache key covers the traced graph, but not, for
  instance, a custom op's fake (meta) kernel: after that fake kernel of the
  FP8 head changed, a cached graph with the old output strides was reused
  and failed. Any change to our sources therefore makes a new key;
- the parts of the run config that shape the compiled graphs (model,
  attention, sequence lengths, dtype, compile mode) and the world size, so
  that two presets warmed on one machine do not overwrite each other.

A stale file is thus never used: it is simply not found. The same holds for
torch's local caches once `key_local_caches()` has run (the trainer calls
it before compiling): a no-op graph pass whose uuid is the source hash
enters Inductor's and AOTAutograd's own cache keys. Files are written
atomically (temporary name, fsync, rename) with a header holding a magic
string, the payload length and its SHA-256; a truncated or corrupted file is
ignored with a warning. A torch without these functions degrades to "no
cache".

Interplay with torch's own caches: nothing here sets environment variables.
Loaded artifacts land in the local caches that torch already uses
(`TORCHINDUCTOR_CACHE_DIR`, default /tmp/torchinductor_<user>; Triton's
`TRITON_CACHE_DIR`, default ~/.triton/cache). A run on a machine whose local
caches are already warm gains nothing from this file; to measure a truly
cold start, point TORCHINDUCTOR_CACHE_DIR and TRITON_CACHE_DIR at empty
folders and set SPEEDRUN_COMPILE_CACHE=off (see docs/performance.md).
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import struct
import sys
import tarfile
import warnings
from datetime import datetime, timezone
from functools import lru_cache
from pathlib import Path

import torch

from speedrun import __version__

MAGIC = b"SPDRCC1\n"
_HEADER = struct.Struct("<8sQ32s")  # magic, payload length, sha256(payload)
ENV_SWITCH = "SPEEDRUN_COMPILE_CACHE"  # "off" / "0": never load a cache file


def available() -> bool:
    """True when this torch has the portable cache functions."""
    c = getattr(torch, "compiler", None)
    return callable(getattr(c, "save_cache_artifacts", None)) and callable(getattr(c, "load_cache_artifacts", None))


def run_device() -> torch.device:
    """The device a run started on this machine uses: the first GPU, else the CPU (as `dist.init_distributed`)."""
    return torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu")


def nothing_to_cache(cfg, device: torch.device | str) -> str | None:
    """Why a run of `cfg` on `device` has no compile cache to make or load, or None when it has one.

    `speedrun warm` refuses with this reason and `speedrun cache` reports it, so the two never
    disagree: a run that compiles nothing (train.compile=auto on a CPU) has nothing to warm."""
    from speedrun.train.setup import use_compile  # the trainer's own rule for compiling

    if not available():
        return f"this torch ({torch.__version__}) has no torch.compiler.save_cache_artifacts"
    device = torch.device(device)
    if use_compile(cfg.train.compile, device):
        return None
    if cfg.train.compile == "auto":
        return f"nothing is compiled on {device.type} (train.compile=auto compiles on CUDA only)"
    return f"nothing is compiled (train.compile={cfg.train.compile})"


def enabled() -> bool:
    return os.environ.get(ENV_SWITCH, "on").strip().lower() not in ("0", "off", "no", "false")


@lru_cache(maxsize=1)
def source_hash() -> str:
    """SHA-256 over the speedrun package's Python sources (relative path + bytes)."""
    return hash_sources(Path(__file__).resolve().parents[1])


def hash_sources(root: Path) -> str:
    root = Path(root)
    h = hashlib.sha256()
    for path in sorted(root.rglob("*.py")):
        if "__pycache__" in path.parts:
            continue
        h.update(path.relative_to(root).as_posix().encode() + b"\0")
        h.update(path.read_bytes() + b"\0")
    return h.hexdigest()


def _triton_version() -> str | None:
    try:
        import triton

        return triton.__version__
    except Exception:
        return None


def device_description(device: torch.device | str) -> str:
    device = torch.device(device)
    if device.type == "cuda":
        index = device.index if device.index is not None else torch.cuda.current_device()
        p = torch.cuda.get_device_properties(index)
        return f"{p.name} sm_{p.major}{p.minor}"
    return f"{device.type} {platform.machine()}"


def graph_config(cfg) -> dict:
    """The config fields that shape the compiled graphs."""
    d = cfg.to_dict()
    t = d["train"]
    train = {k: t[k] for k in ("seq_len", "val_seq_len", "batch_seqs", "dtype", "compile", "kernels")}
    return {"model": d["model"], "attention": d["attention"], "train": train}


def key_parts(cfg, device: torch.device | str, world_size: int = 1) -> dict:
    """Everything the cache key hashes (JSON-serialisable)."""
    return {
        "torch": torch.__version__, "triton": _triton_version(), "cuda": torch.version.cuda,
        "python": f"{sys.version_info.major}.{sys.version_info.minor}",
        "device": device_description(device), "speedrun": __version__, "sources": source_hash(),
        "config": graph_config(cfg), "world_size": int(world_size),
    }


def key_from_parts(parts: dict) -> str:
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:20]


def cache_key(cfg, device: torch.device | str, world_size: int = 1) -> str:
    return key_from_parts(key_parts(cfg, device, world_size))


def local_path(folder: str, cfg, device: torch.device, world_size: int, rank: int) -> Path:
    """`<torch's Inductor cache folder>/<folder>/<run key>-<device>-r<rank>`: speedrun's own entries
    beside torch's local caches (they live and die with them), one per run key, device and rank."""
    from torch._inductor.runtime.cache_dir_utils import cache_dir as inductor_cache_dir

    index = "" if device.index is None else str(device.index)
    key = cache_key(cfg, device, world_size)
    return Path(inductor_cache_dir()) / folder / f"{key}-{device.type}{index}-r{rank}"


def cache_dir() -> Path:
    from speedrun.data.paths import cache_root

    return cache_root() / "compile"


def cache_path(key: str) -> Path:
    return cache_dir() / f"{key}.bin"


def triton_path(key: str) -> Path:
    """speedrun's own Triton kernels for `key` (`triton_bundle`), beside torch's artifacts."""
    return cache_dir() / f"{key}.triton"


def record_path(key: str) -> Path:
    """What `key`'s files were made for, readable (`save_record`)."""
    return cache_dir() / f"{key}.json"


# ---------------------------------------------------------------- file format


def write_file(path: Path, payload: bytes) -> Path:
    """Header + payload, atomically (temporary file, fsync, rename)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "wb") as f:
            f.write(_HEADER.pack(MAGIC, len(payload), hashlib.sha256(payload).digest()))
            f.write(payload)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path


def read_file(path: Path) -> bytes | None:
    """The payload, or None (with a warning) when the file is truncated, corrupted or foreign."""
    path = Path(path)
    try:
        data = path.read_bytes()
    except OSError as e:
        warnings.warn(f"compile cache {path}: cannot read ({e}); ignoring it", stacklevel=2)
        return None
    if len(data) < _HEADER.size:
        warnings.warn(f"compile cache {path}: truncated ({len(data)} bytes); ignoring it", stacklevel=2)
        return None
    magic, length, digest = _HEADER.unpack_from(data)
    payload = data[_HEADER.size:]
    if magic != MAGIC:
        warnings.warn(f"compile cache {path}: not a speedrun compile cache; ignoring it", stacklevel=2)
        return None
    if len(payload) != length or hashlib.sha256(payload).digest() != digest:
        warnings.warn(f"compile cache {path}: partial or corrupted ({len(payload)} of {length} bytes, "
                      "checksum mismatch); ignoring it", stacklevel=2)
        return None
    return payload


# ---------------------------------------------------------------- save / load


def save(key: str) -> Path | None:
    """Serialise this process's compiler artifacts under `key`; None when there are none."""
    if not available():
        return None
    result = torch.compiler.save_cache_artifacts()
    if not result:
        return None
    payload = result[0]
    if not payload:
        return None
    return write_file(cache_path(key), payload)


def load(key: str) -> bool:
    """Load `key`'s artifacts into torch's local caches. False when absent, invalid or unsupported."""
    if not available():
        return False
    path = cache_path(key)
    if not path.is_file():
        return False
    payload = read_file(path)
    if payload is None:
        return False
    try:
        torch.compiler.load_cache_artifacts(payload)
    except Exception as e:  # a torch that cannot read it: behave as if there were none
        warnings.warn(f"compile cache {path}: torch could not load it ({type(e).__name__}: {e}); ignoring it",
                      stacklevel=2)
        return False
    return True


def save_triton(key: str) -> Path | None:
    """Pack this process's speedrun Triton kernels under `key`; None when there are none."""
    from speedrun.compile import triton_bundle

    payload = triton_bundle.collect()
    return write_file(triton_path(key), payload) if payload else None


def load_triton(key: str) -> int:
    """Unpack `key`'s speedrun Triton kernels into Triton's cache; the number of files written (0 when
    there is no file, it is invalid, or Triton's cache is not a local folder)."""
    from speedrun.compile import triton_bundle

    path, root = triton_path(key), triton_bundle.cache_root()
    if root is None or not path.is_file():
        return 0
    payload = read_file(path)
    if payload is None:
        return 0
    try:
        return triton_bundle.unpack(payload, root)
    except (ValueError, OSError, EOFError, tarfile.TarError) as e:
        warnings.warn(f"compile cache {path}: cannot unpack it ({type(e).__name__}: {e}); ignoring it",
                      stacklevel=2)
        return 0


# ---------------------------------------------------------------- what each file was made for
#
# The key is a hash, so a folder of caches says nothing about itself. `speedrun warm` writes the
# key's parts beside the files; `speedrun cache` lists them, and a run that finds no file for its
# key names the nearest one and what differs (a torch upgrade, changed sources, another world size).


def save_record(key: str, parts: dict, preset: str | None = None, overrides: list[str] | None = None) -> Path:
    """`<key>.json`: the key's parts, the preset and overrides it was warmed with, and when."""
    record = {"key": key, "preset": preset, "overrides": list(overrides or []),
              "created": datetime.now(timezone.utc).isoformat(timespec="seconds"), "parts": parts}
    path = record_path(key)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        tmp.write_text(json.dumps(record, indent=1, sort_keys=True, default=str) + "\n")
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path


def read_record(path: Path) -> dict | None:
    """A record written by `save_record`, or None when it is missing or unreadable."""
    try:
        record = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None
    ok = isinstance(record, dict) and isinstance(record.get("parts"), dict) and isinstance(record.get("key"), str)
    return record if ok else None


def stored() -> list[dict]:
    """One entry per `<key>.bin` in the cache folder: key, sizes, and its record (None for files
    saved before records were written)."""
    folder = cache_dir()
    if not folder.is_dir():
        return []
    entries = []
    for path in sorted(folder.glob("*.bin")):
        key = path.stem
        triton = triton_path(key)
        entries.append({"key": key, "bytes": path.stat().st_size,
                        "triton_bytes": triton.stat().st_size if triton.is_file() else 0,
                        "record": read_record(record_path(key))})
    return entries


def differences(here: dict, there: dict, prefix: str = "") -> list[str]:
    """The dotted fields where `there` (a file's parts) differs from `here` (this run's), as text."""
    out = []
    for name in sorted(set(here) | set(there)):
        a, b = here.get(name), there.get(name)
        if isinstance(a, dict) and isinstance(b, dict):
            out += differences(a, b, f"{prefix}{name}.")
        elif a != b:
            field = f"{prefix}{name}"
            out.append(f"{field} (another version of speedrun's code)" if field == "sources"
                       else f"{field} {b!r} (this run: {a!r})")
    return out


def nearest_miss(parts: dict) -> str | None:
    """For a run whose key has no file: the stored file whose parts differ from `parts` in the fewest
    fields, and those fields, as one line; None when no stored file has a record."""
    here = key_from_parts(parts)
    parts = json.loads(json.dumps(parts, default=str))  # as a record holds them: tuples become lists
    found = [(differences(parts, e["record"]["parts"]), e) for e in stored()
             if e["record"] is not None and e["key"] != here]
    if not found:
        return None
    diffs, entry = min(found, key=lambda f: len(f[0]))
    preset = entry["record"].get("preset")
    shown = "; ".join(diffs[:4]) + (f"; and {len(diffs) - 4} more" if len(diffs) > 4 else "")
    return f"nearest file {entry['key']}{f' ({preset})' if preset else ''} was made for another setup: {shown}"


class SourceKeyPass:
    """A post-grad graph pass that does nothing and whose `uuid()` is speedrun's source hash.

    Inductor's FX-graph cache and AOTAutograd's cache hash the uuid of every custom
    pass into their keys (that is what `uuid()` is for), but not our custom ops'
    Python bodies or fake kernels. Registered as `post_grad_custom_post_pass`, this
    makes torch's *local* caches miss after any change to speedrun's sources, as the
    portable cache file already does. Without it, a graph compiled against an
    older fake kernel is reused and fails at its first call (seen twice on the GPU
    when the fused head's op changed its outputs: "wrong number of dimensions ...
    for op: torch.ops.speedrun.fp8_softcap_ce"). The graph is left unchanged.
    """

    def __init__(self, key: str):
        self.key = key

    def __call__(self, graph) -> None:
        return None

    def uuid(self) -> str:
        return self.key


def key_local_caches(key: str | None = None) -> bool:
    """Key torch's local compile caches by speedrun's sources (see `SourceKeyPass`).

    Returns False, changing nothing, when a post-grad custom pass of someone
    else's is already installed (it is left alone) or this torch lacks the hook.
    """
    try:
        from torch._inductor import config as inductor_config
        from torch._inductor.custom_graph_pass import CustomGraphPass
    except ImportError:
        return False
    current = getattr(inductor_config, "post_grad_custom_post_pass", False)
    if current is False or (current is not None and not isinstance(current, _source_key_pass_class())):
        return False
    inductor_config.post_grad_custom_post_pass = _source_key_pass_class()(key or source_hash())
    return isinstance(inductor_config.post_grad_custom_post_pass, CustomGraphPass)


@lru_cache(maxsize=1)
def _source_key_pass_class():
    """`SourceKeyPass` as a subclass of torch's CustomGraphPass (imported lazily: torch._inductor is heavy)."""
    from torch._inductor.custom_graph_pass import CustomGraphPass

    return type("SourceKeyPass", (SourceKeyPass, CustomGraphPass), {})


def load_for_run(cfg, device: torch.device | str, world_size: int = 1, log=print) -> str:
    """At the start of a compiled run: load the matching cache if present; log and return the status.
    On a miss, a second line names the nearest stored file and what it was made for instead."""
    hint = None
    if not available():
        status = "unavailable (this torch has no save/load_cache_artifacts)"
    elif not enabled():
        status = f"off ({ENV_SWITCH})"
    else:
        parts = key_parts(cfg, device, world_size)
        key = key_from_parts(parts)
        status = f"loaded {key}" if load(key) else f"none ({key})"
        if status.startswith("loaded") and triton_path(key).is_file():
            status += f" (+ speedrun's Triton kernels: {load_triton(key)} files written)"
        hint = None if status.startswith("loaded") or log is None else nearest_miss(parts)
    if log is not None:
        log(f"compile cache: {status}")
        if hint:
            log(f"compile cache: {hint}")
    return status
