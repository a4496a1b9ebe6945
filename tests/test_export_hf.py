"""`speedrun export hf`: transformers loads the folder and its logits equal the native model's."""

import importlib.util
import json

import pytest
import torch

from speedrun.run.checkpoint import save_model_files
from speedrun.cli.main import main
from speedrun.tools.export import export
from speedrun.model.gpt import GPT
from speedrun.recipes.presets import demo_2025_08 as demo
from speedrun.tools.sample import final_window
from speedrun.data.tokenizer import encode

HAVE_TRANSFORMERS = importlib.util.find_spec("transformers") is not None
needs_transformers = pytest.mark.skipif(not HAVE_TRANSFORMERS, reason="transformers is not installed "
                                        "(pip install -e '.[test]' installs it)")

VARIANTS = {
    "record-like": {},
    "tied-tanh-bias-full-rotary": {"tied_head": True, "softcap_form": "tanh", "bias": True, "rotary": "full",
                                   "attn_scale": 0.0, "no_attn_layers": ()},
    "llmc-like": {"norm": "layer", "positions": "learned", "max_positions": 512, "activation": "gelu",
                  "value_embeds": 0, "unet": False, "x0_lambdas": False, "attn_gate": False, "qk_norm": False,
                  "logit_softcap": 0.0, "zero_init": False},
    "value-residual": {"value_embeds": 0, "value_residual": True, "softcap_form": "tanh"},
}


def tiny_model(tmp_path, seed=0, attention=None, **model_fields):
    cfg = demo()
    m = cfg.model
    m.model_dim, m.num_heads, m.head_dim, m.num_layers, m.value_embeds, m.mlp_hidden = 64, 2, 32, 4, 2, 128
    m.long_layers, m.no_attn_layers = (0, 3), (2,)
    for k, v in {**model_fields}.items():
        setattr(m, k, v)
    for k, v in (attention or {}).items():
        setattr(cfg.attention, k, v)
    torch.manual_seed(seed)
    model = GPT(cfg.model, cfg.attention)
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.add_(torch.randn_like(p) * (0.2 if name == "scalars" else 0.3 / p.shape[-1] ** 0.5 * 3))
    save_model_files(model, cfg, tmp_path / "ckpt")
    return model.eval(), cfg


def tokens(n, seed=0):
    t = torch.randint(0, 50257, (n,), generator=torch.Generator().manual_seed(seed))
    t[0], t[90], t[91], t[n - 40] = 50256, 50256, 50256, 50256  # documents, one empty
    return t


def native_logits(model, toks):
    n = toks.numel()
    padded = torch.cat([toks, toks.new_zeros((-n) % 128)])
    with torch.no_grad():
        return model.logits(padded, torch.tensor(final_window(model)))[:n]


@needs_transformers
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_exported_logits_equal_native(tmp_path, variant):
    from transformers import AutoModelForCausalLM

    model, cfg = tiny_model(tmp_path, **VARIANTS[variant])
    assert final_window(model) == 2  # 300 tokens > 256-token window: the block window matters
    export(tmp_path / "ckpt", tmp_path / "hf")
    hf = AutoModelForCausalLM.from_pretrained(str(tmp_path / "hf"), trust_remote_code=True).eval()
    toks = tokens(300)
    with torch.no_grad():
        out = hf(toks[None]).logits[0]
    assert out.dtype == torch.float32 and out.shape == (300, 50304)
    torch.testing.assert_close(out, native_logits(model, toks), atol=1e-5, rtol=1e-5)


@needs_transformers
def test_batch_generate_and_tokenizer(tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model, _ = tiny_model(tmp_path, attention={"segment_len": 128})
    export(tmp_path / "ckpt", tmp_path / "hf")
    hf = AutoModelForCausalLM.from_pretrained(str(tmp_path / "hf"), trust_remote_code=True).eval()
    batch = torch.stack([tokens(200, 1), tokens(200, 2)])
    with torch.no_grad():
        out = hf(batch).logits
    torch.testing.assert_close(out[1], native_logits(model, batch[1]), atol=1e-5, rtol=1e-5)
    tok = AutoTokenizer.from_pretrained(str(tmp_path / "hf"), trust_remote_code=True)
    text = "It was a dark and stormy night; the rain fell in torrents."
    assert tok.encode(text) == encode(text) and tok.eos_token_id == 50256
    ids = torch.tensor([[50256, *encode("Hello")]])
    gen = hf.generate(ids, max_new_tokens=4, do_sample=False)
    assert gen.shape == (1, 6)
    step = native_logits(model, ids[0])[-1, :50257].argmax()
    assert int(gen[0, 2]) == int(step)


def test_export_folder_contents(tmp_path):
    tiny_model(tmp_path)
    assert main(["export", "hf", "--ckpt", str(tmp_path / "ckpt"), "--out", str(tmp_path / "hf")]) == 0
    names = {p.name for p in (tmp_path / "hf").iterdir()}
    assert {"config.json", "model.safetensors", "modeling_speedrun.py", "configuration_speedrun.py", "vocab.json",
            "merges.txt", "tokenizer_config.json", "special_tokens_map.json"} <= names
    conf = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert conf["auto_map"]["AutoModelForCausalLM"] == "modeling_speedrun.SpeedrunForCausalLM"
    assert conf["vocab_size"] == 50304 and conf["long_window_blocks"] == 2


def test_export_errors_are_one_line(tmp_path, capsys):
    assert main(["export", "hf", "--ckpt", str(tmp_path / "missing"), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "missing" in err
    tiny_model(tmp_path)
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "x").write_text("x")
    assert main(["export", "hf", "--ckpt", str(tmp_path / "ckpt"), "--out", str(tmp_path / "busy")]) == 2
    assert "--overwrite" in capsys.readouterr().err
