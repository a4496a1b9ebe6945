"""Time three formulations of the attention's QK RMS-norm + rotary, compiled, forward + backward.

usage: (cd scripts/device && python3 qk_forms_bench.py OUT_JSON [cuda|cpu] [T])

The profile puts Inductor's fused QK-norm + rotary kernels at ~190 us forward and ~210 us backward
per layer call at the record's shape, about 2.7x their memory-bound time; Inductor generates a
looped reduction there with two reductions (q and k) and masked double loads for the rotary's
halves. The same function written differently may compile to a better kernel:

  current  rms_norm(q), rms_norm(k), then Rotary.rotate (halves by chunk, joined by cat): the model
  joint    q and k normed and rotated as one (B, T, 2H, D) tensor, split afterwards: one reduction
           per row, 2H rows per token
  roll     joint, and the rotation as x*C + roll(x, D/2)*S with C = (cos, cos), S = (sin, -sin):
           the same products and sums per element, without the halves' masked loads

In eager float32 the three are bit-equal (checked here; the model's test suite holds the model's
form). (The eighth session also timed `qk_rotary`'s hand-written kernels here; `attn_inputs`, which
replaced them, has its own bench: attn_inputs_bench.py.) Each is compiled alone; the input is the (B, T, 3H, D) projection output, the gradient flows
back into it, as in the model. CUDA events, median of 20 after 3 warm-up calls; results written after
each form so that a cut-off run still reports what it finished.
"""

import json
import sys
import time

import torch
import torch.nn.functional as F

from speedrun.model import Rotary

H, D = 6, 128


def rms(x):
    return F.rms_norm(x, (x.size(-1),))


def current(qkv, rope, tables):
    q, k, _ = qkv.chunk(3, dim=-2)
    return Rotary.rotate(rms(q), rope), Rotary.rotate(rms(k), rope)


def joint(qkv, rope, tables):
    qk = Rotary.rotate(rms(qkv[:, :, : 2 * H]), rope)
    return qk[:, :, :H], qk[:, :, H:]


def roll(qkv, rope, tables):
    c, s = tables
    x = rms(qkv[:, :, : 2 * H]).float()
    qk = (x * c + x.roll(D // 2, dims=-1) * s).type_as(qkv)
    return qk[:, :, :H], qk[:, :, H:]


def timed_us(fn):
    """CUDA: `cuda_timing.median_us`; the CPU (a check of the script, not a figure): mean of 5 calls."""
    if torch.cuda.is_available():
        from cuda_timing import median_us

        return median_us(fn)
    fn()
    t = time.perf_counter()
    for _ in range(5):
        fn()
    return (time.perf_counter() - t) / 5 * 1e6


def main(out, device="cuda", T="49152"):
    T = int(T)
    g = torch.Generator(device=device).manual_seed(0)
    rot = Rotary(D, "half_truncated").to(device)
    rot.build_table(T)
    rope = rot.angles(torch.arange(T, device=device), T)
    cos, sin = rope[0][None, :, None, :], rope[1][None, :, None, :]
    tables = (torch.cat((cos, cos), -1), torch.cat((sin, -sin), -1))
    qkv32 = torch.randn(1, T, 3 * H, D, device=device, generator=g)
    outs = [torch.randn(1, T, H, D, device=device, generator=g) for _ in range(2)]
    ref = [f(qkv32, rope, tables) for f in (current, joint, roll)]
    result = {"device": str(device), "T": T, "eager_float32_bit_equal": {
        name: all(torch.equal(a, b) for a, b in zip(ref[0], r)) for name, r in zip(("joint", "roll"), ref[1:])},
        "forms": []}
    print(result, flush=True)
    qkv = qkv32.bfloat16().requires_grad_()
    gouts = [o.bfloat16() for o in outs]
    base = None
    forms = [("current", current), ("joint", joint), ("roll", roll)]
    for name, f in forms:
        t0 = time.time()
        cf = torch.compile(f)
        step = lambda: torch.autograd.grad(cf(qkv, rope, tables), qkv, gouts)[0]
        y, dx = cf(qkv, rope, tables), step()
        compile_s = time.time() - t0
        if base is None:
            base = (y, dx)
        row = {"form": name, "compile_s": round(compile_s, 1), "fwd_bwd_us": timed_us(step),
               "fwd_max_diff_vs_current": max((a.float() - b.float()).abs().max().item() for a, b in zip(y, base[0])),
               "grad_max_diff_vs_current": (dx.float() - base[1].float()).abs().max().item()}
        result["forms"].append(row)
        print(row, flush=True)
        json.dump(result, open(out, "w"), indent=1)


if __name__ == "__main__":
    main(*sys.argv[1:])
