"""The ReLU² MLP's Triton products against cuBLAS + Inductor, at the record's shapes (one GPU).

Usage: python3 relu2_bench.py OUT.json [broad|focused]

Shapes: 49,152 tokens x 768 -> 3,072 (one layer, one micro-step), bfloat16.
1. The reference's pieces, compiled: the forward product + ReLU² (h and a out), the backward
   product + the derivative (dL/dh out), and cuBLAS's products alone.
2. Launch sweep of `relu2_mlp.forward_product` and `backward_product` (broad: tile shapes, stages,
   then the best two's grouping, epilogue split and persistence; focused: around the broad sweep's
   best): forward (a) and backward (dL/dh, relu(h) from a), each checked against the compiled
   reference (largest difference over the reference's largest value; share of elements that differ).
3. The whole layer, compiled, forward + backward (torch.autograd.grad): reference against the op,
   with the default launch (KERNEL_CONFIG) and with the sweep's best in its place.
The best launches are in OUT.json ("best"); a better one becomes relu2_mlp.KERNEL_CONFIG by an edit.
"""

import contextlib
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
    if kind == "focused":  # around the broad sweep's best: epilogue in quarters, a by plain loads
        base = {"BLOCK_M": 128, "BLOCK_N": 256, "BLOCK_K": 64, "num_warps": 8, "GROUP_M": 8, "PERSISTENT": 1,
                "EPI_SPLIT": 2, "H_PTR": 0}
        for st, sp, hp in [(3, 2, 0), (4, 2, 0), (3, 4, 0), (4, 4, 0), (3, 2, 1), (4, 2, 1), (4, 4, 1), (3, 1, 1)]:
            yield dict(base, num_stages=st, EPI_SPLIT=sp, H_PTR=hp)
        return
    shapes = [(128, 256, 64, 3, 8), (128, 256, 64, 4, 8), (128, 128, 64, 3, 8), (128, 128, 64, 4, 8),
              (128, 128, 64, 5, 8), (128, 128, 64, 4, 4), (128, 256, 128, 2, 8), (256, 128, 64, 3, 8),
              (128, 128, 128, 3, 8)]
    for bm, bn, bk, st, wp in shapes:
        yield {"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "num_stages": st, "num_warps": wp,
               "GROUP_M": 8, "EPI_SPLIT": 2, "PERSISTENT": 1, "H_PTR": 0}


def variants(cfg):
    for gm, sp, pe in itertools.product((1, 8), (1, 2), (0, 1)):
        c = dict(cfg, GROUP_M=gm, EPI_SPLIT=sp, PERSISTENT=pe)
        if c != cfg:
            yield c


def run_one(direction, cfg, x, w1, g, w2, a_ref, gh_ref):
    """One launch timed and checked, as the model runs it: the forward stores a, the backward recovers
    relu(h) from a."""
    out = torch.empty_like(a_ref)
    if direction == "fwd":
        fn = lambda: R.forward_product(x, w1, out, cfg)  # noqa: E731
        fn()
        check = {"a": diff(out, a_ref)}
    else:
        fn = lambda: R.backward_product(g, w2, a_ref, out, cfg)  # noqa: E731
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


@contextlib.contextmanager
def launches(best):
    """relu2_mlp.KERNEL_CONFIG's entries replaced by `best`'s ({"fwd": cfg, "bwd": cfg}) for the block;
    the op reads them at each launch. The backward on a capability-9.0 GPU runs the Gluon kernel, which
    takes none of them."""
    saved = {d: dict(c) for d, c in R.KERNEL_CONFIG.items()}
    for d, c in best.items():
        R.KERNEL_CONFIG[d].clear()
        R.KERNEL_CONFIG[d].update(c)
    try:
        yield
    finally:
        for d, c in saved.items():
            R.KERNEL_CONFIG[d].clear()
            R.KERNEL_CONFIG[d].update(c)


def layer_times(x, w1, w2, gy, best):
    xs, w1s, w2s = (t.detach().requires_grad_() for t in (x, w1, w2))
    out = {}
    for name, impl, cfgs in [("reference", "torch", {}), ("kernel_default", "triton", {}),
                             ("kernel_best", "triton", best)]:
        with launches(cfgs):
            f = torch.compile(lambda a, b, c, i=impl: R.relu2_mlp(a, b, c, i))
            step = lambda f=f: torch.autograd.grad(f(xs, w1s, w2s), (xs, w1s, w2s), gy)  # noqa: E731
            got = step()
            out[name] = {"us": median_us(step), "grads": [g.float().norm().item() for g in got]}
        print("layer", name, out[name], flush=True)
    ref = torch.autograd.grad(R.reference(xs, w1s, w2s), (xs, w1s, w2s), gy)
    with launches(best):
        ker = torch.autograd.grad(R.relu2_mlp(xs, w1s, w2s, "triton"), (xs, w1s, w2s), gy)
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
    tensors = (x, w1, g, w2, a_ref, gh_ref)
    kind = sys.argv[2] if len(sys.argv) > 2 else "broad"
    res["sweep"] = kind
    res["fwd"] = sweep(kind, "fwd", *tensors)
    res["bwd"] = sweep(kind, "bwd", *tensors)
    best = {d: min((r for r in res[d] if "us" in r), key=lambda r: r["us"]) for d in ("fwd", "bwd")}
    res["best"] = {d: best[d] for d in best}
    print("best", {d: (best[d]["cfg"], best[d]["us"]) for d in best}, flush=True)
    res["layer"] = layer_times(x, w1, w2, g, {d: best[d]["cfg"] for d in best})
    json.dump(res, open(sys.argv[1], "w"), indent=1)


if __name__ == "__main__":
    main()
