"""The warp-specialised Gluon ReLU² products (relu2_gluon.py) and where relu2_mlp uses them.

Gluon has no CPU interpreter, so on the CPU the kernel is compiled for sm_90 with Triton's own ptxas
(no GPU needed) and checked for spills and shared memory; the GPU tests hold its outputs to the
plain-Triton kernel's and to the epilogue math on cuBLAS's product, bit for bit.
"""

import pytest
import torch

from speedrun.kernels import relu2_mlp as R


def _gluon():
    pytest.importorskip("triton")
    from speedrun.kernels import relu2_gluon as G
    if not G.available():
        pytest.skip("Triton's Gluon (Hopper) does not import here")
    return G


@pytest.mark.parametrize("epilogue,b_nk,a_tma,xtile", [
    (R.STORE_H_AND_A, True, 0, 0), (R.STORE_A, True, 0, 0), (R.DRELU2, False, 0, 0), (R.DRELU2_FROM_A, False, 0, 0),
    (R.DRELU2, False, 0, 1), (R.DRELU2_FROM_A, False, 0, 1),
    (R.DRELU2, False, 1, 0), (R.DRELU2_FROM_A, False, 1, 0), (R.DRELU2_FROM_A, False, 2, 0)])
def test_compiles_for_hopper_without_spills(epilogue, b_nk, a_tma, xtile):
    """Every variant compiles for sm_90 with no local memory (spills) and fits the H200's 227 KB of
    shared memory per block; 12 warps (two consumer warpgroups and the epilogue's). a_tma: the backward
    whose epilogue TMA-loads the saved tensor's tile (its 64 KB buffer beside two ring stages); xtile: the
    backward loading the next tile's first slice with this tile's last."""
    G = _gluon()
    kernel = G.compile_offline(epilogue, b_nk, {"XTILE": xtile}, a_tma=a_tma)
    usage = G.resource_usage(kernel.asm["cubin"])
    assert usage.get("LOCAL", 0) == 0 and usage.get("STACK", 0) == 0, usage
    assert kernel.metadata.shared <= 227 * 1024, kernel.metadata.shared
    assert kernel.metadata.num_warps == 12
    assert "wgmma.mma_async" in kernel.asm["ptx"] and "setmaxnreg" in kernel.asm["ptx"]


def test_used_only_where_asked_and_on_hopper():
    cfg = R.parse_options("")
    assert cfg["bwd"]["GLUON"] == 1 and cfg["fwd"]["GLUON"] == 0
    assert not R.use_gluon(torch.device("cpu"), cfg["bwd"])  # the interpreter's kernel stays on the CPU
    assert R.parse_options("bwd.GLUON=0")["bwd"]["GLUON"] == 0
    with pytest.raises(ValueError, match="GLUON"):
        R.parse_options("GLUON=2")


def test_a_kernel_that_cannot_compile_falls_back_once(monkeypatch):
    """try_launch: a compile failure (another Triton's Gluon) warns once, is remembered, returns False."""
    from speedrun.kernels import relu2_gluon as G
    calls = []

    def broken(*args, **kwargs):
        calls.append(args)
        raise TypeError("warp_specialize() got an unexpected keyword argument")

    monkeypatch.setattr(G, "launch", broken)
    monkeypatch.setattr(G, "_FAILED", {})
    args = (torch.zeros(1), torch.zeros(1), torch.zeros(1), torch.zeros(1), R.DRELU2, False)
    with pytest.warns(RuntimeWarning, match="using the Triton kernel"):
        assert G.try_launch(*args) is False
    assert G.try_launch(*args) is False and len(calls) == 1  # not retried
    assert "TypeError" in G._FAILED[(R.DRELU2, 0, ())]


def test_a_tma_option_reaches_the_gluon_backward(monkeypatch):
    """`bwd.A_TMA=1` or `2` (off by default) picks GLUON_CONFIG's `*_tma` or `*_tma32` entries, for the
    backward only."""
    from speedrun.kernels import relu2_gluon as G
    assert R.parse_options("")["bwd"]["A_TMA"] == 0
    assert R.parse_options("bwd.A_TMA=1")["bwd"]["A_TMA"] == 1
    assert R.parse_options("bwd.A_TMA=2")["bwd"]["A_TMA"] == 2
    with pytest.raises(ValueError, match="A_TMA"):
        R.parse_options("A_TMA=3")
    assert G.direction(R.DRELU2_FROM_A, 1) == "bwd_a_tma" and G.direction(R.DRELU2, 1) == "bwd_tma"
    assert G.direction(R.DRELU2_FROM_A, 2) == "bwd_a_tma32" and G.direction(R.DRELU2, 2) == "bwd_tma32"
    assert G.direction(R.STORE_A, 1) == "fwd" and G.direction(R.DRELU2_FROM_A) == "bwd_a"
    tma, tma32 = (G.config(G.direction(R.DRELU2_FROM_A, n)) for n in (1, 2))
    assert (tma["A_TMA"], tma["STAGES"], tma["BLOCK_K"]) == (1, 2, 64)
    assert (tma32["A_TMA"], tma32["STAGES"], tma32["BLOCK_K"]) == (2, 4, 32) and G.config("bwd_a")["A_TMA"] == 0
    seen = []
    monkeypatch.setattr(R, "use_gluon", lambda device, cfg: True)
    monkeypatch.setattr(G, "try_launch", lambda *args, a_tma=0, overrides=None: seen.append((a_tma, overrides)) or True)
    t = torch.zeros(1)
    for text in ("bwd.A_TMA=1", "bwd.A_TMA=2", "", "bwd.XTILE=1,bwd.EPI_REGS=136"):
        R.launch(t, t, t, t, R.DRELU2_FROM_A, False, R.parse_options(text)["bwd"])
    assert seen == [(1, {"XTILE": 0}), (2, {"XTILE": 0}), (0, {"XTILE": 0}), (0, {"XTILE": 1, "EPI_REGS": 136})]
    for bad in ("bwd.XTILE=2", "bwd.EPI_REGS=140", "bwd.EPI_REGS=16"):
        with pytest.raises(ValueError, match="XTILE|EPI_REGS"):
            R.parse_options(bad)


def test_a_tma_epilogue_frees_its_buffer_before_each_load():
    """The TMA epilogue's PTX: the first tile's loads and, in the loop, the next tile's. Before each 64 KB
    expect on the buffer's barrier, every epilogue thread fences its generic reads of the buffer for the
    async proxy and the partition synchronises (bar.sync 2, 128), so a TMA load cannot overwrite values a
    thread has yet to read; four slice loads each; the next tile's before the stores' drain and the
    buffer's hand-back (acc_free)."""
    G = _gluon()
    ptx = G.compile_offline(R.DRELU2_FROM_A, False, a_tma=1).asm["ptx"].splitlines()
    at = [i for i, line in enumerate(ptx) if "expect_tx" in line and line.rstrip().endswith(", 65536;")]
    assert len(at) == 2, at
    for i in at:
        before = [line.strip() for line in ptx[i - 8:i]]
        fence = max(k for k, line in enumerate(before) if line.startswith("fence.proxy.async"))
        assert any(line.startswith("bar.sync") and "128" in line for line in before[fence:]), before
        after = "\n".join(ptx[i:i + 60])
        assert after.count("cp.async.bulk.tensor.2d.shared::") == 4, after
    drain = next(i for i in range(at[1], len(ptx)) if "cp.async.bulk.wait_group.read" in ptx[i])
    assert drain - at[1] < 60


def _epilogue_reference(p, h=None):
    """relu2_mlp._epilogue's math from the bfloat16 product p: a, or g (with h)."""
    pf = p.float()
    if h is None:
        return (pf.clamp_min(0.0) ** 2).bfloat16()
    hf = h.float()
    return torch.where(hf > 0, pf * (2.0 * hf), 0.0).bfloat16()


@pytest.mark.gpu
@pytest.mark.parametrize("M,K,N", [(49152, 768, 3072), (1000, 200, 392), (77, 64, 264), (20000, 256, 1000)])
def test_gpu_matches_triton_kernel_and_epilogue_math(cuda, M, K, N):
    """At the record's shape and ragged ones (the last with several tiles per program and a ragged last
    tile, for XTILE's loads across tiles): h, a and g equal the Triton kernel's and the epilogue
    math applied to cuBLAS's product (the same 64-wide k-steps in the same order)."""
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("the Gluon kernel's wgmma needs compute capability 9.0")
    G = _gluon()
    g = torch.Generator("cuda").manual_seed(M)
    x, gy = (torch.randn(M, K, generator=g, device="cuda").bfloat16() for _ in range(2))
    w1 = (torch.randn(N, K, generator=g, device="cuda") / K**0.5).bfloat16()
    w2 = (torch.randn(K, N, generator=g, device="cuda") / K**0.5).bfloat16()
    outs = {}
    for name, launch in (("gluon", G.launch), ("triton", None)):
        h, a, gh = (torch.empty(M, N, dtype=torch.bfloat16, device="cuda") for _ in range(3))
        hb = (x @ w1.T)  # the backward's saved h
        if launch is None:
            R.launch(x, w1, h, a, R.STORE_H_AND_A, True, R.parse_options("GLUON=0")["fwd"])
            R.launch(gy, w2, hb, gh, R.DRELU2, False, R.parse_options("GLUON=0")["bwd"])
        else:
            launch(x, w1, h, a, R.STORE_H_AND_A, True)
            launch(gy, w2, hb, gh, R.DRELU2, False)
        if launch is not None:  # the forward without h (STORE_A), as `fwd.GLUON=1` runs it: the same a
            a_only = torch.empty_like(a)
            launch(x, w1, torch.empty(0, dtype=torch.bfloat16, device="cuda"), a_only, R.STORE_A, True)
            assert torch.equal(a_only, a)
        ga = torch.empty_like(gh)  # the same g with relu(h) recovered from a
        ab = torch.relu(hb).square()
        (launch or (lambda *t: R.launch(*t, R.parse_options("GLUON=0")["bwd"])))(gy, w2, ab, ga, R.DRELU2_FROM_A, False)
        if launch is not None:  # the epilogue loading the saved tensor by TMA (A_TMA), both ring shapes,
            # and loading the next tile's first slice with this tile's last (XTILE)
            for a_tma, xtile in ((1, 0), (2, 0), (0, 1)):
                for epilogue, saved, want in ((R.DRELU2, hb, gh), (R.DRELU2_FROM_A, ab, ga)):
                    got = torch.full_like(gh, 7.0)
                    launch(gy, w2, saved, got, epilogue, False, {"XTILE": xtile}, a_tma=a_tma)
                    assert torch.equal(got, want), (epilogue, a_tma, xtile, (got != want).float().mean().item())
        outs[name] = (h, a, gh, ga)
    torch.cuda.synchronize()
    h_ref = x @ w1.T
    g_ref = _epilogue_reference(gy @ w2, h_ref)
    refs = (h_ref, _epilogue_reference(h_ref), g_ref, g_ref)
    for got, tri, ref, what in zip(outs["gluon"], outs["triton"], refs, ("h", "a", "g", "g from a")):
        assert torch.equal(got, tri), (what, (got != tri).float().mean().item())
        assert torch.equal(got, ref), (what, (got != ref).float().mean().item())
