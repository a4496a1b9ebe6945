"""The embedding tables' gradients at the record's shape: Inductor's dense backward against `embeddings`.

usage: (cd scripts/bench && python3 embed_bench.py OUT_JSON [TOKENS_SHARD])

One micro-step: 49,152 tokens looked up in four (50,304 x 768) bfloat16 tables, each lookup times an
upstream gradient, summed; its gradient with respect to the four tables. Tokens: the first 49,152 of
TOKENS_SHARD (a FineWeb-format .bin, e.g. ../../.proxy/fineweb_val_000000.bin), else Zipf-distributed.
Timed (CUDA events, median of 20 after 3 warm-ups):
  ref       torch.autograd.grad of the lookups, torch.compile'd (Inductor: float32 buffer, atomics, rounding)
  kernel    the two kernels alone (the four tables in one launch each), over a sweep of CHUNK x BLOCK_D x warps;
            the 16-bit key sort (and an int64 one) and the zero fill timed apart
  op        the same gradient through `embeddings.lookups(impl="triton")`, torch.compile'd
Accuracy: both against float64 index_add (largest relative excess over one bfloat16 rounding) and the
share of elements where they differ from each other.
"""

import json
import sys

import numpy as np
import torch

from cuda_timing import median_us
from speedrun.kernels import embeddings as E

N, V, D, TABLES = 49152, 50304, 768, 4


def tokens(dev, shard):
    if shard:
        header = np.fromfile(shard, dtype=np.int32, count=256)
        toks = np.fromfile(shard, dtype=np.uint16, count=N, offset=256 * 4)
        assert header[0] == 20240520 and toks.size == N, shard
        return torch.from_numpy(toks.astype(np.int64)).to(dev)
    w = 1.0 / torch.arange(1, V + 1, dtype=torch.float64, device=dev) ** 1.1
    return torch.multinomial(w, N, replacement=True, generator=torch.Generator(device=dev).manual_seed(0))


def main(out, shard=None):
    dev = torch.device("cuda")
    g = torch.Generator(device=dev).manual_seed(1)
    tok = tokens(dev, shard)
    tables = [(torch.randn(V, D, device=dev, generator=g) * 0.1).bfloat16().requires_grad_() for _ in range(TABLES)]
    ups = [torch.randn(N, D, device=dev, generator=g).bfloat16() for _ in range(TABLES)]
    result = {"N": N, "V": V, "D": D, "tables": TABLES, "tokens": shard or "zipf-1.1",
              "distinct_tokens": int(tok.unique().numel()), "default": dict(E.KERNEL_CONFIG)}

    def save():
        with open(out, "w") as f:
            json.dump(result, f, indent=1)

    def grads(impl):  # the lookups compiled (AOTAutograd compiles their backward too); grad taken outside
        def loss(t):
            return sum((o * u).float().sum() for o, u in zip(E.lookups(t, tables, impl), ups))
        compiled = torch.compile(loss, fullgraph=True)
        return lambda t: torch.autograd.grad(compiled(t), tables)

    ref_fn, op_fn = grads("torch"), grads("triton")
    result["ref_us"] = median_us(lambda: ref_fn(tok))
    result["op_us"] = median_us(lambda: op_fn(tok))
    print(f"ref (compiled lookups + Inductor backward) {result['ref_us']:.1f} us; op {result['op_us']:.1f} us")
    save()

    st, order = E.sort_keys(tok, V)
    result["sort_us"] = median_us(lambda: E.sort_keys(tok, V))
    result["sort_int64_us"] = median_us(lambda: torch.sort(tok, stable=True))
    result["zeros_us"] = median_us(lambda: [torch.zeros(V, D, device=dev, dtype=torch.bfloat16) for _ in ups])
    sweep = []
    outs = [torch.zeros(V, D, device=dev, dtype=torch.bfloat16) for _ in ups]
    for chunk in (32, 64, 128):
        for block_d in (64, 128, 256):
            for warps in (1, 2, 4, 8):
                cfg = {"CHUNK": chunk, "BLOCK_D": block_d, "num_warps": warps}
                try:
                    us = median_us(lambda: E.launch(st, order, ups, outs, cfg))
                except Exception as e:  # e.g. out of shared memory: recorded, the sweep goes on
                    sweep.append({**cfg, "error": str(e)[:200]})
                    continue
                sweep.append({**cfg, "us_4_tables": us})
                print(f"kernel {cfg}: {us:.1f} us (4 tables in one launch, without sort and fill)")
    result["sweep"] = sweep
    result["best"] = min((s for s in sweep if "us_4_tables" in s), key=lambda s: s["us_4_tables"])
    save()

    want = [torch.zeros(V, D, dtype=torch.float64, device=dev).index_add_(0, tok, u.double()) for u in ups]
    size = [torch.zeros(V, D, dtype=torch.float64, device=dev).index_add_(0, tok, u.double().abs()) for u in ups]
    acc = {}
    for name, fn in (("ref", ref_fn), ("op", op_fn)):
        got = fn(tok)
        acc[name] = max((((x.double() - w).abs() - 2 ** -8 * w.abs()) / (s + 1e-30)).max().item()
                        for x, w, s in zip(got, want, size))
        acc[name + "_grads"] = got
    acc["differ_share"] = sum((a != b).float().mean().item() for a, b in zip(acc.pop("ref_grads"), acc.pop("op_grads"))) / TABLES
    acc["op_deterministic"] = all(torch.equal(a, b) for a, b in zip(op_fn(tok), op_fn(tok)))
    result["accuracy"] = acc
    print("accuracy", acc)
    save()


if __name__ == "__main__":
    main(*sys.argv[1:])
