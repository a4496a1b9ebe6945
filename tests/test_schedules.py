import pytest

from speedrun.config import AttentionConfig, ScheduleConfig
from speedrun.train.schedules import lr_multiplier, muon_momentum, window_blocks


def test_lr_cooldown():
    s = ScheduleConfig()
    assert lr_multiplier(0.0, s) == 1.0
    assert lr_multiplier(0.549, s) == 1.0
    assert lr_multiplier(1.0, s) == pytest.approx(0.1)
    assert lr_multiplier(0.775, s) == pytest.approx(0.55)


def test_momentum_warmup_scales_with_steps():
    s = ScheduleConfig()
    assert muon_momentum(0.0, s, 0.85, 0.95) == pytest.approx(0.85)
    # record: 300 of 1695 steps; proxy-212: the same fraction
    assert muon_momentum(150 / 1695, s, 0.85, 0.95) == pytest.approx(0.90)
    assert muon_momentum(0.5, s, 0.85, 0.95) == pytest.approx(0.95)


def test_window_grows_from_one_to_fourteen_blocks():
    a = AttentionConfig()
    assert window_blocks(0.0, a) == 1
    assert window_blocks(1.0, a) == 14
    assert window_blocks(128 / 1728, a) == 1
    assert window_blocks(129 / 1728, a) == 2
    steps = 212
    seen = [window_blocks(s / steps, a) for s in range(steps + 1)]
    assert seen == sorted(seen) and set(seen) == set(range(1, 15))
