"""A small random model shared by the inference-side tests (sampling, HellaSwag), and a check of
one config field's validation shared by the kernel tests."""

import pytest
import torch

from speedrun.config import RunConfig, apply_overrides, validate
from speedrun.errors import ConfigError
from speedrun.model.gpt import GPT
from speedrun.recipes.presets import demo_2025_08 as demo


def random_tiny_model(seed=0, **fields):
    """Random 4-layer model: long/short windows, a no-attention layer, value embeds, U-net.

    `fields` override ModelConfig fields (e.g. value_embeds=0, value_residual=True).
    Every weight is perturbed, so no zero-initialised projection hides a path.
    """
    cfg = demo()
    m = cfg.model
    m.model_dim, m.num_heads, m.head_dim, m.num_layers, m.mlp_hidden = 64, 2, 32, 4, 128
    m.value_embeds = 2
    m.long_layers, m.no_attn_layers = (0, 3), (2,)
    for k, v in fields.items():
        setattr(m, k, v)
    torch.manual_seed(seed)
    model = GPT(cfg.model, cfg.attention)
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.add_(torch.randn_like(p) * (0.2 if name == "scalars" else 0.3 / p.shape[-1] ** 0.5 * 3))
    return model.eval(), cfg


def assert_field_validated(field: str, good: str, bad: str) -> None:
    """`validate` takes field=good and refuses field=bad with an error naming the field."""
    cfg = RunConfig()
    apply_overrides(cfg, [f"{field}={good}"])
    validate(cfg)
    apply_overrides(cfg, [f"{field}={bad}"])
    with pytest.raises(ConfigError, match=field):
        validate(cfg)


def force_impl(model, impl: str) -> None:
    """Every kernel choice of a built model set to `impl` ("torch", "triton" or "auto"): how a test runs the
    model's Triton kernels on a CPU under the interpreter, which `train.kernels` (auto | reference) never asks."""
    for module in model.modules():
        if hasattr(module, "impl"):
            module.impl = impl


def run_forked_ranks(worker, world_size: int, out_dir, timeout_s: float = 60.0) -> list:
    """`worker(rank, world_size, init_file, out_dir)` in world_size forked processes (a forked child starts
    at once; a spawned one re-imports torch and Dynamo, seconds each on a shared CPU), then each rank's
    `out_dir/rank{r}.pt`. A rank that hangs fails the test instead of blocking it."""
    import time

    import torch.multiprocessing as mp

    ctx = mp.start_processes(worker, args=(world_size, str(out_dir / "init"), str(out_dir)),
                             nprocs=world_size, join=False, start_method="fork")
    deadline = time.monotonic() + timeout_s
    while not ctx.join(timeout=0.5):
        if time.monotonic() > deadline:
            for proc in ctx.processes:
                proc.kill()
            pytest.fail(f"the gloo ranks did not finish in {timeout_s} s")
    return [torch.load(out_dir / f"rank{r}.pt") for r in range(world_size)]
