"""`speedrun bench` and `speedrun warm`: measure the training step; fill the compile cache.

`speedrun bench --preset P` builds the same `Trainer` a run builds (model,
optimisers, compile mode, loader) and times its `train_step` (see
docs/performance.md for the method):

- `--warmup N` untimed steps first (compilation, autotuning); the time from
  process start to the end of the first step is reported as `first_step_s`;
- then `--repeats R` groups of `--steps N` timed steps, the device
  synchronised at each group's ends (the slowest rank's time, with several).
  ms/step is the median over the groups, with min/max and the interquartile
  range as the spread;
- the timed steps sit at progress (j + 1/2)/N of the run (`--progress
  spread`, the default), so the growing attention window takes the values a
  whole run takes; `--progress 0.9` pins one point instead;
- `--data random` (default) writes random tokens with a document start
  (50256) about every `DOC_LEN` tokens into a temporary folder, so nothing
  needs downloading; `--data DIR` reads real shards.

Reported: ms/step, tokens/s, the model's FLOPs per token (`flops_per_token`,
below), achieved FLOP/s and its fraction of a *measured* matmul peak (an
8192^3 bf16 product timed with CUDA events on this GPU; on a CPU an fp32
product, labelled), peak memory, set-up and compile times, the number of
host synchronisations in one step (CUDA), the GPU's SM clock and power over the
timed steps (`gpu_clocks`: a power-capped card shows), and with `--profile FILE` the 15
kernels with the most device time. `--json FILE` writes every number.

`--comm` adds the optimisers' communication: the collectives one step issues
(from the model's parameters and the optimisers' layout), each timed alone
as all-reduce and as reduce-scatter + all-gather with latency and bus
bandwidth, and how much of it the step hides: the step is timed again with
the optimisers' collectives replaced by local copies of the same sizes.

`speedrun warm --preset P` runs the warm-up steps (and one validation
forward) on random data and saves the compiler's artifacts with
`speedrun.compile.cache`, which a later run of the same preset loads.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import sys
import statistics
import tempfile
import time
import warnings
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist

from speedrun.bench import gpu_clocks
from speedrun.config import RunConfig, apply_overrides, validate
from speedrun.errors import ConfigError, SpeedrunError

DOC_LEN = 1000  # mean FineWeb document length in tokens (random data)
EOT = 50256
SHARD_TOKENS = 100_000_000
CUDA_PEAK_N = 8192
CPU_PEAK_N = 1024


# ================================================================== FLOP count


def matmul_weights(cfg: RunConfig) -> int:
    """Weights used in matrix products per token: the blocks' Q, K, V, O, output
    gates and MLP matrices, and the head (tied or not). Embedding lookups (token,
    value, learned positions), biases, norms and scalars are not matmuls."""
    m = cfg.model
    hdim = m.num_heads * m.head_dim
    attn_layers = [i for i in range(m.num_layers) if i not in m.no_attn_layers]
    per_attn = 4 * hdim * m.model_dim + (m.num_heads * m.gate_inputs if m.attn_gate else 0)
    mlp = 2 * m.model_dim * m.mlp_hidden
    return len(attn_layers) * per_attn + m.num_layers * mlp + m.padded_vocab * m.model_dim


def mean_keys(seq_len: int, block_size: int, window_blocks: int) -> float:
    """Mean number of keys a query attends under the block-sparse causal window.

    A query block sees its own (diagonal) block causally, (block_size + 1) / 2
    keys on average, and up to window_blocks - 1 earlier blocks in full (fewer
    near the start of the row). Documents are ignored: an upper bound on
    what a document-masked FlexAttention computes.
    """
    nb = max(1, seq_len // block_size)
    prev = min(max(window_blocks, 1) - 1, nb - 1)
    # sum over query blocks i of min(prev, i)
    total = prev * (prev - 1) / 2 + (nb - prev) * prev
    return total / nb * block_size + (block_size + 1) / 2


def attention_flops_per_token(cfg: RunConfig, long_blocks: int) -> float:
    """Forward + backward FLOPs of Q·Kᵀ and P·V per token under a long window of `long_blocks`.

    Per layer and query: forward 2 products of 2·(H·D)·keys FLOPs; backward
    twice the forward (dQ, dK, dV, dP), so 12·(H·D)·keys in all. The short
    window is long // 2 (at least one block) on non-long layers.
    """
    m, a, t = cfg.model, cfg.attention, cfg.train
    hdim = m.num_heads * m.head_dim
    short_blocks = max(1, long_blocks // 2) if a.long_short else long_blocks
    seq = a.segment_len or t.seq_len
    total = 0.0
    for i in range(m.num_layers):
        if i in m.no_attn_layers:
            continue
        w = long_blocks if i in m.long_layers else short_blocks
        total += 12 * hdim * mean_keys(seq, a.block_size, w)
    return total


def final_window_blocks(cfg: RunConfig) -> int:
    from speedrun.train import schedules

    return schedules.window_blocks(1.0, cfg.attention)


def flops_per_token(cfg: RunConfig, long_blocks: int | None = None) -> float:
    """Training FLOPs per token: 6 × matmul weights + windowed attention.

    6 = 2 (multiply-add) × 3 (forward, gradient of the input, gradient of the
    weight). Attention is counted at the final (largest) window unless
    `long_blocks` says otherwise. Not counted: element-wise work (norms,
    rotary, soft-cap, cross-entropy), the optimisers, recomputation inside
    the attention backward. For the record: 6 × 1.212e8 + 1.08e8 ≈ 8.35e8
    (the anchor document's ≈ 7.8e8 averages the growing window over the run,
    see `run_mean_flops_per_token`).
    """
    if long_blocks is None:
        long_blocks = final_window_blocks(cfg)
    nb = max(1, (cfg.attention.segment_len or cfg.train.seq_len) // cfg.attention.block_size)
    return 6.0 * matmul_weights(cfg) + attention_flops_per_token(cfg, min(long_blocks, nb))


def window_at(cfg: RunConfig, step: int) -> int:
    from speedrun.train import schedules

    return schedules.window_blocks(step / cfg.train.steps, cfg.attention)


def run_mean_flops_per_token(cfg: RunConfig) -> float:
    """FLOPs per token averaged over every step of a run (the growing window)."""
    n = cfg.train.steps
    return sum(flops_per_token(cfg, window_at(cfg, s)) for s in range(n)) / n


# ================================================================== random data


def random_tokens(n: int, seed: int = 0, doc_len: int = DOC_LEN, vocab: int = EOT) -> np.ndarray:
    """n uint16 tokens in [0, vocab) with 50256 at document starts, gaps ~ geometric(mean doc_len)."""
    rng = np.random.default_rng(seed)
    tokens = rng.integers(0, vocab, size=n, dtype=np.uint16)
    gaps = rng.geometric(1.0 / doc_len, size=n // doc_len * 2 + 16)
    starts = np.concatenate([[0], np.cumsum(gaps)])
    tokens[starts[starts < n]] = EOT
    return tokens


RANDOM_DATA_MAX_STEPS = 64  # beyond this the loader wraps around: random tokens need not be fresh to time a step


def write_random_data(folder: Path, cfg: RunConfig, steps: int, world_size: int, seed: int = 0) -> None:
    """Training shards for `steps` steps (at most RANDOM_DATA_MAX_STEPS: a 1695-step
    bench would otherwise write 1.3 GB per rank) and one validation row per rank."""
    from speedrun.data.shards import write_shard

    t = cfg.train
    steps = min(steps, RANDOM_DATA_MAX_STEPS)
    per_seq = t.seq_len + (2 * DOC_LEN if t.bos_align else 0) + 1
    need = (steps + 2) * t.batch_seqs * per_seq + 4 * t.batch_seqs * t.seq_len
    i = 0
    while need > 0:
        n = min(need, SHARD_TOKENS)
        write_shard(folder / f"bench_train_{i:06d}.bin", random_tokens(n, seed + i))
        need, i = need - n, i + 1
    write_shard(folder / "bench_val_000000.bin", random_tokens(world_size * t.val_seq_len + 1, seed + 10_000))


# ================================================================== helpers


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _barrier() -> None:
    if dist.is_available() and dist.is_initialized():
        dist.barrier()


def _max_over_ranks(values: list[float], device: torch.device) -> list[float]:
    if not (dist.is_available() and dist.is_initialized()) or not values:
        return values
    t = torch.tensor(values, dtype=torch.float64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.tolist()


def spread(values: list[float]) -> dict:
    """Median, min, max and interquartile range of `values`."""
    v = sorted(values)
    if not v:
        return {"median": None, "min": None, "max": None, "q1": None, "q3": None}
    q1, q3 = (np.percentile(v, [25, 75]).tolist() if len(v) > 1 else (v[0], v[0]))
    return {"median": statistics.median(v), "min": v[0], "max": v[-1], "q1": q1, "q3": q3}


def measure_matmul_peak(device: torch.device, n: int | None = None, reps: int = 10) -> dict:
    """Achieved FLOP/s of one large matmul on random data: bf16 8192^3 on CUDA (CUDA events),
    fp32 on a CPU (wall clock). Median over `reps` after warm-up."""
    cuda = device.type == "cuda"
    n = n or (CUDA_PEAK_N if cuda else CPU_PEAK_N)
    dtype = torch.bfloat16 if cuda else torch.float32
    g = torch.Generator(device=device).manual_seed(0)
    a = torch.randn(n, n, device=device, dtype=dtype, generator=g)
    b = torch.randn(n, n, device=device, dtype=dtype, generator=g)
    times = []
    for i in range(reps + 3):
        if cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            torch.mm(a, b)
            end.record()
            end.synchronize()
            ms = start.elapsed_time(end)
        else:
            t0 = time.perf_counter()
            torch.mm(a, b)
            ms = 1000 * (time.perf_counter() - t0)
        if i >= 3:
            times.append(ms)
    ms = statistics.median(times)
    kind = f"{'bf16' if cuda else 'fp32'} {n}^3 matmul ({'CUDA events' if cuda else 'CPU wall clock'})"
    return {"kind": kind, "n": n, "dtype": str(dtype).replace("torch.", ""), "ms": ms,
            "flops_per_s": 2 * n**3 / (ms / 1000)}


def _step_index(cfg: RunConfig, j: int, n: int, progress: float | None) -> int:
    total = cfg.train.steps
    p = (j + 0.5) / max(n, 1) if progress is None else progress
    return min(total - 1, max(0, int(p * total)))


# ================================================================== the bench session


class Session:
    """A Trainer on random (or given) data, in temporary folders, and timing around it."""

    def __init__(self, cfg: RunConfig, args, steps_needed: int, t_start: float):
        from speedrun.train.dist import init_distributed
        from speedrun.train.loop import Trainer

        self.info = init_distributed()
        validate(cfg, self.info.world_size)
        self.tmp = Path(tempfile.mkdtemp(prefix=f"speedrun-bench-r{self.info.rank}-"))
        if args.data == "random":
            write_random_data(self.tmp / "data", cfg, steps_needed, self.info.world_size, seed=cfg.train.seed)
            cfg.data.data_dir = str(self.tmp / "data")
            cfg.data.train_pattern, cfg.data.val_pattern = "bench_train_*.bin", "bench_val_*.bin"
        else:
            cfg.data.data_dir = args.data
        self.cfg = cfg
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="training data wrapped around")
            self.trainer = Trainer(cfg, self.info, self.tmp / "run", progress=False, t_start=t_start)
        self.device = self.trainer.device
        self.setup_s = time.time() - t_start

    @property
    def is_main(self) -> bool:
        return self.info.is_main

    def step(self, step: int) -> torch.Tensor:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="training data wrapped around")
            return self.trainer.train_step(step)

    def warm_up(self, n: int, t_start: float, evaluate: bool = False) -> tuple[float | None, float]:
        """n untimed steps spread over the run, then (`evaluate`) one validation; (process start -> end
        of first step, warm-up seconds). The trainer's precompile child is done or stopped afterwards."""
        first, t0 = None, time.time()
        for i in range(n):
            self.step(_step_index(self.cfg, i, n, None))
            if i == 0:
                _sync(self.device)
                first = time.time() - t_start
        if evaluate and self.trainer.val_file is not None:
            self.trainer.session.before_validation(self.trainer.startup)
            self.trainer.evaluate(0)
        self.trainer.session.stop_precompile()
        self.trainer.session.save_packages()  # the next bench or run of this config starts warm
        _sync(self.device)
        return first, time.time() - t0

    def time_groups(self, steps: int, repeats: int, progress: float | None) -> tuple[list[float], torch.Tensor | None]:
        """ms/step of each group (slowest rank), and the last step's loss."""
        groups, loss = [], None
        for _ in range(repeats):
            _barrier()
            _sync(self.device)
            t0 = time.perf_counter()
            for j in range(steps):
                loss = self.step(_step_index(self.cfg, j, steps, progress))
            _sync(self.device)
            groups.append(1000 * (time.perf_counter() - t0) / max(steps, 1))
        return _max_over_ranks(groups, self.device), loss

    def timed_windows(self, steps: int, progress: float | None) -> list[int]:
        return [window_at(self.cfg, _step_index(self.cfg, j, steps, progress)) for j in range(steps)]

    def count_syncs(self, progress: float | None) -> dict | None:
        """Run one step with CUDA's sync debug mode on; count host synchronisations."""
        if self.device.type != "cuda":
            return None
        _sync(self.device)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            torch.cuda.set_sync_debug_mode("warn")
            try:
                self.step(_step_index(self.cfg, 0, 1, progress))
            finally:
                torch.cuda.set_sync_debug_mode("default")
        _sync(self.device)
        msgs = [str(w.message).splitlines()[0] for w in caught if _is_sync_warning(str(w.message))]
        return {"count": len(msgs), "distinct": sorted(set(msgs))[:10]}

    def close(self) -> None:
        tr = self.trainer
        tr.session.release()
        try:
            tr.loader.close()
            if getattr(tr, "guard", None) is not None:
                tr.guard.close()
            if tr.out is not None:
                tr.out.close()
        finally:
            shutil.rmtree(self.tmp, ignore_errors=True)


def _is_sync_warning(message: str) -> bool:
    """A warning raised for a synchronising call, not torch's notice that the
    debug mode itself is a prototype (which says "synchronizing" too)."""
    text = message.lower()
    return "synchroniz" in text and "prototype feature" not in text


# ================================================================== profiling


def profile_steps(session: Session, n: int, progress: float | None, path: Path | None) -> dict:
    """Top 15 kernels by device time (CPU time on a CPU) over n steps. `path` gets the
    profiler's table (top 80) and, beside it, `<path>.trace.json.gz`, the Chrome trace."""
    return profile_calls(lambda j: session.step(_step_index(session.cfg, j, n, progress)), n, session.device,
                         path if session.is_main else None)


def profile_calls(step, n: int, device: torch.device, path: Path | None) -> dict:
    """`step(j)` for j < n under the profiler: the top 15 kernels by device time (CPU time on a
    CPU), where the device sat idle, and with `path` the table (top 80) and the Chrome trace."""
    from torch.profiler import ProfilerActivity, profile

    cuda = device.type == "cuda"
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    _sync(device)
    with profile(activities=acts) as prof:
        for j in range(n):
            step(j)
        _sync(device)
    key = "self_device_time_total" if cuda else "self_cpu_time_total"
    events = [e for e in prof.key_averages() if getattr(e, key, 0) > 0]
    events.sort(key=lambda e: getattr(e, key), reverse=True)
    total = sum(getattr(e, key) for e in events) or 1.0
    top = [{"name": e.key, "calls": e.count, "total_ms": getattr(e, key) / 1000,
            "ms_per_step": getattr(e, key) / 1000 / n, "percent": 100 * getattr(e, key) / total}
           for e in events[:15]]
    idle = device_idle(_device_spans(prof), n) if cuda else None
    if path is not None:
        table = prof.key_averages().table(sort_by=key, row_limit=80, max_name_column_width=100)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"speedrun bench --profile: {n} step(s), sorted by {key}\n\n{table}\n")
        prof.export_chrome_trace(str(path) + ".trace.json.gz")
    return {"steps": n, "sorted_by": key, "file": str(path) if path else None, "top": top, "idle": idle}


DEVICE_ACTIVITIES = ("kernel", "gpu_memcpy", "gpu_memset")


def _device_spans(prof) -> list[tuple[int, int, str]]:
    """(start_ns, end_ns, name) of every kernel, copy and fill the device ran while profiling
    (user annotations such as "Optimizer.step#Muon.step" span kernels and are left out)."""
    return [(e.start_ns(), e.end_ns(), e.name()) for e in prof.profiler.kineto_results.events() if _on_device(e)]


def _on_device(e) -> bool:
    """A kernel, copy or fill (torch 2.11's events have no activity_type: any non-annotation
    event on the GPU)."""
    if hasattr(e, "activity_type"):
        return e.activity_type() in DEVICE_ACTIVITIES
    annotation = e.is_user_annotation() if hasattr(e, "is_user_annotation") else e.name().startswith(
        ("Optimizer.", "ProfilerStep"))
    return e.device_type() == torch.autograd.DeviceType.CUDA and not annotation


def device_idle(spans: list[tuple[int, int, str]], steps: int, top: int = 8) -> dict | None:
    """Where the device waited during the profiled steps: the union of its activity from the first
    start to the last end, the idle time per step, the idle time split by gap length, and the `top`
    longest gaps with the activities on either side (overlapping spans, e.g. two streams, merge)."""
    if not spans:
        return None
    spans = sorted(spans)
    gaps, busy, end, last = [], 0, spans[0][0], spans[0][2]
    for s, e, name in spans:
        if s > end:
            gaps.append((s - end, last, name))
        busy += max(0, e - max(s, end))
        if e > end:
            end, last = e, name
    span = end - spans[0][0]
    bins = {"<10us": 0, "10-100us": 0, "100us-1ms": 0, ">=1ms": 0}
    for g, _, _ in gaps:
        bins["<10us" if g < 10_000 else "10-100us" if g < 100_000 else "100us-1ms" if g < 1_000_000 else ">=1ms"] += g
    gaps.sort(key=lambda x: x[0], reverse=True)
    per = lambda ns: ns / 1e6 / steps  # noqa: E731
    return {"span_ms_per_step": per(span), "busy_ms_per_step": per(busy), "idle_ms_per_step": per(span - busy),
            "busy_fraction": busy / span if span else 1.0, "gaps": len(gaps),
            "idle_ms_per_step_by_gap": {k: per(v) for k, v in bins.items()},
            "longest": [{"us": g / 1e3, "after": a, "before": b} for g, a, b in gaps[:top]]}


# ================================================================== communication


def _elem_bytes(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()


def plan_collectives(optimizers, world_size: int) -> list[dict]:
    """The collectives the optimisers issue in one step at `world_size` ranks, in issue order.

    Muon: per param group and shape bucket, one reduce-scatter of the stacked
    gradients (padded to a multiple of W) and one all-gather of the same size.
    DistAdam: per parameter, reduce-scatter + all-gather when dim 0 divides by
    W, else one all-reduce. `shape` is the full (unsharded) tensor.
    """
    from speedrun.optim.adam import DistAdam
    from speedrun.optim.muon import Muon

    if world_size <= 1:
        return []
    plan = []

    def add(opt_name, op, name, shape, dtype):
        numel = math.prod(shape)
        plan.append({"optimizer": opt_name, "op": op, "param": name, "shape": list(shape),
                     "dtype": str(dtype).replace("torch.", ""), "numel": numel,
                     "bytes": numel * _elem_bytes(dtype)})

    for opt in optimizers:
        if isinstance(opt, Muon):
            for gi, group in enumerate(opt.param_groups):
                buckets: dict = {}
                for p in group["params"]:
                    buckets.setdefault((tuple(p.shape), p.dtype), []).append(p)
                for (shape, dtype), ps in buckets.items():
                    padded = -(-len(ps) // world_size) * world_size
                    full = (padded, *shape)
                    label = f"group{gi} {len(ps)} x {tuple(shape)}"
                    add("muon", "reduce_scatter", label, full, dtype)
                    add("muon", "all_gather", label, full, dtype)
        elif isinstance(opt, DistAdam):
            for gi, group in enumerate(opt.param_groups):
                for p in group["params"]:
                    label = f"group{gi} {tuple(p.shape)}"
                    if p.ndim > 0 and p.shape[0] % world_size == 0 and p.is_contiguous():
                        add("adam", "reduce_scatter", label, tuple(p.shape), p.dtype)
                        add("adam", "all_gather", label, tuple(p.shape), p.dtype)
                    else:
                        add("adam", "all_reduce", label, tuple(p.shape), p.dtype)
    return plan


BUS_FACTOR = {  # nccl-tests convention: bus bandwidth = size / time x factor
    "all_reduce": lambda w: 2 * (w - 1) / w,
    "reduce_scatter": lambda w: (w - 1) / w,
    "all_gather": lambda w: (w - 1) / w,
    "rs+ag": lambda w: 2 * (w - 1) / w,
}


def _time_collective(fn, device: torch.device, iters: int, repeats: int) -> float:
    """Median ms per call of fn() (which returns a Pending), over `repeats` groups of `iters`."""
    for _ in range(2):
        fn().wait()
    out = []
    for _ in range(repeats):
        _barrier()
        _sync(device)
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(iters):
                fn().wait()
            end.record()
            end.synchronize()
            ms = start.elapsed_time(end)
        else:
            t0 = time.perf_counter()
            for _ in range(iters):
                fn().wait()
            ms = 1000 * (time.perf_counter() - t0)
        out.append(ms / iters)
    return statistics.median(_max_over_ranks(out, device))


def measure_collectives(plan: list[dict], device: torch.device, iters: int = 10, repeats: int = 3) -> list[dict]:
    """Per distinct (numel, dtype) of the plan: all-reduce vs reduce-scatter + all-gather."""
    from speedrun.optim.muon import Collectives

    comm = Collectives()
    W = comm.world_size
    sizes = sorted({(e["numel"], e["dtype"]) for e in plan}, key=lambda s: s[0] * _elem_bytes(getattr(torch, s[1])))
    rows = []
    for numel, dtype_name in sizes:
        dtype = getattr(torch, dtype_name)
        k = -(-numel // W)
        full = torch.randn(k * W, device=device).to(dtype)
        full2 = torch.randn(k * W, device=device).to(dtype)  # gloo's stand-in divides a slice in place
        local = torch.randn(k, device=device).to(dtype)
        gathered = torch.empty(k * W, device=device, dtype=dtype)
        ar = _time_collective(lambda: comm.all_reduce_avg(full), device, iters, repeats)
        rs = _time_collective(lambda: comm.reduce_scatter_avg(full2), device, iters, repeats)
        ag = _time_collective(lambda: comm.all_gather(gathered, local), device, iters, repeats)
        size = k * W * _elem_bytes(dtype)
        row = {"numel": numel, "dtype": dtype_name, "bytes": size, "all_reduce_ms": ar, "reduce_scatter_ms": rs,
               "all_gather_ms": ag, "rs_plus_ag_ms": rs + ag}
        for op, ms in (("all_reduce", ar), ("reduce_scatter", rs), ("all_gather", ag), ("rs+ag", rs + ag)):
            row[f"{op.replace('+', '_plus_')}_busbw_gbs"] = size / (ms / 1000) * BUS_FACTOR[op](W) / 1e9 if ms > 0 else None
        rows.append(row)
    return rows


class LocalCollectives:
    """Stand-in for `muon.Collectives` that communicates nothing: same shapes, local copies.

    reduce-scatter returns this rank's slice; all-reduce returns the tensor;
    all-gather copies this rank's part into every chunk of the output (the
    memory traffic an all-gather's receiving side has). The math is wrong
    across ranks (no averaging), which does not matter for timing.
    """

    def __init__(self, real):
        self.group, self.active = real.group, real.active
        self.world_size, self.rank, self.backend = real.world_size, real.rank, real.backend

    def _native(self, t):
        return False

    def reduce_scatter_avg(self, full):
        from speedrun.optim.muon import done

        k = full.shape[0] // self.world_size
        return done(full[self.rank * k:(self.rank + 1) * k])

    def all_reduce_avg(self, t):
        from speedrun.optim.muon import done

        return done(t)

    def all_gather(self, out, local):
        from speedrun.optim.muon import done

        for i, chunk in enumerate(out.chunk(self.world_size)):
            if i != self.rank:
                chunk.copy_(local)
            elif chunk.data_ptr() != local.data_ptr():
                chunk.copy_(local)
        return done(out)


@contextmanager
def local_collectives(optimizers):
    saved = [opt.comm for opt in optimizers]
    try:
        for opt in optimizers:
            opt.comm = LocalCollectives(opt.comm)
        yield
    finally:
        for opt, comm in zip(optimizers, saved):
            opt.comm = comm


def comm_report(session: Session, args, with_comm_ms: list[float]) -> dict:
    """The --comm section: plan, per-size timings, and the step without collectives."""
    W = session.info.world_size
    plan = plan_collectives(session.trainer.optimizers, W)
    if W == 1:
        return {"world_size": 1, "note": "one process: the optimisers issue no collectives, nothing to measure; "
                                         "the step time above is all local work",
                "collectives": [], "sizes": []}
    sizes = measure_collectives(plan, session.device, iters=args.comm_iters, repeats=3)
    by_size = {(s["numel"], s["dtype"]): s for s in sizes}
    key = {"all_reduce": "all_reduce_ms", "reduce_scatter": "reduce_scatter_ms", "all_gather": "all_gather_ms"}
    serial = sum(by_size[(e["numel"], e["dtype"])][key[e["op"]]] for e in plan)
    with local_collectives(session.trainer.optimizers):
        local_ms, _ = session.time_groups(args.steps, args.repeats, args.progress)
    full, local = statistics.median(with_comm_ms), statistics.median(local_ms)
    exposed = max(0.0, full - local)
    hidden = None if serial <= 0 else min(1.0, max(0.0, 1 - exposed / serial))
    return {
        "world_size": W, "backend": str(dist.get_backend()), "collectives": plan, "sizes": sizes,
        "serial_comm_ms_per_step": serial, "step_ms_with_comm": full, "step_ms_local_comm": local,
        "step_ms_local_comm_spread": spread(local_ms), "exposed_comm_ms": exposed, "hidden_fraction": hidden,
        "bytes_per_step": sum(e["bytes"] for e in plan),
    }


# ================================================================== report


def _fmt_bytes(b: float | None) -> str:
    if b is None:
        return "-"
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if b >= scale:
            return f"{b / scale:.2f} {unit}"
    return f"{b:.0f} B"


def _fmt(x, spec=".1f", none="-") -> str:
    return none if x is None else format(x, spec)


def format_report(r: dict) -> str:
    s = r["ms_per_step_spread"]
    dev = r["device"]
    lines = [f"speedrun bench: {r['preset']} on {r['world_size']} x {dev} (torch {r['env']['torch']}, "
             f"compile={r['compile']}, attention={r['attention_backend']}, fp8_head={r['fp8_head']}, "
             f"data={r['data']})", ""]
    rows = [
        ("ms/step (median)", f"{_fmt(r['ms_per_step'], '.2f')}  [{r['repeats']} x {r['steps']} steps; "
                             f"min {_fmt(s['min'], '.2f')}, max {_fmt(s['max'], '.2f')}, "
                             f"IQR {_fmt(s['q1'], '.2f')}-{_fmt(s['q3'], '.2f')}]"),
        ("tokens/step", f"{r['tokens_per_step']:,}"),
        ("tokens/s", f"{_fmt(r['tokens_per_s'], ',.0f')}"),
        ("FLOP/token (final window)", f"{r['flops_per_token']:.3e}"),
        ("FLOP/token (timed windows)", f"{r['flops_per_token_timed']:.3e}  (window blocks {r['timed_windows']})"),
        ("achieved FLOP/s", f"{_fmt(r['achieved_flops_per_s'], '.3e')} total, "
                            f"{_fmt(r['achieved_flops_per_s_per_device'], '.3e')} per device"),
        ("matmul peak (measured)", f"{r['matmul_peak']['flops_per_s']:.3e} FLOP/s  [{r['matmul_peak']['kind']}]"),
        ("fraction of peak", f"{_fmt(r['fraction_of_peak'], '.3f')}"),
        ("GPU clock (timed steps)", gpu_clocks.describe(r.get("gpu_clocks"))),
        ("energy, cycles / step", gpu_clocks.describe_per_step(r)),
        ("peak memory", f"{_fmt_bytes(r['peak_memory_bytes'])} allocated, "
                        f"{_fmt_bytes(r['peak_reserved_bytes'])} reserved"),
        ("set-up / first step / warm-up", f"{r['setup_s']:.1f} s / {_fmt(r['first_step_s'])} s / "
                                           f"{r['warmup_s']:.1f} s ({r['warmup']} steps)"),
        ("compile cache", str(r["compile_cache"])),
        ("graphs compiled in timed steps", f"{r.get('graphs_compiled_in_timed_steps', '-')}  (0 = no recompiles)"),
        ("last loss", f"{_fmt(r['last_loss'], '.4f')}"),
    ]
    if r.get("host_syncs") is not None:
        rows.append(("host syncs in one step", f"{r['host_syncs']['count']}"))
    width = max(len(k) for k, _ in rows)
    lines += [f"{k:<{width}}  {v}" for k, v in rows]
    if r.get("host_syncs") and r["host_syncs"]["distinct"]:
        lines += ["", "host syncs:"] + [f"  {m}" for m in r["host_syncs"]["distinct"]]
    c = r.get("comm")
    if c is not None:
        lines.append("")
        if c["world_size"] == 1:
            lines.append(f"comm: {c['note']}")
        else:
            lines.append(f"comm ({c['backend']}, {c['world_size']} ranks): {len(c['collectives'])} collectives, "
                         f"{_fmt_bytes(c['bytes_per_step'])} per step")
            lines.append(f"{'size':>11} {'dtype':>8} | {'all-reduce':>16} | {'reduce-scatter':>16} | "
                         f"{'all-gather':>16} | {'RS+AG':>16}   (ms, bus GB/s)")
            for z in c["sizes"]:
                cell = lambda op, k: f"{z[k]:8.3f} {_fmt(z[op + '_busbw_gbs'], '7.1f')}"  # noqa: E731
                lines.append(f"{_fmt_bytes(z['bytes']):>11} {z['dtype']:>8} | {cell('all_reduce', 'all_reduce_ms')} | "
                             f"{cell('reduce_scatter', 'reduce_scatter_ms')} | {cell('all_gather', 'all_gather_ms')} | "
                             f"{cell('rs_plus_ag', 'rs_plus_ag_ms')}")
            hid = c["hidden_fraction"]
            lines.append(f"step {c['step_ms_with_comm']:.2f} ms with collectives, {c['step_ms_local_comm']:.2f} ms "
                         f"with local stand-ins; collectives alone {c['serial_comm_ms_per_step']:.2f} ms/step; "
                         f"exposed {c['exposed_comm_ms']:.2f} ms -> hidden {_fmt(None if hid is None else 100 * hid)}%")
    p = r.get("profile")
    if p is not None:
        lines += ["", f"top kernels ({p['sorted_by']}, {p['steps']} step(s)){' -> ' + p['file'] if p['file'] else ''}:"]
        lines.append(f"{'ms/step':>9} {'%':>6} {'calls':>7}  name")
        for k in p["top"]:
            lines.append(f"{k['ms_per_step']:9.3f} {k['percent']:6.1f} {k['calls']:7d}  {k['name'][:90]}")
        lines += _idle_lines(p.get("idle"))
    return "\n".join(lines)


def _idle_lines(idle: dict | None) -> list[str]:
    if not idle:
        return []
    bins = ", ".join(f"{k} {v:.2f}" for k, v in idle["idle_ms_per_step_by_gap"].items())
    lines = ["", f"device idle: {idle['idle_ms_per_step']:.2f} ms/step of {idle['span_ms_per_step']:.2f} "
                 f"(busy {100 * idle['busy_fraction']:.1f}%; {idle['gaps']} gaps; by gap length: {bins})",
             "longest gaps:"]
    return lines + [f"  {g['us']:9.1f} us  after {g['after'][:60]}  before {g['before'][:60]}" for g in idle["longest"]]


# ================================================================== commands


def _config(args) -> RunConfig:
    from speedrun.recipes.registry import get_preset

    cfg = apply_overrides(get_preset(args.preset), list(args.overrides))
    if not isinstance(cfg, RunConfig):
        raise ConfigError(f"--preset {args.preset}: `speedrun warm` fills the 2025-08 record's portable cache; "
                          "the 2026 record compiles into torch's local caches")
    t = cfg.train
    # a bench is not a run: no validation, checkpoints, health records or injected faults
    t.val_tokens, t.val_every, t.checkpoint_every_steps, t.checkpoint_every_minutes = 0, 0, 0, 0.0
    t.health_every, t.inject_fault, t.on_fault = 0, "", "stop"
    return cfg


def _progress(value: str) -> float | None:
    if value == "spread":
        return None
    p = float(value)
    if not 0 <= p <= 1:
        raise argparse.ArgumentTypeError("--progress must be 'spread' or a number in [0, 1]")
    return p


def run_bench(args) -> dict:
    from speedrun.run.env import environment
    from speedrun.compile.startup import compiled_graphs
    from speedrun.compile.startup import process_start_time

    t_start = process_start_time()
    cfg = _config(args)
    profile_n = min(args.steps, 3) if args.profile else 0
    comm_steps = args.steps * args.repeats if args.comm else 0
    needed = args.warmup + args.steps * args.repeats + profile_n + comm_steps + 2
    session = Session(cfg, args, needed, t_start)
    try:
        first_s, warm_s = session.warm_up(args.warmup, t_start)
        dev = session.device
        if dev.type == "cuda":
            torch.cuda.reset_peak_memory_stats(dev)
        graphs0 = compiled_graphs()
        sampler = gpu_clocks.start(dev) if session.is_main else None
        groups, loss = session.time_groups(args.steps, args.repeats, args.progress)
        clocks = sampler.stop() if sampler else None
        recompiled = compiled_graphs() - graphs0
        cuda = dev.type == "cuda"
        measured = {
            "peak_memory_bytes": torch.cuda.max_memory_allocated(dev) if cuda else None,
            "peak_reserved_bytes": torch.cuda.max_memory_reserved(dev) if cuda else None,
            "last_loss": float(loss) if loss is not None else None,
            "host_syncs": session.count_syncs(args.progress) if args.sync_check else None,
            "comm": comm_report(session, args, groups) if args.comm else None,
            "profile": profile_steps(session, profile_n, args.progress, Path(args.profile)) if args.profile else None,
            "setup_s": session.setup_s, "first_step_s": first_s, "warmup_s": warm_s,
            "graphs_compiled_in_timed_steps": recompiled, "gpu_clocks": clocks,
        }
        rates = _rates(session, cfg, args, groups, measure_matmul_peak(dev, args.peak_size))
        measured.update(gpu_clocks.per_step(clocks, rates["ms_per_step"]))
        return _result(session, cfg, args, rates, measured, _env_summary(environment()))
    finally:
        session.close()


def _rates(session: Session, cfg: RunConfig, args, groups: list[float], peak_mm: dict) -> dict:
    """The step's median and spread, tokens/s, FLOP/s (over the timed steps' windows) and the fraction
    of the measured matrix-product peak."""
    tr, W = session.trainer, session.info.world_size
    windows = session.timed_windows(args.steps, args.progress)
    fpt_timed = statistics.mean(flops_per_token(cfg, w) for w in windows) if windows else flops_per_token(cfg)
    sp = spread(groups)
    ms = sp["median"]
    tps = tr.tokens_per_step / (ms / 1000) if ms else None
    achieved = tps * fpt_timed if tps else None
    per_dev = achieved / W if achieved else None
    return {
        "ms_per_step": ms, "ms_per_step_groups": groups, "ms_per_step_spread": sp,
        "tokens_per_step": tr.tokens_per_step, "tokens_per_s": tps,
        "matmul_weights": matmul_weights(cfg), "flops_per_token": flops_per_token(cfg),
        "flops_per_token_timed": fpt_timed, "flops_per_token_run_mean": run_mean_flops_per_token(cfg),
        "timed_windows": sorted(set(windows)),
        "achieved_flops_per_s": achieved, "achieved_flops_per_s_per_device": per_dev,
        "matmul_peak": peak_mm, "fraction_of_peak": per_dev / peak_mm["flops_per_s"] if per_dev else None,
    }


def _result(session: Session, cfg: RunConfig, args, rates: dict, measured: dict, env: dict) -> dict:
    """The bench's JSON: what ran (preset, device, the trainer's switches, arguments), then the figures."""
    tr, dev = session.trainer, session.device
    d = tr.describe()
    return {
        "preset": cfg.name, "device": (torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu"),
        "world_size": session.info.world_size, "micro_steps": tr.micro_steps,
        "compile": cfg.train.compile if tr.compiled else "off",
        **{k: d[k] for k in ("attention_backend", "fp8_head", "dtype", "embed_rows", "parameters")},
        "data": args.data, "overrides": list(args.overrides),
        "warmup": args.warmup, "steps": args.steps, "repeats": args.repeats,
        "progress": "spread" if args.progress is None else args.progress,
        **rates, **measured,
        "cold_start_phases_s": tr.startup.as_dict(),
        "compile_cache": getattr(tr, "compile_cache", None), "env": env,
    }


def _env_summary(env: dict) -> dict:
    return {k: env.get(k) for k in ("speedrun", "torch", "triton", "cuda", "cuda_driver", "python", "gpus")}


def check_outputs(args) -> None:
    """`--json` and `--profile` are written after the benchmark: refuse a path that cannot be written
    before it starts. Only the process that writes them checks (torchrun's other ranks would race it)."""
    from speedrun.run.outpaths import check_file

    if os.environ.get("RANK", "0") != "0":
        return
    if args.json:
        check_file(args.json, "--json")
    if args.profile:
        check_file(args.profile, "--profile")
        check_file(args.profile + ".trace.json.gz", "--profile")


def _is_record(preset: str) -> bool:
    from speedrun.config import RecordRunConfig
    from speedrun.recipes.registry import get_preset

    return isinstance(get_preset(preset), RecordRunConfig)


def cmd_bench(args) -> int:
    from speedrun.bench import record_steps
    from speedrun.compile.startup import process_start_time
    from speedrun.train.dist import shutdown

    check_outputs(args)
    finished = False
    try:
        record = _is_record(args.preset)
        result = record_steps.run(args, process_start_time()) if record else run_bench(args)
        finished = True
        if dist.is_available() and dist.is_initialized() and dist.get_rank() != 0:
            return 0
        print((record_steps.format_report if record else format_report)(result), flush=True)
        if args.json:
            from speedrun.run.rundir import atomic_write_text

            path = Path(args.json)
            path.parent.mkdir(parents=True, exist_ok=True)
            atomic_write_text(path, json.dumps(result, indent=2, default=str) + "\n")
            print(f"bench: wrote {path}")
        if record:
            stages = record_steps.nonfinite_stages(result)
            where = f"stage(s) {', '.join(map(str, stages))}" if stages else None
        else:
            loss = result["last_loss"]
            where = "the measured steps" if loss is not None and not math.isfinite(loss) else None
        if where:  # the figures are kept above, but a broken step's time is not a result
            print(f"bench: error: the training loss is not finite in {where}: the step is broken and its "
                  "timing is not the step's", file=sys.stderr)
            return 1
        return 0
    finally:
        shutdown(clean=finished)


def run_warm(args) -> dict:
    """Compile the preset's graphs on random data (training steps + one validation forward) and save them."""
    from speedrun.compile import cache as compile_cache
    from speedrun.compile.startup import process_start_time

    t_start = process_start_time()
    cfg = _config(args)
    why = compile_cache.nothing_to_cache(cfg, compile_cache.run_device())
    if why:  # before the model is built; `speedrun cache --preset` gives the same reason
        raise SpeedrunError(f"warm --preset {args.preset}: nothing to cache: {why}")
    args.data = "random"
    cfg.train.val_tokens = int(os.environ.get("WORLD_SIZE", "1")) * cfg.train.val_seq_len  # one validation forward
    session = Session(cfg, args, args.warmup + 2, t_start)
    try:
        tr = session.trainer
        first_s, warm_s = session.warm_up(args.warmup, t_start, evaluate=True)
        W = session.info.world_size
        _sync(session.device)
        key = compile_cache.cache_key(cfg, session.device, W)
        path = compile_cache.save(key) if session.is_main else None
        kernels = compile_cache.save_triton(key) if path else None  # speedrun's own, beside torch's
        parts = compile_cache.key_parts(cfg, session.device, W)
        if path:  # what the files were made for, readable by `speedrun cache` and a run that misses
            compile_cache.save_record(key, parts, args.preset, list(args.overrides))
        _barrier()
        return {"key": key, "path": str(path) if path else None, "bytes": path.stat().st_size if path else 0,
                "triton_path": str(kernels) if kernels else None,
                "triton_bytes": kernels.stat().st_size if kernels else 0,
                "first_step_s": first_s, "warmup_s": warm_s, "loaded": tr.compile_cache, "parts": parts}
    finally:
        session.close()


def cmd_warm(args) -> int:
    from speedrun.train.dist import shutdown

    finished = False
    try:
        r = run_warm(args)
        finished = True
        if r["path"]:
            print(f"compile cache: saved {r['key']} ({_fmt_bytes(r['bytes'])}) -> {r['path']}  "
                  f"[first step {_fmt(r['first_step_s'])} s, warm-up {r['warmup_s']:.1f} s]")
            if r["triton_path"]:
                print(f"compile cache: speedrun's Triton kernels ({_fmt_bytes(r['triton_bytes'])}) -> {r['triton_path']}")
        elif dist.is_available() and dist.is_initialized() and dist.get_rank() != 0:
            pass
        else:
            print(f"compile cache: nothing to save for {r['key']} (torch recorded no artifacts)")
        return 0
    finally:
        shutdown(clean=finished)


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--preset", default="demo", help="preset name (default: demo)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.FIELD=VALUE",
                   help="override any config field, as in train (repeatable)")


def register(subparsers) -> None:
    p = subparsers.add_parser("bench", help="time the training step of a preset on this machine",
                              description="Time the training step of a preset (the same Trainer and train_step as "
                                          "`speedrun train`) on random or real data: ms/step with its spread, tokens/s, "
                                          "FLOP/s and the fraction of a measured matmul peak, memory, compile time; "
                                          "optionally the optimisers' communication (--comm) and a kernel profile. "
                                          "Method: docs/performance.md.")
    _common(p)
    p.add_argument("--steps", type=int, default=20, help="timed steps per group (default 20)")
    p.add_argument("--warmup", type=int, default=10, help="untimed steps first (default 10)")
    p.add_argument("--repeats", type=int, default=5, help="timed groups; the median is reported (default 5)")
    p.add_argument("--data", default="random", metavar="random|DIR", help="random tokens (default) or a shard folder")
    p.add_argument("--progress", type=_progress, default=None, metavar="spread|P",
                   help="where in the run the timed steps sit: spread over it (default) or at progress P")
    p.add_argument("--comm", action="store_true", help="also measure the optimisers' collectives and their overlap")
    p.add_argument("--comm-iters", type=int, default=10, help="calls per timing of one collective (default 10)")
    p.add_argument("--profile", metavar="FILE", help="profile a few steps; write the top-15 kernel table to FILE")
    p.add_argument("--peak-size", type=int, default=None, help="matmul size for the peak (default 8192 CUDA, 1024 CPU)")
    p.add_argument("--no-sync-check", dest="sync_check", action="store_false",
                   help="skip counting host synchronisations in one step (CUDA)")
    p.add_argument("--json", metavar="FILE", help="also write every number as JSON")
    p.add_argument("--pairs", type=int, default=5,
                   help="the 2026 record's presets: timed (even, odd) step pairs per stage (default 5)")
    p.add_argument("--stages", type=int, nargs="+", default=None, metavar="K",
                   help="the 2026 record's presets: time only these stages (default all)")
    p.set_defaults(func=cmd_bench)

    w = subparsers.add_parser("warm", help="compile a preset and save the compile cache for later runs",
                              description="Run the warm-up steps on random data, then save the compiler's "
                                          "artifacts under the cache folder (see speedrun.compile.cache).")
    _common(w)
    w.add_argument("--warmup", type=int, default=2, help="steps to run (default 2)")
    w.set_defaults(func=cmd_warm, data="random", progress=None)
