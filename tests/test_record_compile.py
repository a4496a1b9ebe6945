"""The 2026 record's losses trace as one graph each, which is what the GPU compile plan rests on.

`RecordTrainer` compiles the micro-step's training loss and the validation loss with static shapes,
one graph per stage (train/record_loop.py). A graph break would split the step into pieces run
eagerly between compiled ones, and a value read back from the device would stall it: Dynamo's
`explain` on the CPU finds both without a GPU. The attention kernel is a stand-in here (a dense
masked product with the reference's semantics and no host read), since the GPU's varlen kernel does
not run on the CPU; the FP8 products run through their references, the MLP's delayed scale
included, so the trace covers the seams a GPU run uses.
"""

from __future__ import annotations

import torch

from record_standins import dense_attend, dense_dc
from speedrun.model import record_fp8, record_parts
from speedrun.model.record import RecordGPT, RecordKernels, RecordModelConfig


def _model_and_batch(n=192):
    cfg = RecordModelConfig.tiny()
    model = RecordGPT(cfg, generator=torch.Generator().manual_seed(0))
    model.kernels = RecordKernels("dense", dense_attend, dense_dc)
    model.fp8 = record_fp8.Fp8Training(record_fp8.RECORD_FP8, 0.5, cfg.mlp_bank_layers)
    model.fp8.refresh(model.mlp_bank, bootstrap=True)
    tokens = torch.randint(0, cfg.vocab - 1, (n + 1,), generator=torch.Generator().manual_seed(1))
    cu = torch.tensor([0, 70, 150, n, n], dtype=torch.int32)
    rope = record_parts.rope_tables(record_parts.rope_freqs(cfg.rope_pairs), 2 * n)
    return model, tokens, cu, rope


def test_the_stand_in_attention_is_the_reference():
    gen = torch.Generator().manual_seed(2)
    q, k, v = (torch.randn(100, 6, 16, generator=gen) for _ in range(3))
    cu = torch.tensor([0, 40, 41, 100, 100], dtype=torch.int32)
    want = record_parts.reference_attention(q, k, v, cu, 7, 0.3)
    assert torch.allclose(dense_attend(q, k, v, cu, 7, 0.3, None), want, atol=1e-5)


def test_the_training_loss_is_one_graph_and_keeps_the_delayed_scale():
    model, tokens, cu, rope = _model_and_batch()
    prefix = torch.full((model.cfg.vocab,), -1, dtype=torch.int64)
    args = (tokens[:-1], tokens[1:], cu, (32, 64), 0.1, torch.tensor([1.0, 0.5]), torch.tensor(0.2), prefix)
    kwargs = dict(rope=rope, dtype=torch.bfloat16, longest=80)
    before = model.fp8.mlp[0].s_act.clone()
    explained = torch._dynamo.explain(model.training_loss)(*args, **kwargs)
    assert (explained.graph_count, explained.graph_break_count) == (1, 0), explained.break_reasons
    torch._dynamo.reset()
    compiled = torch.compile(model.training_loss, backend="eager", dynamic=False, fullgraph=True)
    loss = compiled(*args, **kwargs)
    loss.backward()
    after = model.fp8.mlp[0].s_act.clone()
    assert not torch.equal(after, before)  # the delayed scale left the graph as the eager step leaves it
    model.zero_grad()
    model.fp8.mlp[0].s_act = before
    assert torch.equal(model.training_loss(*args, **kwargs), loss.detach()) and torch.equal(model.fp8.mlp[0].s_act, after)


def test_the_validation_loss_is_one_graph():
    model, tokens, cu, rope = _model_and_batch()
    model.eval()
    with torch.no_grad():
        explained = torch._dynamo.explain(model.eval_loss)(tokens[:-1], tokens[1:], cu, (32, 64), 0.1, rope=rope,
                                                            dtype=torch.bfloat16, longest=80, rows=64)
    assert (explained.graph_count, explained.graph_break_count) == (1, 0), explained.break_reasons
