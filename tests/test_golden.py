"""The default path's figures stay where the recorded commit left them.

tests/golden/*.json hold a few steps' losses and per-parameter gradient sums of the default path,
recorded twice (two processes) before a change that must not move the math (golden_helpers.py). On the
machine they were recorded on (the same CPU capability, thread count and torch build, or the same GPU,
torch and Triton) every figure up to the first step whose recorded gradient sums differ is held bit for
bit where the two runs agreed (all of the CPU's; a GPU's first steps). From then on (the GPU's float32
atomics, whose order changes between runs and grows step by step) every later figure is noise, even one
the pair happened to agree on, and one pair of runs estimates that noise only in aggregate: the ratio of
two independent differences is Cauchy-like, so a figure or two in fifty lands 10-40x out by chance (the
recorded commit's own code does, measured 2026-12-05 on an H100), while a changed computation moves a
whole step by orders of magnitude. Such a step's median ratio is held instead. On other machines, whose
vector units and kernels add in other orders, the losses are held to float32 rounding.
"""

import pytest
import torch

from golden_helpers import figures, load, machine


# Where the recorded runs differ, float32 atomics added in another order move a figure by a few float32
# roundings of it, so the spread is at least this fraction of the figure.
ATOMICS_REL = 1e-5
# The bound on a noisy step's median ratio of the new difference to the recorded one: for noise alone
# the median of |Cauchy| is 1 (measured 0.5-1.6 over four runs of two commits).
MEDIAN_RATIO = 3.0


def _off(got: list[float], want: list[float], repeat: list[float], settled: bool) -> list[int]:
    """Indices where `got` leaves the recorded runs' spread. Where `settled` (no atomics' noise yet) any
    change of a figure the runs agreed on counts; noisy figures count all together when their median ratio
    of |got - want| to the recorded spread exceeds MEDIAN_RATIO."""
    exact = [i for i, (g, w, r) in enumerate(zip(got, want, repeat)) if settled and w == r and g != w]
    noisy = [(i, abs(g - w) / max(abs(w - r), ATOMICS_REL * abs(w)))
             for i, (g, w, r) in enumerate(zip(got, want, repeat)) if w != r or not settled]
    ratios = sorted(x for _, x in noisy)
    if ratios and ratios[len(ratios) // 2] > MEDIAN_RATIO:
        exact += [i for i, x in noisy if x > MEDIAN_RATIO]
    return sorted(exact)


def _compare(got: dict, want: dict, same_machine: bool) -> None:
    assert len(got["losses"]) == len(want["losses"])
    if not same_machine:
        assert got["losses"] == pytest.approx(want["losses"], rel=1e-4)
        return
    rep = want["repeat"]
    steps = len(want["grad_sums"])
    # The first step whose backward the atomics touch: its loss is still settled, its gradients partly.
    first = next((s for s in range(steps) if want["grad_sums"][s] != rep["grad_sums"][s]), steps)
    settled, later = slice(0, first + 1), slice(first + 1, None)
    for part, calm in ((settled, True), (later, False)):
        assert not _off(got["losses"][part], want["losses"][part], rep["losses"][part], calm), (
            got["losses"], want["losses"])
    for step, (g, w, r) in enumerate(zip(got["grad_sums"], want["grad_sums"], rep["grad_sums"])):
        off = _off(g, w, r, step <= first)
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


def test_the_comparison_catches_a_moved_noisy_step():
    want = load("proxy212_gpu")
    got = {"losses": list(want["losses"]), "grad_sums": [list(s) for s in want["grad_sums"]]}
    _compare(got, want, True)
    got["grad_sums"][2] = [x * (1 + 1e-2) for x in got["grad_sums"][2]]  # ~10x its spread
    with pytest.raises(AssertionError, match="moved"):
        _compare(got, want, True)
