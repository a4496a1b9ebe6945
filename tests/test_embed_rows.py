"""The embedding tables' gradients added into the in-place sums row by row (embed_rows).

* The op (`speedrun::add_rows_`): the reference adds exactly the touched rows, as the dense path's
  rounding and add would, leaves the others alone and zeroes the scratch rows it read; the Triton
  kernels equal the reference bit for bit (Triton's interpreter in a subprocess, and on a GPU).
* The path: a compiled step with two tables gives the dense in-place path's gradients bit for bit
  over two steps (the scratch must come back to zero), and so does the eager lookup on two threads (the
  trainer's whole step against autograd, rows included: test_grad_accum.py).
* The wiring: which tables a GPT looks up only, the refusals.
"""

from __future__ import annotations

import textwrap

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from interpreter_helpers import run_interpreted
from speedrun.kernels import embed_rows
from speedrun.kernels import embeddings
from speedrun.train import grad_accum
from speedrun.recipes.presets import record_2025_08 as record
from speedrun.train.grad_accum import compile_step_model


def _case(V=300, D=40, N=500, dtype=torch.bfloat16, seed=0):
    """Tokens with heavy repeats, a scratch table holding sums on the touched rows only, a total."""
    gen = torch.Generator().manual_seed(seed)
    tokens = (torch.randint(0, V, (N,), generator=gen) ** 2 // V).to(torch.int32)  # skewed: many repeats
    scratch = torch.zeros(V, D)
    scratch[tokens.long()] = torch.randn(N, D, generator=gen) * 3
    total = (torch.randn(V, D, generator=gen)).to(dtype)
    return tokens, scratch, total


def test_reference_adds_the_touched_rows_once():
    tokens, scratch, total = _case()
    rows = torch.unique(tokens).long()
    untouched = torch.ones(300, dtype=torch.bool)
    untouched[rows] = False
    want = total.clone()
    want[rows] = grad_accum.add_gradient(total[rows], scratch[rows].bfloat16())
    before = total.clone()
    embed_rows.reference(tokens, scratch, total)
    assert torch.equal(total, want) and torch.equal(total[untouched], before[untouched])
    assert not scratch.any() and untouched.sum() > 50 and len(rows) < len(tokens) / 2


def test_op_refuses_bad_input():
    tokens, scratch, total = _case()
    with pytest.raises(ValueError, match="add_rows_: tokens must be 1-D integers"):
        torch.ops.speedrun.add_rows_(tokens.float(), scratch, total)
    with pytest.raises(ValueError, match="add_rows_: scratch must be a contiguous 2-D float32"):
        torch.ops.speedrun.add_rows_(tokens, scratch.double(), total)
    with pytest.raises(ValueError, match="add_rows_: total must be"):
        torch.ops.speedrun.add_rows_(tokens, scratch, total[:, :3].contiguous())


_INTERPRETED = textwrap.dedent("""
    import json, torch
    from speedrun.kernels import embed_rows
    from speedrun.train.grad_accum import add_gradient
    out = {"cases": []}
    gen = torch.Generator().manual_seed(0)
    for V, D, N, dtype, tok_dtype, cfg in [
            (300, 40, 500, torch.bfloat16, torch.int32, None),
            (300, 40, 500, torch.float32, torch.int64, None),
            (97, 300, 1000, torch.bfloat16, torch.int64, {"BLOCK_T": 8, "BLOCK_D": 128}),
            (50, 16, 0, torch.bfloat16, torch.int32, None)]:
        tokens = (torch.randint(0, V, (N,), generator=gen) ** 2 // V).to(tok_dtype)
        scratch = torch.zeros(V, D)
        scratch[tokens.long()] = torch.randn(N, D, generator=gen) * 3
        if N:
            scratch[tokens[0].long(), :3] = torch.tensor([float("nan"), -0.0, 2.0 ** -130])  # NaN, -0, subnormal
            scratch[tokens[1].long(), 0] = 1.0 + 2.0 ** -8  # a tie: to even
        total = torch.randn(V, D, generator=gen).to(dtype)
        s2, t2 = scratch.clone(), total.clone()
        embed_rows.launch(tokens, scratch, total, cfg)
        embed_rows.reference(tokens, s2, t2)
        bits = torch.int16 if dtype == torch.bfloat16 else torch.int32
        same = ((total.view(bits) == t2.view(bits)) | (total.isnan() & t2.isnan())).all()  # any NaN's bits
        out["cases"].append([V, D, N, str(dtype), bool(same), bool(torch.equal(scratch, s2)),
                             bool(not scratch.any())])
    print("RESULT " + json.dumps(out))
""")


def test_interpreted_kernel_is_the_reference_bit_for_bit():
    got = run_interpreted(_INTERPRETED, timeout=600)
    assert len(got["cases"]) == 4
    for V, D, N, dtype, same_total, same_scratch, zero in got["cases"]:
        assert same_total and same_scratch and zero, (V, D, N, dtype)


class TwoTables(nn.Module):
    """Two bfloat16 tables looked up with the same tokens (as GPT's embedding and value embedding), a
    float32 weight, and an untied head: `lookup_table_names` as GPT's."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(97, 32).to(torch.bfloat16)
        self.value = nn.Embedding(97, 32).to(torch.bfloat16)
        self.up = nn.Parameter(torch.randn(32, 32) / 6)
        self.head = nn.Parameter(torch.randn(97, 32) / 6)

    def lookup_table_names(self):
        return ["embed.weight", "value.weight"]

    def forward(self, tokens, targets, long_blocks, dtype=torch.bfloat16, table_sums=None):
        x, v = embeddings.lookups(tokens, [self.embed.weight, self.value.weight], table_sums)
        h = F.linear(x * v.sigmoid(), self.up.to(dtype)).relu().square().float()
        return F.cross_entropy(F.linear(h, self.head), targets)


def _steps(model, step_model, bufs, batches, steps=2):
    grads = []
    for _ in range(steps):
        bufs.start()
        for tokens, targets in batches:
            scratch = bufs.scratch if any(r is not None for r in bufs.scratch) else None
            loss = step_model(tokens, targets, 0, torch.bfloat16, bufs.buffers, None, scratch)
            (loss / len(batches)).backward()
        bufs.finish()
        grads.append({n: p.grad.clone() for n, p in model.named_parameters()})
        with torch.no_grad():
            for p in model.parameters():
                p.sub_(p.grad.to(p.dtype) * 0.5)
    return grads


@pytest.mark.parametrize("compiled,device", [(False, "cpu"), (True, "cpu"),
                                             pytest.param(True, "cuda", marks=pytest.mark.gpu)])
def test_rows_give_the_dense_in_place_sums_bit_for_bit(compiled, device):
    """Two steps of three micro-steps: compiled on the CPU (Inductor's fused atomics into the scratch
    table, as on the GPU), the same gradients as the dense in-place path bit for bit; eager, and on the
    GPU (float32 atomics in either order), within bfloat16's rounding. The scratch tables zero after
    each step, the tables' `.grad` the buffers."""
    gen = torch.Generator().manual_seed(1)
    batches = [(torch.randint(0, 40, (64,), generator=gen).to(device),
                torch.randint(0, 97, (64,), generator=gen).to(device)) for _ in range(3)]
    got = {}
    for path in ("dense", "rows"):
        torch.manual_seed(0)
        model = TwoTables().to(device)
        rows = model.lookup_table_names() if path == "rows" else ()
        bufs = grad_accum.GradBuffers(model, rows=rows)
        got[path] = _steps(model, compile_step_model(model, compiled), bufs, batches)
        if path == "rows":
            names = [n for n, _ in grad_accum.trained_parameters(model)]
            assert [n for n, r in zip(names, bufs.scratch) if r is not None] == ["embed.weight", "value.weight"]
            assert not any(r.any() for r in bufs.scratch if r is not None)
            assert model.embed.weight.grad is bufs.buffers[names.index("embed.weight")]
    for want, have in zip(got["dense"], got["rows"]):
        for name in want:
            assert have[name].dtype == want[name].dtype, name
            if compiled and device == "cpu":
                assert torch.equal(have[name], want[name]), name
            else:  # the CPU's eager dense backward sums in bfloat16, the GPU's atomics in any order
                scale = want[name].float().abs().max()
                assert (have[name].float() - want[name].float()).abs().max() <= 2**-6 * scale, name
    assert got["rows"][0]["embed.weight"].abs().sum() > 0


def test_eager_rows_give_the_dense_bits_on_two_threads():
    """Eager on the CPU's default two threads, a float32 table and the demo's micro-step (256 tokens of
    128 columns: a gradient the CPU kernels split between threads): the step's sum gets the dense
    backward's bits, call after call (atomics in a varying order would not)."""
    gen = torch.Generator().manual_seed(2)
    V, D, N = 1000, 128, 256
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        for _ in range(12):
            tokens = torch.randint(0, V, (N,), generator=gen) ** 2 // V // 20  # 50 rows, heavy repeats
            grad = torch.randn(N, D, generator=gen)
            table = torch.randn(V, D, generator=gen, requires_grad=True)
            total, scratch = torch.randn(V, D, generator=gen), torch.zeros(V, D)
            F.embedding(tokens, table).backward(grad)
            want = total + table.grad
            table.grad = None
            embed_rows.lookup_into(tokens, table, total, scratch).backward(grad)
            assert torch.equal(total, want) and table.grad is None and not scratch.any()
    finally:
        torch.set_num_threads(before)


def test_gpt_names_the_tables_it_only_looks_up():
    from speedrun.model.gpt import GPT

    cfg = record()
    m = cfg.model
    m.model_dim, m.num_heads, m.head_dim, m.mlp_hidden, m.vocab_size = 64, 2, 32, 128, 1000
    assert GPT(cfg.model, cfg.attention).lookup_table_names() == [
        "embed.weight", "value_embeds.0.weight", "value_embeds.1.weight", "value_embeds.2.weight"]
    m.tied_head = True  # the token embedding is the head too: its gradient is not only rows
    assert GPT(cfg.model, cfg.attention).lookup_table_names()[:2] == [None, "value_embeds.0.weight"]


def test_buffers_refuse_a_table_they_do_not_hold():
    model = TwoTables()
    with pytest.raises(ValueError, match="GradBuffers: no trained parameter named 'nope'"):
        grad_accum.GradBuffers(model, rows=["nope"])


@pytest.mark.gpu
def test_gpu_kernel_is_the_reference_bit_for_bit():
    """At the record's table size (V = 50,304, D = 768, 49,152 FineWeb-like skewed tokens)."""
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    tokens, scratch, total = _case(V=50304, D=768, N=49152)
    tokens, scratch, total = tokens.cuda(), scratch.cuda(), total.cuda()
    s2, t2 = scratch.clone(), total.clone()
    embed_rows.launch(tokens, scratch, total)
    embed_rows.reference(tokens, s2, t2)
    assert torch.equal(total.view(torch.int16), t2.view(torch.int16)) and torch.equal(scratch, s2)  # no NaN
    assert not scratch.any()
