"""Stop and resume gives the same run as never stopping (float32 on CPU: exactly).

The straight run and the interrupted one use the same checkpoint and health
settings (a warm-up step too, which must not disturb the restored state).
Most runs take one intra-op thread (faster on a busy machine); the WIDE ones
take the CPU's default two, with tables wide enough that the CPU kernels
split their work: the same seed and a resume still give the same bits.
Interruptions: SIGTERM raised in-process (the real handler: checkpoint, exit
143), SIGINT (130), and a crash between checkpoints (an injected CUDA OOM,
exit 4) resumed from the older checkpoint, whose later metrics are dropped.
"""

import json

import pytest
import torch

from reliability_helpers import curves, events, records, resume, torchrun, train

COMMON = ["--checkpoint-every", "3", "--set", "train.health_every=2", "--set", "train.warmup_steps=1"]


@pytest.fixture(scope="module")
def straight(tmp_path_factory):
    run = tmp_path_factory.mktemp("straight") / "run"
    assert train(run, *COMMON) == 0
    return run


def test_sigterm_then_resume_is_exact(straight, tmp_path):
    run = tmp_path / "run"
    assert train(run, *COMMON, "--set", "train.inject_fault=sigterm@4") == 143
    assert not (run / "summary.json").exists()
    assert (run / "checkpoints" / "latest").read_text().strip() == "step_000005"
    assert resume(run) == 0
    assert curves(run) == curves(straight)
    assert events(run, "resume")[0]["step"] == 5
    final = json.loads((run / "summary.json").read_text())
    assert final["final_val_loss"] == json.loads((straight / "summary.json").read_text())["final_val_loss"]


# The demo's width and tokens a micro-step (128 columns, 256 tokens): enough of an embedding table's
# gradient for the CPU kernels that split their work between threads to do so
WIDE = ["--set", "model.model_dim=128", "--set", "model.num_heads=2", "--set", "model.head_dim=64",
        "--set", "model.mlp_hidden=256", "--set", "model.value_embeds=1", "--set", "train.seq_len=256",
        "--set", "train.val_seq_len=256", "--set", "train.val_tokens=512"]


def _same_weights(run_a, run_b) -> bool:
    from safetensors.torch import load_file

    a, b = load_file(run_a / "model.safetensors"), load_file(run_b / "model.safetensors")
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.fixture(scope="module")
def straight_two_threads(tmp_path_factory):
    run = tmp_path_factory.mktemp("straight2") / "run"
    assert train(run, *COMMON, *WIDE, steps=6, threads=2) == 0
    return run


def test_same_seed_gives_the_same_bits_on_two_threads(straight_two_threads, tmp_path):
    """The default config (the embedding tables' gradients added row by row) on the CPU's default two
    threads: a second run with the same seed logs every loss and ends with every weight bit for bit."""
    run = tmp_path / "run"
    assert train(run, *COMMON, *WIDE, steps=6, threads=2) == 0
    assert curves(run) == curves(straight_two_threads)
    assert _same_weights(run, straight_two_threads)


def test_sigterm_then_resume_is_exact_on_two_threads(straight_two_threads, tmp_path):
    run = tmp_path / "run"
    assert train(run, *COMMON, *WIDE, "--set", "train.inject_fault=sigterm@4", steps=6, threads=2) == 143
    assert resume(run, threads=2) == 0
    assert events(run, "resume")[0]["step"] == 5
    assert curves(run) == curves(straight_two_threads)
    assert _same_weights(run, straight_two_threads)


def test_crash_between_checkpoints_resumes_from_the_last_one(straight, tmp_path):
    run = tmp_path / "run"
    assert train(run, *COMMON, "--set", "train.inject_fault=oom@5") == 4  # dies in step 5; last checkpoint: 3
    assert any(r.get("step", 0) > 3 and "event" not in r for r in records(run))  # metrics went past it
    assert resume(run) == 0
    assert events(run, "resume")[0]["step"] == 3
    assert curves(run) == curves(straight)


def test_sigint_exits_130_and_resumes(tmp_path):
    run = tmp_path / "run"
    assert train(run, "--set", "train.inject_fault=sigint@1", steps=3) == 130
    assert resume(run) == 0
    assert json.loads((run / "summary.json").read_text())["steps"] == 3


@pytest.mark.distributed
def test_two_process_gloo_resume_is_exact(tmp_path):
    """torchrun, 2 CPU processes: each rank writes its optimiser shard; a crash, then resume, matches."""
    from reliability_helpers import TINY

    a, b = tmp_path / "a", tmp_path / "b"
    common = ["--steps", "6", *TINY, *COMMON]
    done = torchrun(2, "--out", str(a), *common)
    assert done.returncode == 0, done.stderr[-2000:]
    crashed = torchrun(2, "--out", str(b), *common, "--set", "train.inject_fault=oom@4")
    assert crashed.returncode != 0 and "out of memory" in crashed.stderr
    ckpt = b / "checkpoints" / (b / "checkpoints" / "latest").read_text().strip()
    # step 3's checkpoint is normally committed before the crash at step 4; under heavy load torchrun
    # may end rank 0 while that write is still in flight, and then step 2's is the latest (never a torn one)
    assert ckpt.name in ("step_000003", "step_000002")
    assert (ckpt / "rank0.pt").exists() and (ckpt / "rank1.pt").exists()
    done = torchrun(2, "--resume", str(b), "--no-progress")
    assert done.returncode == 0, done.stderr[-2000:]
    assert curves(b) == curves(a)


def test_run_header_identifies_the_code(straight):
    """env.json names the code that ran: git commit and dirtiness where git knows, and
    the sha256 of speedrun's sources, which holds even for a copied tree without git."""
    from speedrun.compile.cache import source_hash

    env = json.loads((straight / "env.json").read_text())
    assert env["source_sha256"] == source_hash() and len(env["source_sha256"]) == 64
    assert "git_commit" in env and env["git_dirty"] in (True, False, None)


def test_cold_start_is_split_into_phases(straight):
    """summary.json says where the cold start went; the phases add up to it."""
    summary = json.loads((straight / "summary.json").read_text())
    phases = summary["cold_start_phases_s"]
    expected = {"imports", "model", "compile_cache", "optimizers_data", "first_step", "restore", "start",
                "to_first_step"}
    # one warm-up step: no "warmup_steps"; the first validation is inside the cold start when it comes first
    assert expected <= set(phases) <= expected | {"first_validation", "dynamo_save"}
    assert all(v >= 0 for v in phases.values())
    assert sum(phases.values()) == pytest.approx(summary["cold_start_s"], abs=0.01)
