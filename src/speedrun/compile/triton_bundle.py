"""speedrun's own Triton kernels, carried in the portable compile cache.

`torch.compiler.save_cache_artifacts()` carries the kernels Inductor generates, not the ones speedrun
writes by hand (the soft-capped CE, the ReLU² MLP, the transposes, the optimisers' kernels, ...). On a
machine whose Triton cache is empty each of those is compiled again at its first launch, inside the
cold start. `speedrun warm` therefore also packs the Triton cache folders of every speedrun kernel this
process compiled or loaded, with the folders of the compiled host modules it loaded from Triton's cache
(the `.so` files of Triton's driver utilities and launchers), into one tar; a run that loads the portable cache unpacks it into Triton's cache before
anything launches.

Triton names each folder by a hash of everything that shapes the binary (Triton's version and sources,
the kernel's source and specialisation, the GPU target, the options), so a folder from another setup is
never found, only unused. Unpacking never overwrites a file, writes each one under a temporary name and
renames it (a concurrent rank or reader never sees half a file), and accepts only `folder/file` names.
A Triton group file (`__grp__<kernel>.json`) lists its files by absolute path; those paths are rewritten
to the folder they are unpacked into. A custom Triton cache manager (`TRITON_CACHE_MANAGER`) is left
alone: nothing is packed or unpacked.
"""

from __future__ import annotations

import io
import json
import os
import re
import sys
import tarfile
from pathlib import Path

_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.\-]*$")
_MODULE_PREFIX = "speedrun."


def cache_root() -> Path | None:
    """Triton's local cache folder, or None (no Triton, or a custom cache manager)."""
    try:
        from triton import knobs
    except ImportError:
        return None
    if knobs.cache.manager_class is not None:
        return None
    return Path(knobs.cache.dir)


def _jit_functions():
    """Every Triton JIT function bound as a global of a loaded speedrun module (the kernel modules bind
    their kernels so when they build them, `kernel_choice.built_once`)."""
    from triton.runtime.jit import JITFunction

    for name, module in list(sys.modules.items()):
        if module is None or not name.startswith(_MODULE_PREFIX):
            continue
        for value in list(vars(module).values()):
            if isinstance(value, JITFunction):
                yield value


def _kernel_hashes(fn) -> set[str]:
    """The Triton cache hashes of one JIT function's compiled kernels, on every device."""
    hashes = set()
    for entry in getattr(fn, "device_caches", {}).values():
        kernels = entry[0] if isinstance(entry, tuple) else entry
        for kernel in getattr(kernels, "values", lambda: [])():
            h = getattr(kernel, "hash", None)
            if isinstance(h, str):
                hashes.add(h)
    return hashes


def kernel_folders(root: Path) -> list[Path]:
    """The cache folders of the speedrun kernels this process compiled or loaded."""
    from triton.runtime.cache import get_cache_manager

    folders = set()
    for fn in _jit_functions():
        for h in _kernel_hashes(fn):
            folder = Path(get_cache_manager(h).cache_dir)
            if folder.parent.resolve() == root.resolve() and folder.is_dir():
                folders.add(folder)
    return sorted(folders)


def module_folders(root: Path, maps: Path = Path("/proc/self/maps")) -> list[Path]:
    """The cache folders of the compiled host modules (`*.so`: Triton's driver utilities, its launchers)
    this process has loaded, read from the process's memory maps (Linux; elsewhere none). A cache shared
    with other projects holds many more; only these are needed."""
    try:
        lines = maps.read_text().splitlines()
    except OSError:
        return []
    root = root.resolve()
    folders = set()
    for line in lines:
        fields = line.split(maxsplit=5)  # address, perms, offset, device, inode[, path]
        path = Path(fields[5]) if len(fields) == 6 else None
        if path is not None and path.suffix == ".so" and path.parent.parent == root:
            folders.add(path.parent)
    return sorted(folders)


def pack(folders: list[Path]) -> bytes:
    """The folders' plain files as a gzip tar of `folder/file` entries (lock and temporary files left out)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz", compresslevel=1) as tar:
        for folder in folders:
            for f in sorted(folder.iterdir()):
                if f.is_file() and _NAME.match(f.name) and f.name != "lock" and not f.name.startswith("tmp."):
                    tar.add(str(f), arcname=f"{folder.name}/{f.name}", recursive=False)
    return buf.getvalue()


def collect() -> bytes | None:
    """This process's speedrun kernels and Triton's host modules, packed; None when there are no kernels."""
    root = cache_root()
    if root is None:
        return None
    kernels = kernel_folders(root)
    if not kernels:
        return None
    return pack(sorted(set(kernels) | set(module_folders(root))))


def _write_new(path: Path, data: bytes) -> bool:
    """Write `data` to `path` unless it exists, under a temporary name then renamed."""
    if path.exists():
        return False
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)
    return True


def _relocated_group(data: bytes, folder: Path) -> bytes:
    """A group file's child paths pointed at `folder` (Triton writes absolute paths)."""
    group = json.loads(data)
    paths = group.get("child_paths")
    if not isinstance(paths, dict):
        raise ValueError("a Triton group file without child_paths")
    group["child_paths"] = {k: str(folder / Path(str(p)).name) for k, p in paths.items()}
    return json.dumps(group).encode()


def unpack(payload: bytes, root: Path) -> int:
    """Write the packed files into Triton's cache at `root`, never over an existing one; the number
    written. Raises ValueError on a member that is not a plain `folder/file` entry."""
    written = []
    with tarfile.open(fileobj=io.BytesIO(payload), mode="r:gz") as tar:
        members = tar.getmembers()
        for m in members:
            parts = m.name.split("/")
            if not m.isfile() or len(parts) != 2 or not all(_NAME.match(p) for p in parts):
                raise ValueError(f"unexpected entry {m.name!r} in the Triton bundle")
        # the group files last: a reader that finds one then finds every file it lists
        for m in sorted(members, key=lambda m: m.name.split("/")[1].startswith("__grp__")):
            folder_name, file_name = m.name.split("/")
            data = tar.extractfile(m).read()
            if file_name.startswith("__grp__"):
                data = _relocated_group(data, root / folder_name)
            written.append(_write_new(root / folder_name / file_name, data))
    return sum(written)
