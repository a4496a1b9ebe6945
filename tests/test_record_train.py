"""The 2026 record's training run end to end on the CPU: presets, the command line, the loop, resume.

A tiny `demo` (vocabulary 128, BOS 127, 12 steps = 11 scheduled + 1 extension, so every stage, the
split step and the extension are crossed; 512-768 tokens a step in two micro-batches) on random
documents written here. Stopping and resuming must give the same run as never stopping, bit for bit
in float32 and in bfloat16 with the FP8 head and MLP (their delayed scales saved); a checkpoint at an
even step carries Adam's pending gradient sums into the odd step that applies them. A 2-process gloo
run equals the 1-process run up to float32 summation order: the same global batch in half the
micro-steps a rank.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from reliability_helpers import curves, events, main, resume, torchrun
from speedrun.cli.main import main as cli
from speedrun.config import RecordRunConfig, apply_overrides, diff, from_dict, validate
from speedrun.data.shards import write_shard
from speedrun.errors import ConfigError
from speedrun.recipes.registry import get_preset, parameter_count
from speedrun.train import stages

BOS = 127


def write_documents(folder, seed: int = 0) -> None:
    """A train shard of documents (20-300 tokens, ids < 127, each after BOS) and a val shard: each
    document counts from a random start in steps of 1, 2 or 3, which a model learns in a few steps."""
    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True, exist_ok=True)

    def doc() -> np.ndarray:
        n, start, stride = rng.integers(20, 300), rng.integers(0, BOS), rng.integers(1, 4)
        return np.r_[BOS, (start + stride * np.arange(n)) % BOS]

    for name, count in (("train", 400), ("val", 40)):
        docs = [doc() for _ in range(count)]
        write_shard(folder / f"docs_{name}_000000.bin", np.concatenate(docs).astype(np.uint16))


def tiny(data) -> list[str]:
    """Command-line flags of the tiny record run on `data` (see the module docstring)."""
    sets = {
        "model.vocab": 128, "model.sign_rows": 64, "model.mlp_hidden": 192,
        "docs.bos": BOS, "docs.sets_per_step": 2, "docs.val_tokens": 1024, "docs.val_chunk": 256,
        "docs.val_max_docs": 64, "stages.piece_sets_per_step": 2,
        "stages.tokens_per_step": "512,512,768,768", "stages.max_doc_len": "128,256,256,256",
        "stages.block_tokens": 16, "stages.val_every": 4,
        "stages.momentum_warmup_steps": 4, "stages.momentum_cooldown_steps": 2,
        "data.train_pattern": "docs_train_*.bin", "data.val_pattern": "docs_val_*.bin",
        "train.sample_tokens": 0, "train.dtype": "float32", "train.health_every": 2,
    }
    return ["--preset", "demo", "--steps", "12", "--data-dir", str(data), "--no-progress",
            *[a for k, v in sets.items() for a in ("--set", f"{k}={v}")]]


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    folder = tmp_path_factory.mktemp("docs")
    write_documents(folder)
    return folder


@pytest.fixture(scope="module")
def straight(tmp_path_factory, data):
    run = tmp_path_factory.mktemp("straight") / "run"
    assert main(["train", "--out", str(run), "--checkpoint-every", "3", *tiny(data)]) == 0
    return run


# ------------------------------------------------------------------ presets and configuration


def test_record_presets_and_their_schedules():
    rec, p161, p322 = get_preset("record"), get_preset("proxy161"), get_preset("proxy322")
    assert (rec.stages.scheduled_steps, rec.stages.extension_steps) == (1270, 15)
    assert (p161.stages.scheduled_steps, p161.stages.extension_steps) == (159, 2)
    assert (p322.stages.scheduled_steps, p322.stages.extension_steps) == (318, 4)
    for cfg, every in ((p161, 40), (p322, 80)):
        assert cfg.docs.val_tokens == 2_097_152 and cfg.stages.val_every == every
        assert stages.validates(cfg.stages, every) and stages.validates(cfg.stages, cfg.stages.total_steps)
    assert diff(rec, p161).keys() >= {"stages.scheduled_steps", "stages.extension_steps"}


def test_info_prints_the_specs_parameter_counts(capsys):
    assert cli(["info", "--preset", "record"]) == 0
    out = capsys.readouterr().out
    assert "parameters: 640,605,607" in out and "643,751,335 on 8" in out
    assert parameter_count(get_preset("record"), 8) == 643_751_335


def test_steps_flag_scales_the_record_as_the_spec_says(tmp_path):
    from speedrun.cli.train import register, resolve_config
    import argparse

    parser = argparse.ArgumentParser()
    register(parser.add_subparsers())
    for n, split in ((161, (159, 2)), (322, (318, 4)), (1285, (1270, 15)), (4, (3, 1))):
        cfg = resolve_config(parser.parse_args(["train", "--preset", "record", "--steps", str(n)]))
        assert (cfg.stages.scheduled_steps, cfg.stages.extension_steps) == split
    with pytest.raises(ConfigError, match="--steps 3: the 2026 record needs at least 4 steps"):
        resolve_config(parser.parse_args(["train", "--preset", "record", "--steps", "3"]))


def test_record_config_round_trips_and_sets_a_frozen_section_together():
    cfg = apply_overrides(get_preset("proxy161"), ["model.model_dim=384", "model.head_dim=64", "docs.max_docs_mult=2"])
    assert (cfg.model.model_dim, cfg.model.head_dim, cfg.docs.max_docs_mult) == (384, 64, 2)
    back = from_dict(json.loads(json.dumps(cfg.to_dict())))
    assert isinstance(back, RecordRunConfig) and back == cfg
    with pytest.raises(ConfigError, match=r"--set model.model_dim: .*heads × head_dim must equal the width"):
        apply_overrides(get_preset("record"), ["model.model_dim=384"])
    with pytest.raises(ConfigError, match="did you mean 'stages.val_every'"):
        apply_overrides(get_preset("record"), ["stages.val_evry=3"])


@pytest.mark.parametrize("override, message", [
    ("stages.tokens_per_step=1001,2000,3000,3000", "stages.tokens_per_step: each must be a positive multiple of"),
    ("stages.piece_sets_per_step=4", "stages.piece_sets_per_step: must equal docs.sets_per_step=8"),
    ("docs.max_docs_mult=0", "docs.max_docs_mult"),
    ("train.warmup=sometimes", "train.warmup"),
    ("train.compile=sometimes", "train.compile"),
])
def test_bad_record_settings_are_one_line(override, message):
    with pytest.raises(ConfigError, match=message):
        validate(apply_overrides(get_preset("record"), [override]))


def test_a_world_size_the_record_cannot_split_is_refused():
    with pytest.raises(ConfigError, match="world size 3: preset 'record' runs 8 piece sets a step"):
        validate(get_preset("record"), world_size=3)


# ------------------------------------------------------------------ the run


def test_the_run_learns_and_writes_its_curves(straight):
    train_l, val_l = curves(straight)
    assert sorted(val_l) == [0, 4, 8, 12] and sorted(train_l) == list(range(1, 13))
    assert val_l[12] < val_l[0] - 1.0  # 4.85 (uniform over 127 ids) to ~3.0
    summary = json.loads((straight / "summary.json").read_text())
    assert summary["final_val_loss"] == val_l[12] and summary["steps"] == 12
    assert json.loads((straight / "config.json").read_text())["stages"]["scheduled_steps"] == 11


def test_a_run_with_every_technique_switch_off_trains(tmp_path, data):
    """The switches leave parameters without gradients (the smear gate, the skip's λ): the optimisers
    skip them, and they end where they started."""
    from safetensors.torch import load_file

    run = tmp_path / "run"
    off = [a for name in ("smear", "bigram", "x0_inject", "skip", "dc", "mudd") for a in ("--set", f"model.{name}=false")]
    assert main(["train", "--out", str(run), *tiny(data), *off]) == 0
    _, val_l = curves(run)
    assert val_l[12] < val_l[0] - 1.0
    from speedrun.run.checkpoint import load_config
    from speedrun.train.record_micro import build_record_model

    start = build_record_model(load_config(run), 1, torch.device("cpu"))
    assert torch.equal(load_file(run / "model.safetensors")["smear_gate"], start.smear_gate.detach())


def test_sigterm_at_an_even_step_then_resume_is_exact(straight, tmp_path, data):
    """Step 6 is even (Adam's sums pending) and past the split step; the run crosses stage 3 after."""
    run = tmp_path / "run"
    assert main(["train", "--out", str(run), "--checkpoint-every", "3", *tiny(data),
                 "--set", "train.inject_fault=sigterm@6"]) == 143
    assert resume(run) == 0
    assert events(run, "resume")[0]["step"] % 2 == 1  # the checkpoint holds a pending even step
    assert curves(run) == curves(straight)


def test_resume_across_a_stage_transition_is_exact(straight, tmp_path, data):
    run = tmp_path / "run"
    ends = stages.stage_ends(stages.scaled(12, get_preset("demo").stages))
    assert main(["train", "--out", str(run), "--checkpoint-every", "3", *tiny(data),
                 "--set", f"train.inject_fault=sigterm@{ends[1] - 1}"]) == 143
    assert resume(run) == 0
    assert curves(run) == curves(straight)


def test_bf16_with_fp8_resumes_exactly(tmp_path, data):
    bf16 = ["--set", "train.dtype=bfloat16", "--set", "fp8.mlp=true", "--checkpoint-every", "3"]
    a, b = tmp_path / "a", tmp_path / "b"
    assert main(["train", "--out", str(a), *tiny(data), *bf16]) == 0
    summary = json.loads((a / "summary.json").read_text())
    assert summary["fp8_head"] and summary["fp8_mlp"] and summary["dtype"] == "bfloat16"
    assert main(["train", "--out", str(b), *tiny(data), *bf16, "--set", "train.inject_fault=sigterm@7"]) == 143
    assert resume(b) == 0
    assert curves(a) == curves(b)


def test_warm_up_then_restore_changes_nothing(straight, tmp_path, data):
    run = tmp_path / "run"
    assert main(["train", "--out", str(run), "--checkpoint-every", "3", *tiny(data), "--set", "train.warmup=on"]) == 0
    assert curves(run) == curves(straight)


def test_two_gloo_ranks_equal_one(straight, tmp_path, data):
    """The same global batch over two ranks: the first two steps bit for bit; then gradients summed
    across ranks rather than across micro-steps round in another order by an ulp (step 3), which the
    bfloat16 banks grow to ~1e-4 of the loss by step 7 (measured 2026-12-05)."""
    run = tmp_path / "run"
    proc = torchrun(2, "--out", str(run), "--checkpoint-every", "3", *tiny(data))
    assert proc.returncode == 0, proc.stderr[-2000:]
    (one_train, one_val), (two_train, two_val) = curves(straight), curves(run)
    assert two_train.keys() == one_train.keys() and two_val.keys() == one_val.keys()
    assert [two_train[k] for k in (1, 2)] == [one_train[k] for k in (1, 2)]
    for k in one_train:
        assert two_train[k] == pytest.approx(one_train[k], rel=1e-3), k
    for k in one_val:
        assert two_val[k] == pytest.approx(one_val[k], rel=1e-3), k


# ------------------------------------------------------------------ the tools on a record run


def test_export_and_the_decoder_take_a_record_run(straight, tmp_path, capsys):
    from safetensors.torch import load_file

    from speedrun.run.checkpoint import load_model
    from speedrun.tools.export import export
    from speedrun.tools.record_decode import RecordDecoder

    model, cfg = load_model(straight, "cpu")
    assert isinstance(cfg, RecordRunConfig) and model.cfg.vocab == 128
    ev = stages.final_evaluation(cfg.stages, cfg.model.rope_pairs, cfg.model.rope_base)
    assert ev.windows == (6 * 16, 20 * 16)
    out = export(straight, tmp_path / "hf")
    state = load_file(out / "model.safetensors")
    assert torch.equal(state["qk_bank"], model.qk_bank.detach()[: model.cfg.qk_matrices])
    assert json.loads((out / "config.json").read_text())["attn_scale"] == pytest.approx(ev.attn_scale)
    tokens = torch.tensor([BOS, 5, 17, 99, 3])
    whole = RecordDecoder(model, ev.windows, ev.attn_scale, ev.freqs, torch.float32).extend(tokens)
    dec = RecordDecoder(model, ev.windows, ev.attn_scale, ev.freqs, torch.float32)
    steps = torch.stack([dec.prefill(tokens[:2]), *[dec.step(t) for t in tokens[2:]]])
    assert torch.allclose(whole[1:], steps, atol=1e-5)
    assert cli(["stats", str(straight), str(straight), "--target", "10"]) == 0
    assert "| n | 2 |" in capsys.readouterr().out


def test_hellaswag_scores_a_record_model_by_its_decoder(straight, monkeypatch):
    """Endings scored as the decoder's cross-entropy over EOT + context + ending (the tokenizer mapped
    into the tiny vocabulary)."""
    from speedrun.data import tokenizer
    from speedrun.run.checkpoint import load_model
    from speedrun.tools import hellaswag
    from speedrun.tools.record_decode import RecordDecoder

    monkeypatch.setattr(tokenizer, "encode", lambda text: [ord(c) % 120 for c in text])
    monkeypatch.setattr(tokenizer, "EOT", BOS)
    model, cfg = load_model(straight, "cpu")
    ev = stages.final_evaluation(cfg.stages, cfg.model.rope_pairs, cfg.model.rope_base)
    item = {"ctx": "the cat sat", "endings": ["on the mat", "in a hat", "zq", "and then it rained"], "label": 0}
    s = hellaswag.score_item(model, item, 0, evaluation=ev)
    for k, ending in enumerate(item["endings"]):
        ctx, end = [BOS, *tokenizer.encode(item["ctx"])], tokenizer.encode(" " + ending)
        logits = RecordDecoder(model, ev.windows, ev.attn_scale, ev.freqs, torch.float32).extend(
            torch.tensor(ctx + end))
        direct = torch.nn.functional.cross_entropy(logits[len(ctx) - 1:-1], torch.tensor(end), reduction="sum")
        assert s["sum"][k] == pytest.approx(float(direct), rel=1e-6)


def test_joined_piece_sets_train_as_the_separate_ones(straight, tmp_path, data):
    """`train.merge_tokens=512` joins the first two stages' two 256-token sets into one micro-step (the
    last two stages' 384-token sets stay apart): the same losses, up to the bfloat16 gradients being
    rounded once for both sets rather than once each."""
    run = tmp_path / "run"
    assert main(["train", "--out", str(run), "--checkpoint-every", "3", *tiny(data),
                 "--set", "train.merge_tokens=512"]) == 0
    (train_a, val_a), (train_b, val_b) = curves(straight), curves(run)
    assert train_a.keys() == train_b.keys() and val_a.keys() == val_b.keys()
    assert train_b[1] == pytest.approx(train_a[1], rel=1e-6)  # the first step's loss: no update yet
    for s in train_a:  # 2.2e-4 at most when written (losses of 3 to 5)
        assert train_b[s] == pytest.approx(train_a[s], rel=1e-3), s
    for s in val_a:
        assert val_b[s] == pytest.approx(val_a[s], rel=1e-3), s
