"""`speedrun info`: the software, hardware and data this machine would run with.

`environment()` returns the same facts as a JSON-serialisable dict; the
training loop writes it into each run folder so that a result can always be
traced to its torch/CUDA/GPU combination. Nothing here may fail: a missing
Triton or GPU is reported, not raised.
"""

from __future__ import annotations

import json
import os
import platform
import sys

from speedrun import __version__


def _triton() -> str | None:
    try:
        import triton
        return triton.__version__
    except Exception:
        return None


def _gpus(torch) -> list[dict]:
    if not torch.cuda.is_available():
        return []
    out = []
    for i in range(torch.cuda.device_count()):
        p = torch.cuda.get_device_properties(i)
        out.append({"index": i, "name": p.name, "memory_gib": round(p.total_memory / 2**30, 1),
                    "capability": f"{p.major}.{p.minor}"})
    return out


def _driver(torch) -> str | None:
    try:
        if torch.cuda.is_available():
            import ctypes
            v = ctypes.c_int()
            ctypes.CDLL("libcuda.so.1").cuDriverGetVersion(ctypes.byref(v))
            return f"{v.value // 1000}.{(v.value % 1000) // 10}"
    except Exception:
        pass
    return None


def _data() -> dict:
    from speedrun.data.fineweb import REPOS
    from speedrun.data.paths import cache_root, default_fineweb_dir, demo_assets

    fineweb = {}
    for variant, (_, prefix) in REPOS.items():
        d = default_fineweb_dir(variant)
        n_train = len(list(d.glob(f"{prefix}_train_*.bin"))) if d.is_dir() else 0
        fineweb[variant] = {"dir": str(d), "present": (d / f"{prefix}_val_000000.bin").is_file(),
                            "train_shards": n_train}
    return {"cache_root": str(cache_root()), "fineweb": fineweb,
            "demo": {"embedded_shards": [a.name for a in demo_assets()],
                     "unpacks_to": str(cache_root() / "demo")}}


def environment() -> dict:
    """Versions, devices and data locations (JSON-serialisable)."""
    import torch

    return {
        "speedrun": __version__,
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
        "torch": torch.__version__,
        "triton": _triton(),
        "cuda": torch.version.cuda,
        "cuda_driver": _driver(torch),
        "cuda_available": torch.cuda.is_available(),
        "gpus": _gpus(torch),
        "data": _data(),
    }


def _print(env: dict) -> None:
    print(f"speedrun {env['speedrun']}  python {env['python']}  torch {env['torch']}  "
          f"triton {env['triton'] or 'not installed'}")
    print(f"CUDA {env['cuda'] or 'none (CPU build)'}  driver {env['cuda_driver'] or '-'}  "
          f"platform {env['platform']}  cpus {env['cpu_count']}")
    if not env["gpus"]:
        print("GPUs: none visible")
    for g in env["gpus"]:
        print(f"GPU {g['index']}: {g['name']}, {g['memory_gib']} GiB, capability {g['capability']}")
    data = env["data"]
    print(f"data cache: {data['cache_root']}")
    for variant, d in data["fineweb"].items():
        state = f"present, {d['train_shards']} train shard(s)" if d["present"] else "absent"
        print(f"  FineWeb {variant}: {d['dir']} ({state})")
    demo = data["demo"]
    shipped = ", ".join(demo["embedded_shards"]) or "MISSING from the package"
    print(f"  demo corpus: {shipped} (unpacked on first use under {demo['unpacks_to']})")


def cmd_info(args) -> int:
    env = environment()
    if args.json:
        print(json.dumps(env, indent=2))
    else:
        _print(env)
    if args.preset:
        from speedrun.recipes import registry

        print(registry.describe(args.preset))
    return 0


def register(subparsers) -> None:
    p = subparsers.add_parser("info", help="versions, GPUs and where data is looked for",
                              description="Print Python/torch/Triton/CUDA versions, visible GPUs and data folders.")
    p.add_argument("--json", action="store_true", help="print the same facts as JSON")
    p.add_argument("--preset", metavar="NAME", default=None, help="also describe this preset")
    p.set_defaults(func=cmd_info)
