"""Piece sets joined into one micro-step (`train.merge_tokens`): each set is still its own local batch.

The spec restarts four things at a local batch's first token: the smear, the bigram hash (the sentinel
row), the key offset and the rotary positions; and each set's MTP terms stop at its own end. A batch of
sets joined end to end (`documents.concat`) with `sets` given must therefore compute exactly the sum of
the sets' own losses and their gradients; the same batch read as one set must not.
"""

from __future__ import annotations

import torch

from speedrun.config import RecordRunConfig, apply_overrides
from speedrun.data.documents import DocBatch, concat
from speedrun.model.record import RecordGPT, RecordModelConfig
from speedrun.train.record_micro import sets_per_micro_step

N, BOS = 96, 127
ARGS = ((8, 40), 0.2, [1.0, 0.5, 0.25], 0.3)  # windows, attn scale, MTP weights, prefix weight
BF16_CAST = ("resid_lambdas", "post_lambdas", "mudd_gate_scale")


def _model() -> RecordGPT:
    """The tiny record with every parameter random (zero-initialised ones, the bigram table and the
    smear's λ, would hide a set boundary crossed), in float32: bfloat16 gradients would round each
    set's sum apart, which is what joining changes and what the trainer's test bounds."""
    gen = torch.Generator().manual_seed(0)
    model = RecordGPT(RecordModelConfig.tiny(), generator=gen).float()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=gen) * 0.1)
    return model


def _sets(count: int) -> list[DocBatch]:
    out = []
    for s in range(count):
        gen = torch.Generator().manual_seed(10 + s)
        tokens = torch.randint(0, BOS, (N + 1,), generator=gen)
        tokens[[0, 23, 50]] = BOS
        out.append(DocBatch(tokens[:-1].int(), tokens[1:].long(), torch.tensor([0, 23, 50, N, N], dtype=torch.int32)))
    return out


def _loss_and_grads(model: RecordGPT, batch: DocBatch, sets: int, prefix: torch.Tensor):
    model.zero_grad(set_to_none=True)
    windows, scale, mtp, pi = ARGS
    loss = model.training_loss(batch.inputs, batch.targets, batch.cu_seqlens, windows, scale, mtp, pi, prefix,
                               dtype=torch.float32, sets=sets)
    loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def test_joined_sets_compute_each_set_as_its_own_batch():
    model = _model()
    prefix = torch.randint(-1, model.cfg.vocab, (model.cfg.vocab,), generator=torch.Generator().manual_seed(5))
    parts = _sets(3)
    alone = [_loss_and_grads(model, b, 1, prefix) for b in parts]
    joined = concat(parts)
    loss, grads = _loss_and_grads(model, joined, 3, prefix)
    torch.testing.assert_close(loss, sum(a[0] for a in alone), rtol=1e-6, atol=0)
    assert grads.keys() == alone[0][1].keys()
    for name, g in grads.items():
        ref = sum(a[1][name] for a in alone)
        # float32 parameters the spec casts to bfloat16 before use get a bfloat16 gradient each backward
        bound = (2**-7 if name in BF16_CAST else 1e-5) * float(ref.abs().max())
        assert float((g - ref).abs().max()) <= bound, name
    hidden = model(joined.inputs, joined.cu_seqlens, ARGS[0], ARGS[1], dtype=torch.float32, sets=3)
    each = torch.cat([model(b.inputs, b.cu_seqlens, ARGS[0], ARGS[1], dtype=torch.float32) for b in parts])
    torch.testing.assert_close(hidden, each, rtol=1e-6, atol=1e-6)
    # read as one set, the later sets' first tokens smear, hash and offset across the joins
    as_one = model(joined.inputs, joined.cu_seqlens, ARGS[0], ARGS[1], dtype=torch.float32)
    assert (as_one[N] - each[N]).abs().max() > 1e-2
    assert abs(float(_loss_and_grads(model, joined, 1, prefix)[0] - loss)) > 1e-2


def test_concat_offsets_each_sets_document_bounds():
    a, b = _sets(2)
    joined = concat([a, b])
    assert joined.inputs.shape == (2 * N,) and joined.cu_seqlens.dtype == torch.int32
    assert joined.cu_seqlens.tolist() == [0, 23, 50, N, N, N, N + 23, N + 50, 2 * N, 2 * N]
    assert torch.equal(joined.targets[N:], b.targets) and concat([a]) is a


def test_sets_per_micro_step_joins_what_fits():
    def cfg(*sets: str) -> RecordRunConfig:
        return apply_overrides(RecordRunConfig(), list(sets))

    joined = cfg("train.merge_tokens=32768")
    assert sets_per_micro_step(cfg(), 16_384, 8) == 1  # off by default: the spec's layout
    assert [sets_per_micro_step(joined, n, 8) for n in (16_384, 32_768, 49_152)] == [2, 1, 1]
    assert sets_per_micro_step(cfg("train.merge_tokens=65536"), 16_384, 8) == 4
    assert sets_per_micro_step(cfg("train.merge_tokens=49152"), 16_384, 8) == 2  # 3 does not divide 8
    assert sets_per_micro_step(joined, 16_384, 1) == 1  # eight ranks: one set each
    assert sets_per_micro_step(cfg("train.merge_tokens=32768", "fp8.mlp=true"), 16_384, 8) == 1
