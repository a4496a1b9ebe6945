"""Where a training step's energy goes: each part of the record's micro-step in a loop, on the card's
energy counter.

usage: PYTHONPATH=src python3 scripts/bench/energy_parts.py DATA_DIR OUT.json [SECONDS]
       PYTHONPATH=src python3 scripts/bench/energy_parts.py --report DATA_DIR PARTS.json BENCH.json
       (the step's energy by part, and J per TFLOP, from a run's JSON and `speedrun bench --json` of the
       same card; runs on a CPU)
       PYTHONPATH=src python3 scripts/bench/energy_parts.py --smoke DATA_DIR OUT.json   (CPU: the record's
       layers at 128 wide and 1,024 tokens, each part called once, no energy: that the parts run)

Why: on an H200 held at its 700 W cap the step time is about the step's energy over the cap
(`gpu_clocks.py`; on 2026-12-04, at `b7e5f9d`, a card ran 955 M cycles a step at 1,605 MHz and missed
590 ms/step by 7-8 ms). The profiles say where the *time* goes; a lever's gain there is its energy
saved. This measures, for each part at the record's shapes (one micro-step's 49,152 tokens, the
documents of the first training shard in DATA_DIR), the joules of one call: the part runs in a loop
for about a second to settle the power limiter, then for SECONDS (default 3) between two reads of
NVML's energy counter (`speedrun.bench.energy_counter`), with the SM clock sampled alongside.

Parts (forward + backward each, compiled as the model is, the model's own modules and options):
- `block_L<i>_w<W>`: transformer block i whole (norms, projections, the attention's input kernel,
  FlexAttention, gate, output projection, the ReLU² MLP), at long window W (short windows W // 2);
  blocks 0 (long, value embedding), 4 (long, none), 1 (short, value embedding), 5 (short, none);
- `block_L7`: block 7, the MLP alone (no attention; no window);
- `attn_core_{long,short}_w<W>`: FlexAttention alone on random q, k, v, the same masks;
  `attn_fwd_{long,short}_w<W>` its forward alone (no autograd);
- `mlp_fused`, `mlp_reference`: the MLP alone, the model's kernels and the plain-PyTorch reference;
- `head`: the FP8 head and the soft-capped CE (`model.head_loss`, the weight's FP8 operands made once,
  as the trainer does once a step), forward + backward;
- `bf16_mm`: cuBLAS's bare product of the MLP's shape (49,152 x 768 x 3,072), for J per TFLOP;
  `fp8_mm`: the head's forward product alone (`torch._scaled_mm`, e4m3, 49,152 x 768 x 50,304);
- `train_step`: the whole training step (`speedrun bench`'s trainer on the same shards, steps cycling over
  four points of the run's window schedule): the step's own energy in this process;
- `optimizers`: the optimisers' step alone (Muon and Adam over every parameter, random gradients);
- `spin`: one thread spinning on the GPU (`torch.cuda._sleep`): the card's power with its clocks up
  and nothing else to do.

The per-micro-step sum weighs the blocks as the record's 12 layers are (long: 0 and 11 like 0, 4;
short: 1, 2, 9, 10 like 1, and 3, 5, 6, 8 like 5; layer 7) and the windows equally (the run's
window grows over 1..14 blocks; W in WINDOWS stands for it). What the sum leaves out of a step
(embeddings, U-net skips, the optimisers, the gradient sums, the loop) is the step's energy from
`speedrun bench` less 8 x the sum.
"""

import json
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from speedrun.bench import energy_counter as ec
from speedrun.bench import gpu_clocks as gc
from speedrun.recipes import presets
from speedrun.kernels import relu2_mlp
from speedrun.model.gpt import aligned_pairs, scalar_layout
from speedrun.data.shards import read_shard
from speedrun.train.setup import build_model

T, WINDOWS = 49_152, (2, 6, 10, 14)
LONG_LAYERS = {0: 2, 4: 1}  # representative layer -> how many of the record's long layers it stands for
SHORT_LAYERS = {1: 4, 5: 4}


def energy_of(fn, counter, uuid, seconds: float, warm_s: float = 1.0) -> dict:
    """Joules, microseconds, mean power and SM clock of one call of fn, on a settled power limiter."""
    t0 = time.perf_counter()
    n = 0
    while time.perf_counter() - t0 < warm_s or n < 3:
        fn()
        n += 1
        if n % 4 == 0:
            torch.cuda.synchronize()
    torch.cuda.synchronize()
    per_sync = max(1, min(50, int(n / (time.perf_counter() - t0) * 0.2)))  # about 0.2 s between syncs
    sampler = gc.ClockSampler(uuid, 0.1, counter=counter)
    sampler.start()
    calls, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        for _ in range(per_sync):
            fn()
        calls += per_sync
        torch.cuda.synchronize()
    elapsed = time.perf_counter() - t0
    s = sampler.stop() or {}
    energy = (s.get("counter") or {}).get("energy_j")
    return {"calls": calls, "us": 1e6 * elapsed / calls, "j": None if energy is None else energy / calls,
            "power_w": (s.get("counter") or {}).get("power_w"), "power_w_sampled": s.get("power_w_mean"),
            "mhz_median": s.get("sm_clock_mhz_median"), "mhz_mean": s.get("sm_clock_mhz_mean")}


def grads_of(fn, inputs, params, gy):
    """A closure running fn forward and backward (gradients of inputs and params against gy)."""
    wrt = [*inputs, *params]
    return lambda: torch.autograd.grad(fn(), wrt, gy)


def block_setup(model, layer: int, x, x0, ve_all, rope):
    """The arguments `GPT.hidden` hands block `layer`, less the masks."""
    cfg = model.cfg
    lay = scalar_layout(cfg.num_layers)
    block_l = model.scalars[lay["block"]][2 * layer: 2 * layer + 2] if cfg.x0_lambdas else None
    attn_l = aligned_pairs(model.scalars[lay["attn"]])[layer, :2]
    vi = model.value_embed_for(layer)
    return x, x0, (ve_all[vi] if vi is not None else None), block_l, attn_l, rope


def smoke_call(fn, *_):
    fn()
    return {"calls": 1, "us": 0.0, "j": 0.0, "power_w": None, "power_w_sampled": None, "mhz_median": None,
            "mhz_mean": None}


def main(data_dir: str, out: str, seconds: float = 3.0, smoke: bool = False) -> None:
    global T
    dev = torch.device("cpu" if smoke else "cuda")
    uuid = gc.device_uuid(dev)
    counter = ec.open_counter(uuid)
    if counter is None and not smoke:
        raise SystemExit("energy_parts.py: NVML's energy counter cannot be read on this machine")
    cfg = presets.proxy212()
    if smoke:  # the record's layers, heads and windows at a CPU's size
        m = cfg.model
        m.model_dim, m.num_heads, m.head_dim, m.mlp_hidden = 128, 2, 64, 512
    T = 1024 if smoke else T
    measure = smoke_call if smoke else energy_of
    model = build_model(cfg, dev, 1, torch.bfloat16)
    model.train()
    files = (sorted(Path(data_dir).glob("fineweb_train_*.bin")) or sorted(Path(data_dir).glob("fineweb_val_*.bin"))
             or sorted(Path(data_dir).glob("*.bin")))
    tokens = torch.from_numpy(read_shard(files[0])[:T].astype("int64")).to(dev)
    g = torch.Generator(device=dev).manual_seed(0)
    rnd = lambda *shape: torch.randn(*shape, device=dev, dtype=torch.bfloat16, generator=g)  # noqa: E731
    d = cfg.model.model_dim
    x = F.rms_norm(rnd(1, T, d).float(), (d,)).bfloat16().requires_grad_()
    x0 = F.rms_norm(rnd(1, T, d).float(), (d,)).bfloat16()
    ve_all = [rnd(1, T, d) for _ in range(cfg.model.value_embeds)]
    gy = rnd(1, T, d) * 1e-3
    rope = model.rope(model.positions(T, dev), T)
    res = {"device": "cpu" if smoke else torch.cuda.get_device_name(), "torch": torch.__version__, "tokens": T, "windows": WINDOWS,
           "seconds": seconds, "data": str(files[0].name), "parts": {}}

    def run(name, fn):
        fn()
        if not smoke:
            torch.cuda.synchronize()
        res["parts"][name] = r = measure(fn, counter, uuid, seconds)
        print(f"{name:28s} {r['us']:9.1f} us  {r['j'] or float('nan'):8.4f} J  {r['power_w'] or 0:5.0f} W  "
              f"{r['mhz_median'] or 0:5.0f} MHz", flush=True)
        Path(out).write_text(json.dumps(res, indent=1))

    if not smoke:
        run("spin", lambda: torch.cuda._sleep(int(2e6)))
    w1 = rnd(4 * d, d) * d ** -0.5
    xm = x.detach()[0]
    run("bf16_mm", lambda: xm @ w1.t())
    if not smoke:  # the head's forward product alone: FP8, 49,152 x 768 x 50,304
        x8, w8 = xm.to(torch.float8_e4m3fn), rnd(50_304, d).to(torch.float8_e4m3fn)
        one = torch.ones((), device=dev)
        run("fp8_mm", lambda: torch._scaled_mm(x8, w8.t(), scale_a=one, scale_b=one, out_dtype=torch.bfloat16,
                                               use_fast_accum=True))
    mlp = model.blocks[5].mlp
    for name, impl in (("mlp_fused", mlp.impl), ("mlp_reference", "torch")):
        f = torch.compile(lambda a, i=impl: relu2_mlp.relu2_mlp(a, mlp.fc_w.type_as(a), mlp.proj_w.type_as(a), i))
        run(name, grads_of(lambda f=f: f(x), [x], [mlp.fc_w, mlp.proj_w], gy))
    blocks = {i: torch.compile(model.blocks[i]) for i in (*LONG_LAYERS, *SHORT_LAYERS, 7)}
    run("block_L7", grads_of(lambda: blocks[7](*block_setup(model, 7, x, x0, ve_all, rope), None, False),
                             [x], list(model.blocks[7].parameters()), gy))
    heads, hd = cfg.model.num_heads, cfg.model.head_dim
    q, k, v = (rnd(1, heads, T, hd).requires_grad_() for _ in range(3))
    go = rnd(1, heads, T, hd)
    for w in WINDOWS:
        masks = model.masks(tokens, torch.full((), w, dtype=torch.int32, device=dev))
        for i in (*LONG_LAYERS, *SHORT_LAYERS):
            long = model.is_long(i)
            args = block_setup(model, i, x, x0, ve_all, rope)
            run(f"block_L{i}_w{w}", grads_of(lambda b=blocks[i], a=args, m=masks, lg=long: b(*a, m, lg),
                                             [x], list(model.blocks[i].parameters()), gy))
        for kind, long in (("long", True), ("short", False)):
            run(f"attn_core_{kind}_w{w}", grads_of(lambda m=masks, lg=long: m.attend(q, k, v, lg, 0.12), [q, k, v], [], go))
            with torch.no_grad():
                run(f"attn_fwd_{kind}_w{w}", lambda m=masks, lg=long: m.attend(q, k, v, lg, 0.12))
    xh = x.detach()[0].clone().requires_grad_()
    targets = torch.randint(0, 50257, (T,), device=dev, generator=g)
    head_q = model.head_operands()
    head = torch.compile(lambda a: model.head_loss(a, targets, head_q))
    run("head", grads_of(lambda: head(xh), [xh], [model.head_w], torch.ones((), device=dev)))
    trainer_parts(data_dir, run, smoke)
    res["per_micro_step"] = summarise(res["parts"], d)
    Path(out).write_text(json.dumps(res, indent=1))
    print(json.dumps(res["per_micro_step"], indent=1), flush=True)


def trainer_parts(data_dir: str, run, smoke: bool) -> None:
    """The whole step and the optimisers alone, on `speedrun bench`'s trainer (its config: no validation,
    no checkpoints); `run(name, fn)` measures."""
    import itertools
    from argparse import Namespace

    from speedrun.bench.step import Session, _config

    args = Namespace(preset="proxy212", overrides=[], data="random" if smoke else data_dir)
    cfg = _config(args)
    if smoke:
        m, t = cfg.model, cfg.train
        m.model_dim, m.num_heads, m.head_dim, m.mlp_hidden = 128, 2, 64, 512
        t.seq_len, t.batch_seqs = 1024, 2
    session = Session(cfg, args, 8, time.time())
    steps = itertools.cycle([26, 79, 132, 185])  # long windows spread over the run (about 2 to 13 blocks)
    run("train_step", lambda: session.step(next(steps)))
    trainer = session.trainer
    for p in trainer.model.parameters():
        if p.requires_grad:
            p.grad = torch.randn_like(p) * 1e-3
    run("optimizers", lambda: [opt.step() for opt in trainer.optimizers])
    session.close()


def summarise(parts: dict, d: int) -> dict:
    """Joules and milliseconds of one micro-step by part (the layers' and windows' weights above)."""
    mean = lambda key, name: statistics.fmean(parts[f"{name}_w{w}"][key] for w in WINDOWS)  # noqa: E731
    out = {}
    for key, scale in (("j", 1.0), ("us", 1e-3)):
        long = sum(n * mean(key, f"block_L{i}") for i, n in LONG_LAYERS.items())
        short = sum(n * mean(key, f"block_L{i}") for i, n in SHORT_LAYERS.items())
        attn = 3 * mean(key, "attn_core_long") + 8 * mean(key, "attn_core_short")
        fwd_known = all(f"attn_fwd_long_w{w}" in parts for w in WINDOWS)  # measured since the second machine
        attn_fwd = 3 * mean(key, "attn_fwd_long") + 8 * mean(key, "attn_fwd_short") if fwd_known else None
        mlp = 12 * parts["mlp_fused"][key]
        blocks = long + short + parts["block_L7"][key]
        unit = "j" if key == "j" else "ms"
        out[unit] = {"blocks": blocks * scale, "of_which_attention_core": attn * scale,
                     "attention_core_forward_alone": None if attn_fwd is None else attn_fwd * scale,
                     "of_which_mlp": mlp * scale,
                     "of_which_rest_of_blocks": (blocks - attn - mlp) * scale, "head": parts["head"][key] * scale,
                     "sum": (blocks + parts["head"][key]) * scale}
    bare = parts["bf16_mm"]
    out["bf16_mm_j_per_tflop"] = bare["j"] / (2 * T * d * 4 * d / 1e12)
    if "fp8_mm" in parts:
        out["fp8_mm_j_per_tflop"] = parts["fp8_mm"]["j"] / (2 * T * d * 50_304 / 1e12)
    return out


def attention_tflop(data_dir: str) -> dict:
    """Forward + backward TFLOP of one FlexAttention call per part name ("long_w<W>", "short_w<W>"): the
    tiles the 64-token mask visits (`attention.refined_blocks`, partial and full) x 6 heads x 4 x 64 x 64
    x 128 for the forward, x 3.5 with the backward (its five products to the forward's two)."""
    from speedrun.model.attention import block_structure, document_ids, refined_blocks

    files = sorted(Path(data_dir).glob("fineweb_train_*.bin"))
    tokens = torch.from_numpy(read_shard(files[0])[:T].astype("int64"))
    s = block_structure(document_ids(tokens), 128)
    out = {}
    for w in WINDOWS:
        for kind, win in (("long", w), ("short", max(w // 2, 1))):
            partial, full = refined_blocks(s, torch.tensor(win), 128, 64)
            out[f"{kind}_w{w}"] = 3.5 * (partial.sum().item() + full.sum().item()) * 6 * 4 * 64 * 64 * 128 / 1e12
    return out


def report(data_dir: str, parts_path: str, bench_path: str) -> None:
    """The step's energy by part (J a step and share of the bench's), and J per TFLOP where counted."""
    res, bench = json.loads(Path(parts_path).read_text()), json.loads(Path(bench_path).read_text())
    parts, step_j = res["parts"], bench["energy_j_per_step"]
    m = summarise(parts, 768)["j"]
    micro = bench["tokens_per_step"] // T
    rows = [("attention core (FlexAttention fwd + bwd)", m["of_which_attention_core"]),
            ("  its forward", m["attention_core_forward_alone"]),
            ("ReLU² MLP (fused kernels + cuBLAS)", m["of_which_mlp"]),
            ("rest of the blocks (q/k/v/o products, norms, inputs, gates)", m["of_which_rest_of_blocks"]),
            ("FP8 head + soft-capped CE", m["head"]), ("all parts", m["sum"])]
    print(f"step: {bench['ms_per_step']:.2f} ms, {step_j:.1f} J ({bench.get('energy_source')}), "
          f"{micro} micro-steps")
    for name, j in rows:
        if j is None:
            continue
        print(f"{name:62s} {micro * j:7.1f} J/step  {100 * micro * j / step_j:5.1f}%")
    outside = step_j - micro * m["sum"]
    if "optimizers" in parts:
        opt = parts["optimizers"]["j"]
        print(f"{'the optimisers alone':62s} {opt:7.1f} J/step  {100 * opt / step_j:5.1f}%")
        outside -= opt
    print(f"{'outside the parts (step less all parts)':62s} {outside:7.1f} J/step  {100 * outside / step_j:5.1f}%")
    if "train_step" in parts:
        ts = parts["train_step"]
        print(f"the step in this process: {ts['us'] / 1e3:.1f} ms, {ts['j']:.1f} J at {ts['mhz_median']} MHz median")
    tf = attention_tflop(data_dir)
    for key in tf:
        core, fwd = parts[f"attn_core_{key}"], parts.get(f"attn_fwd_{key}")
        split = "" if fwd is None else (f" (fwd {fwd['j'] / (tf[key] / 3.5):.2f}, "
                                        f"bwd {(core['j'] - fwd['j']) / (tf[key] * 2.5 / 3.5):.2f})")
        print(f"attention {key:9s} {tf[key]:.3f} TFLOP  fwd+bwd {core['j'] / tf[key]:.2f} J/TFLOP{split}  "
              f"{tf[key] / core['us'] * 1e6:.0f} TFLOP/s")
    mean_tf = sum(3 * tf[f"long_w{w}"] + 8 * tf[f"short_w{w}"] for w in WINDOWS) / len(WINDOWS)
    mlp_tf = 6 * 2 * T * 768 * 3072 / 1e12
    print(f"attention, the run's mix: {micro * mean_tf:.1f} TFLOP/step, "
          f"{m['of_which_attention_core'] / mean_tf:.2f} J/TFLOP")
    print(f"MLP: {parts['mlp_fused']['j'] / mlp_tf:.2f} J/TFLOP fused, {parts['mlp_reference']['j'] / mlp_tf:.2f} "
          f"reference; bare bf16 product {summarise(parts, 768)['bf16_mm_j_per_tflop']:.2f}; "
          f"bare FP8 product {summarise(parts, 768).get('fp8_mm_j_per_tflop', float('nan')):.2f}")


if __name__ == "__main__":
    if sys.argv[1] == "--report":
        report(*sys.argv[2:5])
    elif sys.argv[1] == "--smoke":
        main(sys.argv[2], sys.argv[3], smoke=True)
    else:
        main(sys.argv[1], sys.argv[2], float(sys.argv[3]) if len(sys.argv) > 3 else 3.0)
