"""kernel_choice: the implementation picked for a tensor, and `built_once`, which every Triton kernel module's
builder goes through (the interpreter tests of those modules run the builders themselves)."""

import pytest
import torch

from speedrun.kernels import choice as kernel_choice


def test_pick_impl():
    assert kernel_choice.pick_impl(torch.zeros(1), "auto") == "torch"  # a CPU tensor: the reference
    assert kernel_choice.pick_impl(torch.zeros(1), "triton") == "triton"
    with pytest.raises(ValueError, match="'cuda'"):
        kernel_choice.pick_impl(torch.zeros(1), "cuda")


def test_built_once_imports_triton_into_the_module_and_builds_once(monkeypatch):
    triton = pytest.importorskip("triton")
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    module = {"__name__": "fake_kernels", "triton": None, "tl": None}
    exec(  # a builder defined in its own module namespace, as a kernel module's is
        "calls = []\n"
        "def build(interpreted):\n"
        "    calls.append(interpreted)\n"
        "    return (triton, tl)\n", module)
    build = kernel_choice.built_once(module["build"])
    first = build()
    assert first == (triton, triton.language) and module["triton"] is triton  # bound before the builder ran
    assert build() is first and module["calls"] == [True]  # built once; interpreted read at that moment
    assert build.__name__ == "build"
