"""Typed run configuration.

A run is described by one of two configs made of small dataclasses: `RunConfig` for the 2025-08
record's family (the ladder's rungs, `proxy212`) and `RecordRunConfig` for the 2026-07 record (#89),
whose sections are the frozen constants classes that live beside the math they parameterise (the
model's `RecordModelConfig`, the schedule's `StageConfig`, the loader's `DocumentConfig`, the
optimisers' and FP8's). Both share `KeepingConfig`, the fields that keep a run (seed, dtype,
compile, checkpoints, the fault policy), so run folders, checkpoints and resume treat them alike.

Every technique is a field, so an ablation is one override (`--set model.value_embeds=0`).
Overrides are parsed against the field's declared type (a frozen section is replaced, which runs its
own checks); an unknown field is refused with the nearest valid name. Presets (recipes/) are plain
functions returning a config.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import math
import typing
from dataclasses import dataclass, field

from speedrun.data.documents import DocumentConfig
from speedrun.errors import ConfigError
from speedrun.model.record import RecordModelConfig
from speedrun.model.record_fp8 import Fp8Config
from speedrun.optim.normuon import NorMuonConfig
from speedrun.optim.record_adam import RecordAdamConfig
from speedrun.train.stages import StageConfig


@dataclass
class ModelConfig:
    """The network. Defaults are the 2025-08 record."""

    vocab_size: int = 50257
    vocab_multiple: int = 128  # pad the vocabulary to a multiple of this (1 = no padding)
    num_layers: int = 12
    model_dim: int = 768
    num_heads: int = 6
    head_dim: int = 128
    mlp_hidden: int = 3072
    activation: str = "relu2"  # "relu2" | "gelu"
    positions: str = "rotary"  # "rotary" | "learned"
    rotary: str = "half_truncated"  # "half_truncated" (1/1024 base, half the dims) | "full" (base 10000)
    max_positions: int = 1024  # only for learned positions
    norm: str = "rms"  # "rms" (parameter-free) | "layer" (learned LayerNorm, llm.c)
    qk_norm: bool = True
    zero_init: bool = True  # zero-initialise output projections and the head
    tied_head: bool = False
    value_embeds: int = 3  # number of value embeddings (0 = none), fed to the first and last layers
    x0_lambdas: bool = True  # x = l0*x + l1*x0 before each block (embedding skip)
    unet: bool = True  # U-net skips between layer i < L/2 and L-1-i
    logit_softcap: float = 30.0  # 0 = none
    softcap_form: str = "sigmoid"  # "sigmoid": c*sigmoid(z/7.5) | "tanh": c*tanh(z/c)
    attn_scale: float = 0.12  # 0 = 1/sqrt(head_dim)
    attn_gate: bool = True  # per-head sigmoid output gate from x[..., :12]
    gate_inputs: int = 12
    no_attn_layers: tuple[int, ...] = (7,)
    long_layers: tuple[int, ...] = (0, 4, 7, 11)  # layers with the long window; others short
    fp8_head: bool = True  # FP8 head in training where the GPU supports it
    bf16_embeds: bool = True  # embeddings stored in bfloat16 when activations are bfloat16
    bias: bool = False  # biases in linear layers (llm.c GPT-2)
    value_residual: bool = False  # 2024-11 ladder rungs: layers >= 1 mix layer 0's V into theirs (the attention lambdas)

    @property
    def padded_vocab(self) -> int:
        m = self.vocab_multiple
        return ((self.vocab_size + m - 1) // m) * m


@dataclass
class AttentionConfig:
    """Which tokens see which."""

    doc_mask: bool = True  # causal inside each document only
    block_size: int = 128
    window: str = "growing"  # "none" (full causal) | "fixed" | "growing"
    window_tokens: int = 1728  # final long window before rounding up to a block
    long_short: bool = True  # short window = long // 2 on non-long layers
    # "auto" | "flex" | "dense" | "gluon": which implementation attends (kernels/table.py). "gluon":
    # kernels/attn_gluon.py on FlexAttention's 64-token block lists, Hopper only; "flex": FlexAttention
    # (any GPU); "dense": the plain reference (any device, memory quadratic in the row). "auto": gluon on a
    # Hopper GPU in bfloat16 with head_dim 128, flex on other GPUs, dense on a CPU (flex on a GPU under
    # train.kernels=reference).
    backend: str = "auto"
    segment_len: int = 0  # >0: the row is independent sequences of this length (positions restart)


@dataclass
class OptimConfig:
    """Optimisers: Muon on block matrices + Adam on the rest, or AdamW on all."""

    kind: str = "muon"  # "muon" | "adamw"
    adam_betas: tuple[float, float] = (0.8, 0.95)
    adam_eps: float = 1e-10
    embed_lr: float = 0.6
    head_lr: float = 0.008
    scalar_lr: float = 0.04
    muon_lr: float = 0.05
    muon_momentum: float = 0.95
    muon_momentum_start: float = 0.85
    muon_ns_steps: int = 5
    # AdamW-only (the llm.c baseline)
    adamw_lr: float = 0.0018
    adamw_betas: tuple[float, float] = (0.9, 0.95)
    adamw_eps: float = 1e-8
    weight_decay: float = 0.0  # AdamW, on matrices and embeddings


@dataclass
class ScheduleConfig:
    """Everything that changes over a run, as a fraction of progress = step / steps."""

    warmup_frac: float = 0.0  # linear lr warm-up
    cooldown_frac: float = 0.45  # final linear cooldown
    final_lr_frac: float = 0.1  # lr multiplier at the end of cooldown
    momentum_warmup_frac: float = 300 / 1695  # Muon momentum start -> final


@dataclass
class KeepingConfig:
    """What keeps a run, whichever record it trains: seed, dtype, compile, logging, checkpoints and
    the fault policy (see docs/reliability.md). Nothing here changes the math of a step."""

    seed: int = 0
    compile: str = "auto"  # the whole model compiled: "auto" (on CUDA) | "on" (any device) | "off"
    # "auto": every model function on the kernel kernels/table.py names for the device (its reference
    # where none applies) | "reference": every function on its plain-PyTorch reference (the tests and
    # anyone debugging a kernel use it). The same math; the kernels are held to the references by tests.
    kernels: str = "auto"
    log_every: int = 1
    dtype: str = "auto"  # activations: "auto" (bfloat16 on CUDA, float32 on CPU) | "bfloat16" | "float32"
    sample_tokens: int = 0  # print this many sampled tokens at the end (demo)
    # Reliability (see docs/reliability.md). Checkpoints: every N steps and/or every M minutes (0 = off).
    checkpoint_every_steps: int = 0
    checkpoint_every_minutes: float = 0.0
    health_every: int = 0  # health record (norms, activation RMS) every K steps; 0 = checks only at val/checkpoints
    spike_factor: float = 2.0  # loss > factor x median of recent losses is a spike (0 = off)
    on_fault: str = "stop"  # non-finite loss/gradient or spike: "stop" | "recover"
    max_recoveries: int = 3  # "recover": stop after this many roll-backs
    recover_lr_factor: float = 0.5  # "recover": lr multiplied by this at each roll-back
    inject_fault: str = ""  # TESTING ONLY: e.g. "nan@5,grad_inf@3,spike@4,oom@2,sigterm@6" (batch index)


@dataclass
class TrainConfig(KeepingConfig):
    """Steps, batch, validation and the compile warm-up of the 2025-08 family."""

    steps: int = 1695
    seq_len: int = 48 * 1024  # tokens per sequence (one micro-step)
    batch_seqs: int = 8  # sequences per optimiser step, over all ranks and micro-steps
    bos_align: bool = True
    val_tokens: int = 10_485_760
    val_seq_len: int = 4 * 64 * 1024  # tokens per rank per validation forward
    val_every: int = 125
    warmup_steps: int = 3  # untimed warm-up steps (the first compiles), then state restored; the reference ran 10
    # warm-up steps when this run's compiled graphs are already in the local caches (a warm note, or
    # Dynamo packages, on every rank): an earlier run with the same key ran the full warm-up. At least
    # 2 with health steps (both graphs must load before the clock); never more than warmup_steps
    warmup_steps_warm: int = 1
    # compile the evaluation graph and the FP8 head in a second process during the first warm-up step
    # (precompile.py); only where the step is compiled on a GPU. Speed only: nothing it computes is used.
    precompile: bool = True
    # keep Dynamo's traced graphs and guards between runs (dynamo_cache.py, torch's caching precompile):
    # a warm start skips re-tracing; speed only, the compiled code is the same
    dynamo_cache: bool = True


@dataclass
class RecordTrainConfig(KeepingConfig):
    """The 2026 record's run keeping; its steps, batches and validations come from `stages` and `docs`."""

    # the spec's untimed warm-up set (stages.warmup_steps: every compiled shape once, with an eval
    # forward each), then model, optimisers, FP8 and loader restored: "auto" when the step is compiled
    # | "on" | "off" (each new shape then compiles inside the timed run). The same math either way.
    warmup: str = "auto"
    # compile the later stages' graphs in child processes while the trainer compiles the first
    # (compile/record_precompile.py); only where the step is compiled and warmed up on a GPU. Speed
    # only: nothing a child computes is used.
    precompile: bool = True
    # join consecutive piece sets into one micro-step of at most this many tokens (0: one set a
    # micro-step, the spec's layout; the `record` preset joins up to 32,768): each set is still
    # computed as its own local batch, so the function is the same; the gradient of the joined sets
    # is summed in float32 inside the backward before its one bfloat16 rounding. Not with the FP8
    # MLP, whose delayed scales move every micro-step.
    merge_tokens: int = 0


@dataclass
class DataConfig:
    train_pattern: str = "fineweb_train_*.bin"
    val_pattern: str = "fineweb_val_*.bin"
    data_dir: str = ""  # "" = the default FineWeb folder; "demo" = the embedded corpus


@dataclass
class RunConfig:
    name: str = "record_2025_08"
    model: ModelConfig = field(default_factory=ModelConfig)
    attention: AttentionConfig = field(default_factory=AttentionConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    schedule: ScheduleConfig = field(default_factory=ScheduleConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    data: DataConfig = field(default_factory=DataConfig)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=True)


@dataclass
class Fp8Choice:
    """Which products of the 2026 record train in FP8 (spec "FP8"); the eval path is always bf16.
    Either applies only where activations are bfloat16 (a float32 CPU run is the unquantised math).

    The record trains its MLP in FP8; here it trains in bf16 unless asked, chosen by the loss first and
    the time second (docs/benchmarks.md, one H100, 2026-12-07): `proxy161` with the FP8 MLP ended at
    4.0233 and 4.0322 (seeds 0 and 1), over the per-run bar of 4.030 and the two-seed bar of 4.025, and
    in bf16 at 4.0163 and 4.0122, 1 % faster a step (the casts, maxima and transposes of the delayed
    scaling cost what the e4m3 products save). The record's anchor measurement ran its MLP in bf16 too."""

    head: bool = True  # the head's e4m3 forward and e5m2 gradient
    mlp: bool = False  # the MLP's up and down projections in e4m3, with the delayed scales


@dataclass
class RecordRunConfig:
    """The 2026-07 record (#89): model, staged schedule, loader, optimisers, FP8, run keeping, data."""

    name: str = "record"
    model: RecordModelConfig = field(default_factory=RecordModelConfig)
    stages: StageConfig = field(default_factory=StageConfig)
    docs: DocumentConfig = field(default_factory=DocumentConfig)
    normuon: NorMuonConfig = field(default_factory=NorMuonConfig)
    adam: RecordAdamConfig = field(default_factory=RecordAdamConfig)
    fp8: Fp8Choice = field(default_factory=Fp8Choice)
    fp8_scales: Fp8Config = field(default_factory=Fp8Config)
    train: RecordTrainConfig = field(default_factory=RecordTrainConfig)
    data: DataConfig = field(default_factory=DataConfig)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=True)


AnyConfig = RunConfig | RecordRunConfig
SECTIONS = ("model", "attention", "optim", "schedule", "train", "data")  # RunConfig's


def sections(cfg: AnyConfig | type) -> tuple[str, ...]:
    """The section names of a run config (instance or class), in declaration order."""
    return tuple(f.name for f in dataclasses.fields(cfg) if f.name != "name")


def config_class(d: dict) -> type:
    """Which run config a `to_dict()` form (a saved config.json) is: the 2026 record's has `stages`."""
    return RecordRunConfig if "stages" in d else RunConfig


# Fields that chose how a step ran, removed once measured (docs/performance.md says what each measured),
# with the value the code now always has: a config.json that holds one at that value still loads.
RETIRED: dict[str, object] = {
    "train.pdl": False,  # Inductor's programmatic dependent launch: no gain on an H200
    "train.inductor_options": "",  # further Inductor options: none adopted
    "model.gate_kernel": "linear",  # the gate's product as fused element-wise work: 7% slower a step
    "model.wgrad_blas": "cublas",  # cuBLASLt for the weight gradients: 2.6-3.6 ms a step slower
    # per-operation kernel choices, now the one switch train.kernels (auto | reference)
    "model.ce_kernel": "auto", "model.qk_kernel": "auto", "model.mlp_kernel": "auto",
    "attention.order_kernel": "auto", "optim.kernel": "auto",
    # the measured winners, now the only path
    "model.ce_math": "lean", "model.head_kernel": "auto", "model.ce_transposed": True,
    "model.head_rowsums": "split", "model.mlp_options": "", "model.embed_kernel": "rows",
    "attention.flex_options": ("fwd_BLOCK_M=64,fwd_BLOCK_N=64,fwd_num_warps=4,fwd_num_stages=3,"
                               "bwd_BLOCK_M1=32,bwd_BLOCK_N1=64,bwd_BLOCK_M2=64,bwd_BLOCK_N2=32,"
                               "bwd_num_warps=4,bwd_num_stages=4"),
    "attention.sparse_block": 64, "attention.gluon_q_regs": True, "attention.gluon_dq_q_regs": True,
    "attention.gluon_dkdv_smem": True, "attention.gluon_docs_i32": True,
    "train.grad_accum": "auto", "train.cast_once": True, "train.head_once": True,
    # the losers, deleted
    "attention.gluon_overlap": False,  # slower and more energy in isolation on two cards
    "train.cudagraphs": False,  # the same step time in full runs, no multi-GPU test
}


def from_dict(d: dict) -> AnyConfig:
    """Rebuild a RunConfig from `to_dict()` output (e.g. a saved config.json). A retired field at the
    value the code keeps is dropped; at any other value the run it describes is not what the code
    computes or how it compiles, and loading refuses in one line."""
    cfg = config_class(d)(name=d.get("name", "custom"))
    items = []
    for section in sections(cfg):
        for key, value in d.get(section, {}).items():
            path = f"{section}.{key}"
            if path in RETIRED:
                if value != RETIRED[path]:
                    raise ConfigError(f"{path}={value!r}: this option was removed (docs/performance.md); "
                                      f"this speedrun runs only {path}={RETIRED[path]!r}")
                continue
            items.append((path, value))
    set_fields(cfg, items)
    return cfg


def _field_names(obj) -> list[str]:
    return [f.name for f in dataclasses.fields(obj)]


def all_field_paths(kind: type = RunConfig) -> list[str]:
    cfg = kind()
    return [f"{s}.{n}" for s in sections(cfg) for n in _field_names(getattr(cfg, s))]


def _unknown(path: str, kind: type = RunConfig) -> ConfigError:
    near = difflib.get_close_matches(path, all_field_paths(kind), n=1, cutoff=0.5)
    hint = f"; did you mean '{near[0]}'?" if near else ""
    return ConfigError(f"--set {path}: no such config field{hint}")


def _coerce(path: str, tp, value):
    """Turn `value` (a string from the command line, or JSON data) into type `tp`."""
    if dataclasses.is_dataclass(tp) and isinstance(value, dict):  # a table row read back from JSON
        hints = typing.get_type_hints(tp)
        return tp(**{k: _coerce(path, hints[k], v) for k, v in value.items()})
    origin = typing.get_origin(tp)
    if origin is tuple:
        if isinstance(value, str):
            parts = [p for p in value.replace("(", "").replace(")", "").split(",") if p.strip()]
        else:
            parts = list(value)
        args = typing.get_args(tp)
        elem = args[0] if args else str
        if len(args) == 2 and args[1] is Ellipsis or len(args) == 1:
            return tuple(_coerce(path, elem, p) for p in parts)
        if len(parts) != len(args):
            raise ConfigError(f"--set {path}: expected {len(args)} comma-separated values, got {value!r}")
        return tuple(_coerce(path, a, p) for a, p in zip(args, parts))
    try:
        if tp is bool:
            if isinstance(value, bool):
                return value
            s = str(value).strip().lower()
            if s in ("1", "true", "yes", "on"):
                return True
            if s in ("0", "false", "no", "off"):
                return False
            raise ValueError
        if tp is int:
            if isinstance(value, float) and not value.is_integer():
                raise ValueError
            if isinstance(value, str):
                value = value.replace("_", "")
                f = float(value)
                if not f.is_integer():
                    raise ValueError
                return int(f)
            return int(value)
        if tp is float:
            return float(value)
        if tp is str:
            return str(value)
    except (TypeError, ValueError):
        pass
    name = getattr(tp, "__name__", str(tp))
    raise ConfigError(f"--set {path}: {value!r} is not a valid {name}")


def set_field(cfg: AnyConfig, path: str, value) -> None:
    """Set `section.name` on cfg from a string or JSON value, type-checked."""
    set_fields(cfg, [(path, value)])


def _resolve(cfg: AnyConfig, path: str, value) -> tuple[str, str, object]:
    """(section, name, typed value) of one `section.name` setting, or the one-line error."""
    if "." not in path:
        raise _unknown(path, type(cfg))
    section, name = path.split(".", 1)
    if section not in sections(cfg) or name not in _field_names(getattr(cfg, section)):
        raise _unknown(path, type(cfg))
    hints = typing.get_type_hints(type(getattr(cfg, section)))
    return section, name, _coerce(path, hints[name], value)


def set_fields(cfg: AnyConfig, items: list[tuple[str, object]]) -> None:
    """Set several `section.name` values. A frozen section (the 2026 record's constants) is replaced
    once by a copy holding all of its new values, so its checks see them together (a width and a head
    size that only fit each other); a mutable section is set field by field."""
    frozen: dict[str, dict[str, object]] = {}
    for path, value in items:
        section, name, typed = _resolve(cfg, path, value)
        if getattr(cfg, section).__dataclass_params__.frozen:
            frozen.setdefault(section, {})[name] = typed
        else:
            setattr(getattr(cfg, section), name, typed)
    for section, changes in frozen.items():
        try:
            setattr(cfg, section, dataclasses.replace(getattr(cfg, section), **changes))
        except ConfigError as e:
            raise ConfigError(f"--set {', '.join(f'{section}.{n}' for n in changes)}: {e}") from None


def apply_overrides(cfg: AnyConfig, overrides: list[str]) -> AnyConfig:
    """Apply `section.field=value` strings (a frozen section's together, see set_fields)."""
    items = []
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"--set {item}: expected section.field=value")
        path, value = item.split("=", 1)
        items.append((path.strip(), value.strip()))
    set_fields(cfg, items)
    return cfg


def diff(a: AnyConfig, b: AnyConfig) -> dict[str, tuple]:
    """Fields whose values differ: {path: (a_value, b_value)} (configs of one kind)."""
    if type(a) is not type(b):
        raise ConfigError(f"'{a.name}' and '{b.name}' are configs of different records")
    da, db = a.to_dict(), b.to_dict()
    out = {}
    for s in sections(a):
        for k in da[s]:
            if da[s][k] != db[s][k]:
                out[f"{s}.{k}"] = (da[s][k], db[s][k])
    return out


ALLOWED_WORLD_SIZES = (1, 2, 4, 8)

# The FlexAttention and Gluon block masks' granularity in tokens (model/attention.py): a divisor of
# attention.block_size finer than it visits 11-25% fewer tiles on FineWeb's documents.
MASK_BLOCK = 64


Check = tuple[bool, str, str]  # (holds, option name, what is wrong)


def _one_of(value: str, name: str, options: tuple[str, ...]) -> Check:
    """A check that `value` is one of `options` ("must be a, b or c, got 'x'")."""
    listed = ", ".join(options[:-1]) + " or " + options[-1]
    return value in options, name, f"must be {listed}, got {value!r}"



def _finite(x) -> bool:
    return not isinstance(x, float) or math.isfinite(x)


def _at_least(x, lo, name: str) -> Check:
    return _finite(x) and x >= lo, name, f"must be >= {lo}, got {x!r}"


def _above(x, lo, name: str) -> Check:
    return _finite(x) and x > lo, name, f"must be > {lo}, got {x!r}"


def _within(x, lo, hi, name: str, below_hi: bool = False) -> Check:
    """`x` in [lo, hi], or [lo, hi) with `below_hi`."""
    ok = _finite(x) and lo <= x and (x < hi if below_hi else x <= hi)
    return ok, name, f"must be in [{lo}, {hi}{')' if below_hi else ']'}, got {x!r}"


def _betas(betas: tuple[float, ...], name: str) -> Check:
    ok = all(_finite(b) and 0 <= b < 1 for b in betas)
    return ok, name, f"each beta must be in [0, 1), got {tuple(betas)}"


def _layers(layers: tuple[int, ...], num_layers: int, name: str) -> Check:
    ok = all(0 <= i < num_layers for i in layers)
    return ok, name, (f"layer indices must be in 0..{num_layers - 1} (model.num_layers={num_layers}), "
                      f"got {tuple(layers)}")


def _range_checks(cfg: RunConfig) -> list[Check]:
    """Every number with a range: sizes and counts, learning rates, betas and fractions, layer indices.

    Checked before the rest, whose checks divide by some of these (the sequence lengths' own
    checks there: positive multiples of the block). A zero learning rate is allowed: it
    freezes that group, an ablation; a negative one climbs the loss instead of descending it."""
    m, a, o, sch, t = cfg.model, cfg.attention, cfg.optim, cfg.schedule, cfg.train
    return [
        _at_least(m.vocab_size, 1, "model.vocab_size"),
        _at_least(m.vocab_multiple, 1, "model.vocab_multiple"),
        _at_least(m.num_layers, 1, "model.num_layers"),
        _at_least(m.model_dim, 1, "model.model_dim"),
        _at_least(m.num_heads, 1, "model.num_heads"),
        _at_least(m.head_dim, 1, "model.head_dim"),
        _at_least(m.mlp_hidden, 1, "model.mlp_hidden"),
        _at_least(m.max_positions, 1, "model.max_positions"),
        _at_least(m.value_embeds, 0, "model.value_embeds"),
        _at_least(m.logit_softcap, 0, "model.logit_softcap"),
        _at_least(m.attn_scale, 0, "model.attn_scale"),
        _at_least(m.gate_inputs, 1, "model.gate_inputs"),
        _layers(m.no_attn_layers, m.num_layers, "model.no_attn_layers"),
        _layers(m.long_layers, m.num_layers, "model.long_layers"),
        _at_least(a.block_size, 1, "attention.block_size"),
        _at_least(a.window_tokens, 1, "attention.window_tokens"),
        _at_least(a.segment_len, 0, "attention.segment_len"),
        _betas(o.adam_betas, "optim.adam_betas"),
        _above(o.adam_eps, 0, "optim.adam_eps"),
        _at_least(o.embed_lr, 0, "optim.embed_lr"),
        _at_least(o.head_lr, 0, "optim.head_lr"),
        _at_least(o.scalar_lr, 0, "optim.scalar_lr"),
        _at_least(o.muon_lr, 0, "optim.muon_lr"),
        _within(o.muon_momentum, 0, 1, "optim.muon_momentum", below_hi=True),
        _within(o.muon_momentum_start, 0, 1, "optim.muon_momentum_start", below_hi=True),
        _at_least(o.muon_ns_steps, 0, "optim.muon_ns_steps"),
        _at_least(o.adamw_lr, 0, "optim.adamw_lr"),
        _betas(o.adamw_betas, "optim.adamw_betas"),
        _above(o.adamw_eps, 0, "optim.adamw_eps"),
        _at_least(o.weight_decay, 0, "optim.weight_decay"),
        _within(sch.warmup_frac, 0, 1, "schedule.warmup_frac"),
        _within(sch.cooldown_frac, 0, 1, "schedule.cooldown_frac"),
        _within(sch.final_lr_frac, 0, 1, "schedule.final_lr_frac"),
        # may exceed 1: proxy212 keeps the record's 300-step warm-up in a 212-step run
        _at_least(sch.momentum_warmup_frac, 0, "schedule.momentum_warmup_frac"),
        (t.steps > 0, "train.steps", f"must be > 0, got {t.steps}"),
        (t.batch_seqs > 0, "train.batch_seqs", f"must be > 0, got {t.batch_seqs}"),
        _at_least(t.val_tokens, 0, "train.val_tokens"),
        _at_least(t.val_every, 0, "train.val_every"),
        _at_least(t.warmup_steps, 0, "train.warmup_steps"),
        _at_least(t.warmup_steps_warm, 1, "train.warmup_steps_warm"),
    ] + _keeping_checks(t)


def _keeping_checks(t: KeepingConfig) -> list[Check]:
    """The run keeping's numbers and choices (both records)."""
    return [
        (0 <= t.seed < 2**64, "train.seed", f"must be in [0, 2^64), got {t.seed}"),  # numpy's and torch's seeds
        _at_least(t.log_every, 0, "train.log_every"),
        _at_least(t.sample_tokens, 0, "train.sample_tokens"),
        _at_least(t.checkpoint_every_steps, 0, "train.checkpoint_every_steps"),
        _at_least(t.checkpoint_every_minutes, 0, "train.checkpoint_every_minutes"),
        _at_least(t.health_every, 0, "train.health_every"),
        (t.spike_factor == 0 or _finite(t.spike_factor) and t.spike_factor > 1, "train.spike_factor",
         f"must be 0 (off) or > 1, got {t.spike_factor}"),
        _at_least(t.max_recoveries, 0, "train.max_recoveries"),
        (0 < t.recover_lr_factor <= 1, "train.recover_lr_factor", f"must be in (0, 1], got {t.recover_lr_factor}"),
        _one_of(t.dtype, "train.dtype", ("auto", "bfloat16", "float32")),
        _one_of(t.compile, "train.compile", ("auto", "on", "off")),
        _one_of(t.kernels, "train.kernels", ("auto", "reference")),
        _one_of(t.on_fault, "train.on_fault", ("stop", "recover")),
    ]


def _model_checks(m: ModelConfig) -> list[Check]:
    return [
        (m.head_dim % 4 == 0, "model.head_dim", f"must be a multiple of 4, got {m.head_dim}"),
        _one_of(m.activation, "model.activation", ("relu2", "gelu")),
        _one_of(m.positions, "model.positions", ("rotary", "learned")),
        _one_of(m.rotary, "model.rotary", ("half_truncated", "full")),
        _one_of(m.norm, "model.norm", ("rms", "layer")),
        _one_of(m.softcap_form, "model.softcap_form", ("sigmoid", "tanh")),
        (2 * m.value_embeds <= m.num_layers, "model.value_embeds",
         f"needs 2*value_embeds <= num_layers, got {m.value_embeds} for {m.num_layers} layers"),
        (m.gate_inputs <= m.model_dim, "model.gate_inputs", "must be <= model_dim"),
        (m.num_heads * m.head_dim == m.model_dim, "model.head_dim",
         f"num_heads x head_dim must equal model_dim, got {m.num_heads} x {m.head_dim} != {m.model_dim}"),
    ]


def _attention_checks(a: AttentionConfig, t: TrainConfig) -> list[Check]:
    return [
        (not a.segment_len or t.seq_len % a.segment_len == 0, "attention.segment_len",
         f"train.seq_len={t.seq_len} must be a multiple of it"),
        _one_of(a.window, "attention.window", ("none", "fixed", "growing")),
        _one_of(a.backend, "attention.backend", ("auto", "flex", "dense", "gluon")),
        (a.backend == "dense" or a.block_size % MASK_BLOCK == 0, "attention.block_size",
         f"must be a multiple of {MASK_BLOCK} (the FlexAttention and Gluon masks' blocks) unless "
         f"attention.backend=dense, got {a.block_size}"),
    ]


def _shape_checks(t: TrainConfig, a: AttentionConfig) -> list[Check]:
    return [
        (t.seq_len > 0 and t.seq_len % a.block_size == 0, "train.seq_len",
         f"must be a positive multiple of attention.block_size={a.block_size}, got {t.seq_len}"),
        (t.val_seq_len > 0 and t.val_seq_len % a.block_size == 0, "train.val_seq_len",
         f"must be a positive multiple of attention.block_size={a.block_size}, got {t.val_seq_len}"),
    ]


def _run_checks(cfg: RunConfig) -> list[Check]:
    return [
        _one_of(cfg.optim.kind, "optim.kind", ("muon", "adamw")),
    ]


def _record_checks(cfg: RecordRunConfig, world_size: int) -> list[Check]:
    """The 2026 record's batch and validation split over the world size (the sections' own
    constructors already refused inconsistent constants)."""
    st, d = cfg.stages, cfg.docs
    span = world_size * d.val_chunk
    return [
        (all(n > 0 and n % d.sets_per_step == 0 for n in st.tokens_per_step), "stages.tokens_per_step",
         f"each must be a positive multiple of docs.sets_per_step={d.sets_per_step}, got {st.tokens_per_step}"),
        (st.piece_sets_per_step == d.sets_per_step, "stages.piece_sets_per_step",
         f"must equal docs.sets_per_step={d.sets_per_step}, got {st.piece_sets_per_step}"),
        (d.val_tokens >= 0 and d.val_tokens % span == 0, "docs.val_tokens",
         f"must be a multiple of world size x docs.val_chunk = {world_size} x {d.val_chunk}, got {d.val_tokens}"),
        _at_least(d.max_docs_mult, 1, "docs.max_docs_mult"),
        _at_least(cfg.train.merge_tokens, 0, "train.merge_tokens"),
        _at_least(st.val_every, 0, "stages.val_every"),
        _one_of(cfg.train.warmup, "train.warmup", ("auto", "on", "off")),
        _one_of(cfg.train.compile, "train.compile", ("auto", "on", "off")),
    ] + _keeping_checks(cfg.train)


def validate(cfg: AnyConfig, world_size: int = 1) -> None:
    """Refuse values that cannot run, each with one line naming the field."""
    if isinstance(cfg, RecordRunConfig):
        if world_size not in ALLOWED_WORLD_SIZES or cfg.docs.sets_per_step % world_size:
            raise ConfigError(f"world size {world_size}: preset '{cfg.name}' runs {cfg.docs.sets_per_step} piece "
                              f"sets a step over 1, 2, 4 or 8 ranks dividing it")
        for ok, name, msg in _record_checks(cfg, world_size):
            if not ok:
                raise ConfigError(f"{name}: {msg}")
        return
    m, a, t = cfg.model, cfg.attention, cfg.train
    for ok, name, msg in _range_checks(cfg):
        if not ok:
            raise ConfigError(f"{name}: {msg}")
    checks = (_shape_checks(t, a) + _model_checks(m) + _attention_checks(a, t)
              + _run_checks(cfg))
    if m.positions == "learned":
        span = a.segment_len or max(t.seq_len, t.val_seq_len)  # positions restart at each segment
        checks.append((span <= m.max_positions, "model.max_positions",
                       f"learned positions need max_positions >= {span} (attention.segment_len, or else "
                       f"train.seq_len and train.val_seq_len)"))
    for ok, name, msg in checks:
        if not ok:
            raise ConfigError(f"{name}: {msg}")
    if world_size not in ALLOWED_WORLD_SIZES or t.batch_seqs % world_size:
        raise ConfigError(
            f"world size {world_size}: preset '{cfg.name}' splits train.batch_seqs={t.batch_seqs} sequences "
            f"per step over 1, 2, 4 or 8 ranks dividing it; launch with one of "
            f"{[w for w in ALLOWED_WORLD_SIZES if t.batch_seqs % w == 0]} processes")
    if t.val_tokens and t.val_tokens % (world_size * t.val_seq_len):
        raise ConfigError(
            f"train.val_tokens: {t.val_tokens} is not a multiple of world size x train.val_seq_len "
            f"= {world_size} x {t.val_seq_len}")

