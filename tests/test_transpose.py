"""The one-byte transpose kernel against `a.T.contiguous()`: bit-equal, on the CPU (Triton's
interpreter, in a subprocess: see test_softcap_ce.py) and on the GPU at the record's size."""

import textwrap

import pytest
import torch

from interpreter_helpers import run_interpreted
from speedrun.kernels.transpose import transpose_copy

_INTERPRETED = textwrap.dedent(r'''
    import json, os
    assert os.environ.get("TRITON_INTERPRET") == "1"
    import torch
    from speedrun.kernels import transpose as tr

    tr.KERNEL_CONFIG.update(BLOCK_M=16, BLOCK_N=32, num_warps=1)
    g = torch.Generator().manual_seed(0)
    cases = []
    for (m, n), dtype in [((40, 96), torch.uint8), ((37, 101), torch.float8_e5m2), ((1, 7), torch.int8),
                          ((129, 3), torch.float8_e4m3fn), ((16, 32), torch.float8_e5m2)]:
        a = torch.randint(0, 256, (m, n), generator=g, dtype=torch.uint8).view(dtype)
        got = tr.transpose_copy(a, "triton")
        ref = a.T.contiguous()
        cases.append(dict(shape=[m, n], dtype=str(dtype), out_shape=list(got.shape), out_dtype=str(got.dtype),
                          contiguous=got.is_contiguous(),
                          equal=bool(torch.equal(got.view(torch.uint8), ref.view(torch.uint8)))))
    # a non-contiguous input is read as its values, not its storage
    a = torch.randint(0, 256, (30, 50), generator=g, dtype=torch.uint8)[:, 5:45]
    cases.append(dict(shape=[30, 40], dtype="sliced", equal=bool(torch.equal(tr.transpose_copy(a, "triton"), a.T)),
                      contiguous=True, out_shape=[40, 30], out_dtype="torch.uint8"))
    print("RESULT " + json.dumps(cases))
''')


def test_interpreted_kernel_is_bit_equal_to_torch():
    for case in run_interpreted(_INTERPRETED):
        assert case["equal"] and case["contiguous"], case
        assert case["out_shape"] == case["shape"][::-1], case
        if case["dtype"] != "sliced":
            assert case["out_dtype"] == case["dtype"], case


def test_reference_and_bad_input():
    a = torch.arange(12, dtype=torch.uint8).reshape(3, 4)
    assert torch.equal(transpose_copy(a), a.T) and transpose_copy(a).is_contiguous()  # CPU: "auto" is torch
    with pytest.raises(ValueError, match="one-byte"):
        transpose_copy(torch.zeros(3, 4))
    with pytest.raises(ValueError, match="2-D"):
        transpose_copy(torch.zeros(2, 3, 4, dtype=torch.uint8))


@pytest.mark.gpu
def test_gpu_kernel_is_bit_equal_at_record_size(cuda):
    """The head's e5m2 gradient of one micro-step: (49,152 x 50,304), 2.47 GB."""
    pytest.importorskip("triton")
    g = torch.Generator("cuda").manual_seed(0)
    a = torch.randint(0, 256, (49152, 50304), generator=g, device="cuda", dtype=torch.uint8).view(torch.float8_e5m2)
    got = transpose_copy(a, "triton")
    assert got.dtype == torch.float8_e5m2 and got.shape == (50304, 49152)
    assert torch.equal(got.view(torch.uint8), a.view(torch.uint8).T.contiguous())
