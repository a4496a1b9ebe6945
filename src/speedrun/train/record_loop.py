"""The 2026-07 record's training loop (#89): the `Trainer`'s loop with the record's step.

The loop itself (validation with the clock stopped, the timed run, checkpoints, resume, faults, the
summary and the run folder) is `Trainer`'s: a record differs in what a step is, and this class
supplies exactly that. Why it is built this way:

- A step is asked of the staged schedule (`stages.step_plan`): its batch shape, windows, lr and
  momentum, MTP and prefix weights. Nothing about the schedule is state; YaRN's frequencies and
  softmax scale are a function of the stage (`stages.yarn_state`), so a resumed run, the warm-up's
  restore and the final validation all just ask again.
- The loader (`documents.DocumentLoader`) takes the step's shape as arguments; `_StepBatches` is
  it as the run guard asks for it (`next_step()` with this step's plan), so skipping a bad batch
  after a recovery draws one of the same shape.
- The step is the spec's: every micro-step backpropagates grad_scale × its summed loss (1/grad_accum,
  no division by tokens), NorMuon updates the banks every step, Adam the rest on odd steps from the
  even step's kept gradients (`RecordAdam.restore_pending_grads` puts them back before the odd
  step's backward, as the record's surviving gradients are), the embedding unties from the head at
  the split step, and FP8's MLP weights are re-quantised after every update.
- What the spec keeps besides parameters and optimiser state is saved with a checkpoint
  (`extra_state`): the FP8 delayed scales. The tie is part of Adam's state dict.
- What serves the model's seams on this device is chosen once (`record_attention.pick`). On a GPU
  (`train.compile=auto`) the micro-step's loss and the validation loss are compiled whole, with
  static shapes: everything that varies inside a stage reaches them as a tensor (the loss weights)
  and everything a stage fixes as a Python constant (windows, YaRN scale, the cut length that the
  attention kernel sizes its grid by), so each stage is one training graph and one validation
  graph, all met by the warm-up before the clock starts.
"""

from __future__ import annotations

import torch

from speedrun.compile.session import PlainSession
from speedrun.config import RecordRunConfig
from speedrun.data import documents
from speedrun.data.shards import check_vocab
from speedrun.kernels import table as kernel_table
from speedrun.compile import record_precompile
from speedrun.model.record import RecordGPT, count_parameters
from speedrun.optim.normuon import build_normuon
from speedrun.optim.record_adam import build_record_adam
from speedrun.train import stages
from speedrun.train.dist import DistInfo, all_reduce_mean
from speedrun.train.loop import Trainer, grad_norm
from speedrun.train.record_micro import MicroLoss, refresh_fp8, setup_model, step_batches
from speedrun.train.setup import data_folder, use_compile

BANKS = ("qk_bank", "vo_bank", "mlp_bank")  # NorMuon's; every other parameter is Adam's


class _StepBatches:
    """The document loader as the run guard draws from it: `next_step()` gives this step's
    micro-batches (on the device) at the shape of the plan the trainer set (`step_batches`)."""

    def __init__(self, loader: documents.DocumentLoader, device: torch.device, cfg: RecordRunConfig,
                 micro_steps: int):
        self.loader, self.device, self.cfg, self.micro_steps = loader, device, cfg, micro_steps
        self.plan: stages.StepPlan | None = None

    def next_step(self) -> list[documents.DocBatch]:
        return [documents.to_device(b, self.device)
                for b in step_batches(self.loader, self.plan, self.cfg, self.micro_steps)]

    def state_dict(self) -> dict:
        return self.loader.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self.loader.load_state_dict(state)


def split_parameters(model: RecordGPT) -> tuple[dict, dict]:
    """(NorMuon's banks, Adam's other parameters), by the spec's names."""
    named = dict(model.named_parameters())
    return {n: named[n] for n in BANKS}, {n: p for n, p in named.items() if n not in BANKS}


class RecordTrainer(Trainer):
    """Trains a `RecordRunConfig`; `Trainer` runs the loop around its steps."""

    cfg: RecordRunConfig

    def __init__(self, cfg: RecordRunConfig, info: DistInfo, *args, session=None, **kwargs):
        session = session or PlainSession(use_compile(cfg.train.compile, info.device), info)
        super().__init__(cfg, info, *args, session=session, **kwargs)

    # -------------------------------------------------------------- set-up

    def _build(self) -> None:
        cfg, info = self.cfg, self.info
        st, d = cfg.stages, cfg.docs
        self.micro_steps = documents.grad_accum_steps(info.world_size, d)
        self.compiled = self.session.compiled
        self.session.open(self.out.path if self.out else None)
        self.compile_cache = self.session.cache_state
        run_warmup = cfg.train.warmup == "on" or (cfg.train.warmup == "auto" and self.compiled)
        self.warmup_count = len(stages.warmup_steps(st)) if run_warmup else 0
        self.startup.mark("compile_cache")
        # the later stages' graphs compile in child processes while this one compiles the first's
        self.precompilers = record_precompile.start(cfg, info, self.out.path if self.out else None) \
            if self.compiled and self.warmup_count else []
        self.model = setup_model(cfg, info.world_size, self.device, self.dtype, self.micro_steps)
        self.fp8 = self.model.fp8
        self.loss = MicroLoss(cfg, self.model, self.device, self.dtype, self.compiled)
        self.startup.mark("model")
        self.optimizers = self._optimizers()
        self._refresh_fp8(after_step=-1)
        folder = data_folder(cfg.data)
        train_files = documents.discover_files(folder, cfg.data.train_pattern, "train")
        self.val_files = documents.val_files(folder, cfg.data.val_pattern) if d.val_tokens else []
        check_vocab(train_files + self.val_files, cfg.model.vocab)
        self.loader = _StepBatches(documents.DocumentLoader(train_files, info.rank, info.world_size, d),
                                   self.device, cfg, self.micro_steps)
        self._val: tuple[list[documents.DocBatch], int] | None = None

    def _optimizers(self) -> list[torch.optim.Optimizer]:
        """NorMuon over the banks, Adam over the rest with the tie until the split step."""
        banks, others = split_parameters(self.model)
        st = self.cfg.stages
        muon = build_normuon(*banks.values(), self.cfg.normuon, momentum=stages.muon_momentum(st, 0),
                             kernel=kernel_table.impl(self.cfg.train.kernels))
        adam = build_record_adam(others, self.cfg.adam, split_step=stages.split_step(st),
                                 kernel=kernel_table.impl(self.cfg.train.kernels))
        return [muon, adam]

    def _refresh_fp8(self, after_step: int) -> None:
        refresh_fp8(self.model, self.cfg, after_step)

    def describe(self) -> dict:
        f = self.fp8
        return {
            "parameters": count_parameters(self.model), "world_size": self.info.world_size,
            "micro_steps": self.micro_steps, "dtype": str(self.dtype).replace("torch.", ""),
            "attention_backend": self.model.kernels.name,
            "fp8_head": bool(f and f.head_grad_scale is not None),
            "fp8_mlp": bool(f and f.mlp), "compile": self.compiled, "device": str(self.device),
        }

    def headline(self) -> str:
        st, d = self.cfg.stages, self.describe()
        return (f"speedrun: {self.cfg.name}: {d['parameters']:,} parameters, {st.scheduled_steps} + "
                f"{st.extension_steps} steps, {self.info.world_size} rank(s) x {self.micro_steps} micro-step(s), "
                f"{d['dtype']}, fp8 head/mlp={d['fp8_head']}/{d['fp8_mlp']}, compile={d['compile']}")

    # -------------------------------------------------------------- what the loop asks

    @property
    def total_steps(self) -> int:
        return self.cfg.stages.total_steps

    def validates(self, step: int) -> bool:
        return stages.validates(self.cfg.stages, step)

    @property
    def val_enabled(self) -> bool:
        return bool(self.cfg.docs.val_tokens)

    def tokens_at(self, step: int) -> int:
        st = self.cfg.stages
        return sum(stages.tokens_per_step(st, s) for s in range(min(step, st.total_steps)))

    def base_lrs(self) -> dict[str, float]:
        return {"normuon": self.cfg.normuon.lr, "adam": self.cfg.adam.lr}

    # -------------------------------------------------------------- steps

    def set_schedules(self, plan: stages.StepPlan) -> None:
        self.lr_mult = plan.lr_mul * self.guard.lr_factor
        for opt in self.optimizers:
            for group in opt.param_groups:
                group["lr"] = group["initial_lr"] * self.lr_mult
                if "momentum" in group:
                    group["momentum"] = plan.momentum

    def micro_loss(self, batch: documents.DocBatch, plan: stages.StepPlan) -> torch.Tensor:
        """One micro-batch's summed training loss (MTP and prefix terms) at the plan's schedule."""
        return self.loss(batch, plan)

    def train_step(self, step: int) -> torch.Tensor:
        """One optimiser step over this rank's micro-batches; its mean loss per token (device)."""
        plan = stages.step_plan(self.cfg.stages, step, self.cfg.docs)
        self.set_schedules(plan)
        muon, adam = self.optimizers
        if plan.adam_step:
            adam.restore_pending_grads()  # the even step's gradients, summed onto by this step's
        self.loader.plan = plan
        batches = self.guard.next_batches()
        total = torch.zeros((), device=self.device)
        with self.guard.health.watch(step):
            for batch in batches:
                loss = self.guard.loss(self.micro_loss(batch, plan))
                (loss / self.micro_steps).backward()
                total += loss.detach().float()
        self.guard.before_update(step)
        self.grad_norm = grad_norm(self.model) if self._log_step(step) else None
        muon.step()
        adam.step(step=step)
        muon.zero_grad(set_to_none=True)
        self.model.tied = adam.tied
        self._refresh_fp8(after_step=step)
        mean = all_reduce_mean(total / (self.micro_steps * plan.local_tokens))  # every piece set's tokens
        self.guard.after_update(step, mean)
        return mean

    @torch.no_grad()
    def evaluate(self, step: int) -> float:
        """Mean next-token loss over the val chunks: the step's windows and YaRN, or at the end the
        final windows with the extension's YaRN."""
        st = self.cfg.stages
        last = step >= st.total_steps
        stage = stages.stage_index(st, min(step, st.total_steps - 1))
        windows = stages.final_val_windows(st) if last else stages.windows(st, step)
        self.model.eval()
        batches, longest = self._val_batches()
        total = torch.zeros((), device=self.device)
        for batch in batches:
            rope = self.loss.rope(stage, batch.inputs.numel())
            total += self.model.eval_loss(batch.inputs, batch.targets, batch.cu_seqlens, windows, self.loss.yarn[stage][1],
                                          rope=rope, dtype=self.dtype, longest=longest).float()
        self.model.train()
        return all_reduce_mean(total / max(len(batches), 1)).item()

    def _val_batches(self) -> tuple[list[documents.DocBatch], int]:
        """This rank's val chunks on the device, read once a run, and their longest document (the
        attention kernel's grid bound), found once so that no validation reads it back per layer."""
        if self._val is None:
            batches = list(documents.val_batches(self.val_files, self.info.rank, self.info.world_size, self.cfg.docs))
            longest = max(int((b.cu_seqlens[1:] - b.cu_seqlens[:-1]).max()) for b in batches)
            self._val = [documents.to_device(b, self.device) for b in batches], longest
        return self._val

    def warm_up(self) -> None:
        """The spec's untimed warm-up: at each step of the warm-up set one training step, then
        parameters, optimisers (NorMuon's buffers zeroed, the tie restored), FP8 and the loader back
        to their start. The later stages' graphs are the precompile children's: before a later stage's
        first step the trainer waits until that stage is compiled (`record_precompile.ready`), then finds
        its graphs in torch's caches; the children are reaped once the warm-up's steps are done."""
        if not self.warmup_count:
            return
        model_state = {k: v.detach().clone() for k, v in self.model.state_dict().items()}
        loader_state = self.loader.state_dict()
        for i, step in enumerate(stages.warmup_steps(self.cfg.stages)):
            stage = stages.stage_index(self.cfg.stages, step)
            if self.precompilers and stage > 0:
                self._precompile_note(record_precompile.ready(self.precompilers,
                                                              stages.stage_ends(self.cfg.stages)[stage]))
            self.train_step(step)
            self.startup.mark("first_step" if i == 0 else "warmup_steps")
        if self.precompilers:
            self._precompile_note(record_precompile.finish(self.precompilers))
            self.precompilers = []
        self.model.load_state_dict(model_state)
        self.model.tied = True
        self.optimizers = self._optimizers()
        if self.fp8 is not None:
            self.fp8.reset()
        self._refresh_fp8(after_step=-1)
        self.loader.load_state_dict(loader_state)
        self.startup.mark("restore")

    def _precompile_note(self, note: str | None) -> None:
        if note and self.info.is_main:
            print(f"speedrun: precompile: {note}", flush=True)

    # -------------------------------------------------------------- checkpoints and the end

    def extra_state(self) -> dict:
        """What a checkpoint keeps besides model, optimisers, loader and RNG: the FP8 delayed scales."""
        return {"fp8": self.fp8.state_dict() if self.fp8 is not None else None}

    def load_extra_state(self, state: dict) -> None:
        if self.fp8 is not None and state.get("fp8") is not None:
            self.fp8.load_state_dict(state["fp8"])
        self.model.tied = self.optimizers[1].tied

    def _print_sample(self) -> None:
        from speedrun.tools.sample import generate_record_text

        st = self.cfg.stages
        freqs, scale = self.loss.yarn[stages.N_STAGES - 1]
        text = generate_record_text(self.model, "It was a dark and stormy night", self.cfg.train.sample_tokens,
                                    stages.final_val_windows(st), scale, freqs, dtype=self.dtype)
        print(f"sample: {text}")
