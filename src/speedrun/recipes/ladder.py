"""The record ladder: the speedrun's history as a chain of presets.

Each rung is a plain function that calls the rung before it and changes only
what that record changed; `Rung.changes` lists the config fields it claims,
and the tests hold every rung to exactly those (`config.diff` against its
parent). The last rung, `record_2025_08`, is `presets.record_2025_08` itself, so
the chain ends at the 2025-08 record with nothing left over. (The 2026-07 record,
`presets.record`, is a different model: its techniques come in through their own
config fields.)

Values come from ../shared/spec/record-2025-08.md where it gives them (step
counts, tokens per step, which technique arrived when) and are otherwise
chosen to be sensible and documented in docs/ladder.md, section
"Approximations". Pure systems records (distributed Muon, faster gradient
reduction, Triton Newton–Schulz kernels) compute the same function and so
have no rung; neither has a rung for an intermediate record whose change is
folded into a neighbour (bfloat16 activations beyond embeddings, the 12-08
and 12-10 value-embedding layouts).

`speedrun ladder` prints the rungs; `--diff NAME` shows a rung's changes,
`--proxy-steps NAME` the steps at which it reads proxy-212's 83M tokens and
`--report RUN_DIR...` tabulates finished ladder runs.
"""

from __future__ import annotations

import argparse
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from speedrun.recipes import presets
from speedrun.config import RunConfig, diff
from speedrun.errors import ConfigError, DataError

PROXY_TOKENS = 212 * 393_216  # proxy-212: 83,361,792 tokens
SEQ_64K = 64 * 1024  # the 2024 rungs: 8 micro-steps of 64 x 1024 tokens per step


@dataclass(frozen=True)
class Rung:
    name: str
    date: str
    description: str
    record_steps: int | None  # the public record's step count (None: not published)
    record_time_min: float  # the public record's training time on 8 x H100
    tokens_per_step: int
    parent: str | None
    build: Callable[[], RunConfig]
    changes: tuple[str, ...]  # config field paths this rung changes relative to its parent


# ---------------------------------------------------------------- the rungs


def llmc_baseline() -> RunConfig:
    """2024-05-28: llm.c's GPT-2 (124M): AdamW, GELU, learned positions, LayerNorm, tied head."""
    cfg = RunConfig(name="llmc_baseline")
    m, a, o, s, t = cfg.model, cfg.attention, cfg.optim, cfg.schedule, cfg.train
    m.vocab_multiple = 1  # 50,257: no padding
    m.num_heads, m.head_dim = 12, 64
    m.activation, m.positions, m.rotary, m.max_positions = "gelu", "learned", "full", 1024
    m.norm, m.bias, m.qk_norm, m.zero_init, m.tied_head = "layer", True, False, False, True
    m.value_embeds, m.x0_lambdas, m.unet = 0, False, False
    m.logit_softcap, m.softcap_form, m.attn_scale, m.attn_gate = 0.0, "tanh", 0.0, False
    m.no_attn_layers, m.long_layers = (), ()
    m.fp8_head, m.bf16_embeds = False, False
    # 1024-token sequences: each 64K-token micro-step row is 64 independent sequences
    a.doc_mask, a.window, a.long_short, a.segment_len = False, "none", False, 1024
    o.kind, o.adamw_lr, o.adamw_betas, o.adamw_eps, o.weight_decay = "adamw", 6e-4, (0.9, 0.95), 1e-8, 0.1
    # llm.c: 700 warm-up steps, then cosine to 0; here linear to 0 (the schedules are linear)
    s.warmup_frac = 700 / 19_560
    s.cooldown_frac, s.final_lr_frac = 1 - s.warmup_frac, 0.0
    s.momentum_warmup_frac = 0.0
    t.steps, t.seq_len, t.batch_seqs, t.bos_align = 19_560, SEQ_64K, 8, False
    return cfg


def adamw_rotary() -> RunConfig:
    """2024-06-06: AdamW lr x3, rotary embeddings, RMSNorm without affine parameters, trapezoidal lr."""
    cfg = llmc_baseline()
    cfg.name = "adamw_rotary"
    cfg.model.positions, cfg.model.norm, cfg.model.bias = "rotary", "rms", False
    cfg.optim.adamw_lr = 0.0018
    cfg.schedule.warmup_frac, cfg.schedule.cooldown_frac = 256 / 9_536, 2_048 / 9_536
    cfg.train.steps = 9_536
    return cfg


def muon() -> RunConfig:
    """2024-10-04: Muon on the block matrices, Adam on the (tied) embedding."""
    cfg = adamw_rotary()
    cfg.name = "muon"
    o = cfg.optim
    o.kind, o.muon_lr, o.embed_lr, o.adam_betas, o.adam_eps = "muon", 0.025, 0.0018, (0.9, 0.95), 1e-8
    o.weight_decay = 0.0  # (only AdamW reads it)
    cfg.train.steps = 7_000  # not published; estimated from the time (24.9 vs 31.4 min)
    return cfg


def muon_tuned() -> RunConfig:
    """2024-10-10: Muon improvements: higher Adam lr, no lr warm-up."""
    cfg = muon()
    cfg.name = "muon_tuned"
    cfg.optim.embed_lr = 0.0036
    cfg.schedule.warmup_frac = 0.0
    cfg.train.steps = 6_200
    return cfg


def modern_arch() -> RunConfig:
    """2024-10-14: vocabulary padded to 50,304, ReLU², zero-init projections, QK-norm, 6 heads of 128."""
    cfg = muon_tuned()
    cfg.name = "modern_arch"
    m = cfg.model
    m.vocab_multiple, m.activation, m.zero_init, m.qk_norm = 128, "relu2", True, True
    m.num_heads, m.head_dim = 6, 128
    cfg.train.steps = 5_100
    return cfg


def untied_head() -> RunConfig:
    """2024-11-03: separate embedding and head, each with its own Adam lr."""
    cfg = modern_arch()
    cfg.name = "untied_head"
    cfg.model.tied_head = False
    cfg.optim.embed_lr, cfg.optim.head_lr = 0.3, 0.004
    cfg.train.steps = 4_578
    return cfg


def value_skips() -> RunConfig:
    """2024-11-06: value residual and embedding (x0) skips, tanh logit softcap 30, Muon momentum warm-up."""
    cfg = untied_head()
    cfg.name = "value_skips"
    cfg.model.value_residual, cfg.model.x0_lambdas, cfg.model.logit_softcap = True, True, 30.0
    cfg.schedule.momentum_warmup_frac = 300 / 1695
    cfg.train.steps = 3_200
    return cfg


def bf16() -> RunConfig:
    """2024-11-08: bfloat16 activations (here: embeddings stored in bfloat16; see docs/ladder.md)."""
    cfg = value_skips()
    cfg.name = "bf16"
    cfg.model.bf16_embeds = True
    cfg.train.steps = 3_242
    return cfg


def unet() -> RunConfig:
    """2024-11-10: U-net skips between the two halves, learning rates doubled."""
    cfg = bf16()
    cfg.name = "unet"
    cfg.model.unet = True
    cfg.optim.embed_lr, cfg.optim.head_lr, cfg.optim.muon_lr = 0.6, 0.008, 0.05
    cfg.train.steps = 3_000
    return cfg


def flex_attention() -> RunConfig:
    """2024-11-19: 64K-token rows with document-causal FlexAttention, 1024-token window."""
    cfg = unet()
    cfg.name = "flex_attention"
    a = cfg.attention
    a.doc_mask, a.segment_len, a.window, a.window_tokens = True, 0, "fixed", 1024
    cfg.optim.adam_betas = (0.8, 0.95)
    cfg.train.steps = 1_875
    return cfg


def window_warmup() -> RunConfig:
    """2024-11-24: the attention window grows from 128 to 1792 tokens over training."""
    cfg = flex_attention()
    cfg.name = "window_warmup"
    cfg.attention.window, cfg.attention.window_tokens = "growing", 1728
    cfg.train.steps = 1_750
    return cfg


def value_embeds() -> RunConfig:
    """2024-12-04: value embeddings replace the value residual (6, shared by layer i and i+6)."""
    cfg = window_warmup()
    cfg.name = "value_embeds"
    cfg.model.value_residual, cfg.model.value_embeds = False, 6
    cfg.train.steps = 1_530
    return cfg


def sparse_value_embeds() -> RunConfig:
    """2024-12-17: 3 value embeddings (012…012), half-truncated rotary, layer 7 without attention."""
    cfg = value_embeds()
    cfg.name = "sparse_value_embeds"
    cfg.model.value_embeds, cfg.model.rotary, cfg.model.no_attn_layers = 3, "half_truncated", (7,)
    cfg.train.steps = 1_490
    return cfg


def softcap15() -> RunConfig:
    """2025-01-04: logit softcap 30 -> 15."""
    cfg = sparse_value_embeds()
    cfg.name = "softcap15"
    cfg.model.logit_softcap = 15.0
    cfg.train.steps = 1_390
    return cfg


def fp8_head() -> RunConfig:
    """2025-01-13: FP8 head, shifted logits 30·sigmoid(z/7.5), lr cooldown to 0.1 instead of 0."""
    cfg = softcap15()
    cfg.name = "fp8_head"
    cfg.model.fp8_head, cfg.model.softcap_form, cfg.model.logit_softcap = True, "sigmoid", 30.0
    cfg.schedule.cooldown_frac, cfg.schedule.final_lr_frac = 0.4, 0.1
    cfg.train.steps = 1_395
    return cfg


def long_short() -> RunConfig:
    """2025-01-16: long-short windows (layers 0, 4, 7, 11 long), attention scale 0.12, Adam eps 1e-10."""
    cfg = fp8_head()
    cfg.name = "long_short"
    cfg.attention.long_short, cfg.model.long_layers = True, (0, 4, 7, 11)
    cfg.model.attn_scale, cfg.optim.adam_eps = 0.12, 1e-10
    cfg.train.steps = 1_393
    return cfg


def smaller_batch() -> RunConfig:
    """2025-01-26: 8 x 48K = 393,216 tokens per step instead of 524,288."""
    cfg = long_short()
    cfg.name = "smaller_batch"
    cfg.train.seq_len, cfg.train.steps = 48 * 1024, 1_770
    return cfg


def bos_align() -> RunConfig:
    """2025-07-12: every sequence starts at a document start, cooldown fraction 0.45."""
    cfg = smaller_batch()
    cfg.name = "bos_align"
    cfg.train.bos_align, cfg.schedule.cooldown_frac = True, 0.45
    cfg.train.steps = 1_750
    return cfg


_B = 524_288
_S = 393_216
# name, date, description, record steps, record minutes, tokens/step, build, changes
_TABLE: list[tuple] = [
    ("llmc_baseline", "2024-05-28", "llm.c GPT-2 baseline (AdamW, GELU, learned positions, tied head)", 19_560, 45.0, _B,
     llmc_baseline, ()),
    ("adamw_rotary", "2024-06-06", "tuned AdamW lr, rotary embeddings, RMSNorm, trapezoidal lr", 9_536, 31.4, _B,
     adamw_rotary, ("model.positions", "model.norm", "model.bias", "optim.adamw_lr", "schedule.warmup_frac",
                    "schedule.cooldown_frac", "train.steps")),
    ("muon", "2024-10-04", "Muon optimiser", None, 24.9, _B, muon,
     ("optim.kind", "optim.muon_lr", "optim.embed_lr", "optim.adam_betas", "optim.adam_eps", "optim.weight_decay",
      "train.steps")),
    ("muon_tuned", "2024-10-10", "Muon improvements", 6_200, 22.3, _B, muon_tuned,
     ("optim.embed_lr", "schedule.warmup_frac", "train.steps")),
    ("modern_arch", "2024-10-14", "padded vocab, ReLU², zero-init projections, QK-norm", 5_100, 15.2, _B, modern_arch,
     ("model.vocab_multiple", "model.activation", "model.zero_init", "model.qk_norm", "model.num_heads",
      "model.head_dim", "train.steps")),
    ("untied_head", "2024-11-03", "untied embedding and head", 4_578, 10.8, _B, untied_head,
     ("model.tied_head", "optim.embed_lr", "optim.head_lr", "train.steps")),
    ("value_skips", "2024-11-06", "value and embedding skips, momentum warm-up, logit softcap", 3_200, 8.2, _B,
     value_skips, ("model.value_residual", "model.x0_lambdas", "model.logit_softcap", "schedule.momentum_warmup_frac", "train.steps")),
    ("bf16", "2024-11-08", "bfloat16 activations (embeddings)", 3_242, 7.8, _B, bf16,
     ("model.bf16_embeds", "train.steps")),
    ("unet", "2024-11-10", "U-net skips, doubled lr", 3_000, 7.2, _B, unet,
     ("model.unet", "optim.embed_lr", "optim.head_lr", "optim.muon_lr", "train.steps")),
    ("flex_attention", "2024-11-19", "64K-token FlexAttention with document masks", 1_875, 5.03, _B, flex_attention,
     ("attention.doc_mask", "attention.segment_len", "attention.window", "attention.window_tokens",
      "optim.adam_betas", "train.steps")),
    ("window_warmup", "2024-11-24", "attention window warm-up", 1_750, 4.66, _B, window_warmup,
     ("attention.window", "attention.window_tokens", "train.steps")),
    ("value_embeds", "2024-12-04", "value embeddings", 1_530, 4.41, _B, value_embeds,
     ("model.value_residual", "model.value_embeds", "train.steps")),
    ("sparse_value_embeds", "2024-12-17", "sparse value embeddings, better rotary, layer 7 without attention",
     1_490, 3.57, _B, sparse_value_embeds, ("model.value_embeds", "model.rotary", "model.no_attn_layers", "train.steps")),
    ("softcap15", "2025-01-04", "softcap 30 -> 15", 1_390, 3.4, _B, softcap15, ("model.logit_softcap", "train.steps")),
    ("fp8_head", "2025-01-13", "FP8 head, shifted logits, lr decay to 0.1", 1_395, 3.14, _B, fp8_head,
     ("model.fp8_head", "model.softcap_form", "model.logit_softcap", "schedule.cooldown_frac",
      "schedule.final_lr_frac", "train.steps")),
    ("long_short", "2025-01-16", "long-short windows, attention scale 0.12, small Adam eps (merged QKV)", 1_393, 2.99,
     _B, long_short, ("attention.long_short", "model.long_layers", "model.attn_scale", "optim.adam_eps",
                      "train.steps")),
    ("smaller_batch", "2025-01-26", "smaller batch", 1_770, 2.93, _S, smaller_batch, ("train.seq_len", "train.steps")),
    ("bos_align", "2025-07-12", "batches start at document starts, cooldown 0.45", 1_750, 2.86, _S, bos_align,
     ("train.bos_align", "schedule.cooldown_frac", "train.steps")),
    ("record_2025_08", "2025-08-23", "sparse attention output gate", 1_695, 2.81, _S, presets.record_2025_08,
     ("model.attn_gate", "train.steps")),
]


def rungs() -> list[Rung]:
    """The ladder in order, from the llm.c baseline to `record_2025_08`."""
    out, parent = [], None
    for name, date, desc, steps, minutes, tps, build, changes in _TABLE:
        out.append(Rung(name, date, desc, steps, minutes, tps, parent, build, tuple(changes)))
        parent = name
    return out


def get_rung(name: str) -> Rung:
    by_name = {r.name: r for r in rungs()}
    if name not in by_name:
        import difflib

        near = difflib.get_close_matches(name, list(by_name), n=1)
        hint = f"; did you mean '{near[0]}'?" if near else f"; rungs: {', '.join(by_name)}"
        raise ConfigError(f"ladder: no rung '{name}'{hint}")
    return by_name[name]


def tokens_per_step(cfg: RunConfig) -> int:
    return cfg.train.batch_seqs * cfg.train.seq_len


def proxy_steps(rung: Rung | str, tokens: int = PROXY_TOKENS) -> int:
    """Steps at which the rung reads `tokens` (default: proxy-212's 83,361,792)."""
    rung = get_rung(rung) if isinstance(rung, str) else rung
    return max(1, round(tokens / rung.tokens_per_step))


def rung_diff(rung: Rung | str) -> dict[str, tuple]:
    """{field: (parent value, rung value)} for the fields the rung changes."""
    rung = get_rung(rung) if isinstance(rung, str) else rung
    base = get_rung(rung.parent).build() if rung.parent else RunConfig()
    return diff(base, rung.build())


# ---------------------------------------------------------------- the command


def _table(rows: list[list[str]], header: list[str]) -> str:
    widths = [max(len(str(x)) for x in col) for col in zip(header, *rows)]
    fmt = lambda r: "  ".join(str(x).ljust(w) for x, w in zip(r, widths)).rstrip()  # noqa: E731
    return "\n".join([fmt(header), fmt(["-" * w for w in widths])] + [fmt(r) for r in rows])


def _json_value(v):
    return list(v) if isinstance(v, tuple) else v


def ladder_rows() -> list[dict]:
    return [{"name": r.name, "date": r.date, "description": r.description, "parent": r.parent,
             "record_steps": r.record_steps, "steps": r.build().train.steps, "tokens_per_step": r.tokens_per_step,
             "record_time_min": r.record_time_min, "proxy_steps": proxy_steps(r), "changes": list(r.changes)}
            for r in rungs()]


def _run_summary(run: Path) -> dict:
    """Final val loss, training time and tokens of one finished (or partial) run folder."""
    from speedrun.tools.plot import run_curve

    curve = run_curve(run)
    cfg_path, name = run / "config.json", run.name
    if cfg_path.is_file():
        name = json.loads(cfg_path.read_text()).get("name", name)
    return {"run": str(run), "rung": name, "step": curve["step"][-1], "val_loss": curve["val_loss"][-1],
            "time_s": curve["time_ms"][-1] / 1000, "tokens": curve["tokens"][-1]}


def report(runs: list[Path]) -> str:
    """A markdown table of ladder runs in ladder order, with the change against the parent rung's run."""
    order = {r.name: i for i, r in enumerate(rungs())}
    parents = {r.name: r.parent for r in rungs()}
    results = sorted((_run_summary(Path(p)) for p in runs), key=lambda s: order.get(s["rung"], len(order)))
    by_rung = {s["rung"]: s for s in results}
    lines = ["| rung | steps | tokens | val loss | Δ vs parent | train time (s) | ms/step |",
             "|---|---|---|---|---|---|---|"]
    for s in results:
        # nearest measured ancestor
        p = parents.get(s["rung"])
        while p is not None and p not in by_rung:
            p = parents.get(p)
        delta = f"{s['val_loss'] - by_rung[p]['val_loss']:+.4f} (vs {p})" if p else "–"
        tokens = f"{s['tokens'] / 1e6:.1f}M" if s["tokens"] is not None else "?"
        ms = 1000 * s["time_s"] / s["step"] if s["step"] else math.nan
        lines.append(f"| {s['rung']} | {s['step']} | {tokens} | {s['val_loss']:.4f} | {delta} | "
                     f"{s['time_s']:.1f} | {ms:.0f} |")
    return "\n".join(lines)


def register(subparsers) -> None:
    p = subparsers.add_parser("ladder", help="the record ladder: list its rungs (presets), diff one, report runs")
    p.add_argument("--json", action="store_true", help="print the rungs as JSON")
    p.add_argument("--diff", metavar="NAME", help="the fields a rung changes from its parent (old -> new)")
    p.add_argument("--proxy-steps", metavar="NAME", help="steps at which the rung reads proxy-212's 83M tokens")
    p.add_argument("--report", nargs="+", metavar="RUN_DIR", help="markdown table of finished ladder runs")
    p.set_defaults(func=cli_ladder)


def cli_ladder(args: argparse.Namespace) -> int:
    if args.diff:
        rung = get_rung(args.diff)
        changes = rung_diff(rung)
        if args.json:
            print(json.dumps({k: [_json_value(a), _json_value(b)] for k, (a, b) in changes.items()}, indent=2))
        else:
            print(f"{rung.name} ({rung.date}): {rung.description}; parent: {rung.parent or '(config defaults)'}")
            for k, (a, b) in changes.items():
                print(f"  {k}: {a!r} -> {b!r}")
        return 0
    if args.proxy_steps:
        print(proxy_steps(args.proxy_steps))
        return 0
    if args.report:
        missing = [p for p in args.report if not Path(p).is_dir()]
        if missing:
            raise DataError(f"{missing[0]}: run folder not found")
        print(report([Path(p) for p in args.report]))
        return 0
    rows = ladder_rows()
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    table = [[r["name"], r["date"], r["description"], f"{r['steps']:,}" + ("" if r["record_steps"] else "*"),
              f"{r['tokens_per_step']:,}", f"{r['record_time_min']:g} min", r["proxy_steps"]] for r in rows]
    print(_table(table, ["name", "date", "change", "steps", "tokens/step", "record time", "proxy steps"]))
    print("* step count not published; estimated.  Train one: speedrun train --preset NAME [--steps N] "
          "[--set section.field=value]")
    return 0
