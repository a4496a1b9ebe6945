"""Where data lives on disk.

One place decides every default folder so that `speedrun data fineweb`
writes where `speedrun train` reads and `speedrun info` reports both:

- `SPEEDRUN_HOME` (default `~/.cache/speedrun`) holds everything;
- FineWeb shards go to `$SPEEDRUN_DATA/<variant>` when `SPEEDRUN_DATA` is set,
  else `$SPEEDRUN_HOME/data/fineweb<variant>`;
- the demo corpus ships xz-compressed inside the package (wheels stay small)
  and is unpacked once into `$SPEEDRUN_HOME/demo/<hash of the assets>`; each file
  is written to a temp name, verified as a shard, then renamed, so a killed
  process or two ranks racing never leave a half-written shard behind.
"""

from __future__ import annotations

import hashlib
import lzma
import os
import shutil
from importlib import resources
from pathlib import Path

from speedrun.errors import DataError
from speedrun.data.shards import read_header

VARIANTS = ("10B", "100B", "edu10B")


def cache_root() -> Path:
    """`$SPEEDRUN_HOME`, default `~/.cache/speedrun`."""
    env = os.environ.get("SPEEDRUN_HOME")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "speedrun"


def default_fineweb_dir(variant: str = "10B") -> Path:
    """Default folder of one FineWeb variant's shards."""
    if variant not in VARIANTS:
        raise DataError(f"unknown FineWeb variant {variant!r}; choose one of {', '.join(VARIANTS)}")
    env = os.environ.get("SPEEDRUN_DATA")
    if env:
        return Path(env).expanduser() / variant
    return cache_root() / "data" / f"fineweb{variant}"


def demo_assets() -> list:
    """The package's compressed demo shards (importlib.resources traversables)."""
    folder = resources.files("speedrun") / "assets" / "demo"
    if not folder.is_dir():
        return []
    return sorted((p for p in folder.iterdir() if p.name.endswith(".bin.xz")), key=lambda p: p.name)


def _unpack(src, dest: Path) -> None:
    tmp = dest.with_name(f".{dest.name}.{os.getpid()}.tmp")
    try:
        with src.open("rb") as raw, lzma.open(raw) as fin, open(tmp, "wb") as fout:
            shutil.copyfileobj(fin, fout, 1 << 20)
        read_header(tmp)  # verify before it becomes visible
        os.replace(tmp, dest)
    except lzma.LZMAError as e:
        raise DataError(f"{src}: embedded demo shard is corrupt ({e}); reinstall speedrun") from None
    finally:
        tmp.unlink(missing_ok=True)


def demo_data_dir() -> Path:
    """Folder holding the unpacked demo shards (`demo_train_*.bin`, `demo_val_*.bin`)."""
    assets = demo_assets()
    if not assets:
        raise DataError("the embedded demo corpus is missing from the package (speedrun/assets/demo); "
                        "reinstall speedrun")
    digest = hashlib.sha256()
    for src in assets:
        digest.update(src.name.encode() + src.read_bytes())
    out = cache_root() / "demo" / digest.hexdigest()[:16]
    out.mkdir(parents=True, exist_ok=True)
    for src in assets:
        dest = out / src.name[: -len(".xz")]
        try:
            read_header(dest)
        except DataError:
            _unpack(src, dest)
    return out


def resolve_files(data_dir: str | os.PathLike, pattern: str) -> list[Path]:
    """Files in `data_dir` matching the glob `pattern`, sorted; DataError if none."""
    folder = Path(data_dir).expanduser()
    if not folder.is_dir():
        raise DataError(f"{folder}: data folder not found (looking for {pattern})")
    files = sorted(p for p in folder.glob(pattern) if p.is_file())
    if not files:
        raise DataError(f"{folder}: no files match {pattern!r}")
    return files


# What `speedrun data tokenize` and FineWeb both write: <prefix>_train_NNNNNN.bin, <prefix>_val_NNNNNN.bin
SPLIT_PATTERN = "*_{split}_[0-9]*.bin"


def discover_files(data_dir: str | os.PathLike, pattern: str, split: str) -> list[Path]:
    """The shards of one split (`train` or `val`): those matching the preset's `pattern`, else, in a
    folder that holds exactly one `<prefix>_<split>_NNNNNN.bin` series, that series. So a preset runs
    on a folder of `speedrun data tokenize --prefix anything` shards with `--data-dir` alone."""
    folder = Path(data_dir).expanduser()
    if not folder.is_dir():
        raise DataError(f"{folder}: data folder not found (looking for {pattern})")
    files = sorted(p for p in folder.glob(pattern) if p.is_file())
    if files:
        return files
    generic = SPLIT_PATTERN.format(split=split)
    found = sorted(p for p in folder.glob(generic) if p.is_file())
    prefixes = sorted({p.name.rsplit(f"_{split}_", 1)[0] for p in found})
    if len(prefixes) == 1:
        return found
    why = (f"several series match {generic!r} ({', '.join(prefixes)}); choose one with "
           f"--set data.{split}_pattern=PREFIX_{split}_*.bin") if prefixes else f"nor {generic!r}"
    raise DataError(f"{folder}: no {split} shards: nothing matches {pattern!r}, {why}")
