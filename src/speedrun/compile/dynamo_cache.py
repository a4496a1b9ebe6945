"""Dynamo's own work, cached between runs: what is left of a warm start.

With torch's local caches warm (Inductor's FX graphs, AOTAutograd, Triton),
a run still re-traces its Python with Dynamo before those caches can hit:
about 6 s of bytecode tracing for the record's training and evaluation
graphs on an H200, a third of a warm start's compile time. torch's
"caching precompile" (`torch._dynamo.config.caching_precompile`, a
prototype since torch 2.8) stores what Dynamo produced (the transformed
bytecode, its guards, the compiled backends) as a package; a later process
installs it when `torch.compile` wraps the function and runs without
tracing. It checks the sources of every inlined function on load.

What this module adds around the prototype:

- **Where packages live.** torch files a package under the function's
  qualified name and first line only, so every preset, world size and
  source version would share one slot. Here the folder is
  `<Inductor cache>/speedrun-dynamo/<compile_cache.cache_key>-<device>-r<rank>`:
  a package is only loaded by a run with the same torch, Triton, GPU,
  speedrun sources, graph-shaping config, world size, device and rank. It
  sits inside torch's local cache folder (`TORCHINDUCTOR_CACHE_DIR`), so it
  lives and dies with the caches it complements: empty those folders and
  the start is cold again.
- **Dropped guards.** The prototype drops identity guards (`ID_MATCH`,
  closure and dict-version guards). They protect code and module identity;
  the key's hash of every speedrun source covers that for our code, and the
  key's config part for the model's structure. Shapes, dtypes, devices and
  constants are still guarded; a guard that fails recompiles as usual.
- **Only where it works: torch >= 2.13.** On torch 2.11 (the H200
  machine's) every package of the record failed to install, twice for two
  different reasons in unpickling its guards: `ImportSource` (a module
  reached by an inlined function's globals) installs a guard as it is
  created, which needs a tracing context ("TracingContext.get() must be
  called within an ongoing trace"); inside a throwaway tracing context the
  next failure was "DefaultsSource.__init__() takes from 3 to 4 positional
  arguments but 6 were given". `compile_with` keeps the throwaway context
  (the guards it collects are discarded; the package's own guard state is
  what is checked) and `supported()` is False before 2.13.
- **Failure is never fatal.** A package torch cannot install raises inside
  `torch.compile` (also seen on a CPU with a package traced while parameters
  had gradients: "assigned grad expected to be a Tensor"); `compile_with`
  then deletes it, leaves a `.failed` note so that later runs of the same
  key do not try again (they start as without this module, precompile child
  included), turns the feature off for this process and compiles afresh.
- **Saving is explicit** (`save`): the trainer saves once its graphs exist
  (before the first timed step) and only when it compiled something new.

`train.dynamo_cache=false` turns it off. Nothing it does changes what the
compiled code computes: the installed graphs are the ones Inductor's cache
would have served after a re-trace.
"""

from __future__ import annotations

import contextlib
import shutil
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, TypeVar

import torch

T = TypeVar("T")
FOLDER = "speedrun-dynamo"


@dataclass
class DynamoPackages:
    """This process's package folder, and whether a package was there when the run started."""

    path: Path
    found: bool


MIN_TORCH = "2.13"


def supported() -> bool:
    """True on a torch where the prototype installs our packages: 2.13 (tested on the CPU). On 2.11
    (the H200 machine's) every package of the record failed to install, for two torch bugs in
    unpickling guards (see the module docstring); 2.12 is untested, so it is left off there too."""
    if torch.torch_version.TorchVersion(torch.__version__) < MIN_TORCH:
        return False
    try:
        import torch._dynamo.config as dynamo_config
        from torch._dynamo.package import DynamoCache  # noqa: F401
        from torch._dynamo.precompile_context import PrecompileContext
    except ImportError:
        return False
    return hasattr(dynamo_config, "caching_precompile") and hasattr(PrecompileContext, "save_to_dynamo_cache")


def package_dir(cfg, device: torch.device, world_size: int, rank: int) -> Path:
    """The folder for one run key, device and rank, inside torch's Inductor cache folder."""
    from speedrun.compile.cache import local_path

    return local_path(FOLDER, cfg, device, world_size, rank)


def has_package(path: Path) -> bool:
    return path.is_dir() and any(path.glob("*/entry"))


def failed_note(path: Path) -> Path:
    return path.with_name(path.name + ".failed")


def enable(cfg, device: torch.device, world_size: int, rank: int) -> DynamoPackages | None:
    """Turn caching precompile on for this process, packages in this run's folder; None when off
    (`train.dynamo_cache=false`) or unsupported. Call before `torch.compile`."""
    if not cfg.train.dynamo_cache or not supported():
        return None
    from torch._dynamo.package import DynamoCache

    path = package_dir(cfg, device, world_size, rank)
    if failed_note(path).exists():  # this key's package could not be installed before: run without
        return None
    DynamoCache.path_prefix = lambda: str(path)  # this instance only; torch's default reads its cache dir
    torch._dynamo.config.caching_precompile = True
    return DynamoPackages(path=path, found=has_package(path))


def disable(packages: DynamoPackages | None, remove: bool = False) -> None:
    """Turn caching precompile off again (and delete this run's packages when `remove`)."""
    if packages is None:
        return
    from torch._dynamo.package import DynamoCache

    torch._dynamo.config.caching_precompile = False
    DynamoCache.__dict__.pop("path_prefix", None)
    if remove:
        shutil.rmtree(packages.path, ignore_errors=True)


def compile_with(packages: DynamoPackages | None, compile_fn: Callable[[], T]) -> T:
    """`compile_fn()` (which calls `torch.compile`); if installing a stored package fails there,
    delete the package, disable caching precompile, warn in one line and compile without it."""
    if packages is None or not packages.found:
        return compile_fn()
    try:
        with _throwaway_tracing_context():
            return compile_fn()
    except Exception as e:  # noqa: BLE001 - any failure of the prototype: compile as if it were absent
        warnings.warn(f"dynamo cache {packages.path}: torch could not install it ({type(e).__name__}: {e}); "
                      "deleted it, compiling without it", stacklevel=2)
        disable(packages, remove=True)
        failed_note(packages.path).write_text(f"{type(e).__name__}: {e}\n")
        packages.found = False
        return compile_fn()


def _throwaway_tracing_context():
    """A tracing context whose guards nobody reads (see the module docstring); a null context on a
    torch where it cannot be made."""
    try:
        from torch._guards import TracingContext, tracing

        return tracing(TracingContext(None))
    except Exception:  # noqa: BLE001
        return contextlib.nullcontext()


def save(packages: DynamoPackages | None) -> bool:
    """Write this process's Dynamo packages to its folder; False (with a warning on failure) if not."""
    if packages is None or not torch._dynamo.config.caching_precompile:
        return False
    from torch._dynamo.precompile_context import PrecompileContext

    try:
        PrecompileContext.save_to_dynamo_cache()
    except Exception as e:  # noqa: BLE001 - a cache that cannot be written only costs the next start time
        warnings.warn(f"dynamo cache {packages.path}: could not save ({type(e).__name__}: {e})", stacklevel=2)
        return False
    return has_package(packages.path)
