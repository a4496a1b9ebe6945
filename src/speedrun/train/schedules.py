"""Everything that changes during a run, as a function of progress.

progress = step / steps, so `--steps N` scales every schedule of a preset
(the record's 1695 steps become proxy-212's 212 with the same shapes).
"""

from __future__ import annotations

import math

from speedrun.config import AttentionConfig, ScheduleConfig


def lr_multiplier(progress: float, s: ScheduleConfig) -> float:
    """Optional linear warm-up, constant, then linear cooldown to final_lr_frac."""
    if s.warmup_frac and progress < s.warmup_frac:
        return (progress + 1e-12) / s.warmup_frac
    if s.cooldown_frac <= 0 or progress < 1 - s.cooldown_frac:
        return 1.0
    w = (1 - progress) / s.cooldown_frac
    return w * 1.0 + (1 - w) * s.final_lr_frac


def muon_momentum(progress: float, s: ScheduleConfig, start: float, end: float) -> float:
    """Linear momentum warm-up from `start` to `end` over momentum_warmup_frac."""
    if s.momentum_warmup_frac <= 0:
        return end
    frac = min(progress / s.momentum_warmup_frac, 1.0)
    return (1 - frac) * start + frac * end


UNLIMITED_BLOCKS = 1 << 30


def window_blocks(progress: float, a: AttentionConfig) -> int:
    """Long sliding window in blocks of `a.block_size` tokens.

    growing: ceil_to_block(window_tokens * progress), at least one block
    (the record: 128 -> 1792 tokens, 1 -> 14 blocks). fixed: the final window
    from the start. none: unlimited (full causal attention).
    """
    if a.window == "none":
        return UNLIMITED_BLOCKS
    if a.window == "fixed":
        return max(1, math.ceil(a.window_tokens / a.block_size))
    return max(1, math.ceil(a.window_tokens * progress / a.block_size))
