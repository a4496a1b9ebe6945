"""Export the 2026-07 record's model (`RecordGPT`) to a folder that `transformers` loads with
trust_remote_code=True.

Why it is built this way:

- The folder holds model.safetensors (the native state dict under the native names, written with
  safetensors' `save_file`), config.json, the self-contained modelling file
  `hf_modeling/record_modeling.py` that config.json's `auto_map` names, and the GPT-2 tokenizer
  files of the 2025 export. Writing config.json by hand keeps export free of a `transformers`
  dependency; only loading the result needs it.
- Tensors keep their own dtype (bf16 tables and banks, fp32 scalars and lambdas, the bf16 ±1 sign
  table as the buffer `bigram_signs`): exact, and half the bytes of an all-float32 file.
  config.json's `dtype` is float32, so `from_pretrained` builds a float32 model by default and
  computes the function of the training model's float32 forward.
- The world-size pads of qk_bank and vo_bank (zero matrices, present at W = 8 only) are left out:
  an exported folder is the same whatever W trained it, and its state dict is that of a
  `RecordGPT(cfg, world_size=1)`. The unused entries the spec lists stay, so the layout matches.
- What the forward needs besides the weights is passed in, not looked up: the windows of the
  evaluation to reproduce (the record's final validation uses short 768, long 2560 tokens, with no
  YaRN update), and the rotary frequencies and softmax scale the run ended with. The layer map and
  the gate lanes are written from the model's own config (`RecordGPT.lanes`).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from importlib import resources
from pathlib import Path

from torch import Tensor

from speedrun.errors import ConfigError
from speedrun.model.record import RecordGPT, RecordModelConfig, gate_lanes
from speedrun.tools.export_hf import write_tokenizer

MODELING_FILE = "record_modeling.py"
SWITCHES = ("smear", "bigram", "x0_inject", "skip", "dc", "mudd")  # RecordModelConfig's technique switches
EOT = 50256
REAL_VOCAB = 50257


def hf_config(cfg: RecordModelConfig, windows: Sequence[int], attn_scale: float, freqs: Tensor) -> dict:
    """config.json contents for `record_modeling.RecordConfig`: sizes, layer map and gate lanes of
    `cfg`, the (short, long) windows in tokens, the float32 rotary frequencies and the scale."""
    short, long = (int(w) for w in windows)
    if min(short, long) < 0:
        raise ConfigError(f"export: windows must be >= 0 tokens, got {tuple(windows)}")
    if tuple(freqs.shape) != (cfg.rope_pairs,):
        raise ConfigError(f"export: {cfg.rope_pairs} rotary frequencies expected, got shape {tuple(freqs.shape)}")
    lanes = [[kind, layer, k, s.start, s.stop] for (kind, layer), (k, s) in gate_lanes(cfg).items()]
    eot = EOT if cfg.vocab > EOT else None  # a test-size vocabulary has no GPT-2 end-of-text id
    return dict(
        vocab_size=cfg.vocab, real_vocab_size=min(REAL_VOCAB, cfg.vocab), model_dim=cfg.model_dim,
        num_heads=cfg.num_heads, head_dim=cfg.head_dim, num_layers=cfg.num_layers, mlp_hidden=cfg.mlp_hidden,
        mlp_bank_layers=cfg.mlp_bank_layers, qk_matrices=cfg.qk_matrices, vo_matrices=cfg.vo_matrices,
        bigram_rows=cfg.bigram_rows, sign_rows=cfg.sign_rows, smear_inputs=cfg.smear_inputs,
        ve_gate_inputs=cfg.ve_gate_inputs, mudd_dim=cfg.mudd_dim, mudd_rows=max(len(m) for m in cfg.mudd_inits),
        gate_rows=max(cfg.gate_outputs), gate_outputs=list(cfg.gate_outputs),
        mudd_outputs=[len(m) for m in cfg.mudd_inits], mudd_scale=cfg.mudd_scale, norm_eps=cfg.norm_eps,
        dc_keys=cfg.dc_keys, dc_eps=cfg.dc_eps, xsa_eps=cfg.xsa_eps,
        no_attn_layer=cfg.no_attn_layer, long_layers=list(cfg.long_layers), paired_layers=list(cfg.paired_layers),
        key_offset_layers=list(cfg.key_offset_layers), ve_layers=list(cfg.ve_layers), cache7_layer=cfg.cache7_layer,
        cache7_input_layers=list(cfg.cache7_input_layers), dc_layer=cfg.dc_layer, mudd_layer=cfg.mudd_layer,
        skip_source=cfg.skip_source, post_gate_layer=cfg.post_gate_layer, gate_lanes=lanes,
        short_window=short, long_window=long, rope_freqs=[float(f) for f in freqs.float().tolist()],
        attn_scale=float(attn_scale), eot_token_id=eot, bos_token_id=eot, eos_token_id=eot,
        tie_word_embeddings=False, dtype="float32", model_type="speedrun_record",
        architectures=["RecordForCausalLM"],
        auto_map={"AutoConfig": "record_modeling.RecordConfig",
                  "AutoModelForCausalLM": "record_modeling.RecordForCausalLM"},
    )


def exported_state(model: RecordGPT) -> dict[str, Tensor]:
    """The state dict in native dtypes on the CPU, qk_bank and vo_bank without their world-size pads."""
    c = model.cfg
    real = {"qk_bank": c.qk_matrices, "vo_bank": c.vo_matrices}
    state = {}
    for name, t in model.state_dict().items():
        t = t.detach().cpu()
        state[name] = t[: real[name]].clone() if name in real else t.contiguous()
    return state


def export(model: RecordGPT, cfg: RecordModelConfig, windows: Sequence[int], attn_scale: float, freqs: Tensor,
           out_dir: Path | str, *, overwrite: bool = False) -> Path:
    """Write the Hugging Face folder of `model` (whose config is `cfg`) into `out_dir`; returns it.
    windows (short, long) in tokens, attn_scale and float32 freqs as the evaluation to reproduce
    uses them (the record's final validation: (768, 2560) and the run's last YaRN values)."""
    from safetensors.torch import save_file

    if cfg != model.cfg:
        raise ConfigError("export: cfg is not the model's configuration")
    off = [name for name in SWITCHES if not getattr(cfg, name)]
    if off:
        raise ConfigError(f"export: the exported modelling file computes the whole record; this model has "
                          f"{', '.join(off)} switched off")
    out = Path(out_dir)
    if out.exists() and any(out.iterdir()) and not overwrite:
        raise ConfigError(f"export: {out} exists and is not empty; pass overwrite=True")
    config = hf_config(cfg, windows, attn_scale, freqs)
    out.mkdir(parents=True, exist_ok=True)
    save_file(exported_state(model), str(out / "model.safetensors"), metadata={"format": "pt"})
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    eot = config["eot_token_id"]
    gen = {"bos_token_id": eot, "eos_token_id": eot, "pad_token_id": eot}
    (out / "generation_config.json").write_text(json.dumps(gen, indent=2) + "\n")
    code = resources.files("speedrun") / "tools" / "hf_modeling" / MODELING_FILE
    (out / MODELING_FILE).write_bytes(code.read_bytes())
    write_tokenizer(out)
    return out
