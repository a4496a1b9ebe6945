"""Output paths, checked before the work that fills them.

A command that writes its result at the end (a plot, a benchmark's JSON, an
exported model, tokenised shards) would otherwise learn that the path cannot
be written only once the work is done, and report it as an OSError traceback.
These checks run first and turn every such case into one `ConfigError` line
naming the option, the path and the reason:

    --out /data/file.txt/sub: cannot create (/data/file.txt is not a folder)
    --json out: is a folder, not a file
    --out /ro/run: cannot create (Read-only file system)

Permission bits alone cannot answer the question (root ignores them; a
read-only mount or a name too long for the file system does not show in
them), so each check does what the command will do and undoes it: it makes
the missing folders and the file, then removes what it made. A path that
already exists is left as it was.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from speedrun.errors import ConfigError


def _nearest_existing(path: Path) -> Path:
    """`path` itself or its closest ancestor that exists (a dangling link counts: it blocks a mkdir)."""
    while not os.path.lexists(path) and path != path.parent:
        path = path.parent
    return path


def _reason(e: OSError) -> str:
    return e.strerror or type(e).__name__


def _make_folders(folder: Path, option: str, shown: Path) -> list[Path]:
    """Create `folder` and any missing folders above it; returns those made, outermost first."""
    base = _nearest_existing(folder)
    if not base.is_dir():
        raise ConfigError(f"{option} {shown}: cannot create ({base} is not a folder)")
    missing = []
    while folder != base:
        missing.append(folder)
        folder = folder.parent
    made: list[Path] = []
    try:
        for p in reversed(missing):
            os.mkdir(p)
            made.append(p)
    except OSError as e:
        _remove(made)
        raise ConfigError(f"{option} {shown}: cannot create ({_reason(e)})") from None
    return made


def _remove(made: list[Path]) -> None:
    """Undo a check: remove what it made, innermost first."""
    for p in reversed(made):
        try:
            p.rmdir() if p.is_dir() else p.unlink()
        except OSError:
            pass  # something else wrote there meanwhile: leave it


def _as_path(path, option: str) -> Path:
    text = str(os.fspath(path))
    if not text.strip():
        raise ConfigError(f"{option}: empty path")
    if "\0" in text:
        raise ConfigError(f"{option} {text!r}: not a valid path (it holds a NUL character)")
    return Path(text).expanduser()


def check_folder(path, option: str) -> Path:
    """Refuse, as one line, an output folder that cannot be created or written into; returns it as a Path."""
    path = _as_path(path, option)
    if os.path.lexists(path) and not path.is_dir():
        raise ConfigError(f"{option} {path}: exists and is not a folder")
    made = _make_folders(path, option, path)
    try:
        with tempfile.TemporaryFile(dir=path):
            pass
    except OSError as e:
        verb = "cannot create" if made else "cannot write into it"
        raise ConfigError(f"{option} {path}: {verb} ({_reason(e)})") from None
    finally:
        _remove(made)
    return path


def check_file(path, option: str) -> Path:
    """Refuse, as one line, an output file that cannot be created or replaced; returns it as a Path.

    An existing file's folder must take new files too: results may be written to
    a temporary name beside the file and renamed over it."""
    path = _as_path(path, option)
    if path.is_dir():
        raise ConfigError(f"{option} {path}: is a folder, not a file")
    existed = os.path.lexists(path)
    made = _make_folders(path.parent, option, path)
    try:
        if existed:
            with open(path, "ab"):  # appending nothing: the file stays as it was
                pass
            with tempfile.TemporaryFile(dir=path.parent):
                pass
        else:
            with open(path, "xb"):
                made.append(path)
    except OSError as e:
        raise ConfigError(f"{option} {path}: cannot {'write' if existed else 'create'} ({_reason(e)})") from None
    finally:
        _remove(made)
    return path
