"""The 2026-07 record's staged schedule against the specification's own numbers
(../shared/spec/record-2026-07.md: "Schedules", "YaRN", "Validation and timing",
"Scaling the schedule") and, for YaRN, an independent float64 computation."""

import math

import pytest
import torch

from speedrun.data.documents import DocumentConfig
from speedrun.errors import ConfigError
from speedrun.train import stages
from speedrun.train.stages import StageConfig, scaled

RECORD = StageConfig()

# The spec's "Scaling the schedule" table, one dict per column.
TABLE = {
    "record": dict(
        n=1285, s=1270, e=15, ends=(0, 423, 847, 1270, 1285), lengths=(423, 424, 423, 15),
        split=847, cooldown=(508, 762),
        warmup=(0, 1, *range(421, 425), *range(845, 849), *range(1268, 1272)),
        tokens=338_821_120, lr=(0.912, 1.027, 0.152),
        validations=(0, 250, 500, 750, 1000, 1250, 1285),
    ),
    "proxy-161": dict(
        n=161, s=159, e=2, ends=(0, 53, 106, 159, 161), lengths=(53, 53, 53, 2),
        split=107, cooldown=(63, 96),
        warmup=(0, 1, *range(51, 55), *range(104, 108), *range(157, 161)),
        tokens=42_467_328, lr=(0.921, 1.022, 0.166), validations=(0, 161),
    ),
    "322": dict(
        n=322, s=318, e=4, ends=(0, 106, 212, 318, 322), lengths=(106, 106, 106, 4),
        split=213, cooldown=(127, 191),
        warmup=(0, 1, *range(104, 108), *range(210, 214), *range(316, 320)),
        tokens=84_934_656, lr=(0.917, 1.027, 0.158), validations=(0, 250, 322),
    ),
}


@pytest.fixture(params=list(TABLE), ids=list(TABLE))
def column(request):
    col = TABLE[request.param]
    return scaled(col["n"]), col


def test_scaled_splits_steps_into_scheduled_and_extension(column):
    cfg, col = column
    assert (cfg.scheduled_steps, cfg.extension_steps) == (col["s"], col["e"])
    assert cfg.total_steps == col["n"]
    # only S and E scale
    assert cfg == StageConfig(scheduled_steps=col["s"], extension_steps=col["e"])


def test_scaled_record_is_the_record():
    assert scaled(1285) == RECORD


def test_too_short_a_run_is_refused():
    assert scaled(4).scheduled_steps == 3
    with pytest.raises(ConfigError):
        scaled(3)


def test_stage_ends_and_lengths(column):
    cfg, col = column
    ends = stages.stage_ends(cfg)
    assert ends == col["ends"]
    assert tuple(b - a for a, b in zip(ends, ends[1:])) == col["lengths"]


def test_stage_index_at_boundaries(column):
    cfg, col = column
    ends = col["ends"]
    for i in range(4):
        assert stages.stage_index(cfg, ends[i]) == i
        assert stages.stage_index(cfg, ends[i + 1] - 1) == i
    assert stages.stage_index(cfg, cfg.total_steps) == 3  # the final validation's step
    with pytest.raises(ValueError):
        stages.stage_index(cfg, cfg.total_steps + 1)
    with pytest.raises(ValueError):
        stages.stage_index(cfg, -1)


def test_split_step_and_cooldown(column):
    cfg, col = column
    assert stages.split_step(cfg) == col["split"]
    c = stages.cooldown_start(cfg)
    assert (c, cfg.scheduled_steps - c) == col["cooldown"]


def test_warmup_steps(column):
    cfg, col = column
    assert stages.warmup_steps(cfg) == col["warmup"]


def test_warmup_steps_drop_negative_offsets():
    # S = 3: stage 2 starts at 1, so its b-2 would be -1
    cfg = scaled(4)
    assert stages.stage_ends(cfg) == (0, 1, 2, 3, 4)
    assert stages.warmup_steps(cfg) == (0, 1, 2, 3, 4)


def test_training_tokens(column):
    cfg, col = column
    assert stages.training_tokens(cfg) == col["tokens"]
    per_step = sum(stages.tokens_per_step(cfg, s) for s in range(cfg.total_steps))
    assert per_step == col["tokens"]


def test_lr_at_stage_two_end_stage_three_start_and_last_scheduled_step(column):
    cfg, col = column
    ends = col["ends"]
    got = [stages.lr_multiplier(cfg, s) for s in (ends[2] - 1, ends[2], cfg.scheduled_steps - 1)]
    assert [round(x, 3) for x in got] == list(col["lr"])


def test_lr_shape_in_every_column(column):
    cfg, col = column
    ends, c = col["ends"], col["cooldown"][0]
    assert all(stages.lr_multiplier(cfg, s) == 1.0 for s in range(ends[1]))
    assert all(stages.lr_multiplier(cfg, s) == 1.52 for s in range(ends[1], c + 1))
    assert stages.lr_multiplier(cfg, c + 1) < 1.52
    assert all(stages.lr_multiplier(cfg, s) == 0.15 for s in range(cfg.scheduled_steps, cfg.total_steps + 1))


def test_record_lr_values():
    lr = [stages.lr_multiplier(RECORD, s) for s in range(1286)]
    assert lr[:423] == [1.0] * 423
    assert lr[423:509] == [1.52] * 86
    assert round(lr[846], 3) == 0.912
    assert round(lr[847], 3) == 1.027
    assert round(lr[1269], 3) == 0.152
    assert lr[1270:] == [0.15] * 16
    # the blend itself, at one point: tau' = (1000 - 508) / 762 in stage 3
    t = (1000 - 508) / 762
    assert lr[1000] == pytest.approx(1.73 * (1 - t) + 0.15 * t, rel=1e-15)


def test_validation_steps(column):
    cfg, col = column
    assert stages.validation_steps(cfg) == col["validations"]


def test_momentum_record():
    mu = [stages.muon_momentum(RECORD, s) for s in range(1286)]
    assert mu[0] == pytest.approx(0.85)
    assert mu[150] == pytest.approx(0.90)
    assert mu[300] == 0.95 and mu[1235] == 0.95
    assert mu[1236] == pytest.approx(0.948)
    assert round(mu[1284], 3) == 0.852
    assert mu[1285] == pytest.approx(0.85)


def test_momentum_proxy_161_never_cools_down():
    cfg = scaled(161)
    for s in range(162):
        assert stages.muon_momentum(cfg, s) == pytest.approx(0.85 + s / 3000, abs=1e-12)
    assert round(stages.muon_momentum(cfg, 160), 3) == 0.903


def test_momentum_322_drops_at_300():
    cfg = scaled(322)
    assert round(stages.muon_momentum(cfg, 299), 4) == 0.9497
    assert round(stages.muon_momentum(cfg, 300), 3) == 0.894
    assert round(stages.muon_momentum(cfg, 321), 3) == 0.852


RECORD_WINDOWS = [(128, 384), (384, 896), (640, 1408), (768, 1664)]


def test_windows_batch_and_lengths_per_stage():
    ends = stages.stage_ends(RECORD)
    n_loc = [16_384, 32_768, 49_152, 49_152]
    tokens = [131_072, 262_144, 393_216, 393_216]
    l_max = [896, 2048, 2048, 2048]
    for i in range(4):
        for s in (ends[i], (ends[i] + ends[i + 1]) // 2, ends[i + 1] - 1):
            assert stages.windows(RECORD, s) == RECORD_WINDOWS[i]
            assert stages.tokens_per_step(RECORD, s) == tokens[i]
            assert stages.local_tokens(RECORD, s) == n_loc[i]
            assert stages.max_doc_len(RECORD, s) == l_max[i]
    assert stages.final_val_windows(RECORD) == (768, 2560)


def _lerp(a, b, t):
    return a + (b - a) * t


@pytest.mark.parametrize(
    "step, mtp, pi",
    [
        (0, (1.0, 0.5, 0.25), 0.25),
        (211, (1.0, 0.5, _lerp(0.25, 0.0, 211 / 423)), 0.25),
        (422, (1.0, 0.5, 0.25 / 423), 0.25),
        (423, (1.0, 0.5), 0.25),
        (635, (1.0, 0.25), 0.125),
        (846, (1.0, 0.5 / 424), 0.25 / 424),
        (847, (1.0,), 0.0),
        (1269, (1.0,), 0.0),
        (1270, (1.0,), 0.0),
        (1285, (1.0,), 0.0),
    ],
)
def test_mtp_and_prefix_weights_record(step, mtp, pi):
    got = stages.mtp_weights(RECORD, step)
    assert len(got) == len(mtp)
    assert got == pytest.approx(mtp, abs=1e-15)
    assert stages.prefix_weight(RECORD, step) == pytest.approx(pi, abs=1e-15)


def test_mtp_within_a_scaled_stage():
    cfg = scaled(161)
    tau = (80 - 53) / (106 - 53)
    assert stages.stage_progress(cfg, 80) == tau
    assert stages.mtp_weights(cfg, 80) == pytest.approx((1.0, 0.5 * (1 - tau)), abs=1e-15)
    assert stages.prefix_weight(cfg, 80) == pytest.approx(0.25 * (1 - tau), abs=1e-15)


def test_step_flags():
    plan = stages.step_plan(RECORD, 847, DocumentConfig(max_docs_mult=4))
    assert plan.split_step and plan.adam_step and plan.stage_start and plan.stage == 2
    assert plan.max_docs == 512 and plan.long_window == 1408 and plan.lr_mul == stages.lr_multiplier(RECORD, 847)
    p846 = stages.step_plan(RECORD, 846)
    assert not (p846.split_step or p846.adam_step or p846.stage_start or p846.validates)
    assert [s for s in range(1286) if stages.is_stage_start(RECORD, s)] == [423, 847, 1270]
    assert stages.step_plan(RECORD, 250).validates and not stages.step_plan(RECORD, 251).validates
    fwd = [s for s in range(40) if stages.fp8_bootstrap_forward(RECORD, s)]
    refresh = [s for s in range(40) if stages.fp8_bootstrap_refresh(RECORD, s)]
    assert fwd == list(range(17)) and refresh == list(range(16))


def _freqs64(n=32):
    return [1024.0 ** (-j / 31) for j in range(n)]


def _yarn64(freqs, old, new):
    # the spec's rule, element by element in float64
    out = []
    for f in freqs:
        r = old * f / (2 * math.pi)
        w = min(1.0, max(0.0, (r - 1) / 31))
        out.append(f * (old / new + w * (1 - old / new)))
    return out


def test_yarn_attn_scale_sequence():
    scales = [stages.yarn_state(RECORD, i)[1] for i in range(4)]
    assert scales == pytest.approx([0.1, 0.116946, 0.127518, 0.131778], abs=5e-7)
    # the final validation (step == total) stays in the extension's state
    assert stages.stage_index(RECORD, 1285) == 3


def test_yarn_frequencies_after_one_transition():
    freqs, scale = stages.yarn_state(RECORD, 1)
    want = _yarn64(_freqs64(), 384, 896)
    assert freqs.dtype == torch.float32
    torch.testing.assert_close(freqs, torch.tensor(want, dtype=torch.float32), rtol=2e-6, atol=0)
    assert scale == pytest.approx(0.1 * (1 + 0.2 * math.log(896 / 384)), rel=1e-15)
    # the ramp is exercised: some frequencies kept, some fully slowed, some between
    ratio = torch.tensor(want, dtype=torch.float64) / torch.tensor(_freqs64(), dtype=torch.float64)
    assert (ratio == 1).any() and (ratio == 384 / 896).any()
    assert ((ratio > 384 / 896) & (ratio < 1)).any()


def test_yarn_three_transitions_match_float64():
    want = _freqs64()
    for old, new in ((384, 896), (896, 1408), (1408, 1664)):
        want = _yarn64(want, old, new)
    freqs, _ = stages.yarn_state(RECORD, 3)
    torch.testing.assert_close(freqs, torch.tensor(want, dtype=torch.float32), rtol=5e-6, atol=0)


