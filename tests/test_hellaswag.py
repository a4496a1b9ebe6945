"""HellaSwag scoring: the scorer's losses equal a direct `model.logits` computation,
and accuracy counts exactly the items whose label is the lowest-loss ending."""

import json

import pytest
import torch
import torch.nn.functional as F

from speedrun.tools import hellaswag
from speedrun.run.checkpoint import save_model_files
from speedrun.cli.main import main
from model_helpers import random_tiny_model as tiny_model
from speedrun.data.tokenizer import EOT, encode

CTXS = [
    ("Baking cookies", "A woman puts a tray into the oven.", "She"),
    ("Washing a car", "A man sprays soap onto a red car.", "He"),
    ("Playing guitar", "A boy sits on a chair holding a guitar.", "The boy"),
    ("Mowing the lawn", "A man pushes a mower across the yard.", "He"),
    ("Swimming", "Several kids jump into a pool.", "They"),
]
ENDINGS = ["waits for the timer and then takes them out.", "eats the oven door slowly.",
           "begins to strum a few chords.", "folds the sky into a small box."]


def real_format_items(labels):
    """Items with every field of the public hellaswag_val.jsonl."""
    out = []
    for i, ((activity, ctx_a, ctx_b), label) in enumerate(zip(CTXS, labels)):
        out.append({"ind": 1000 + i, "activity_label": activity, "ctx_a": ctx_a, "ctx_b": ctx_b,
                    "ctx": f"{ctx_a} {ctx_b}", "split": "val", "split_type": "indomain",
                    "endings": ENDINGS[i % 4:] + ENDINGS[: i % 4], "source_id": f"activitynet~v_{i}",
                    "label": label})
    return out


def direct_losses(model, ctx, ending):
    """Independent computation: one unpadded-length row, logits -> cross-entropy by hand."""
    c, e = [EOT, *encode(ctx)], encode(" " + ending)
    seq = torch.tensor(c + e + [0] * ((-(len(c) + len(e))) % 128))
    with torch.no_grad():
        logp = F.log_softmax(model.logits(seq, torch.tensor(2)), dim=-1)
    return torch.stack([-logp[len(c) - 1 + j, tok] for j, tok in enumerate(e)])


def write_jsonl(path, items):
    path.write_text("".join(json.dumps(it) + "\n" for it in items))
    return path


def test_scores_equal_direct_computation():
    model, _ = tiny_model()
    item = real_format_items([0])[0]
    s = hellaswag.score_item(model, item, window=2)
    for k, ending in enumerate(item["endings"]):
        d = direct_losses(model, item["ctx"], ending)
        assert s["sum"][k] == pytest.approx(float(d.sum()), rel=1e-5)
        assert s["mean"][k] == pytest.approx(float(d.mean()), rel=1e-5)
    assert len(set(s["sum"])) == 4


def test_accuracy_counts_lowest_loss_endings(tmp_path):
    model, _ = tiny_model()
    items = real_format_items([0] * 5)
    direct = [[direct_losses(model, it["ctx"], e) for e in it["endings"]] for it in items]
    best = [min(range(4), key=lambda k: float(d[k].sum())) for d in direct]
    best_norm = [min(range(4), key=lambda k: float(d[k].mean())) for d in direct]
    labels = [b if i < 3 else (b + 1) % 4 for i, b in enumerate(best)]  # 3 of 5 right by summed loss
    for it, label in zip(items, labels):
        it["label"] = label
    loaded = hellaswag.load_items(write_jsonl(tmp_path / "val.jsonl", items))
    r = hellaswag.evaluate(model, loaded, window=2)
    assert r["items"] == 5 and r["acc"] == pytest.approx(3 / 5)
    assert r["acc_norm"] == pytest.approx(sum(b == l for b, l in zip(best_norm, labels)) / 5)


def test_command_with_local_file_and_limit(tmp_path, capsys):
    model, cfg = tiny_model()
    save_model_files(model, cfg, tmp_path / "m")
    path = write_jsonl(tmp_path / "val.jsonl", real_format_items([0, 1, 2, 3, 0]))
    assert main(["eval", "hellaswag", "--ckpt", str(tmp_path / "m"), "--file", str(path), "--limit", "2",
                 "--device", "cpu", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["items"] == 2 and 0 <= out["acc"] <= 1


def test_offline_without_file_is_one_line_error(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("SPEEDRUN_HOME", str(tmp_path / "home"))
    monkeypatch.setattr(hellaswag, "URL", "http://127.0.0.1:9/hellaswag_val.jsonl")
    assert main(["eval", "hellaswag", "--ckpt", str(tmp_path / "m")]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "--file" in err
    assert not (tmp_path / "home" / "hellaswag" / "hellaswag_val.jsonl").exists()


def test_bad_file_is_one_line_error(tmp_path, capsys):
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps(real_format_items([0])[0]) + "\n{\"ctx\": \"x\"}\n")
    assert main(["eval", "hellaswag", "--ckpt", str(tmp_path), "--file", str(bad)]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "bad.jsonl:2" in err
