"""The GPU's SM clock, power draw and clock-event reasons while something is being timed.

Why this exists: the same code and the same step ran 611 to 648 ms/step on different H200s of one
cloud (measured at 99b1d90, 2026-12-01). Under this model's load an H200 reaches its 700 W
power limit and the driver lowers the SM clock from 1,980 MHz to 1,500-1,650 MHz; how far depends on
the card. A step time means little without the clock it ran at, so `speedrun bench` and `speedrun
train` record the clock and power of their timed part and say when the power cap or a thermal limit
held the clock down.

How: a background thread runs `nvidia-smi --query-gpu=... --format=csv,noheader,nounits -i UUID`
once per interval (default 0.25 s) and keeps the rows; `stop()` summarises them. The query that finds
the driver's field names at `start()` is not kept: the card is idle then (345 MHz on an H200). nvidia-smi rather than
NVML's Python bindings because every driver install has it and the bindings are not in every image.
One query costs the host a few tens of milliseconds, off the training thread; the device is not
touched. Where nvidia-smi is missing or fails, the summary is None and reports say "n/a": a timing is
never lost for want of its clocks.

Two figures per step come from the same span (`per_step`): the energy (mean power x step time) and
the SM cycles (mean clock x step time). The mean power is the card's own energy counter's over the
span where it can be read (`energy_counter.py`: two reads, exact), else the samples' mean. On a card
held at its power cap the step takes about its energy divided by the cap, so a change that saves
cycles but spends more energy per step runs slower there (1e8865a, 2026-12-02: the weight
gradients on cuBLASLt took 0.9% fewer cycles a step and 0.6% more energy, and the step was 0.6%
slower); an uncapped card sees the cycles. The sampled figures are estimates: the driver's power
reading is itself an average (over one second on recent GPUs) and the samples are 0.25 s apart, so
they need timed parts of tens of seconds; the counter's energy does not, the mean clock still does.

The reasons come from `clocks_event_reasons.*` (drivers from 535 on); older drivers name the same
fields `clocks_throttle_reasons.*`, tried next; failing both, the clocks and power are kept without
reasons.
"""

from __future__ import annotations

import shutil
import statistics
import subprocess
import threading
import time

from speedrun.bench import energy_counter

BASE_FIELDS = ("clocks.sm", "clocks.max.sm", "power.draw", "power.limit", "temperature.gpu")
REASONS = ("sw_power_cap", "hw_slowdown", "sw_thermal_slowdown", "hw_thermal_slowdown", "hw_power_brake_slowdown")
REASON_PREFIXES = ("clocks_event_reasons", "clocks_throttle_reasons")


def device_uuid(device) -> str | None:
    """nvidia-smi's id ("GPU-<uuid>") of a torch CUDA device, or None (not CUDA, or no uuid)."""
    import torch

    if getattr(device, "type", None) != "cuda" or not torch.cuda.is_available():
        return None
    uuid = getattr(torch.cuda.get_device_properties(device), "uuid", None)
    return f"GPU-{uuid}" if uuid is not None else None


def _number(text: str) -> float | None:
    try:
        return float(text.strip())
    except ValueError:  # "[N/A]", "[Not Supported]"
        return None


def parse_row(line: str, reasons: tuple[str, ...]) -> dict | None:
    """One CSV line of BASE_FIELDS then the reason fields; None if it has the wrong number of columns."""
    cells = [c.strip() for c in line.split(",")]
    if len(cells) != len(BASE_FIELDS) + len(reasons):
        return None
    row = {f: _number(c) for f, c in zip(BASE_FIELDS, cells)}
    row["active"] = [r for r, c in zip(reasons, cells[len(BASE_FIELDS):]) if c.lower() == "active"]
    return row


def summarize(rows: list[dict], reasons_known: bool) -> dict | None:
    """Median, min and max SM clock (MHz), the card's maximum, median and max power (W) against the
    limit, the hottest temperature, and the share of samples in which each clock-event reason was
    active (None when the driver gave no reasons). None without a usable sample."""
    clocks = [r["clocks.sm"] for r in rows if r["clocks.sm"] is not None]
    if not clocks:
        return None
    power = [r["power.draw"] for r in rows if r["power.draw"] is not None]
    pick = lambda key: next((r[key] for r in rows if r[key] is not None), None)  # noqa: E731
    temps = [r["temperature.gpu"] for r in rows if r["temperature.gpu"] is not None]
    shares = None
    if reasons_known:
        shares = {why: sum(why in r["active"] for r in rows) / len(rows) for why in REASONS}
    return {"samples": len(rows), "sm_clock_mhz_median": statistics.median(clocks), "sm_clock_mhz_min": min(clocks),
            "sm_clock_mhz_max": max(clocks), "sm_clock_mhz_card_max": pick("clocks.max.sm"),
            "sm_clock_mhz_mean": statistics.fmean(clocks),
            "power_w_median": statistics.median(power) if power else None, "power_w_max": max(power, default=None),
            "power_w_mean": statistics.fmean(power) if power else None,
            "power_limit_w": pick("power.limit"), "temperature_c_max": max(temps, default=None),
            "reason_shares": shares}


class ClockSampler:
    """Samples one GPU from `start()` to `stop()` in a daemon thread; `stop()` returns `summarize`'s dict
    or None. `smi` is the nvidia-smi executable (a stand-in in tests); `counter` the card's energy counter
    (`energy_counter.open_counter`), read at `start` and `stop`, or None."""

    def __init__(self, gpu: str | None, interval_s: float = 0.25, smi: str = "nvidia-smi",
                 counter: energy_counter.EnergyCounter | None = None):
        self.gpu, self.interval_s, self.smi = gpu, interval_s, smi
        self.span = energy_counter.Span(counter, time.perf_counter)
        self.rows: list[dict] = []
        self.reasons: tuple[str, ...] = ()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _query(self, reasons: tuple[str, ...]) -> list[dict] | None:
        fields = ",".join(BASE_FIELDS + reasons)
        try:
            out = subprocess.run([self.smi, f"--query-gpu={fields}", "--format=csv,noheader,nounits", "-i", self.gpu],
                                 capture_output=True, text=True, timeout=10)
        except (OSError, subprocess.SubprocessError):
            return None
        if out.returncode != 0:
            return None
        rows = [parse_row(line, tuple(r.rsplit(".", 1)[-1] for r in reasons)) for line in out.stdout.splitlines()
                if line.strip()]
        return rows if rows and all(rows) else None

    def _probe(self) -> bool:
        """Find the field names this driver takes. False if none works. The probe's sample is not kept:
        it is taken before the timed work starts (an idle card's clock)."""
        for prefix in REASON_PREFIXES + (None,):
            reasons = tuple(f"{prefix}.{r}" for r in REASONS) if prefix else ()
            if self._query(reasons) is not None:
                self.reasons = reasons
                return True
        return False

    def start(self) -> bool:
        """Begin sampling; False (and nothing runs) without a GPU id or a working nvidia-smi."""
        if self.gpu is None or shutil.which(self.smi) is None or not self._probe():
            return False
        self._thread = threading.Thread(target=self._loop, name="speedrun-gpu-clocks", daemon=True)
        self._thread.start()
        self.span.start()
        return True

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            rows = self._query(self.reasons)
            if rows:
                self.rows.extend(rows)

    def stop(self) -> dict | None:
        """End sampling and summarise the samples taken since `start` (None if the work was shorter
        than one interval)."""
        if self._thread is None:
            return None
        energy = self.span.stop()
        self._stop.set()
        self._thread.join()
        self._thread = None
        summary = summarize(self.rows, bool(self.reasons))
        if summary is not None:
            summary["counter"] = energy  # {"energy_j", "seconds", "power_w"} or None
        return summary


def per_step(summary: dict | None, ms_per_step: float | None) -> dict:
    """The energy (J) and SM cycles (millions) of one step: the mean power and the samples' mean clock
    times the step time; each None where the summary, its power or the step time is missing. The power
    is the energy counter's over the span where it was read ("energy_source": "counter"), else the
    samples' mean ("sampled"); `energy_j_per_step_sampled` keeps the latter either way."""
    none = {"energy_j_per_step": None, "sm_mcycles_per_step": None, "energy_j_per_step_sampled": None,
            "energy_source": None}
    if not summary or ms_per_step is None:
        return none
    sampled = summary.get("power_w_mean")
    counted = (summary.get("counter") or {}).get("power_w")
    power = counted if counted is not None else sampled
    return {"energy_j_per_step": None if power is None else power * ms_per_step / 1e3,
            "sm_mcycles_per_step": summary["sm_clock_mhz_mean"] * ms_per_step / 1e3,
            "energy_j_per_step_sampled": None if sampled is None else sampled * ms_per_step / 1e3,
            "energy_source": None if power is None else ("counter" if counted is not None else "sampled")}


def describe_per_step(figures: dict) -> str:
    """"413.8 J, 963.9 M SM cycles (energy counter's mean power and sampled mean clock x ms/step)", or
    "n/a"."""
    energy, cycles = figures.get("energy_j_per_step"), figures.get("sm_mcycles_per_step")
    if cycles is None:
        return "n/a (no clock samples)"
    parts = ([] if energy is None else [f"{energy:.1f} J"]) + [f"{cycles:.1f} M SM cycles"]
    if figures.get("energy_source") == "counter":
        return ", ".join(parts) + " (energy counter's mean power and sampled mean clock x ms/step)"
    return ", ".join(parts) + " (sampled mean power and clock x ms/step)"


def describe(summary: dict | None) -> str:
    """One line for reports, e.g. "1,560 MHz median (1,515-1,980; card max 1,980), 690 W median of 700 W
    limit, clock held down by: sw power cap 85% of samples", or "n/a (...)"."""
    if not summary:
        return "n/a (no CUDA GPU or no nvidia-smi)"
    s = summary
    card = s["sm_clock_mhz_card_max"]
    span = f"{s['sm_clock_mhz_min']:,.0f}-{s['sm_clock_mhz_max']:,.0f}" + ("" if card is None else f"; card max {card:,.0f}")
    text = f"{s['sm_clock_mhz_median']:,.0f} MHz median ({span})"
    if s["power_w_median"] is not None:
        limit = "" if s["power_limit_w"] is None else f" of {s['power_limit_w']:.0f} W limit"
        text += f", {s['power_w_median']:.0f} W median{limit}"
    shares = s["reason_shares"]
    if shares is None:
        return text + ", reasons not reported by this driver"
    active = [f"{why.replace('_', ' ')} {100 * share:.0f}%" for why, share in shares.items() if share > 0]
    return text + (f", clock held down by: {', '.join(active)} of samples" if active else ", no clock limit active")


def start(device, interval_s: float = 0.25) -> ClockSampler:
    """A started sampler for a torch device (inactive where it cannot sample: `stop()` then gives None)."""
    uuid = device_uuid(device)
    sampler = ClockSampler(uuid, interval_s, counter=energy_counter.open_counter(uuid))
    sampler.start()
    return sampler



class RunClocks:
    """A training run's clocks: sampled from its first timed step to its end, the summary and the
    energy and SM cycles a step added to summary.json (validations included, a few % of the run).
    `speedrun train` hands one to the trainer on the main rank."""

    def __init__(self, device):
        self.device, self.sampler = device, None

    def timed_start(self) -> None:
        self.sampler = start(self.device)

    def finish(self, summary: dict) -> None:
        sampler, self.sampler = self.sampler, None
        clocks = sampler.stop() if sampler is not None else None
        summary["gpu_clocks"] = clocks
        summary.update(per_step(clocks, summary["ms_per_step"]))
        if clocks:
            print(f"speedrun: GPU clock over the timed run: {describe(clocks)}; per step "
                  f"{describe_per_step(summary)}", flush=True)
