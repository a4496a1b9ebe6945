"""Sort-free formulations of the block lists (attention._true_first in commit 72dcb66: prefix sums
and one scatter), each compiled alone on the GPU and checked against the stable argsort; timed with
CUDA events around 20 back-to-back calls. Thirteenth session: all compiled alone, but inside the
model's mask build Inductor 2.11's Triton code generation failed for every one ("list indices must
be integers or slices, not NoneType"; docs/benchmarks.md), so the lists stayed argsorts.
usage: python3 scripts/device/true_first_forms.py OUT_JSON"""
import json
import sys
import time

import torch


def slots(mask, highest_first):
    m = mask.to(torch.int32)
    n = m.shape[-1]
    num = m.sum(dim=-1, keepdim=True, dtype=torch.int32)
    trues = m.cumsum(dim=-1, dtype=torch.int32)
    falses = torch.arange(1, n + 1, dtype=torch.int32, device=m.device) - trues
    slot = torch.where(mask, num - trues, n - falses) if highest_first else torch.where(mask, trues - 1, num + falses - 1)
    return num.squeeze(-1), slot, n


def form_2d(mask, highest_first):
    hf = highest_first
    num, slot, n = slots(mask, hf)
    cols = torch.arange(n, dtype=torch.int32, device=mask.device).expand_as(slot)
    return num, torch.empty_like(slot).scatter(-1, slot.long(), cols)


def form_1d(mask, highest_first):
    hf = highest_first
    num, slot, n = slots(mask, hf)
    r = slot.shape[0]
    flat = (slot.long() + n * torch.arange(r, device=mask.device)[:, None]).reshape(-1)
    cols = torch.arange(n, dtype=torch.int32, device=mask.device).repeat(r)
    return num, torch.empty(r * n, dtype=torch.int32, device=mask.device).scatter(0, flat, cols).view(r, n)


def form_index_put(mask, highest_first):
    hf = highest_first
    num, slot, n = slots(mask, hf)
    rows = torch.arange(slot.shape[0], device=mask.device)[:, None].expand_as(slot)
    cols = torch.arange(n, dtype=torch.int32, device=mask.device).expand_as(slot)
    out = torch.empty_like(slot)
    out[rows, slot.long()] = cols
    return num, out


def form_search(mask, highest_first):
    hf = highest_first
    m = mask.to(torch.int32)
    n = m.shape[-1]
    num = m.sum(dim=-1, keepdim=True, dtype=torch.int32)
    trues = m.cumsum(dim=-1, dtype=torch.int32)
    falses = torch.arange(1, n + 1, dtype=torch.int32, device=m.device) - trues
    p = torch.arange(n, dtype=torch.int32, device=m.device).expand_as(m)
    if hf:  # slot p < num: the (num - p)-th True column; else the (n - p)-th False column
        want_t, want_f = num - p, n - p
    else:
        want_t, want_f = p + 1, p + 1 - num
    jt = torch.searchsorted(trues, want_t.contiguous())
    jf = torch.searchsorted(falses, want_f.contiguous())
    return num.squeeze(-1), torch.where(p < num, jt, jf).to(torch.int32)


def reference(mask, hf):
    if hf:
        idx = mask.to(torch.int8).argsort(dim=-1, stable=True).flip(-1)
    else:
        idx = mask.to(torch.int8).argsort(dim=-1, descending=True, stable=True)
    return mask.sum(-1, dtype=torch.int32), idx.to(torch.int32)


def main(out):
    dev = torch.device("cuda")
    g = torch.Generator(device=dev).manual_seed(0)
    mask = torch.rand(768, 768, device=dev, generator=g) < 0.3
    mask = mask & torch.ones(768, 768, device=dev, dtype=torch.bool).tril()
    res = {}
    for name, fn in [("2d", form_2d), ("1d", form_1d), ("index_put", form_index_put), ("search", form_search)]:
        for hf in (True, False):
            key = f"{name}_{'high' if hf else 'low'}"
            torch._dynamo.reset()
            c = torch.compile(fn, fullgraph=True, dynamic=False)
            try:
                t0 = time.time()
                num, idx = c(mask, hf)
                rn, ri = reference(mask, hf)
                ok = bool(torch.equal(num, rn) and torch.equal(idx, ri))
                torch.cuda.synchronize()
                st, en = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                st.record()
                for _ in range(20):
                    c(mask, hf)
                en.record()
                torch.cuda.synchronize()
                st2 = torch.cuda.Event(enable_timing=True); en2 = torch.cuda.Event(enable_timing=True)
                st2.record()
                for _ in range(20):
                    reference(mask, hf)
                en2.record(); torch.cuda.synchronize()
                res[key] = {"equal_to_argsort": ok, "compile_s": round(time.time() - t0, 2),
                            "us": st.elapsed_time(en) * 50, "argsort_eager_us": st2.elapsed_time(en2) * 50}
            except Exception as e:
                res[key] = {"error": f"{type(e).__name__}: {str(e).splitlines()[-1][:200] if str(e) else ''}"}
            print(key, res[key], flush=True)
    open(out, "w").write(json.dumps(res, indent=1))


if __name__ == "__main__":
    main(sys.argv[1])
