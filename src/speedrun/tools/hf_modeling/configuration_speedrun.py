"""Hugging Face config for models exported by `speedrun export hf`.

This file is copied next to the weights and loaded with
`trust_remote_code=True`, so it may import only `transformers`. Its fields are
speedrun's `ModelConfig` fields plus the attention-mask facts the network
needs at inference (document separator, block size, final window in blocks);
defaults are the 2025-08 record. `vocab_size` is the PADDED vocabulary (the
logits' width, 50,304 by default); `real_vocab_size` is the tokenizer's.
"""

from transformers import PretrainedConfig

DEFAULTS = dict(
    vocab_size=50304, real_vocab_size=50257, num_layers=12, model_dim=768, num_heads=6, head_dim=128,
    mlp_hidden=3072, activation="relu2", positions="rotary", rotary="half_truncated", max_positions=1024,
    norm="rms", qk_norm=True, tied_head=False, value_embeds=3, value_residual=False, x0_lambdas=True, unet=True,
    logit_softcap=30.0, softcap_form="sigmoid", attn_scale=0.12, attn_gate=True, gate_inputs=12,
    no_attn_layers=[7], long_layers=[0, 4, 7, 11], bias=False, num_scalars=60,
    doc_mask=True, block_size=128, long_window_blocks=14, long_short=True, segment_len=0, eot_token_id=50256,
)


class SpeedrunConfig(PretrainedConfig):
    model_type = "speedrun"

    def __init__(self, **kwargs):
        for key, default in DEFAULTS.items():
            value = kwargs.pop(key, default)
            setattr(self, key, list(value) if isinstance(value, tuple) else value)
        # names that generic transformers code (generate, pipelines) looks for
        self.hidden_size = self.model_dim
        self.num_hidden_layers = self.num_layers
        self.num_attention_heads = self.num_heads
        for key in ("hidden_size", "num_hidden_layers", "num_attention_heads"):
            kwargs.pop(key, None)
        kwargs.setdefault("bos_token_id", self.eot_token_id)
        kwargs.setdefault("eos_token_id", self.eot_token_id)
        kwargs["tie_word_embeddings"] = False  # a tied head is read from embed.weight directly
        super().__init__(**kwargs)
