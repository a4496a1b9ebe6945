"""`speedrun bench --preset record`: the 2026 record's ms per step in each stage, and the schedule's time.

The 2026 record's step changes shape three times (131k, 262k, 393k tokens a step, and the
extension's windows), and Adam updates on odd steps only, so one number cannot describe it. This
bench builds the same `RecordTrainer` a run builds and, for each stage, runs two untimed steps at
the stage's start (the stage's graph compiles) and then times `--pairs` consecutive (even, odd)
pairs of steps, the device synchronised around each pair. A stage's ms per step is the mean over
its pairs of half a pair's time; the schedule's time is the sum over stages of steps × that. The
peak memory of each stage is the allocator's over its timed steps. `--profile FILE` then runs one
pair of each stage again under the profiler (the kernels, and where the device sat idle), and
`--stages K...` times only those stages (each stage's graph compiles for minutes on empty caches).

The tokens are random (no corpus needed); their document lengths are the corpus's when `--data DIR`
names one (its first training shard's BOS gaps, resampled), otherwise geometric around 1,000 tokens.
Document lengths set the attention's work and the loader's packing, so the corpus's own make the
figure the one a run on it sees.
"""

from __future__ import annotations

import tempfile
import time
import warnings
from pathlib import Path

import numpy as np
import torch

from speedrun.config import RecordRunConfig, apply_overrides, validate
from speedrun.data import documents
from speedrun.data.shards import read_shard, write_shard
from speedrun.data.synthetic import EOT, random_documents
from speedrun.errors import ConfigError
from speedrun.recipes.registry import get_preset
from speedrun.train import stages

LENGTH_SAMPLE = 4_000_000  # tokens of the corpus read for its document lengths


def corpus_doc_lengths(folder: str, pattern: str) -> np.ndarray:
    """Document lengths (BOS to BOS) in the first LENGTH_SAMPLE tokens of a corpus's first training shard."""
    files = documents.discover_files(folder, pattern, "train")
    tokens = read_shard(files[0])[:LENGTH_SAMPLE]
    starts = np.flatnonzero(tokens == EOT)
    if starts.size < 2:
        raise ConfigError(f"--data {folder}: fewer than two document starts in its first {LENGTH_SAMPLE:,} tokens")
    return np.diff(starts)


def write_data(folder: Path, cfg: RecordRunConfig, pairs: int, lengths: np.ndarray | None) -> None:
    """One training shard for every stage's measured steps (the loader wraps past it: random tokens
    need not be fresh to time a step) and nothing to validate on; the config's document start token
    and vocabulary."""
    per_step = max(cfg.stages.tokens_per_step)
    tokens = random_documents(per_step * (2 * pairs + 4), lengths, cfg.train.seed, cfg.docs.bos, cfg.model.vocab)
    write_shard(folder / "bench_train_000000.bin", tokens)


def stage_steps(cfg: RecordRunConfig, pairs: int) -> list[tuple[int, list[int]]]:
    """Per stage: (stage, its steps to run) from its first even step: two untimed, then up to
    2·pairs timed (a short stage, such as a scaled-down extension, times fewer; one too short for
    a timed pair gets none)."""
    bounds = stages.stage_ends(cfg.stages)
    out = []
    for k, (start, end) in enumerate(zip(bounds, bounds[1:])):
        first = start + start % 2
        fit = min(pairs, (end - first - 2) // 2)
        out.append((k, list(range(first, first + 2 + 2 * fit)) if fit > 0 else []))
    return out


def _config(resolved: RecordRunConfig, folder: Path) -> RecordRunConfig:
    """The resolved preset on the bench's data, with nothing but training steps."""
    return apply_overrides(resolved, [
        f"data.data_dir={folder}", "data.train_pattern=bench_train_*.bin", "docs.val_tokens=0",
        "train.checkpoint_every_steps=0", "train.checkpoint_every_minutes=0", "train.health_every=0",
        "train.warmup=off"])


def run(args, t_start: float) -> dict:
    """The measurement (module docstring); returns every number."""
    from speedrun.train.dist import init_distributed
    from speedrun.train.record_loop import RecordTrainer

    info = init_distributed()
    tmp = Path(tempfile.mkdtemp(prefix=f"speedrun-bench-r{info.rank}-"))
    base = apply_overrides(get_preset(args.preset), list(args.overrides))
    lengths = corpus_doc_lengths(args.data, base.data.train_pattern) if args.data != "random" else None
    (tmp / "data").mkdir()
    cfg = _config(base, tmp / "data")
    validate(cfg, info.world_size)
    write_data(tmp / "data", cfg, args.pairs, lengths)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="training data wrapped around")
        trainer = RecordTrainer(cfg, info, tmp / "run", progress=False, t_start=t_start)
        result = {"preset": args.preset, "device": torch.cuda.get_device_name() if info.device.type == "cuda" else "cpu",
                  "world_size": info.world_size, "describe": trainer.describe(), "stages": []}
        for k, steps in stage_steps(cfg, args.pairs):
            if steps and (args.stages is None or k in args.stages):
                result["stages"].append(_time_stage(trainer, cfg, k, steps, t_start))
                if info.is_main:  # a stage's line as soon as it is measured: compiling takes minutes
                    print(_stage_line(result["stages"][-1]), flush=True)
    result["schedule_s"] = schedule_seconds(cfg, {s["stage"]: s["ms_per_step"] for s in result["stages"]})
    result["schedule_steps"] = cfg.stages.total_steps
    if args.profile:
        result["profile"] = _profile(trainer, result["stages"], Path(args.profile) if info.is_main else None)
    return result


def _profile(trainer, measured: list[dict], path: Path | None) -> dict:
    """One (even, odd) pair of each measured stage again, under the profiler, after the timing (the
    profiler slows what it watches): the top kernels, the device's idle time, the table and trace."""
    from speedrun.bench.step import profile_calls

    steps = [s for st in measured for s in st["steps"][:2]]
    return profile_calls(lambda j: trainer.train_step(steps[j]), len(steps), trainer.device, path)


def schedule_seconds(cfg: RecordRunConfig, rate: dict[int, float]) -> float | None:
    """The schedule's time from the stages' ms per step; a stage too short for a timed pair runs at
    the rate of the last timed one before it. None when a stage has no such rate (`--stages`)."""
    total = 0.0
    for k, (start, end) in enumerate(zip(stages.stage_ends(cfg.stages), stages.stage_ends(cfg.stages)[1:])):
        known = [j for j in rate if j <= k]
        if not known or (k not in rate and k < stages.N_STAGES - 1):
            return None
        total += (end - start) * rate[max(known)] / 1000
    return total


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _time_stage(trainer, cfg: RecordRunConfig, k: int, steps: list[int], t_start: float) -> dict:
    """Two untimed steps (compile), then the timed pairs; ms per step, spread, peak memory."""
    dev = trainer.device
    t0 = time.time()
    for s in steps[:2]:
        trainer.train_step(s)
    _sync(dev)
    warm_s = time.time() - t0
    if dev.type == "cuda":
        torch.cuda.reset_peak_memory_stats(dev)
    pair_ms = []
    for i in range(2, len(steps), 2):
        _sync(dev)
        t = time.perf_counter()
        trainer.train_step(steps[i])
        loss = trainer.train_step(steps[i + 1])
        _sync(dev)
        pair_ms.append((time.perf_counter() - t) * 1000)
    plan = stages.step_plan(cfg.stages, steps[0], cfg.docs)
    return {"stage": k, "steps": steps[2:], "tokens_per_step": plan.tokens_per_step,
            "windows": [plan.short_window, plan.long_window], "warm_s": warm_s,
            "since_start_s": time.time() - t_start, "pair_ms": pair_ms,
            "ms_per_step": float(np.mean(pair_ms)) / 2, "pair_ms_min": min(pair_ms), "pair_ms_max": max(pair_ms),
            "peak_memory_gib": torch.cuda.max_memory_allocated(dev) / 2**30 if dev.type == "cuda" else None,
            "last_loss": float(loss)}


def _stage_line(s: dict) -> str:
    peak = f"{s['peak_memory_gib']:.1f}" if s["peak_memory_gib"] is not None else "-"
    return (f"{s['stage']:>5} {s['tokens_per_step']:>8} {str(tuple(s['windows'])):>11} {s['ms_per_step']:>9.1f} "
            f"{s['pair_ms_min']:>8.1f}/{s['pair_ms_max']:<8.1f} {peak:>9} {s['warm_s']:>9.1f} {s['last_loss']:>9.4f}")


def nonfinite_stages(r: dict) -> list[int]:
    """The measured stages whose last training loss is NaN or infinite: their steps are broken, so
    their timings measure something other than the record's step."""
    return [s["stage"] for s in r["stages"] if not np.isfinite(s["last_loss"])]


def format_report(r: dict) -> str:
    d = r["describe"]
    lines = [f"bench {r['preset']}: {r['device']}, {r['world_size']} rank(s) x {d['micro_steps']} micro-step(s), "
             f"attention {d['attention_backend']}, fp8 head/mlp {d['fp8_head']}/{d['fp8_mlp']}, compile {d['compile']}",
             f"{'stage':>5} {'tokens':>8} {'windows':>11} {'ms/step':>9} {'pair min/max ms':>17} {'peak GiB':>9} "
             f"{'compile s':>9} {'last loss':>9}"]
    lines += [_stage_line(s) for s in r["stages"]]
    if r["schedule_s"] is not None:
        lines.append(f"the {r['schedule_steps']}-step schedule at these rates: {r['schedule_s']:.1f} s")
    return "\n".join(lines)
