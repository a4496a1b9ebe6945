import importlib.util, time, torch
spec = importlib.util.spec_from_file_location("b", "scripts/device/attn_gluon_bench.py"); b = importlib.util.module_from_spec(spec); spec.loader.exec_module(b)
from speedrun import attn_gluon as A
from speedrun.attention import _compiled_flex, block_structure, flex_block_mask
from speedrun.config import AttentionConfig, parse_flex_options
from speedrun.flex_tiles import use_sparse_block
dev = torch.device("cuda"); T, H, D = 8192, 6, 128
g = torch.Generator(device=dev).manual_seed(0)
docs = torch.cumsum((torch.rand(T, device=dev, generator=g) < 0.002).long(), 0)
q, k, v = (torch.randn(1, T, H, D, device=dev, dtype=torch.bfloat16, generator=g).transpose(1, 2) for _ in range(3))
use_sparse_block(64, 128, dev)
mask = flex_block_mask(block_structure(docs, 128), torch.tensor(6, device=dev, dtype=torch.int32), 128, 64)
flex, opts = _compiled_flex(), parse_flex_options(AttentionConfig().flex_options)
outs = {}
fns = {"gluon2": lambda: outs.__setitem__("gluon2", A.forward(q, k, v, docs, mask, 0.12)[0]),
       "gluon_qreg": lambda: outs.__setitem__("gluon_qreg", A.forward(q, k, v, docs, mask, 0.12, {"Q_REG": 1})[0]),
       "flex": lambda: outs.__setitem__("flex", flex(q, k, v, block_mask=mask, scale=0.12, kernel_options=opts))}
ref = {n: (f(), outs[n].clone())[1] for n, f in fns.items()}
for n, f in fns.items():
    try:
        rep = b.graphed(f); outs[n] = None
        rep(); torch.cuda.synchronize()
        t0 = time.perf_counter(); [rep() for _ in range(20)]; torch.cuda.synchronize()
        us = (time.perf_counter() - t0) / 20 / b.GRAPH_CALLS * 1e6
        t0 = time.perf_counter(); [f() for _ in range(160)]; torch.cuda.synchronize()
        eager = (time.perf_counter() - t0) / 160 * 1e6
        print(n, "graph replay vs eager output max diff", (outs[n].float() - ref[n].float()).abs().max().item(), f"graph {us:.1f} us/call, eager loop {eager:.1f}")
    except Exception as e:
        print(n, "FAILED", type(e).__name__, e)
