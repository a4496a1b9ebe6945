"""Time the precise soft-capped cross-entropy kernel's launch variants at the record's head shape (one GPU).

usage: (cd scripts/bench && python3 ce_bench.py OUT_JSON)

z: (49152, 50304) bfloat16 logits (randn * 4), targets random; the precise kernel
(the one the soft-cap forms and caps outside the lean kernel's run) at the record's
sigmoid form, so that its figures compare with the earlier ones and with
`ce_math_bench.py`'s lean kernel, with the gradient written (training) and without
(evaluation), for `softcap_ce.KERNEL_CONFIG` variants of BLOCK_V and num_warps. (A polynomial exp
on the FMA units in the row-sum pass was timed here on 2026-11-30, `dd6597f`: slower
in every variant, removed.)
CUDA events, median of 20 after 3 warm-up calls. Each variant's losses and
gradient are compared with the first variant's.
"""

import itertools
import json
import sys

import torch

from cuda_timing import median_us
from speedrun.kernels import softcap_ce as sc

N, V = 49152, 50304


def main(out: str) -> None:
    g = torch.Generator(device="cuda").manual_seed(0)
    z = (torch.randn(N, V, device="cuda", generator=g) * 4).to(torch.bfloat16)
    t = torch.randint(0, V, (N,), device="cuda", generator=g)
    rows, ref = [], None
    precise = lambda want_grad: sc._launch(z, t, 30.0, "sigmoid", want_grad, None, 1.0, None, lean=False)  # noqa: E731
    for block, warps in itertools.product((1024, 2048, 4096), (4, 8, 16)):
        sc.KERNEL_CONFIG.update(BLOCK_V=block, num_warps=warps)
        losses, grad = precise(True)
        if ref is None:
            ref = (losses.clone(), grad.clone())
        row = {"BLOCK_V": block, "num_warps": warps,
               "loss_sum_rel_diff": abs(losses.double().sum().item() / ref[0].double().sum().item() - 1),
               "loss_max_abs_diff": (losses - ref[0]).abs().max().item(),
               "grad_max_abs_diff": (grad.float() - ref[1].float()).abs().max().item(),
               "train_us": median_us(lambda: precise(True)),
               "eval_us": median_us(lambda: precise(False))}
        rows.append(row)
        print(row, flush=True)
        del losses, grad
    best = min(rows, key=lambda r: r["train_us"])
    print("best", best)
    json.dump({"rows": rows, "best": best}, open(out, "w"), indent=1)


if __name__ == "__main__":
    main(sys.argv[1])
