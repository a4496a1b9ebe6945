"""Presets: plain functions returning a run config, each derived from another.

`record` is the 2026-07 record (#89, `RecordRunConfig`); `proxy161` and `proxy322` are it at 1/8 and
1/4 of its schedule on the proxy corpus, and `demo` is its architecture shrunk to train on the
embedded corpus on two CPU cores in a few minutes. `record_2025_08` is the FlexAttention record of
2025-08-23 (`RunConfig`), the last rung of the ladder (ladder.py), with `proxy212` and
`demo_2025_08` derived from it. registry.py lists them all by name.
"""

from __future__ import annotations

from dataclasses import replace

from speedrun.config import RecordRunConfig, RunConfig
from speedrun.train.stages import scaled

PROXY_DOCS_MULT = 4  # the proxy corpus's documents are shorter than FineWeb's: 4x the N_max bound
PROXY_VAL_TOKENS = 2_097_152


# ---------------------------------------------------------------- the 2026-07 record


def record() -> RecordRunConfig:
    """Record #89 (2026-07-17): 1,270 scheduled steps and 15 of extension, 339M tokens.

    On fewer than eight GPUs the first stage's 16,384-token piece sets run two to a micro-step
    (`train.merge_tokens`): the same function with one bfloat16 rounding fewer a pair, 1.9 s quicker
    over `proxy161` on an H100 (docs/benchmarks.md, 2026-12-07); on eight a rank has one set a step."""
    cfg = RecordRunConfig(name="record")
    cfg.train.merge_tokens = 32_768
    return cfg


def record_steps(cfg: RecordRunConfig, steps: int) -> RecordRunConfig:
    """`cfg` over `steps` steps, scaled as the spec's "Scaling the schedule": E = max(1,
    round(15·N/1285)) extension steps, S = N − E scheduled (161 → 159 + 2, 322 → 318 + 4)."""
    cfg.stages = scaled(steps, cfg.stages)
    return cfg


def _proxy(name: str, steps: int, val_every: int) -> RecordRunConfig:
    cfg = record_steps(record(), steps)
    cfg.name = name
    cfg.stages = replace(cfg.stages, val_every=val_every)
    cfg.docs = replace(cfg.docs, val_tokens=PROXY_VAL_TOKENS, max_docs_mult=PROXY_DOCS_MULT)
    return cfg


def proxy161() -> RecordRunConfig:
    """The record at 1/8 of its schedule (159 + 2 steps, 42.5M tokens) on the proxy corpus.

    It validates 2,097,152 tokens every 40 steps and at the end, as the record's own script was run on
    the proxy corpus for the reference figures."""
    return _proxy("proxy161", 161, 40)


def proxy322() -> RecordRunConfig:
    """The record at 1/4 of its schedule (318 + 4 steps, 84.9M tokens) on the proxy corpus.

    It validates 2,097,152 tokens every 80 steps and at the end."""
    return _proxy("proxy322", 322, 80)


def demo() -> RecordRunConfig:
    """The record's architecture at a CPU size on the embedded corpus: the README's main command.

    The structure stays (11 layers, 6 paired heads, every gate and MUDD lane); the width, the MLP,
    the generators and the bigram table shrink, the batches are 2,048 then 3,072 tokens with windows
    of one to three 64-token blocks, and validation reads the first 16,384 tokens of the val shard.
    A step is four micro-batches (on 1, 2 or 4 ranks), not eight, and documents are cut at 512 then 1,024
    tokens: the embedded books are ~2,100-token pieces, and a cut drops the rest of a piece, so eight
    256-token micro-batches would spend the corpus before the run ends (and two of 1,536 tokens cost
    more on the CPU than four of 768)."""
    cfg = record_steps(record(), 100)
    cfg.name = "demo"
    cfg.model = replace(cfg.model, model_dim=96, head_dim=16, mlp_hidden=384, mudd_dim=16, bigram_factor=1,
                        sign_rows=1024)
    cfg.stages = replace(cfg.stages, tokens_per_step=(2048, 2048, 3072, 3072),
                         max_doc_len=(512, 1024, 1024, 1024), piece_sets_per_step=4, block_tokens=64, val_every=25,
                         momentum_warmup_steps=25, momentum_cooldown_steps=10)
    cfg.docs = replace(cfg.docs, sets_per_step=4, val_tokens=16_384, val_chunk=4096, max_docs_table=())
    cfg.train.sample_tokens = 48
    cfg.train.merge_tokens = 0  # its four micro-steps stay four: on a CPU fewer, larger ones cost more (above)
    cfg.data.data_dir = "demo"
    cfg.data.train_pattern, cfg.data.val_pattern = "demo_train_*.bin", "demo_val_*.bin"
    return cfg


# ---------------------------------------------------------------- the 2025-08 record


def record_2025_08() -> RunConfig:
    """The 2025-08-23 record: 1695 steps of 8 x 49,152 tokens."""
    return RunConfig(name="record_2025_08")


def proxy212() -> RunConfig:
    """proxy-212: the 2025-08 record at 212 steps on the proxy corpus, as the reference ran it.

    The reference (../shared/bench) changed only the step count and the
    validation size and interval, so its Muon momentum warm-up stayed at 300
    *steps* (0.85 -> 0.92 over a 212-step run) while lr and window scale with
    progress. Pinning that here reproduces its math; scaling the warm-up with
    progress instead (`record_2025_08` with --steps 212) ends 0.03 higher.
    """
    cfg = record_2025_08()
    cfg.name = "proxy212"
    cfg.train.steps, cfg.train.val_tokens, cfg.train.val_every = 212, 2_097_152, 53
    cfg.schedule.momentum_warmup_frac = 300 / 212
    return cfg


def demo_2025_08() -> RunConfig:
    """The 2025-08 record's architecture, small, on the embedded corpus."""
    cfg = record_2025_08()
    cfg.name = "demo_2025_08"
    m, a, t, d = cfg.model, cfg.attention, cfg.train, cfg.data
    m.num_layers, m.model_dim, m.num_heads, m.head_dim, m.mlp_hidden = 6, 128, 2, 64, 512
    m.value_embeds, m.no_attn_layers, m.long_layers = 2, (), (0, 5)
    a.window_tokens = 256
    t.steps, t.seq_len, t.batch_seqs, t.bos_align = 80, 256, 8, False
    # five validations (steps 0, 20, 40, 60, 80) draw the loss curve for about 3% of the run's time
    t.val_tokens, t.val_seq_len, t.val_every = 8192, 2048, 20
    t.warmup_steps, t.sample_tokens = 0, 48
    d.data_dir = "demo"
    d.train_pattern, d.val_pattern = "demo_train_*.bin", "demo_val_*.bin"
    return cfg
