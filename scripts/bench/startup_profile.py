"""Where a process's start goes on this machine, before any compile: imports, CUDA set-up, Inductor.
Prints one line per stage (seconds since the interpreter started) and writes `-X importtime`-style
totals of the slowest top-level imports when run with -X importtime (stderr)."""
import os
import time

t0 = time.time()
marks = []


def mark(name):
    marks.append((name, time.time() - t0))


import torch  # noqa: E402

mark("import torch")
import speedrun.train.loop  # noqa: E402,F401

mark("import speedrun.train.loop")
torch.cuda.set_device(0)
torch.zeros(1, device="cuda")
mark("cuda context")
from speedrun.compile.cache import key_local_caches  # noqa: E402

key_local_caches()
mark("key_local_caches (inductor config)")
import torch._inductor.compile_fx  # noqa: E402,F401

mark("import compile_fx")
import triton  # noqa: E402,F401

mark("import triton")
from torch._inductor.codecache import torch_key  # noqa: E402

torch_key()
mark("torch_key")
x = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
(x @ x).sum().item()
mark("first cuBLAS matmul")
for name, t in marks:
    print(f"{t:7.2f}  {name}")
print("python", os.sys.version.split()[0], "torch", torch.__version__, "file", torch.__file__)
