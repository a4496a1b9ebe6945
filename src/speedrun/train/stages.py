"""The 2026-07 record's staged schedule (#89), as pure functions of the step.

The 2025-08 schedules in `schedules.py` are functions of progress = step / steps,
because that record scales every shape with the run length. The 2026 record does
not: it runs in stages whose boundaries scale with the scheduled step count S
while token counts, windows, multipliers and several absolute-step constants
(momentum warm-up 300 and cool-down 50, validation every 250, Adam on odd steps,
the FP8 bootstrap) stay put. So every function here takes the integer step and
one frozen `StageConfig`, and derives stage boundaries with the record's own
arithmetic (float64 products, Python's round-half-to-even, floor for the
cooldown start), which is what makes the scaled tables of the specification
come out exactly.

Nothing here holds state: the training loop asks `step_plan(cfg, step)` what to
do at a step, and `yarn_state` rebuilds the RoPE frequencies and softmax scale of
any stage from the initial ones, so the untimed warm-up's reset is just "ask
again for step 0".

Stages are indexed from 0: 0, 1, 2 are the specification's stages 1-3 and 3 is
the extension. Source: ../shared/spec/record-2026-07.md, sections "Schedules",
"YaRN", "Validation and timing", "Scaling the schedule" and "FP8".
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import NamedTuple

import torch

from speedrun.data.documents import DocumentConfig, train_max_docs
from speedrun.errors import ConfigError
from speedrun.model import record_parts

N_STAGES = 4  # three scheduled stages and the extension


@dataclass(frozen=True)
class StageConfig:
    """The record's schedule constants (spec: "Schedules", "YaRN", "Validation and
    timing", "Scaling the schedule"; the FP8 bootstrap from "FP8"). Per-stage tuples
    have one entry per stage, the extension last. `scaled(N)` changes only
    scheduled_steps and extension_steps."""

    scheduled_steps: int = 1270  # S
    extension_steps: int = 15  # E
    stage_fracs: tuple[float, float] = (1 / 3, 2 / 3)  # ends of stages 1 and 2, as fractions of S
    tokens_per_step: tuple[int, ...] = (131_072, 262_144, 393_216, 393_216)
    piece_sets_per_step: int = 8  # micro-batches of n_loc tokens per step, whatever the world size
    max_doc_len: tuple[int, ...] = (896, 2048, 2048, 2048)  # L_max
    block_tokens: int = 128
    window_blocks: tuple[tuple[int, int], ...] = ((1, 3), (3, 7), (5, 11), (6, 13))  # (short, long)
    final_val_window_blocks: tuple[int, int] = (6, 20)  # 768 / 2560 tokens, no YaRN
    lr_mul: tuple[float, ...] = (1.0, 1.52, 1.73, 1.0)  # the extension's 1.0 never shows (tau' = 1)
    lr_floor: float = 0.15
    cooldown_frac: float = 0.6
    # MTP weights: a stage's list moves linearly from its start to its end values
    mtp_start: tuple[tuple[float, ...], ...] = ((1.0, 0.5, 0.25), (1.0, 0.5), (1.0,), (1.0,))
    mtp_end: tuple[tuple[float, ...], ...] = ((1.0, 0.5, 0.0), (1.0, 0.0), (1.0,), (1.0,))
    prefix_start: tuple[float, ...] = (0.25, 0.25, 0.0, 0.0)  # prefix-token CE weight pi
    prefix_end: tuple[float, ...] = (0.25, 0.0, 0.0, 0.0)
    momentum_start: float = 0.85
    momentum_peak: float = 0.95
    momentum_warmup_steps: int = 300
    momentum_cooldown_steps: int = 50  # the last steps, 0.95 back towards 0.85
    split_stage: int = 2  # embed and head untie at this stage's start (made odd)
    warmup_first_steps: tuple[int, ...] = (0, 1)
    warmup_offsets: tuple[int, ...] = (-2, -1, 0, 1)  # around the starts of stages 2, 3 and S
    val_every: int = 250  # 0: validate only at the end
    # cu_seqlens length N_max per n_loc; other n_loc: floor(n_loc / 300) up to a multiple of 128
    fp8_bootstrap_refreshes: int = 16  # the FP8 refreshes after steps 0-15 bootstrap
    attn_scale_start: float = 0.1  # before the first YaRN update (the update's rule: record_parts.yarn)

    def __post_init__(self) -> None:
        # Fewer than 3 scheduled steps leaves a stage empty, and the split step undefined.
        if self.scheduled_steps < 3 or self.extension_steps < 0:
            raise ConfigError(
                f"stage schedule: need scheduled_steps >= 3 and extension_steps >= 0, "
                f"got {self.scheduled_steps} and {self.extension_steps}"
            )
        per_stage = (self.tokens_per_step, self.max_doc_len, self.window_blocks, self.lr_mul,
                     self.mtp_start, self.mtp_end, self.prefix_start, self.prefix_end)
        if any(len(t) != N_STAGES for t in per_stage):
            raise ConfigError(f"stage schedule: every per-stage tuple needs {N_STAGES} entries")

    @property
    def total_steps(self) -> int:
        return self.scheduled_steps + self.extension_steps


def scaled(total_steps: int, base: StageConfig | None = None) -> StageConfig:
    """The schedule of a run of N = total_steps steps: E = max(1, round(15 N / 1285)),
    S = N - E, with 15 and 1285 the base's E and S + E (1285 -> 1270 + 15,
    161 -> 159 + 2, 322 -> 318 + 4). Everything else is kept."""
    base = base if base is not None else StageConfig()
    # The integer product is exact; the one division is the only rounding, and
    # 15 N / 1285 never lands on a half for integer N.
    ext = max(1, round(base.extension_steps * total_steps / base.total_steps))
    return replace(base, scheduled_steps=total_steps - ext, extension_steps=ext)


# ---- stage boundaries -------------------------------------------------------------------


def stage_ends(cfg: StageConfig) -> tuple[int, ...]:
    """[0, round(S/3), round(2S/3), S, S+E] with float64 products and half-to-even."""
    s = cfg.scheduled_steps
    inner = tuple(round(s * f) for f in cfg.stage_fracs)
    return (0, *inner, s, cfg.total_steps)


def _check_step(cfg: StageConfig, step: int) -> None:
    # step == total is the final validation's step, which the loop also schedules.
    if not 0 <= step <= cfg.total_steps:
        raise ValueError(f"step {step} outside 0..{cfg.total_steps}")


def stage_index(cfg: StageConfig, step: int) -> int:
    """0, 1, 2 for stages 1-3, 3 for the extension (and for step == total)."""
    _check_step(cfg, step)
    ends = stage_ends(cfg)
    return next((i for i in range(N_STAGES) if step < ends[i + 1]), N_STAGES - 1)


def stage_progress(cfg: StageConfig, step: int) -> float:
    """tau = (step - start) / (end - start) in the step's stage; the last step of a
    stage has (len - 1) / len, and step == total has 1."""
    i = stage_index(cfg, step)
    start, end = stage_ends(cfg)[i : i + 2]
    return (step - start) / (end - start)


def is_stage_start(cfg: StageConfig, step: int) -> bool:
    """Whether windows, YaRN, batch size, L_max and MTP/pi change before this step's forward."""
    return step in stage_ends(cfg)[1:N_STAGES]


def split_step(cfg: StageConfig) -> int:
    """The start of stage 3, made odd so the untying lands on an Adam step."""
    return stage_ends(cfg)[cfg.split_stage] | 1


def cooldown_start(cfg: StageConfig) -> int:
    """c = floor(S (1 - 0.6))."""
    return math.floor(cfg.scheduled_steps * (1 - cfg.cooldown_frac))


def warmup_steps(cfg: StageConfig) -> tuple[int, ...]:
    """The untimed warm-up's steps: {0, 1} and b-2 .. b+1 around the starts of stages 2,
    3 and S (values < 2 dropped from the second part), so each compiled shape is met."""
    ends = stage_ends(cfg)[1:N_STAGES]
    around = {b + o for b in ends for o in cfg.warmup_offsets if b + o >= 2}
    return tuple(sorted(set(cfg.warmup_first_steps) | around))


def validation_steps(cfg: StageConfig) -> tuple[int, ...]:
    """Every val_every steps from 0, and the end (step == total)."""
    return tuple(s for s in range(cfg.total_steps + 1) if validates(cfg, s))


def validates(cfg: StageConfig, step: int) -> bool:
    _check_step(cfg, step)
    periodic = cfg.val_every > 0 and step % cfg.val_every == 0
    return periodic or step == cfg.total_steps


# ---- batch shape ------------------------------------------------------------------------


def tokens_per_step(cfg: StageConfig, step: int) -> int:
    return cfg.tokens_per_step[stage_index(cfg, step)]


def local_tokens(cfg: StageConfig, step: int) -> int:
    """n_loc: the tokens of one rank's micro-batch, tokens/step / 8 at every world size."""
    return tokens_per_step(cfg, step) // cfg.piece_sets_per_step


def training_tokens(cfg: StageConfig) -> int:
    """The tokens of the whole run: the sum of tokens/step over steps 0 .. total-1."""
    ends = stage_ends(cfg)
    return sum((ends[i + 1] - ends[i]) * cfg.tokens_per_step[i] for i in range(N_STAGES))


def max_doc_len(cfg: StageConfig, step: int) -> int:
    """L_max: documents are cut to this many tokens."""
    return cfg.max_doc_len[stage_index(cfg, step)]


# ---- attention windows and YaRN ---------------------------------------------------------


def windows(cfg: StageConfig, step: int) -> tuple[int, int]:
    """(short, long) sliding windows in tokens for training and intermediate validation."""
    short, long = cfg.window_blocks[stage_index(cfg, step)]
    return short * cfg.block_tokens, long * cfg.block_tokens


def final_val_windows(cfg: StageConfig) -> tuple[int, int]:
    """(short, long) of the final validation: 768 / 2560, set without a YaRN update."""
    short, long = cfg.final_val_window_blocks
    return short * cfg.block_tokens, long * cfg.block_tokens


def yarn_state(
    cfg: StageConfig,
    stage: int,
    dtype: torch.dtype = torch.float32,
    device: torch.device | str | None = None,
    pairs: int = 32,
    base: float = 1024.0,
) -> tuple[torch.Tensor, float]:
    """RoPE frequencies and attn_scale in force during `stage` (0..3): the initial ones
    with YaRN applied at every stage start whose long window changed (384 -> 896 ->
    1408 -> 1664 in the record: attn_scale 0.1 -> 0.116946 -> 0.127518 -> 0.131778).
    The final validation keeps the extension's values. pairs and base: the model's rotary
    (`RecordModelConfig.rope_pairs`, `rope_base`)."""
    if not 0 <= stage < N_STAGES:
        raise ValueError(f"stage {stage} outside 0..{N_STAGES - 1}")
    freqs, scale = record_parts.rope_freqs(pairs, base).to(device=device, dtype=dtype), cfg.attn_scale_start
    longs = [b[1] * cfg.block_tokens for b in cfg.window_blocks]
    for old, new in zip(longs[:stage], longs[1 : stage + 1]):
        if new != old:
            freqs, scale = record_parts.yarn(freqs, scale, old, new)
            freqs = freqs.to(dtype)
    return freqs, scale


class FinalEvaluation(NamedTuple):
    """How a finished run's model is evaluated: the final validation's (short, long) windows in tokens,
    and the extension's softmax scale and float32 rotary frequencies (sample, export and eval use it)."""

    windows: tuple[int, int]
    attn_scale: float
    freqs: torch.Tensor


def final_evaluation(cfg: StageConfig, pairs: int, base: float) -> FinalEvaluation:
    freqs, scale = yarn_state(cfg, N_STAGES - 1, pairs=pairs, base=base)
    return FinalEvaluation(final_val_windows(cfg), scale, freqs)


# ---- optimiser and loss weights ---------------------------------------------------------


def lr_multiplier(cfg: StageConfig, step: int) -> float:
    """s(step): the stage's lr_mul, and from the cooldown start c a linear blend towards
    0.15 reached at S, so the extension runs at 0.15. No warm-up."""
    mul = cfg.lr_mul[stage_index(cfg, step)]
    c = cooldown_start(cfg)
    if step < c:
        return mul
    t = min(1.0, (step - c) / (cfg.scheduled_steps - c))
    return mul * (1 - t) + cfg.lr_floor * t


def muon_momentum(cfg: StageConfig, step: int) -> float:
    """0.85 -> 0.95 over the first 300 steps, 0.95, then back towards 0.85 over the last
    50 (step > total - 50). The warm-up rule wins where both apply: that is the record's
    order, and what makes a 322-step run drop from 0.9497 to 0.894 at step 300."""
    _check_step(cfg, step)
    rise = cfg.momentum_peak - cfg.momentum_start
    if step < cfg.momentum_warmup_steps:
        return cfg.momentum_start + rise * step / cfg.momentum_warmup_steps
    cd_start = cfg.total_steps - cfg.momentum_cooldown_steps
    if step > cd_start:
        return cfg.momentum_peak - rise * (step - cd_start) / cfg.momentum_cooldown_steps
    return cfg.momentum_peak


def mtp_weights(cfg: StageConfig, step: int) -> tuple[float, ...]:
    """Weights of the next-token and multi-token CE terms, a + (b - a) tau per entry."""
    i, t = stage_index(cfg, step), stage_progress(cfg, step)
    return tuple(a + (b - a) * t for a, b in zip(cfg.mtp_start[i], cfg.mtp_end[i]))


def prefix_weight(cfg: StageConfig, step: int) -> float:
    """pi, the prefix-token CE weight, a + (b - a) tau like the MTP weights."""
    i, t = stage_index(cfg, step), stage_progress(cfg, step)
    a, b = cfg.prefix_start[i], cfg.prefix_end[i]
    return a + (b - a) * t


def adam_steps(step: int) -> bool:
    """Adam updates on odd steps only, with the gradients of the even step before."""
    return step % 2 == 1


def fp8_bootstrap_refresh(cfg: StageConfig, step: int) -> bool:
    """Whether the FP8 MLP refresh after this step's update uses the bootstrap scales."""
    return 0 <= step < cfg.fp8_bootstrap_refreshes


def fp8_bootstrap_forward(cfg: StageConfig, step: int) -> bool:
    """Whether this step's forwards see bootstrap scales: those set before training and
    by the refreshes after steps 0-15, so forwards 0-16."""
    return 0 <= step <= cfg.fp8_bootstrap_refreshes


# ---- everything about one step ----------------------------------------------------------


@dataclass(frozen=True)
class StepPlan:
    """What the training loop does at one step (windows are the training ones)."""

    step: int
    stage: int
    tau: float
    stage_start: bool
    tokens_per_step: int
    local_tokens: int
    max_doc_len: int
    max_docs: int
    short_window: int
    long_window: int
    lr_mul: float
    momentum: float
    mtp_weights: tuple[float, ...]
    prefix_weight: float
    adam_step: bool
    split_step: bool
    validates: bool
    fp8_bootstrap_forward: bool


def step_plan(cfg: StageConfig, step: int, docs: DocumentConfig = DocumentConfig()) -> StepPlan:
    """All of the schedule at `step`; N_max by the loader's rule (`documents.train_max_docs`, whose
    `max_docs_mult` raises the bound for corpora of shorter documents)."""
    n_loc = local_tokens(cfg, step)
    short, long = windows(cfg, step)
    return StepPlan(
        step=step,
        stage=stage_index(cfg, step),
        tau=stage_progress(cfg, step),
        stage_start=is_stage_start(cfg, step),
        tokens_per_step=tokens_per_step(cfg, step),
        local_tokens=n_loc,
        max_doc_len=max_doc_len(cfg, step),
        max_docs=train_max_docs(n_loc, docs),
        short_window=short,
        long_window=long,
        lr_mul=lr_multiplier(cfg, step),
        momentum=muon_momentum(cfg, step),
        mtp_weights=mtp_weights(cfg, step),
        prefix_weight=prefix_weight(cfg, step),
        adam_step=adam_steps(step),
        split_step=step == split_step(cfg),
        validates=validates(cfg, step),
        fp8_bootstrap_forward=fp8_bootstrap_forward(cfg, step),
    )
