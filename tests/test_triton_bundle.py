"""speedrun's own Triton kernels in the portable compile cache (`triton_bundle`, `compile_cache`).

No GPU compiles a kernel here, so each test lays out a Triton cache the way Triton's compiler does
(its own cache manager writes the files and the group file) and hands a speedrun kernel a compiled
kernel whose hash names that folder. What matters is the far end: after unpacking into another cache
folder, Triton's own cache manager finds the kernel's group there, with every file it lists.
"""

import ctypes
import io
import json
import shutil
import sysconfig
import sys
import tarfile
import types
from pathlib import Path

import pytest
import torch

triton = pytest.importorskip("triton")
from triton.runtime.cache import get_cache_manager  # noqa: E402

from speedrun.compile import cache as compile_cache

from speedrun.compile import triton_bundle
from speedrun.recipes.registry import get_preset  # noqa: E402

HASH = "ab" * 32  # Triton's hashes are sha256 hex digests
OTHER = "cd" * 32


def _compiled(h: str, name: str) -> None:
    """What Triton's compiler leaves in its cache for one kernel: its files, then the group file."""
    cache = get_cache_manager(h)
    paths = {f"{name}.cubin": cache.put(b"\x7fELF-binary-" + h.encode(), f"{name}.cubin", binary=True),
             f"{name}.json": cache.put(json.dumps({"name": name, "hash": h}), f"{name}.json", binary=False)}
    cache.put_group(f"{name}.json", paths)


def _kernel_module(monkeypatch, name: str, hashes: list[str]):
    """A loaded module `name` with one Triton JIT function that has compiled kernels of these hashes."""

    def k(x):
        pass

    k.__module__ = name
    fn = triton.jit(k)
    fn.device_caches[0] = ({f"spec{i}": types.SimpleNamespace(hash=h) for i, h in enumerate(hashes)},
                           {}, None, None, None)
    module = types.ModuleType(name)
    module.kernel = fn
    monkeypatch.setitem(sys.modules, name, module)
    return fn


def _host_module(folder, load: bool) -> None:
    """A compiled host module in a Triton cache folder (a copy of a small C extension), dlopened when
    `load`, as Triton loads its utilities and launchers."""
    extensions = sorted(Path(sysconfig.get_config_var("DESTSHARED") or "/nonexistent").glob("*.so"))
    if not extensions:
        pytest.skip("this Python has no C extension module files to copy")
    folder.mkdir(parents=True)
    so = folder / "cuda_utils.so"
    shutil.copyfile(extensions[0], so)
    if load:
        ctypes.CDLL(str(so))


def test_host_modules_are_the_loaded_ones(tmp_path):
    _host_module(tmp_path / "L", load=True)
    _host_module(tmp_path / "N", load=False)
    assert triton_bundle.module_folders(tmp_path) == [(tmp_path / "L").resolve()]
    assert triton_bundle.module_folders(tmp_path, maps=tmp_path / "no-such-file") == []


@pytest.fixture
def triton_cache(tmp_path, monkeypatch):
    """Triton's cache in tmp_path/a; returns a function that switches it to tmp_path/<name>."""
    def use(name):
        monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / name))
        return tmp_path / name

    use("a")
    return use


def test_packed_kernels_are_found_by_triton_in_another_cache(triton_cache, monkeypatch):
    _compiled(HASH, "softcap_ce_fwd")
    _compiled(OTHER, "triton_poi_fused_add_0")  # a kernel nothing of speedrun's holds: left out
    _host_module(triton_cache("a") / "LAUNCHER", load=True)  # Triton's utilities, loaded by this process
    _host_module(triton_cache("a") / "ELSEWHERE", load=False)  # another project's, not loaded: left out
    _kernel_module(monkeypatch, "speedrun._test_kernels", [HASH])
    _kernel_module(monkeypatch, "someone_else", [OTHER])
    payload = triton_bundle.collect()
    names = tarfile.open(fileobj=io.BytesIO(payload), mode="r:gz").getnames()
    folder = get_cache_manager(HASH).key
    assert sorted(names) == sorted([f"{folder}/softcap_ce_fwd.cubin", f"{folder}/softcap_ce_fwd.json",
                                    f"{folder}/__grp__softcap_ce_fwd.json", "LAUNCHER/cuda_utils.so"])

    module = (triton_cache("a") / "LAUNCHER" / "cuda_utils.so").read_bytes()
    b = triton_cache("b")
    assert triton_bundle.unpack(payload, b) == 4
    assert (b / "LAUNCHER" / "cuda_utils.so").read_bytes() == module
    group = get_cache_manager(HASH).get_group("softcap_ce_fwd.json")  # Triton's own lookup, in b
    assert group is not None and set(group) == {"softcap_ce_fwd.cubin", "softcap_ce_fwd.json"}
    assert all(p.startswith(str(b)) for p in group.values())
    assert open(group["softcap_ce_fwd.cubin"], "rb").read() == b"\x7fELF-binary-" + HASH.encode()
    assert get_cache_manager(OTHER).get_group("triton_poi_fused_add_0.json") is None
    assert not list(b.rglob(".*.tmp"))


def test_unpacking_never_overwrites(triton_cache, monkeypatch):
    _compiled(HASH, "k")
    _kernel_module(monkeypatch, "speedrun._test_kernels", [HASH])
    payload = triton_bundle.collect()
    b = triton_cache("b")
    assert triton_bundle.unpack(payload, b) == 3
    cubin = b / get_cache_manager(HASH).key / "k.cubin"
    cubin.write_bytes(b"compiled here")
    assert triton_bundle.unpack(payload, b) == 0
    assert cubin.read_bytes() == b"compiled here"


def test_nothing_packed_without_speedrun_kernels(triton_cache, monkeypatch):
    _compiled(OTHER, "k")
    _kernel_module(monkeypatch, "speedrun._test_kernels", [])
    _kernel_module(monkeypatch, "someone_else", [OTHER])
    assert triton_bundle.collect() is None


def _tar(entries: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name, data in entries.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


@pytest.mark.parametrize("name", ["../evil/x", "/abs/x", "a/b/c", "onlyfile", "a/.hidden"])
def test_unpack_refuses_anything_but_folder_slash_file(tmp_path, name):
    with pytest.raises(ValueError, match="unexpected entry"):
        triton_bundle.unpack(_tar({"good/k.cubin": b"x", name: b"y"}), tmp_path / "root")
    assert not (tmp_path / "root").exists() and not (tmp_path / "evil").exists()


def test_run_loads_the_kernels_with_torchs_artifacts(tmp_path, triton_cache, monkeypatch):
    monkeypatch.setenv("SPEEDRUN_HOME", str(tmp_path / "home"))
    monkeypatch.setattr(torch.compiler, "load_cache_artifacts", lambda b: "info")
    monkeypatch.setattr(torch.compiler, "save_cache_artifacts", lambda: (b"artifacts-bytes", "info"))
    _compiled(HASH, "k")
    _kernel_module(monkeypatch, "speedrun._test_kernels", [HASH])
    cfg = get_preset("demo_2025_08")
    key = compile_cache.cache_key(cfg, "cpu", 1)
    compile_cache.save(key)
    assert compile_cache.save_triton(key) == compile_cache.triton_path(key)
    b = triton_cache("b")
    status = compile_cache.load_for_run(cfg, "cpu", 1, None)
    assert status == f"loaded {key} (+ speedrun's Triton kernels: 3 files written)"
    assert get_cache_manager(HASH).get_group("k.json") is not None
    assert compile_cache.load_for_run(cfg, "cpu", 1, None).endswith("0 files written)")  # already there

    compile_cache.write_file(compile_cache.triton_path(key), _tar({"../x/y": b"z"}))  # a hostile file
    with pytest.warns(UserWarning, match="cannot unpack it"):
        assert compile_cache.load_triton(key) == 0
    assert not (b.parent / "x").exists()
