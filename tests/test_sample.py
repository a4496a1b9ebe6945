"""Key-value-cached sampling equals recomputing the full forward each token."""

import pytest
import torch

from speedrun.model.attention import EOT, dense_mask
from speedrun.run.checkpoint import save_model_files
from speedrun.cli.main import main
from model_helpers import random_tiny_model as tiny_model
from speedrun.tools.sample import KVCache, generate, generate_text, window_mask


@pytest.mark.parametrize("density", [0.0, 0.01, 0.05, 0.3])
def test_window_mask_equals_dense_mask(density):
    g = torch.Generator().manual_seed(int(density * 100))
    for _ in range(20):
        t = 128 * int(torch.randint(1, 6, (1,), generator=g))
        docs = (torch.rand(t, generator=g) < density).long().cumsum(0)
        w = int(torch.randint(0, 6, (1,), generator=g))
        pos = torch.arange(t)
        assert torch.equal(window_mask(docs, pos, docs, pos, w, 128), dense_mask(docs, w, 128))


def full_forward_logits(model, seq, w):
    n = len(seq)
    padded = torch.tensor(seq + [0] * ((-n) % 128))
    return model.logits(padded, torch.tensor(w))[n - 1]


def test_cached_greedy_equals_recomputed_greedy():
    model, _ = tiny_model()
    g = torch.Generator().manual_seed(3)
    prompt = torch.randint(0, 50257, (200,), generator=g).tolist()
    prompt[0], prompt[150] = EOT, EOT  # two documents; 200 > one 128-token block
    w = 2  # long window 2 blocks, short 1: the window cuts into the first document
    fast = generate(model, prompt, 16, temperature=0, window_blocks=w)
    seq, slow = list(prompt), []
    for _ in range(16):
        tok = int(full_forward_logits(model, seq, w)[:50257].argmax())
        slow.append(tok)
        seq.append(tok)
    assert fast == slow
    assert len(set(fast)) > 5  # the random model is not degenerate


@pytest.mark.parametrize("fields", [{}, {"value_embeds": 0, "value_residual": True}])
def test_cached_logits_match_at_every_step(fields):
    model, _ = tiny_model(1, **fields)
    seq = [EOT] + torch.randint(0, 50257, (300,), generator=torch.Generator().manual_seed(0)).tolist()
    cache = KVCache(model, len(seq), 1, torch.float32)
    cache.extend(torch.tensor(seq[:140]))
    for n in range(141, len(seq) + 1, 37):
        got = cache.extend(torch.tensor(seq[cache.tokens.numel():n]))
        torch.testing.assert_close(got, full_forward_logits(model, seq[:n], 1), atol=2e-4, rtol=1e-4)


def test_sampling_is_seeded_and_respects_top_k():
    model, _ = tiny_model()
    a = generate(model, [EOT, 100, 200], 20, temperature=1.0, top_k=5, seed=7)
    b = generate(model, [EOT, 100, 200], 20, temperature=1.0, top_k=5, seed=7)
    assert a == b and all(t < 50257 for t in a)
    first = full_forward_logits(model, [EOT, 100, 200], 2)[:50257]
    assert a[0] in torch.topk(first, 5).indices.tolist()
    text = generate_text(model, "Hello", 8, seed=1)
    assert text.startswith("Hello") and len(text) > len("Hello")


def test_sample_command(tmp_path, capsys):
    model, cfg = tiny_model()
    save_model_files(model, cfg, tmp_path / "m")
    assert main(["sample", "--ckpt", str(tmp_path / "m"), "--prompt", "Once upon", "--max-new-tokens", "5",
                 "--device", "cpu"]) == 0
    assert capsys.readouterr().out.startswith("Once upon")


def test_sample_missing_ckpt_is_one_line_error(tmp_path, capsys):
    assert main(["sample", "--ckpt", str(tmp_path / "nope"), "--prompt", "x"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "nope" in err and "config.json" in err


@pytest.mark.gpu
def test_cached_greedy_same_on_gpu():
    model, _ = tiny_model()
    prompt = [EOT] + list(range(1000, 1180))
    cpu = generate(model, prompt, 12, temperature=0, window_blocks=2)
    assert generate(model.cuda(), prompt, 12, temperature=0, window_blocks=2) == cpu


@pytest.mark.parametrize("args, message", [
    (["--temperature", "-1"], "--temperature: must be >= 0 (0 = greedy), got -1.0"),
    (["--temperature", "nan"], "--temperature: must be >= 0 (0 = greedy), got nan"),
    (["--top-k", "-5"], "--top-k: must be >= 0 (0 = all tokens), got -5"),
    (["--max-new-tokens", "0"], "--max-new-tokens: must be >= 1, got 0"),
])
def test_sampling_options_out_of_range_are_refused_before_loading(tmp_path, capsys, args, message):
    assert main(["sample", "--ckpt", str(tmp_path / "nope"), *args]) == 2  # no model: refused before loading
    assert capsys.readouterr().err.strip() == f"speedrun: error: {message}"
