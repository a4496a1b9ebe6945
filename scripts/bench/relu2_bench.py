"""The ReLU² MLP's Triton products against cuBLAS + Inductor, at the record's shapes (one GPU).

Usage: python3 relu2_bench.py OUT.json [OPTIONS-FILE [broad|focused]]

Shapes: 49,152 tokens x 768 -> 3,072 (one layer, one micro-step), bfloat16.
1. The reference's pieces, compiled: the forward product + ReLU² (h and a out), the backward
   product + the derivative (dL/dh out), and cuBLAS's products alone.
2. Launch sweep of `relu2_mlp.launch` (broad: tile shapes, stages, then the best two's grouping,
   epilogue split and persistence; focused: around the broad sweep's best), forward (store a; h too with
   FROM_A=0) and backward (dL/dh, relu(h) from a; from h with FROM_A=0), each checked
   against the compiled reference (largest difference over the reference's largest value; share of
   elements that differ).
3. The whole layer, compiled, forward + backward (torch.autograd.grad): reference against the op,
   with the default launch and the sweep's best.
The best launch options are written to OPTIONS-FILE (for the benches that follow).
"""

import itertools
import json
import sys

import torch
import torch.nn.functional as F

from cuda_timing import median_us
from speedrun.kernels import relu2_mlp as R

M, D, FH = 49152, 768, 3072


def diff(a, b):
    a, b = a.float(), b.float()
    return {"max_rel": ((a - b).abs().max() / b.abs().max()).item(), "frac_differ": (a != b).float().mean().item()}


def pieces(x, w1, g, w2, h):
    fwd = torch.compile(lambda x, w: (lambda h: (h, F.relu(h).square()))(x @ w.T))
    bwd = torch.compile(lambda g, w, h: (lambda ga, r: torch.where(r <= 0, 0, ga * 2 * r))(g @ w, F.relu(h)))
    return fwd, bwd


def sweep_configs(kind):
    if kind == "focused":  # around call 1's best: epilogue in quarters, h by plain loads, warp specialisation
        base = {"BLOCK_M": 128, "BLOCK_N": 256, "BLOCK_K": 64, "num_warps": 8, "GROUP_M": 8, "PERSISTENT": 1,
                "EPI_SPLIT": 2, "H_PTR": 0, "WARP_SPEC": 0}
        for st, sp, hp, ws in [(3, 2, 0, 0), (4, 2, 0, 0), (3, 4, 0, 0), (4, 4, 0, 0), (3, 2, 1, 0), (4, 2, 1, 0),
                               (4, 4, 1, 0), (3, 1, 1, 0), (4, 2, 0, 1), (3, 2, 0, 1)]:
            yield dict(base, num_stages=st, EPI_SPLIT=sp, H_PTR=hp, WARP_SPEC=ws)
        return
    shapes = [(128, 256, 64, 3, 8), (128, 256, 64, 4, 8), (128, 128, 64, 3, 8), (128, 128, 64, 4, 8),
              (128, 128, 64, 5, 8), (128, 128, 64, 4, 4), (128, 256, 128, 2, 8), (256, 128, 64, 3, 8),
              (128, 128, 128, 3, 8)]
    for bm, bn, bk, st, wp in shapes:
        yield {"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "num_stages": st, "num_warps": wp,
               "GROUP_M": 8, "EPI_SPLIT": 2, "PERSISTENT": 1, "H_PTR": 0, "WARP_SPEC": 0}


def variants(cfg):
    for gm, sp, pe in itertools.product((1, 8), (1, 2), (0, 1)):
        c = dict(cfg, GROUP_M=gm, EPI_SPLIT=sp, PERSISTENT=pe)
        if c != cfg:
            yield c


def run_one(direction, cfg, x, w1, g, w2, h_ref, a_ref, gh_ref):
    """One launch timed and checked; with FROM_A (the default) as the model runs it: the forward stores a
    alone and the backward recovers relu(h) from a."""
    out = torch.empty_like(h_ref)
    from_a = cfg.get("FROM_A", R.KERNEL_CONFIG["fwd"]["FROM_A"])
    if direction == "fwd":
        h = torch.empty(0, dtype=h_ref.dtype, device=h_ref.device) if from_a else torch.empty_like(h_ref)
        fn = lambda: R.launch(x, w1, h, out, R.STORE_A if from_a else R.STORE_H_AND_A, True, cfg)  # noqa: E731
        fn()
        check = {"a": diff(out, a_ref)} if from_a else {"h": diff(h, h_ref), "a": diff(out, a_ref)}
    else:
        saved, code = (a_ref, R.DRELU2_FROM_A) if from_a else (h_ref, R.DRELU2)
        fn = lambda: R.launch(g, w2, saved, out, code, False, cfg)  # noqa: E731
        fn()
        check = {"gh": diff(out, gh_ref)}
    return {"cfg": cfg, "us": median_us(fn), "check": check}


def sweep(kind, direction, *tensors):
    rows = []

    def one(cfg):
        try:
            r = run_one(direction, cfg, *tensors)
        except Exception as e:  # noqa: BLE001  (out of shared memory, ...): record and go on
            r = {"cfg": cfg, "error": repr(e)[:300]}
        rows.append(r)
        print(direction, json.dumps(r), flush=True)

    for cfg in sweep_configs(kind):
        one(cfg)
    ok = sorted((r for r in rows if "us" in r), key=lambda r: r["us"])
    for best in ok[:2 if kind == "broad" else 0]:
        for cfg in variants(best["cfg"]):
            one(cfg)
    return rows


def layer_times(x, w1, w2, gy, options):
    xs, w1s, w2s = (t.detach().requires_grad_() for t in (x, w1, w2))
    out = {}
    for name, impl, opts in [("reference", "torch", ""), ("kernel_default", "triton", ""),
                             ("kernel_best", "triton", options)]:
        f = torch.compile(lambda a, b, c, i=impl, o=opts: R.relu2_mlp(a, b, c, i, o))
        step = lambda f=f: torch.autograd.grad(f(xs, w1s, w2s), (xs, w1s, w2s), gy)  # noqa: E731
        got = step()
        out[name] = {"us": median_us(step), "grads": [g.float().norm().item() for g in got]}
        print("layer", name, out[name], flush=True)
    ref = torch.autograd.grad(R.reference(xs, w1s, w2s), (xs, w1s, w2s), gy)
    ker = torch.autograd.grad(R.relu2_mlp(xs, w1s, w2s, "triton", options), (xs, w1s, w2s), gy)
    out["grad_check"] = [diff(k, r) for k, r in zip(ker, ref)]
    return out


def main():
    torch.manual_seed(0)
    dev = "cuda"
    x = F.rms_norm(torch.randn(M, D, device=dev), (D,)).bfloat16()
    w1 = (torch.rand(FH, D, device=dev) * 2 - 1).mul(D ** -0.5).bfloat16()
    w2 = (torch.rand(D, FH, device=dev) * 2 - 1).mul(FH ** -0.5).bfloat16()
    g = (torch.randn(M, D, device=dev) * 1e-3).bfloat16()
    fwd, bwd = pieces(x, w1, g, w2, None)
    h_ref, a_ref = fwd(x, w1)
    gh_ref = bwd(g, w2, h_ref)
    res = {"shape": [M, D, FH], "device": torch.cuda.get_device_name(), "torch": torch.__version__}
    res["reference"] = {
        "fwd_mm_us": median_us(lambda: x @ w1.T), "fwd_us": median_us(lambda: fwd(x, w1)),
        "bwd_mm_us": median_us(lambda: g @ w2), "bwd_us": median_us(lambda: bwd(g, w2, h_ref)),
    }
    print("reference", res["reference"], flush=True)
    tensors = (x, w1, g, w2, h_ref, a_ref, gh_ref)
    kind = sys.argv[3] if len(sys.argv) > 3 else "broad"
    res["sweep"] = kind
    res["fwd"] = sweep(kind, "fwd", *tensors)
    res["bwd"] = sweep(kind, "bwd", *tensors)
    best = {d: min((r for r in res[d] if "us" in r), key=lambda r: r["us"]) for d in ("fwd", "bwd")}
    options = ",".join(f"{d}.{k}={v}" for d in ("fwd", "bwd") for k, v in best[d]["cfg"].items())
    res["best"] = {d: best[d] for d in best}
    res["best_options"] = options
    print("best", options, {d: best[d]["us"] for d in best}, flush=True)
    res["layer"] = layer_times(x, w1, w2, g, options)
    json.dump(res, open(sys.argv[1], "w"), indent=1)
    if len(sys.argv) > 2:
        open(sys.argv[2], "w").write(options)


if __name__ == "__main__":
    main()
