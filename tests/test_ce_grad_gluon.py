"""The CE's gradient pass in both layouts (ce_grad_gluon.py) and where softcap_ce uses it.

Gluon has no CPU interpreter: on the CPU the kernel is compiled for sm_90 with Triton's own ptxas and its
SASS is read (no shared memory, no spills, 16-byte loads of z, 8-byte stores of g, the lean kernel's
special-function count); the target columns written after it run interpreted (test_softcap_ce.py). On the
GPU both outputs must equal the lean kernel's gradient and its transposed copy byte for byte.
"""

import pytest
import torch

from speedrun.kernels import ce_grad_gluon as G


def _gluon():
    pytest.importorskip("triton")
    if not G.available():
        pytest.skip("Triton's Gluon does not import here")


LAUNCHES = [{}, {"TPC": 4, "num_warps": 4}, {"TPC": 4, "num_warps": 4, "CPT": 16}, {"TPC": 16, "num_warps": 16}]


@pytest.mark.parametrize("cfg", LAUNCHES)
def test_compiles_for_hopper_without_spills(cfg):
    """Every launch compiles for sm_90 with no spills and, per loop step and thread, four rows of CPT columns
    of both halves (8 x CPT elements): z in 2 * CPT-byte vector loads, g's rows in CPT-byte stores, g^T in
    16-byte stores of four words after the layout conversion, and 2.5 special-function ops an element as
    in the lean kernel."""
    _gluon()
    from speedrun.kernels.relu2_gluon import resource_usage

    kernel = G.compile_offline(cfg=cfg)
    cubin = kernel.asm["cubin"]
    usage = resource_usage(cubin)
    assert usage.get("LOCAL", 0) == 0 and usage.get("STACK", 0) == 0, usage
    cpt = dict(G.CONFIG, **cfg)["CPT"]
    counts = G.sass_counts(cubin)
    assert counts["MUFU"] == 8 * cpt * 5 // 2, counts
    assert counts["LDG"] == 8 * (cpt // 8) + 4, counts  # z: 4 rows x 2 halves x 16 bytes; the row sets' shifts
    assert counts["LDG.128"] == 8 * (cpt // 8), counts
    ptx = kernel.asm["ptx"]
    assert ptx.count(f"st.global.v{cpt // 4}.b32") >= 8, counts  # g: 4 rows x 2 halves, CPT bytes each
    assert ptx.count("st.global.v4.b32") >= 2 and counts["shared"] > 0, counts  # g^T after the conversion


def test_launch_refuses_a_tile_it_cannot_convert():
    with pytest.raises(ValueError, match="128 rows"):
        G.grid(49152, 50304, 2048, {"CPT": 8, "TPC": 8, "num_warps": 4})


def test_grid_covers_rows_and_lean_blocks():
    assert G.grid(49152, 50304, 2048, G.CONFIG) == (384, 13)
    assert G.grid(148, 3001, 256, {"CPT": 8, "TPC": 4, "num_warps": 4}) == (2, 6)


def test_applies_only_to_e5m2_on_a_gpu():
    z = torch.zeros(8, 16, dtype=torch.bfloat16)
    assert not G.applies(z, torch.float8_e5m2)  # the CPU


# --------------------------------------------------------------------------- GPU


def _lean_and_both(z, t, rowsums=None):
    from speedrun.kernels import softcap_ce as sc
    from speedrun.kernels import transpose

    l0, g0 = sc.launch(z, t, 30.0, "sigmoid", True, torch.float8_e5m2, 448.0, rowsums)
    g0t = transpose.transpose_copy(g0)
    l1, g1, g1t = sc.launch_transposed(z, t, 30.0, torch.float8_e5m2, 448.0, rowsums)
    u = lambda x: x.view(torch.uint8)  # noqa: E731
    return torch.equal(l0, l1), torch.equal(u(g0), u(g1)), torch.equal(u(g0t), u(g1t)), u(g1)


@pytest.mark.gpu
@pytest.mark.parametrize("cfg", LAUNCHES)
def test_gpu_both_layouts_are_the_lean_kernels_bytes(cuda, cfg, monkeypatch):
    """At the record's size (49,152 x 50,304; z and its row sums from the Gluon head kernel, as in training),
    and at a ragged size (rows not a multiple of a CTA's, columns not of a lean block or a loop step, the
    lean block smaller, row sums from their definition): the losses, g and g^T equal the lean kernel's
    losses, gradient and transposed copy byte for byte; an ignored row is zero and a last-column target
    is written."""
    _gluon()
    from speedrun.kernels import head_gluon
    from speedrun.kernels import softcap_ce as sc

    for key, value in cfg.items():
        monkeypatch.setitem(G.CONFIG, key, value)
    gen = torch.Generator("cuda").manual_seed(4)
    m, n = 49152, 50304
    x = (torch.randn(m, 768, generator=gen, device="cuda") * 2).to(torch.float8_e4m3fn)
    w = torch.randn(n, 768, generator=gen, device="cuda").to(torch.float8_e4m3fn)
    z = torch.empty(m, n, dtype=torch.bfloat16, device="cuda")
    rowsums = torch.empty(m, head_gluon.rowsum_tiles(n), device="cuda")
    head_gluon.launch(x, w, torch.full((), 0.25, device="cuda"), z, rowsums)
    t = torch.randint(0, 50257, (m,), generator=gen, device="cuda")
    t[5], t[9] = sc.IGNORE_INDEX, n - 1
    losses, row_major, transposed, g = _lean_and_both(z, t, rowsums)
    assert losses and row_major and transposed
    assert not g[5].any() and g[9, n - 1] != 0 and (g != 0).float().mean() > 0.05
    del z, g, rowsums
    monkeypatch.setitem(sc.LEAN_CONFIG, "BLOCK_V", 512)
    z = (torch.randn(148, 3001, generator=gen, device="cuda") * 8).bfloat16()
    t = torch.randint(0, 3001, (148,), generator=gen, device="cuda")
    t[7], t[147] = sc.IGNORE_INDEX, 3000
    for rs in (head_gluon.rowsums_reference(z, 30.0).float(), None):
        losses, row_major, transposed, g = _lean_and_both(z, t, rs)
        assert losses and row_major and transposed
        assert not g[7].any() and g[147, 3000] != 0
