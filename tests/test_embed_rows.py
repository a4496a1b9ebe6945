"""model.embed_kernel=rows: the embedding tables' gradients added into the in-place sums row by row.

* The op (`speedrun::add_rows_`): the reference adds exactly the touched rows, as the dense path's
  rounding and add would, leaves the others alone and zeroes the scratch rows it read; the Triton
  kernels equal the reference bit for bit (Triton's interpreter in a subprocess, and on a GPU).
* The path: a compiled step with two tables gives the dense in-place path's gradients bit for bit
  over two steps (the scratch must come back to zero), so does the eager lookup on two threads, and
  the tiny run trains exactly as autograd.
* The wiring: which tables a GPT looks up only, `resolve` (rows is the default wherever the in-place sums
  run, the dense tables elsewhere), the refusals.
"""

from __future__ import annotations

import json
import textwrap

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from interpreter_helpers import run_interpreted
from reliability_helpers import curves, train
from speedrun.kernels import embed_rows
from speedrun.kernels import embeddings
from speedrun.train import grad_accum
from speedrun.config import validate
from speedrun.errors import ConfigError
from speedrun.recipes.presets import record
from speedrun.compile.regional import compile_step_model


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

    def __init__(self, kernel: str):
        super().__init__()
        self.kernel = kernel
        self.embed = nn.Embedding(97, 32).to(torch.bfloat16)
        self.value = nn.Embedding(97, 32).to(torch.bfloat16)
        self.up = nn.Parameter(torch.randn(32, 32) / 6)
        self.head = nn.Parameter(torch.randn(97, 32) / 6)

    def lookup_table_names(self):
        return ["embed.weight", "value.weight"]

    def forward(self, tokens, targets, long_blocks, dtype=torch.bfloat16, table_sums=None):
        x, v = embeddings.lookups(tokens, [self.embed.weight, self.value.weight], self.kernel, table_sums)
        h = F.linear(x * v.sigmoid(), self.up.to(dtype)).relu().square().float()
        return F.cross_entropy(F.linear(h, self.head), targets)


def _steps(model, step_model, bufs, batches, steps=2):
    grads = []
    for _ in range(steps):
        bufs.start()
        for tokens, targets in batches:
            scratch = bufs.scratch if any(r is not None for r in bufs.scratch) else None
            loss = step_model(tokens, targets, 0, torch.bfloat16, bufs.begin(), None, scratch)
            (loss / len(batches)).backward()
        bufs.finish()
        grads.append({n: p.grad.clone() for n, p in model.named_parameters()})
        with torch.no_grad():
            for p in model.parameters():
                p.sub_(p.grad.to(p.dtype) * 0.5)
    return grads


@pytest.mark.parametrize("compiled", [False, True])
def test_rows_give_the_dense_in_place_sums_bit_for_bit(compiled):
    """Two steps of three micro-steps: compiled (Inductor's fused atomics into the scratch table, as on
    the GPU), the same gradients as the dense in-place path bit for bit; eager, within bfloat16's
    rounding. The scratch tables zero after each step, the tables' `.grad` the buffers."""
    gen = torch.Generator().manual_seed(1)
    batches = [(torch.randint(0, 40, (64,), generator=gen), torch.randint(0, 97, (64,), generator=gen))
               for _ in range(3)]
    got = {}
    for kernel in ("torch", "rows"):
        torch.manual_seed(0)
        model = TwoTables(kernel)
        rows = model.lookup_table_names() if kernel == "rows" else ()
        bufs = grad_accum.GradBuffers(model, False, (), rows)
        got[kernel] = _steps(model, compile_step_model(model, "on", compiled, summed="inplace"), bufs, batches)
        if kernel == "rows":
            names = [n for n, _ in grad_accum.trained_parameters(model)]
            assert [n for n, r in zip(names, bufs.scratch) if r is not None] == ["embed.weight", "value.weight"]
            assert not any(r.any() for r in bufs.scratch if r is not None)
            assert model.embed.weight.grad is bufs.buffers[names.index("embed.weight")]
    for want, have in zip(got["torch"], got["rows"]):
        for name in want:
            assert have[name].dtype == want[name].dtype, name
            if compiled:
                assert torch.equal(have[name], want[name]), name
            else:  # the CPU's eager dense backward sums in bfloat16 (CUDA's and Inductor's in float32)
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


def test_tiny_run_trains_as_autograd(tmp_path):
    """The tiny model with a value embedding, eager on the CPU: every loss as autograd's with the rows
    (the default: in-place sums), and with the dense tables where grad_accum is set to autograd."""
    ve = ("--set", "model.value_embeds=1")
    assert train(tmp_path / "autograd", *ve, "--set", "train.grad_accum=autograd", steps=4) == 0
    assert train(tmp_path / "rows", *ve, steps=4) == 0
    assert curves(tmp_path / "autograd") == curves(tmp_path / "rows")
    run = json.loads((tmp_path / "rows" / "env.json").read_text())["run"]
    assert run["grad_accum"] == "inplace" and run["embed_rows"] is True
    run = json.loads((tmp_path / "autograd" / "env.json").read_text())["run"]
    assert run["grad_accum"] == "autograd" and run["embed_rows"] is False


def test_config_and_resolve():
    """rows is the default and takes the in-place sums wherever they run; elsewhere (regional compile, a
    grad_accum set to graph or autograd) the tables' dense gradients, so no setting is refused."""
    assert record().model.embed_kernel == "rows"
    assert grad_accum.resolve("auto", "auto", False, False, 1, rows=True) == "inplace"  # eager, one micro-step
    assert grad_accum.resolve("auto", "on", True, False, 8, rows=True) == "inplace"
    assert grad_accum.resolve("auto", "regional", True, False, 8, rows=True) == "autograd"
    assert grad_accum.resolve("graph", "on", True, False, 8, rows=True) == "graph"
    for field, value in (("grad_accum", "graph"), ("grad_accum", "autograd"), ("compile", "regional")):
        cfg = record()
        setattr(cfg.train, field, value)
        validate(cfg, 1)
    bad = record()
    bad.model.embed_kernel = "sparse"
    with pytest.raises(ConfigError, match="model.embed_kernel"):
        validate(bad, 1)
    model = TwoTables("rows")
    with pytest.raises(ValueError, match="GradBuffers: no trained parameter named 'nope'"):
        grad_accum.GradBuffers(model, False, (), ["nope"])
    with pytest.raises(ValueError, match="scratch tables need the in-place sums"):
        bufs = grad_accum.GradBuffers(model, False, (), model.lookup_table_names())
        grad_accum.SummedModel(model)(torch.zeros(4, dtype=torch.long), torch.zeros(4, dtype=torch.long), 0,
                                      torch.bfloat16, bufs.begin(), None, bufs.scratch)


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


@pytest.mark.gpu
def test_gpu_tiny_run_trains_like_the_dense_path(tmp_path):
    """Compiled on the GPU in bfloat16 (the tables too): rows against the dense in-place path, the same
    losses within the compiled step's run-to-run spread (float32 atomics in either order)."""
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    from reliability_helpers import assert_curves_close

    gpu = ["--set", "train.compile=on", "--set", "train.precompile=false", "--set", "train.warmup_steps=2",
           "--set", "train.dtype=bfloat16", "--set", "model.value_embeds=1", "--set", "train.grad_accum=inplace"]
    assert train(tmp_path / "dense", *gpu, "--set", "model.embed_kernel=torch", steps=6) == 0
    assert train(tmp_path / "rows", *gpu, steps=6) == 0
    assert_curves_close(tmp_path / "dense", tmp_path / "rows")
    assert json.loads((tmp_path / "rows" / "env.json").read_text())["run"]["embed_rows"] is True
