"""Layer 10's DC correction by its Triton kernels (kernels/record_dc.py) against
`record_parts.dc_correction`, the float32 reference: the term and the gradients of q, k, v and both
coefficients.

On the CPU the kernels run under Triton's interpreter (in a subprocess, interpreter_helpers.py), with a
head size of 32, windows from 0 to the largest the kernels take, documents shorter and longer than the
band, one of a single token, and a last query block that is partial; on a GPU at the record's size
(49,152 tokens, 6 heads of 128, window 111) against the reference and against the varlen path it
replaces.
"""

from __future__ import annotations

import textwrap

import pytest
import torch

from interpreter_helpers import run_interpreted
from speedrun.kernels import record_dc

_INTERPRETED = textwrap.dedent(r'''
    import json
    import torch
    from speedrun.kernels import record_dc
    from speedrun.model.record_parts import dc_correction

    def case(n, cu, keys, seed):
        gen = torch.Generator().manual_seed(seed)
        q, k, v = (torch.randn(n, 6, 32, generator=gen).bfloat16() for _ in range(3))
        w1, w2 = torch.randn(n, 6, generator=gen), torch.randn(n, 6, generator=gen)
        g = torch.randn(n, 6, 32, generator=gen)
        cu = torch.tensor(cu, dtype=torch.int32)

        def run(fn, dtype):
            leaves = [t.to(dtype).requires_grad_() for t in (q, k, v)] + [w1.requires_grad_(), w2.requires_grad_()]
            term = fn(*leaves[:3], cu, leaves[3], leaves[4], 0.3, keys)
            return [term, *torch.autograd.grad(term, leaves, g)]

        got = run(record_dc.dc_correction, torch.bfloat16)
        want = run(dc_correction, torch.float32)
        rel = [((a.double() - b.double()).abs().max() / b.double().abs().max().clamp_min(1e-30)).item()
               for a, b in zip(got, want)]
        out = dict(n=n, keys=keys, rel=rel, dtypes=[str(t.dtype) for t in got])
        if seed == 0:  # no atomics: the same bits twice; and the ops inside a whole compiled graph, as the
            # training step holds them
            again = run(record_dc.dc_correction, torch.bfloat16)
            out["same"] = all(torch.equal(a, b) for a, b in zip(got, again))
            compiled = run(torch.compile(record_dc.dc_correction, fullgraph=True), torch.bfloat16)
            out["compiled"] = max(((a.double() - b.double()).abs().max() / b.double().abs().max()).item()
                                  for a, b in zip(compiled, got))
        return out

    cases = [case(300, [0, 150, 151, 290, 300, 300], 112, 0),
             case(200, [0, 200], 129, 1),                      # the largest window: one document
             case(130, [0, 5, 64, 130], 1, 2),                 # each query sees itself alone
             case(96, [0, 40, 96], 20, 3)]
    print("RESULT " + json.dumps(cases))
''')


@pytest.fixture(scope="module")
def interpreted():
    return run_interpreted(_INTERPRETED)


def test_interpreted_term_and_gradients_are_the_references(interpreted):
    for c in interpreted:
        # term, dq, dk, dv, dw1, dw2: bf16 inputs and gradients, tf32 products, against float32
        assert c["dtypes"] == ["torch.float32"] + ["torch.bfloat16"] * 3 + ["torch.float32"] * 2, c
        assert max(c["rel"]) < 2e-2, c
    # compiled: the same kernels; Inductor's float32 norm of w1 may round differently, which can move a
    # bfloat16 gradient by a step (measured 1.0e-5 of the largest)
    assert interpreted[0]["compiled"] < 5e-3, interpreted[0]
    assert interpreted[0]["same"], interpreted[0]  # no atomics: the same bits twice


def test_windows_past_the_band_are_refused():
    q = torch.zeros(8, 6, 32, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="window"):
        record_dc.record_dc(q, q, q, torch.zeros(8, dtype=torch.int32), torch.ones(8, 6), torch.ones(8, 6), 0.1,
                            record_dc.MAX_WINDOW + 1)


def test_document_starts():
    cu = torch.tensor([0, 3, 3, 7, 10, 10], dtype=torch.int32)
    assert record_dc.doc_starts(cu, 10).tolist() == [0, 0, 0, 3, 3, 3, 3, 7, 7, 7]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_gpu_at_record_size():
    pytest.importorskip("triton")
    from speedrun.model.record_parts import dc_correction

    gen = torch.Generator(device="cuda").manual_seed(5)
    n = 49152
    lengths = torch.randint(1, 1500, (200,), generator=gen, device="cuda")
    cu = torch.cat([torch.zeros(1, device="cuda", dtype=torch.int64), lengths.cumsum(0)]).clamp(max=n)
    cu = torch.cat([cu, torch.full((1,), n, device="cuda")]).to(torch.int32)
    q, k, v = (torch.randn(n, 6, 128, device="cuda", generator=gen, dtype=torch.bfloat16) for _ in range(3))
    w1, w2 = (torch.randn(n, 6, device="cuda", generator=gen) for _ in range(2))
    g = torch.randn(n, 6, 128, device="cuda", generator=gen)

    def run(fn, dtype):
        leaves = [t.to(dtype).requires_grad_() for t in (q, k, v)] + [w1.requires_grad_(), w2.requires_grad_()]
        term = fn(*leaves[:3], cu, leaves[3], leaves[4], 0.12)
        return [term, *torch.autograd.grad(term, leaves, g)]

    got = run(record_dc.dc_correction, torch.bfloat16)
    want = run(dc_correction, torch.float32)
    for i, (a, b) in enumerate(zip(got, want)):
        rel = ((a.float() - b.float()).abs().max() / b.float().abs().max()).item()
        assert rel < 2e-2, (i, rel)
    again = run(record_dc.dc_correction, torch.bfloat16)
    assert all(torch.equal(a, b) for a, b in zip(got, again))
