"""What a run builds before its first step: the model exactly as the trainer runs it, its data files,
its dtype and whether it compiles.

Apart from the loop because the precompile child and the compile cache build the same things without
a trainer: one definition, so what they compile is what the run runs.
"""

from __future__ import annotations

from pathlib import Path

import torch

from speedrun.config import MASK_BLOCK, DataConfig, RunConfig
from speedrun.kernels.fp8 import fp8_supported
from speedrun.model.attention import pick_backend
from speedrun.model.gpt import GPT


def pick_dtype(name: str, device: torch.device) -> torch.dtype:
    if name == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    return {"bfloat16": torch.bfloat16, "float32": torch.float32}[name]


def use_compile(mode: str, device: torch.device) -> bool:
    """Whole-model compile: `on` anywhere (several CPU tests run compiled), `auto` on CUDA."""
    return mode == "on" or (mode == "auto" and device.type == "cuda")


def data_folder(data: DataConfig) -> Path:
    """The shards' folder: the embedded corpus for "demo", the default FineWeb folder for ""."""
    from speedrun.data.paths import default_fineweb_dir, demo_data_dir

    d = data.data_dir
    return demo_data_dir() if d == "demo" else Path(d) if d else default_fineweb_dir()


def resolve_data(cfg: RunConfig) -> tuple[list[Path], Path | None]:
    from speedrun.data.paths import discover_files

    folder = data_folder(cfg.data)
    train = discover_files(folder, cfg.data.train_pattern, "train")
    val = discover_files(folder, cfg.data.val_pattern, "val")[0] if cfg.train.val_tokens else None
    return train, val


def build_model(cfg: RunConfig, device: torch.device, world_size: int, dtype: torch.dtype) -> GPT:
    """The model exactly as the trainer runs it (seeded initialisation, embedding dtype, rotary
    table, attention backend, FP8 head); `precompile` builds the same one to compile its graphs."""
    torch.manual_seed(cfg.train.seed)
    model = GPT(cfg.model, cfg.attention, pad_scalars_to=world_size, kernels=cfg.train.kernels).to(device)
    if dtype == torch.bfloat16 and cfg.model.bf16_embeds:
        for m in model.modules():
            if isinstance(m, torch.nn.Embedding):
                m.to(torch.bfloat16)
    if model.rotary is not None:  # rotary angles as a table: two loads instead of cos/sin per element
        model.rotary.build_table(max(cfg.train.seq_len, cfg.train.val_seq_len))
    model.attention_backend = pick_backend(cfg.attention.backend, device, MASK_BLOCK, cfg.model.head_dim, dtype,
                                           reference=cfg.train.kernels == "reference")
    if model.attention_backend == "flex":
        from speedrun.kernels.flex_tiles import use_sparse_block  # imports Inductor's heuristics: ~2 s, only here

        use_sparse_block(MASK_BLOCK, cfg.attention.block_size, device)
    model.use_fp8 = cfg.model.fp8_head and fp8_supported(device)
    return model
