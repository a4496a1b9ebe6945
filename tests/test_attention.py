"""FlexAttention block masks against the dense reference mask."""

import pytest
import torch

from speedrun.attention import (
    AttentionMasks, EOT, block_structure, dense_mask, document_ids, window_counts,
)


def random_tokens(n, p_doc, gen):
    tok = torch.randint(0, 50000, (n,), generator=gen)
    tok[torch.rand(n, generator=gen) < p_doc] = EOT
    tok[0] = EOT
    return tok


def block_mask_from_structure(docs, w, bs):
    """Expand the FlexAttention-side block selection to a (T, T) mask."""
    s = block_structure(docs, bs)
    partial, full = window_counts(s, torch.tensor(w))
    nb = docs.numel() // bs
    keep = torch.zeros(nb, nb, dtype=torch.bool)
    for q in range(nb):
        keep[q, s.partial_idx[q, : partial[q]].long()] = True
        keep[q, s.full_idx[q, : full[q]].long()] = True
    t = docs.numel()
    pos = torch.arange(t)
    allowed = (pos[:, None] >= pos) & (docs[:, None] == docs)
    return allowed & keep.repeat_interleave(bs, 0).repeat_interleave(bs, 1)


@pytest.mark.parametrize("seed", range(6))
def test_block_selection_matches_dense_reference(seed):
    gen = torch.Generator().manual_seed(seed)
    bs = 16
    tok = random_tokens(bs * 12, [0.0, 0.01, 0.05, 0.2, 0.02, 0.1][seed], gen)
    docs = document_ids(tok)
    for w in [0, 1, 2, 3, 5, 12, 100]:
        assert torch.equal(block_mask_from_structure(docs, w, bs), dense_mask(docs, w, bs)), (seed, w)


@pytest.mark.parametrize("seed", range(3))
def test_query_side_blocks_equal_torch_transpose(seed):
    """`flex_block_mask` builds the backward's per-key-block lists itself (no vmap
    to trace); they must be exactly what `BlockMask.from_kv_blocks` computes."""
    from torch.nn.attention.flex_attention import BlockMask

    from speedrun.attention import flex_block_mask

    gen = torch.Generator().manual_seed(seed)
    bs = 16
    docs = document_ids(random_tokens(bs * 20, [0.0, 0.02, 0.15][seed], gen))
    s = block_structure(docs, bs)
    for w in [1, 2, 3, 7, 40]:
        wt = torch.tensor(w, dtype=torch.int32)
        got = flex_block_mask(s, wt, bs)
        partial, full = window_counts(s, wt)
        ref = BlockMask.from_kv_blocks(partial[None, None].contiguous(), s.partial_idx[None, None].contiguous(),
                                       full[None, None].contiguous(), s.full_idx[None, None].contiguous(),
                                       BLOCK_SIZE=bs)
        for name in ("q_num_blocks", "q_indices", "full_q_num_blocks", "full_q_indices",
                     "kv_num_blocks", "kv_indices", "full_kv_num_blocks", "full_kv_indices"):
            a, b = getattr(got, name), getattr(ref, name)
            assert a.dtype == b.dtype and a.stride() == b.stride() and torch.equal(a, b), (seed, w, name)


def test_dense_mask_rules():
    bs = 4
    tok = torch.tensor([EOT, 1, 2, 3, 4, 5, EOT, 6, 7, 8, 9, 10, 11, 12, 13, 14])
    m = dense_mask(document_ids(tok), 2, bs)
    assert not m[7, 5]  # other document
    assert m[7, 6] and m[5, 0]
    assert not m[2, 3]  # causal
    assert m[15, 8] and not m[15, 7]  # window: blocks 2 and 3 only


@pytest.mark.parametrize("seed", range(3))
def test_flex_equals_dense_forward_cpu(seed):
    gen = torch.Generator().manual_seed(seed)
    bs, T, H, D = 128, 512, 2, 16
    tok = random_tokens(T, 0.004 * (seed + 1), gen)
    docs = document_ids(tok)
    q, k, v = (torch.randn(1, H, T, D, generator=gen) for _ in range(3))
    for w in [1, 2, 3]:
        long, short = torch.tensor(w), torch.tensor(max(w // 2, 1))
        flex = AttentionMasks(docs, long, short, bs, "flex")
        dense = AttentionMasks(docs, long, short, bs, "dense")
        for is_long in (True, False):
            a = flex.attend(q, k, v, is_long, 0.12)
            b = dense.attend(q, k, v, is_long, 0.12)
            torch.testing.assert_close(a, b, atol=2e-5, rtol=2e-5)


@pytest.mark.gpu
@pytest.mark.parametrize("seed", range(3))
def test_compiled_flex_equals_dense_with_grad_gpu(cuda, seed):
    gen = torch.Generator().manual_seed(seed)
    bs, T, H, D = 128, 4096, 6, 128
    tok = random_tokens(T, 0.002 * (seed + 1), gen).to(cuda)
    docs = document_ids(tok)
    qkv = [torch.randn(1, H, T, D, generator=gen).to(cuda, torch.bfloat16).requires_grad_() for _ in range(3)]

    @torch.compile(fullgraph=True)
    def run_flex(q, k, v, w):
        return AttentionMasks(docs, w, w // 2, bs, "flex").attend(q, k, v, True, 0.12)

    for w in [1, 5, 14]:
        wt = torch.tensor(w, device=cuda, dtype=torch.int32)
        out = run_flex(*qkv, wt)
        grads = torch.autograd.grad(out.float().square().sum(), qkv)
        ref_in = [t.detach().float().requires_grad_() for t in qkv]
        ref = AttentionMasks(docs, wt, wt // 2, bs, "dense").attend(*ref_in, True, 0.12)
        ref_grads = torch.autograd.grad(ref.square().sum(), ref_in)
        rel = (out.float() - ref).norm() / ref.norm()
        assert rel < 1e-2, rel
        for g, r in zip(grads, ref_grads):
            assert (g.float() - r).norm() / r.norm() < 2e-2


def test_flex_options_parse_and_validate():
    from speedrun.config import RunConfig, apply_overrides, parse_flex_options, validate
    from speedrun.errors import ConfigError

    assert parse_flex_options("") == {}
    assert parse_flex_options("fwd_BLOCK_M=128, bwd_num_warps=4,fwd_USE_TMA=true") == {
        "fwd_BLOCK_M": 128, "bwd_num_warps": 4, "fwd_USE_TMA": True}
    for bad in ("fwd_BLOCK_M", "fwd_BLOCK_M=big", "=3", "a b=1"):
        cfg = apply_overrides(RunConfig(), [f"attention.flex_options={bad}"])
        with pytest.raises(ConfigError, match="attention.flex_options"):
            validate(cfg)


def test_flex_options_reach_the_kernel_call(monkeypatch):
    """The model hands its parsed options to every FlexAttention call (and none when empty)."""
    import speedrun.attention as attention_mod
    from speedrun.config import AttentionConfig, ModelConfig
    from speedrun.model import GPT

    seen = []
    monkeypatch.setattr(attention_mod, "flex_attention",
                        lambda q, k, v, mask, scale, options=None: seen.append(options) or v)
    cfg = ModelConfig(num_layers=2, value_embeds=1, model_dim=32, num_heads=2, head_dim=16, mlp_hidden=64,
                      vocab_size=300, no_attn_layers=(), long_layers=(0,))
    for text, want in (("fwd_BLOCK_M=64,bwd_num_stages=2", {"fwd_BLOCK_M": 64, "bwd_num_stages": 2}), ("", None)):
        seen.clear()
        model = GPT(cfg, AttentionConfig(flex_options=text))
        model.attention_backend = "flex"
        model(torch.randint(0, 300, (256,)), torch.randint(0, 300, (256,)), torch.tensor(2))
        assert seen == [want, want]
