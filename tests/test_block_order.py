"""The block lists' order kernel (block_order.py) against its argsort reference: bit for bit under
Triton's interpreter on the CPU (a subprocess, see interpreter_helpers), inside FlexAttention's block
masks, and at the record's size on the GPU."""

import textwrap

import pytest
import torch

from interpreter_helpers import run_interpreted
from speedrun.kernels import block_order

_INTERPRETED = textwrap.dedent(r'''
    import json, os
    assert os.environ.get("TRITON_INTERPRET") == "1"
    import torch
    from speedrun.kernels import block_order
    from speedrun.model.attention import block_structure, document_ids, flex_block_mask

    g = torch.Generator().manual_seed(0)
    out = {"cases": [], "masks": [], "opcheck": {}}
    shapes = [(5, 7), (16, 16), (3, 40), (1, 1), (9, 33)]
    for (r, n) in shapes:
        for density in (0.0, 0.3, 1.0):
            m = torch.rand(r, n, generator=g) < density
            for view, x in (("rows", m), ("transposed", m.T)):
                for high in (True, False):
                    got = block_order.order(x, high, "triton")
                    ref = block_order.reference(x, high)
                    out["cases"].append(dict(shape=[r, n], density=density, view=view, high=high,
                                             equal=all(torch.equal(a, b) for a, b in zip(got, ref)),
                                             dtypes=[str(t.dtype) for t in got], contiguous=got[1].is_contiguous()))
    tok = torch.randint(0, 1000, (128 * 12,), generator=g)
    tok[torch.rand(tok.shape, generator=g) < 0.01] = 50256
    s = block_structure(document_ids(tok), 128)
    for w in (1, 3, 40):
        wt = torch.tensor(w, dtype=torch.int32)
        a, b = flex_block_mask(s, wt, 128, "triton"), flex_block_mask(s, wt, 128, "torch")
        names = ("kv_num_blocks", "kv_indices", "full_kv_num_blocks", "full_kv_indices", "q_num_blocks", "q_indices",
                 "full_q_num_blocks", "full_q_indices")
        out["masks"].append({n: bool(torch.equal(getattr(a, n), getattr(b, n))) for n in names})
    m = torch.rand(6, 10, generator=g) < 0.4
    for high in (True, False):
        res = torch.library.opcheck(torch.ops.speedrun.block_order.default, (m, high),
                                    test_utils=("test_schema", "test_faketensor"), raise_exception=False)
        out["opcheck"][str(high)] = {k: v if v == "SUCCESS" else repr(v)[:500] for k, v in res.items()}
    print("RESULT " + json.dumps(out))
''')


@pytest.fixture(scope="module")
def interpreted():
    return run_interpreted(_INTERPRETED, timeout=600)


def test_interpreted_kernel_is_the_argsort(interpreted):
    """Every shape, density (none, some, all True), view (rows, a transposed view read through its
    strides) and direction: the same counts and indices as the reference, int32, contiguous."""
    assert len(interpreted["cases"]) == 5 * 3 * 2 * 2
    for case in interpreted["cases"]:
        assert case["equal"] and case["contiguous"] and case["dtypes"] == ["torch.int32"] * 2, case


def test_interpreted_block_masks_are_unchanged(interpreted):
    for lists in interpreted["masks"]:
        assert all(lists.values()), lists


def test_interpreted_op_registration(interpreted):
    for result in interpreted["opcheck"].values():
        assert all(v == "SUCCESS" for v in result.values()), result


def test_reference_order_and_checks():
    m = torch.tensor([[True, False, True, False], [False, False, False, False]])
    count, idx = block_order.order(m, True)  # the CPU: the reference
    assert count.tolist() == [2, 0] and idx.tolist() == [[2, 0, 3, 1], [3, 2, 1, 0]]
    count, idx = block_order.order(m, False)
    assert count.tolist() == [2, 0] and idx.tolist() == [[0, 2, 1, 3], [0, 1, 2, 3]]
    with pytest.raises(ValueError, match="bool"):
        block_order.order(m.int(), True)
    with pytest.raises(ValueError, match="2-D"):
        block_order.order(m[0], True)


@pytest.mark.gpu
def test_gpu_kernel_is_the_argsort_at_record_size(cuda):
    """768 x 768 blocks (49,152 tokens in 64-token blocks): random matrices of three densities and
    the record's own lists from FineWeb-like documents, both directions, rows and transposed."""
    pytest.importorskip("triton")
    from speedrun.model.attention import block_structure, document_ids, refined_blocks

    g = torch.Generator("cuda").manual_seed(0)
    mats = [torch.rand(768, 768, generator=g, device=cuda) < d for d in (0.01, 0.5, 0.99)]
    tok = torch.randint(0, 50000, (49152,), generator=g, device=cuda)
    tok[torch.rand(tok.shape, generator=g, device=cuda) < 1 / 420] = 50256
    s = block_structure(document_ids(tok), 128)
    mats += list(refined_blocks(s, torch.tensor(14, dtype=torch.int32, device=cuda), 128, 64))
    for m in mats:
        for x in (m, m.T):
            for high in (True, False):
                got, ref = block_order.order(x, high, "triton"), block_order.reference(x, high)
                assert all(torch.equal(a, b) for a, b in zip(got, ref))
