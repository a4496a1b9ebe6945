"""The 2026 record's model as a run sets it up, and its micro-step loss as a run calls it.

Two processes must build exactly this: the trainer, and the precompile children
(compile/record_precompile.py) that compile the later stages' graphs while the trainer compiles the
first. A compiled graph is found in torch's caches only if everything that shapes it is the same (the
model's seams, the FP8 state, the constants of the stage, the inputs' shapes and types), so both
call the functions here rather than each writing its own.

- `setup_model`: the model from the run's seed, its FP8 products (bf16 activations only, the
  head's gradient scale 1/micro-steps) and the kernels the device's one choice gives it.
- `MicroLoss`: the training loss of one micro-batch at a step's plan, compiled with static shapes
  where the run compiles: the loss weights reach it as tensors (they move every step), the windows,
  YaRN scale and cut length as constants of the stage. One graph per stage.
- `step_batches`: a step's piece sets, joined `sets_per_micro_step` to a micro-batch where
  `train.merge_tokens` asks (the first stage's 16,384-token sets run two to a micro-step at 32,768: half the
  launches and the micro-steps' fixed costs, with products of stage 2's size).
"""

from __future__ import annotations

import torch

from speedrun.config import RecordRunConfig
from speedrun.data import documents
from speedrun.data.transfer import host_to_device
from speedrun.data.tokenizer import get_encoding
from speedrun.kernels import record_attention
from speedrun.model import record_parts
from speedrun.model.record import RecordGPT
from speedrun.model.record_fp8 import Fp8Training
from speedrun.model.record_loss import prefix_table
from speedrun.train import stages

# Inductor's mix-order reduction fusion fails on the loss's (n - 1)-row slices (torch 2.11: an
# assertion "16384 v.s. 16383" in its scheduler), so it stays off for the record's graphs.
COMPILE_OPTIONS = {"triton.mix_order_reduction": False}


def fp8_training(cfg: RecordRunConfig, dtype: torch.dtype, micro_steps: int, device: torch.device) -> Fp8Training | None:
    """FP8 where the config asks for it and activations are bfloat16 (the record's numbers)."""
    f = cfg.fp8
    if dtype != torch.bfloat16 or not (f.head or f.mlp):
        return None
    layers = cfg.model.mlp_bank_layers if f.mlp else 0
    return Fp8Training(cfg.fp8_scales, 1.0 / micro_steps if f.head else None, layers, device)


def build_record_model(cfg: RecordRunConfig, world_size: int, device: torch.device) -> RecordGPT:
    """The model's weights as a run starts them: initialised from a CPU generator seeded with
    train.seed (the same weights on every device and world size, pads aside), tied."""
    gen = torch.Generator().manual_seed(cfg.train.seed)
    return RecordGPT(cfg.model, world_size, device=device, generator=gen)


def setup_model(cfg: RecordRunConfig, world_size: int, device: torch.device, dtype: torch.dtype,
                micro_steps: int) -> RecordGPT:
    """`build_record_model` with its FP8 products and the kernels of the device's one choice."""
    model = build_record_model(cfg, world_size, device)
    model.fp8 = fp8_training(cfg, dtype, micro_steps, device)
    model.kernels = record_attention.pick(cfg.train.kernels, device)
    return model


def refresh_fp8(model: RecordGPT, cfg: RecordRunConfig, after_step: int) -> None:
    """Re-quantise the MLP weights after an update (-1: before the first step); the refreshes after
    steps 0..15 bootstrap W2's scale from the current weights."""
    if model.fp8 is not None and model.fp8.mlp is not None:
        model.fp8.refresh(model.mlp_bank, cfg.fp8_scales.bootstrap_refreshes > after_step)


def sets_per_micro_step(cfg: RecordRunConfig, n_loc: int, micro_steps: int) -> int:
    """How many of a step's piece sets (n_loc tokens each) one micro-step joins: the most that divide
    the rank's micro_steps sets and fit `train.merge_tokens`; 1 when joining is off, a set alone
    already fills the bound, or the FP8 MLP's delayed scales move with each set's forward."""
    if cfg.train.merge_tokens <= 0 or cfg.fp8.mlp:
        return 1
    return max((k for k in range(1, micro_steps + 1) if micro_steps % k == 0 and k * n_loc <= cfg.train.merge_tokens),
               default=1)


def step_batches(loader: documents.DocumentLoader, plan: stages.StepPlan, cfg: RecordRunConfig,
                 micro_steps: int) -> list[documents.DocBatch]:
    """This rank's batches of one step at the plan's shape, `sets_per_micro_step` piece sets to a batch
    (on the host)."""
    sets = loader.next_step(plan.local_tokens, plan.max_doc_len, plan.max_docs)
    k = sets_per_micro_step(cfg, plan.local_tokens, micro_steps)
    return [documents.concat(sets[i : i + k]) for i in range(0, len(sets), k)]


class MicroLoss:
    """The summed training loss of one micro-batch at a step's plan (module docstring); also the
    stage's YaRN state and RoPE tables, which validation reads too."""

    def __init__(self, cfg: RecordRunConfig, model: RecordGPT, device: torch.device, dtype: torch.dtype,
                 compiled: bool):
        self.cfg, self.device, self.dtype = cfg, device, dtype
        self.fn = torch.compile(model.training_loss, dynamic=False, options=COMPILE_OPTIONS) if compiled \
            else model.training_loss
        self.prefix = prefix_table(get_encoding(), cfg.model.vocab).to(device)
        m = cfg.model
        self.yarn = {k: stages.yarn_state(cfg.stages, k, device=device, pairs=m.rope_pairs, base=m.rope_base)
                     for k in range(stages.N_STAGES)}
        self._rope: dict[tuple[int, int], tuple[torch.Tensor, torch.Tensor]] = {}
        self._weights: tuple[int, tuple[torch.Tensor, torch.Tensor | float]] | None = None

    def rope(self, stage: int, n: int) -> tuple[torch.Tensor, torch.Tensor]:
        """cos/sin of the stage's YaRN frequencies for 2n positions (the paired layers' rows)."""
        if (stage, n) not in self._rope:
            self._rope[(stage, n)] = record_parts.rope_tables(self.yarn[stage][0], 2 * n)
        return self._rope[(stage, n)]

    def weights(self, plan: stages.StepPlan) -> tuple[torch.Tensor, torch.Tensor | float]:
        """MTP weights as a tensor; π as a tensor in the stages that have a prefix term, else 0. Made
        once a step (its micro-steps share them): two host-to-device copies a step, not two a micro-step,
        both queued behind the device's work (`host_to_device`)."""
        if self._weights is None or self._weights[0] != plan.step:
            st, k = self.cfg.stages, plan.stage
            mtp = host_to_device(plan.mtp_weights, torch.float32, self.device)
            has_prefix = st.prefix_start[k] or st.prefix_end[k]
            pi = host_to_device(plan.prefix_weight, torch.float32, self.device) if has_prefix else 0.0
            self._weights = plan.step, (mtp, pi)
        return self._weights[1]

    def __call__(self, batch: documents.DocBatch, plan: stages.StepPlan) -> torch.Tensor:
        """The summed loss of a batch of one or more piece sets (`step_batches`); a joined batch is a
        graph of its own shape, as each stage is."""
        mtp, pi = self.weights(plan)
        return self.fn(batch.inputs, batch.targets, batch.cu_seqlens, (plan.short_window, plan.long_window),
                       self.yarn[plan.stage][1], mtp, pi, self.prefix, rope=self.rope(plan.stage, plan.local_tokens),
                       dtype=self.dtype, longest=plan.max_doc_len, sets=batch.inputs.numel() // plan.local_tokens)
