"""The default path's figures stay where the recorded commit left them.

tests/golden/*.json hold a few steps' losses and per-parameter gradient sums of the default path,
recorded twice (two processes) before a change that must not move the math (golden_helpers.py). On the
machine they were recorded on (the same CPU capability, thread count and torch build, or the same GPU,
torch and Triton) every figure must stay within the recorded code's own run-to-run spread: bit for bit
where its two runs agreed (the CPU, a GPU's first step), within ten times their difference where they
did not (the GPU's float32 atomics, whose order changes between runs and grows step by step). On other
machines, whose vector units and kernels add in other orders, the losses are held to float32 rounding.
"""

import pytest
import torch

from golden_helpers import figures, load, machine


# Where the recorded runs differ, two samples only show that a figure moves, not how far: float32
# atomics added in another order move a gradient's sum by a few float32 roundings of it, so the bound
# is at least this fraction of the figure.
ATOMICS_REL = 1e-5


def _within_spread(got: list[float], want: list[float], repeat: list[float]) -> list[int]:
    """Indices where `got` leaves the recorded runs' spread: none where they agreed, else 10x their
    difference or ATOMICS_REL of the figure, whichever is larger."""
    return [i for i, (g, w, r) in enumerate(zip(got, want, repeat))
            if abs(g - w) > (max(10 * abs(w - r), ATOMICS_REL * abs(w)) if w != r else 0.0)]


def _compare(got: dict, want: dict, same_machine: bool) -> None:
    assert len(got["losses"]) == len(want["losses"])
    if not same_machine:
        assert got["losses"] == pytest.approx(want["losses"], rel=1e-4)
        return
    rep = want["repeat"]
    assert not _within_spread(got["losses"], want["losses"], rep["losses"]), (got["losses"], want["losses"])
    for step, (g, w, r) in enumerate(zip(got["grad_sums"], want["grad_sums"], rep["grad_sums"])):
        off = _within_spread(g, w, r)
        assert not off, f"step {step}: gradient sums of parameters {off} moved: " + ", ".join(
            f"#{i} {g[i]!r} recorded {w[i]!r} / {r[i]!r}" for i in off[:4])


def test_cpu_default_path_matches_the_recorded_figures():
    want = load("demo_cpu")
    threads = torch.get_num_threads()
    torch.set_num_threads(want["machine"]["threads"])
    try:
        got = figures(want["preset"], len(want["losses"]), want["overrides"])
        same = machine() == want["machine"]
    finally:
        torch.set_num_threads(threads)
    _compare(got, want, same)


def test_the_comparison_catches_one_changed_bit():
    want = load("demo_cpu")
    got = {"losses": list(want["losses"]), "grad_sums": [list(s) for s in want["grad_sums"]]}
    _compare(got, want, True)
    i = next(i for i, x in enumerate(got["grad_sums"][-1]) if x)
    got["grad_sums"][-1][i] *= 1 + 2 ** -52  # the last bit of one sum
    with pytest.raises(AssertionError, match="moved"):
        _compare(got, want, True)


@pytest.mark.gpu
def test_gpu_proxy212_matches_the_recorded_figures():
    want = load("proxy212_gpu")
    got = figures(want["preset"], len(want["losses"]), want["overrides"])
    same = {k: want["machine"].get(k) for k in ("gpu", "torch", "triton")} == machine()
    _compare(got, want, same)
