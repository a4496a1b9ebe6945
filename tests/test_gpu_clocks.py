"""gpu_clocks: sampling the SM clock and power through nvidia-smi (a stand-in script on the CPU)."""

import stat
import textwrap
import time

import pytest
import torch

from speedrun.bench import gpu_clocks as gc


def _fake_smi(tmp_path, rows, legacy=False, fail=False):
    """An executable that answers --query-gpu like nvidia-smi: `rows` (CSV lines) cycled one per call.
    legacy: rejects clocks_event_reasons.* as an older driver does; fail: always exits 6."""
    state = tmp_path / "calls"
    state.write_text("0")
    lines = "\n".join(rows)
    script = tmp_path / "nvidia-smi"
    script.write_text(textwrap.dedent(f"""\
        #!/usr/bin/env python3
        import sys
        args = " ".join(sys.argv[1:])
        if {fail!r} or ({legacy!r} and "clocks_event_reasons" in args):
            print('Field "clocks_event_reasons.sw_power_cap" is not a valid field to query.', file=sys.stderr)
            sys.exit(2 if not {fail!r} else 6)
        assert "-i GPU-test" in args and "--format=csv,noheader,nounits" in args, args
        n = int(open({str(state)!r}).read())
        open({str(state)!r}, "w").write(str(n + 1))
        rows = {lines!r}.splitlines()
        print(rows[n % len(rows)])
        """))
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    return str(script)


ROWS = ["1980, 1980, 130.5, 700.00, 42, Not Active, Not Active, Not Active, Not Active, Not Active",
        "1560, 1980, 690.2, 700.00, 58, Active, Not Active, Not Active, Not Active, Not Active",
        "1515, 1980, 695.7, 700.00, 59, Active, Not Active, Not Active, Not Active, Not Active",
        "1620, 1980, 688.0, 700.00, 60, Active, Not Active, Active, Not Active, Not Active"]


def test_summary_of_known_rows():
    rows = [gc.parse_row(line, gc.REASONS) for line in ROWS]
    s = gc.summarize(rows, reasons_known=True)
    assert s["samples"] == 4 and s["sm_clock_mhz_median"] == 1590 and s["sm_clock_mhz_min"] == 1515
    assert s["sm_clock_mhz_max"] == 1980 and s["sm_clock_mhz_card_max"] == 1980
    assert s["power_w_median"] == pytest.approx(689.1) and s["power_w_max"] == pytest.approx(695.7)
    assert s["power_limit_w"] == 700 and s["temperature_c_max"] == 60
    assert s["reason_shares"]["sw_power_cap"] == 0.75 and s["reason_shares"]["sw_thermal_slowdown"] == 0.25
    assert s["reason_shares"]["hw_slowdown"] == 0
    assert s["sm_clock_mhz_mean"] == pytest.approx(1668.75) and s["power_w_mean"] == pytest.approx(551.1)
    text = gc.describe(s)
    assert text.startswith("1,590 MHz median (1,515-1,980; card max 1,980), 689 W median of 700 W limit")
    assert "sw power cap 75%" in text and "sw thermal slowdown 25%" in text and "hw slowdown" not in text


def test_unsupported_values_and_bad_rows():
    row = gc.parse_row("1410, [N/A], [N/A], [Not Supported], 31", ())
    assert row["clocks.sm"] == 1410 and row["power.draw"] is None and row["active"] == []
    assert gc.parse_row("1410, 1980", ()) is None  # a column short
    s = gc.summarize([row], reasons_known=False)
    assert s["power_w_median"] is None and s["reason_shares"] is None
    assert gc.describe(s) == "1,410 MHz median (1,410-1,410), reasons not reported by this driver"
    assert gc.summarize([], reasons_known=True) is None
    assert gc.describe(None).startswith("n/a")


def test_energy_and_cycles_per_step_from_the_means():
    rows = [gc.parse_row(line, gc.REASONS) for line in ROWS[1:]]
    s = gc.summarize(rows, reasons_known=True)  # means 1,565 MHz and 691.3 W
    got = gc.per_step(s, 600.0)
    assert got["energy_j_per_step"] == pytest.approx(414.78) and got["sm_mcycles_per_step"] == pytest.approx(939.0)
    assert gc.describe_per_step(got).startswith("414.8 J, 939.0 M SM cycles")
    assert got["energy_source"] == "sampled" and got["energy_j_per_step_sampled"] == pytest.approx(414.78)
    s["counter"] = {"energy_j": 2100.0, "seconds": 3.0, "power_w": 700.0}  # the counter's mean power wins
    got = gc.per_step(s, 600.0)
    assert got["energy_j_per_step"] == pytest.approx(420.0) and got["energy_source"] == "counter"
    assert got["energy_j_per_step_sampled"] == pytest.approx(414.78)
    assert "energy counter" in gc.describe_per_step(got)
    no_power = gc.summarize([gc.parse_row("1410, [N/A], [N/A], [Not Supported], 31", ())], reasons_known=False)
    got = gc.per_step(no_power, 500.0)
    assert got["energy_j_per_step"] is None and got["sm_mcycles_per_step"] == pytest.approx(705.0)
    assert got["energy_source"] is None and got["energy_j_per_step_sampled"] is None
    assert gc.describe_per_step(got).startswith("705.0 M SM cycles")
    assert gc.per_step(None, 500.0)["energy_j_per_step"] is None
    assert gc.per_step(None, 500.0)["sm_mcycles_per_step"] is None
    assert gc.per_step(s, None)["sm_mcycles_per_step"] is None
    assert gc.describe_per_step(gc.per_step(None, 1.0)).startswith("n/a")


def test_sampler_collects_until_stopped(tmp_path):
    sampler = gc.ClockSampler("GPU-test", interval_s=0.01, smi=_fake_smi(tmp_path, ROWS))
    assert sampler.start()
    deadline = time.monotonic() + 60
    while len(sampler.rows) < 8 and time.monotonic() < deadline:
        time.sleep(0.01)
    s = sampler.stop()
    assert s["samples"] >= 8 and s["sm_clock_mhz_min"] == 1515 and s["sm_clock_mhz_max"] == 1980
    assert s["samples"] == len(sampler.rows)  # the probe's row (the script's first) is not among them
    assert s["counter"] is None  # no energy counter was given
    assert sampler.reasons[0] == "clocks_event_reasons.sw_power_cap"
    assert 0.5 <= s["reason_shares"]["sw_power_cap"] <= 0.85  # 3 of every 4 rows
    assert sampler.stop() is None  # stopping twice is harmless


def test_older_driver_field_names(tmp_path):
    sampler = gc.ClockSampler("GPU-test", interval_s=0.01, smi=_fake_smi(tmp_path, ROWS, legacy=True))
    assert sampler.start()
    deadline = time.monotonic() + 60
    while len(sampler.rows) < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    s = sampler.stop()
    assert sampler.reasons[0] == "clocks_throttle_reasons.sw_power_cap"
    assert s["reason_shares"]["sw_power_cap"] > 0  # rows 2 and 3 of the script (the probe took row 1)


def test_no_sampling_where_it_cannot(tmp_path):
    assert not gc.ClockSampler("GPU-test", smi=_fake_smi(tmp_path, ROWS, fail=True)).start()
    assert not gc.ClockSampler("GPU-test", smi=str(tmp_path / "missing")).start()
    assert not gc.ClockSampler(None, smi=_fake_smi(tmp_path, ROWS)).start()
    sampler = gc.start(torch.device("cpu"))
    assert sampler.stop() is None
    assert gc.device_uuid(torch.device("cpu")) is None


@pytest.mark.gpu
def test_gpu_sampler_sees_the_card_work(cuda):
    """On a GPU machine: a few seconds of matrix products raise the power above idle and every sample
    has a clock; the card's maximum clock is reported."""
    sampler = gc.start(torch.device("cuda"))
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    for _ in range(1000):
        a = (a @ a).clamp_(-1, 1)
    torch.cuda.synchronize()
    s = sampler.stop()
    assert s is not None, "nvidia-smi did not answer for this GPU's uuid"
    assert s["samples"] >= 2 and 0 < s["sm_clock_mhz_median"] <= s["sm_clock_mhz_card_max"]
    assert s["power_w_max"] > 0 and s["reason_shares"] is not None
    per = gc.per_step(s, 100.0)
    assert per["energy_j_per_step"] > 0 and per["sm_mcycles_per_step"] > 0


def test_a_training_run_records_its_clocks(tmp_path, monkeypatch, capsys):
    """`speedrun train` samples from its first timed step to the end and writes the summary, with the
    energy and SM cycles per step, into summary.json and its last lines (a stand-in sampler here: the CPU has no nvidia-smi)."""
    import json

    from reliability_helpers import train

    clocks = gc.summarize([gc.parse_row(ROWS[1], gc.REASONS)], True)
    calls = []

    class Sampler:
        def stop(self):
            calls.append("stop")
            return clocks

    monkeypatch.setattr(gc, "start", lambda device: calls.append(("start", device.type)) or Sampler())
    assert train(tmp_path / "run", steps=3) == 0
    assert calls == [("start", "cpu"), "stop"]
    got = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert got["gpu_clocks"] == clocks
    assert got["energy_j_per_step"] == pytest.approx(690.2 * got["ms_per_step"] / 1e3)
    assert got["sm_mcycles_per_step"] == pytest.approx(1560 * got["ms_per_step"] / 1e3)
    out = capsys.readouterr().out
    assert "GPU clock over the timed run: 1,560 MHz median" in out
    assert f"per step {got['energy_j_per_step']:.1f} J, {got['sm_mcycles_per_step']:.1f} M SM cycles" in out
    from speedrun.tools import compare

    m = compare.load(str(tmp_path / "run"))
    assert m["kind"] == "run" and m["final_val_loss"] == got["final_val_loss"] and m["sm_clock_mhz"] == 1560

