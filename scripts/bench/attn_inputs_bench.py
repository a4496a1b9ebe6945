"""The attention's input side at the record's shape: compiled reference against `attn_inputs`' kernels.

usage: (cd scripts/bench && python3 attn_inputs_bench.py OUT_JSON)

One layer call: the (49,152 x 2,304) bfloat16 projection -> q, k (QK RMS-norm + rotary) and v
(λ0 v + λ1 ve), forward and backward (gradients of the projection, ve and λ). Timed (CUDA events,
median of 20 after 3 warm-ups):
  ref       the model's own operations (`attn_inputs.reference`), torch.compile'd: what training ran
  kernel    the op's forward and backward launches alone, over a sweep of BLOCK_R x warps
  op        `attention_inputs(impl="triton")` forward + backward inside torch.compile, at the default launch
Accuracy: the op's outputs and gradients against the compiled reference (largest difference, share of
elements that differ) and both against float64 (relative norms). Results written after each part.
"""

import json
import sys

import torch

from cuda_timing import median_us
from speedrun.kernels import attn_inputs as ai
from speedrun.model.gpt import Rotary

T, H, D = 49152, 6, 128


def main(out):
    dev = torch.device("cuda")
    g = torch.Generator(device=dev).manual_seed(0)
    qkv = torch.randn(1, T, 3 * H * D, device=dev, generator=g).bfloat16().requires_grad_()
    ve = torch.randn(1, T, H * D, device=dev, generator=g).bfloat16().requires_grad_()
    lam = torch.tensor([0.8, 0.3], device=dev, requires_grad=True)
    rot = Rotary(D, "half_truncated").to(dev)
    rot.build_table(T)
    cos, sin = rot.angles(torch.arange(T, device=dev), T)
    ups = [torch.randn(1, T, H, D, device=dev, generator=g).bfloat16() for _ in range(3)]
    result = {"T": T, "H": H, "D": D, "default": dict(ai.KERNEL_CONFIG)}

    def save():
        with open(out, "w") as f:
            json.dump(result, f, indent=1)

    def fwd_bwd(fn):
        def step():
            outs = fn(qkv, ve, lam, cos, sin, H)
            return torch.autograd.grad(outs, (qkv, ve, lam), ups)
        return step

    ref_c = torch.compile(ai.reference)
    op_c = torch.compile(lambda *a: ai.attention_inputs(*a, impl="triton"))
    with torch.no_grad():
        result["ref_fwd_us"] = median_us(lambda: ref_c(qkv, ve, lam, cos, sin, H))
    result["ref_fwd_bwd_us"] = median_us(fwd_bwd(ref_c))
    result["op_fwd_bwd_us"] = median_us(fwd_bwd(op_c))
    print("ref", {k: result[k] for k in ("ref_fwd_us", "ref_fwd_bwd_us", "op_fwd_bwd_us")}, flush=True)
    save()

    # accuracy: op against the compiled reference and float64
    outs = {}
    for name, fn in (("op", op_c), ("ref", ref_c)):
        o = fn(qkv, ve, lam, cos, sin, H)
        outs[name] = [t.detach() for t in o] + [t.detach() for t in torch.autograd.grad(o, (qkv, ve, lam), ups)]
    q64, ve64, lam64 = (t.detach().double().requires_grad_() for t in (qkv, ve, lam))
    o64 = ai.reference_float64(q64, ve64, lam64, cos, sin, H)
    g64 = torch.autograd.grad(o64, (q64, ve64, lam64), [u.double() for u in ups])
    names = ("q", "k", "v", "d_qkv", "d_ve", "d_lambda")
    acc = {}
    for i, n in enumerate(names):
        a, b = outs["op"][i].double(), outs["ref"][i].double()
        exact = (list(o64) + list(g64))[i].double()
        rel = lambda x: ((x - exact).norm() / exact.norm()).item()
        acc[n] = {"max_abs_diff_vs_ref": (a - b).abs().max().item(), "share_differ": (a != b).double().mean().item(),
                  "rel_err_op_vs_float64": rel(a), "rel_err_ref_vs_float64": rel(b)}
    result["accuracy"] = acc
    print("accuracy", json.dumps(acc), flush=True)
    save()

    # the launches alone, swept
    flat = qkv.detach().view(T, -1)
    ve_flat = ve.detach().view(T, -1)
    gq, gk, gv = (u.view(T, H, D) for u in ups)
    bytes_fwd = (flat.numel() + ve_flat.numel() + 3 * T * H * D) * 2
    bytes_bwd = (3 * T * H * D + flat.numel() + ve_flat.numel() + flat.numel() + ve_flat.numel()) * 2
    sweep = []
    for block in (16, 32, 64, 128):
        for warps in (2, 4, 8):
            row = {"BLOCK_R": block, "num_warps": warps}
            ai.KERNEL_CONFIG.update(BLOCK_R=block, num_warps=warps, BLOCK_R_BWD=block, num_warps_bwd=warps)
            try:
                row["fwd_us"] = median_us(lambda: ai.launch_forward(flat, ve_flat, lam.detach(), cos, sin, H))
                row["bwd_us"] = median_us(lambda: ai.launch_backward(gq, gk, gv, flat, ve_flat, lam.detach(),
                                                                     cos, sin, H))
                row["fwd_TBps"] = bytes_fwd / row["fwd_us"] / 1e6
                row["bwd_TBps"] = bytes_bwd / row["bwd_us"] / 1e6
            except Exception as e:  # record and go on
                row["error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"
            sweep.append(row)
            print("sweep", row, flush=True)
            result["sweep"] = sweep
            save()
    ok = [r for r in sweep if "fwd_us" in r]
    bf = min(ok, key=lambda r: r["fwd_us"])
    bb = min(ok, key=lambda r: r["bwd_us"])
    result["best"] = {"BLOCK_R": bf["BLOCK_R"], "num_warps": bf["num_warps"], "fwd_us": bf["fwd_us"],
                      "BLOCK_R_BWD": bb["BLOCK_R"], "num_warps_bwd": bb["num_warps"], "bwd_us": bb["bwd_us"]}
    print("best", result["best"], flush=True)
    ai.KERNEL_CONFIG.update({k: result["best"][k] for k in ("BLOCK_R", "num_warps", "BLOCK_R_BWD", "num_warps_bwd")})
    torch._dynamo.reset()
    op_c = torch.compile(lambda *a: ai.attention_inputs(*a, impl="triton"))
    result["op_fwd_bwd_us_best"] = median_us(fwd_bwd(op_c))
    print("best op fwd+bwd", result["op_fwd_bwd_us_best"], flush=True)
    save()


if __name__ == "__main__":
    main(sys.argv[1])
