"""`speedrun export hf`: a folder that `transformers` loads with trust_remote_code.

The folder holds the native state dict as float32 safetensors (the names are
kept, so no tensor is renamed or reshaped and nothing can be mis-mapped), the
self-contained modelling code from speedrun/tools/hf_modeling/, a config.json whose
`auto_map` points at it, and the GPT-2 tokenizer written from the vocabulary
files the package already ships (encoder.json is GPT-2's vocab.json, vocab.bpe
its merges.txt). Writing config.json by hand keeps export free of a
`transformers` dependency; only loading the result needs it. The window saved
is the one training ends with (`schedules.window_blocks(1.0, ...)`).
"""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path

import torch


MODEL_FIELDS = ("num_layers", "model_dim", "num_heads", "head_dim", "mlp_hidden", "activation", "positions",
                "rotary", "max_positions", "norm", "qk_norm", "tied_head", "value_embeds", "value_residual", "x0_lambdas", "unet",
                "logit_softcap", "softcap_form", "attn_scale", "attn_gate", "gate_inputs", "no_attn_layers",
                "long_layers", "bias")
EOT_TEXT = "<|endoftext|>"


def hf_config(model, cfg) -> dict:
    """config.json contents for SpeedrunConfig."""
    from speedrun.train.schedules import window_blocks

    m, a = cfg.model, cfg.attention
    out = {f: list(getattr(m, f)) if isinstance(getattr(m, f), tuple) else getattr(m, f) for f in MODEL_FIELDS}
    out.update(
        vocab_size=m.padded_vocab, real_vocab_size=m.vocab_size, num_scalars=model.scalars.numel(),
        doc_mask=a.doc_mask, block_size=a.block_size, long_window_blocks=window_blocks(1.0, a),
        long_short=a.long_short, segment_len=a.segment_len, eot_token_id=50256,
        bos_token_id=50256, eos_token_id=50256, tie_word_embeddings=False, dtype="float32",
        model_type="speedrun", architectures=["SpeedrunForCausalLM"], speedrun_preset=cfg.name,
        auto_map={"AutoConfig": "configuration_speedrun.SpeedrunConfig",
                  "AutoModelForCausalLM": "modeling_speedrun.SpeedrunForCausalLM"},
    )
    return out


def write_tokenizer(out: Path) -> None:
    """GPT-2 tokenizer files (GPT2Tokenizer / GPT2TokenizerFast / AutoTokenizer)."""
    assets = resources.files("speedrun") / "assets" / "gpt2"
    (out / "vocab.json").write_bytes((assets / "encoder.json").read_bytes())
    (out / "merges.txt").write_bytes((assets / "vocab.bpe").read_bytes())
    special = {"bos_token": EOT_TEXT, "eos_token": EOT_TEXT, "unk_token": EOT_TEXT}
    (out / "special_tokens_map.json").write_text(json.dumps(special, indent=2) + "\n")
    config = {"tokenizer_class": "GPT2Tokenizer", "model_max_length": 1 << 30, "add_prefix_space": False,
              "add_bos_token": False, **special}
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")


def write_code(out: Path) -> None:
    code = resources.files("speedrun") / "tools" / "hf_modeling"
    for name in ("configuration_speedrun.py", "modeling_speedrun.py"):
        (out / name).write_bytes((code / name).read_bytes())


def export_gpt(model, cfg, out: Path) -> Path:
    """Write the Hugging Face folder of a `GPT` (whose run config is `cfg`) into `out`; returns it."""
    from safetensors.torch import save_file

    out.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().to(torch.float32).contiguous() for k, v in model.state_dict().items()}
    save_file(state, str(out / "model.safetensors"), metadata={"format": "pt"})
    (out / "config.json").write_text(json.dumps(hf_config(model, cfg), indent=2) + "\n")
    gen = {"bos_token_id": 50256, "eos_token_id": 50256, "pad_token_id": 50256}
    (out / "generation_config.json").write_text(json.dumps(gen, indent=2) + "\n")
    write_code(out)
    write_tokenizer(out)
    return out
