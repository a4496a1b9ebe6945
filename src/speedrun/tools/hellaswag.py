"""`speedrun eval hellaswag`: the standard zero-shot HellaSwag accuracy.

Scoring is the usual one for small base models (as in Karpathy's
build-nanogpt): for each of the 4 endings, the model reads the context then
" " + ending, and the ending's tokens are scored by cross-entropy given
everything before them. `acc` picks the ending with the lowest summed loss,
`acc_norm` the lowest mean loss per token (length-normalised). Each sequence
starts with EOT, as every training document does, and is scored by its own
forward pass (`GPT.logits` on one row padded to a block; for the 2026 record's
`RecordGPT`, its key-value decoder over the whole row at the final validation's
windows, scale and rotary frequencies), so the number depends only on the model,
not on how items are batched.

The data is the public validation split (10,042 items): fetched once, with a
timeout, into the cache (speedrun.data.paths.cache_root()), or read from `--file`
on an offline machine.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from speedrun.config import RecordRunConfig
from speedrun.errors import ConfigError, DataError
from speedrun.run.checkpoint import load_model
from speedrun.tools.record_decode import RecordDecoder
from speedrun.tools.sample import final_window, resolve_device
from speedrun.train.stages import FinalEvaluation, final_evaluation

URL = "https://raw.githubusercontent.com/rowanz/hellaswag/master/data/hellaswag_val.jsonl"
NUM_VAL_ITEMS = 10042


def cached_file() -> Path:
    from speedrun.data.paths import cache_root

    return cache_root() / "hellaswag" / "hellaswag_val.jsonl"


def download(dest: Path, timeout: float = 60.0) -> Path:
    """Fetch the validation jsonl once (temp file, then rename)."""
    import urllib.error
    import urllib.request

    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_name(f".{dest.name}.{os.getpid()}.tmp")
    try:
        with urllib.request.urlopen(URL, timeout=timeout) as r, open(tmp, "wb") as f:
            f.write(r.read())
        os.replace(tmp, dest)
    except (urllib.error.URLError, OSError) as e:
        reason = getattr(e, "reason", e)
        raise DataError(f"could not download HellaSwag from {URL} ({reason}); "
                        f"offline, pass --file PATH to a local hellaswag_val.jsonl") from None
    finally:
        tmp.unlink(missing_ok=True)
    return dest


def load_items(path: Path, limit: int | None = None) -> list[dict]:
    """Items of a HellaSwag jsonl: each with ctx, 4 endings and an int label."""
    path = Path(path)
    if not path.is_file():
        raise DataError(f"--file {path}: not found")
    items = []
    with open(path) as f:
        for i, line in enumerate(f, 1):
            if limit is not None and len(items) >= limit:
                break
            if not line.strip():
                continue
            try:
                d = json.loads(line)
                item = {"ctx": str(d["ctx"]), "endings": [str(e) for e in d["endings"]], "label": int(d["label"])}
            except (json.JSONDecodeError, KeyError, TypeError, ValueError) as e:
                raise DataError(f"{path}:{i}: not a HellaSwag item ({type(e).__name__}: {e})") from None
            if len(item["endings"]) != 4 or not 0 <= item["label"] < 4:
                raise DataError(f"{path}:{i}: needs 4 endings and a label in 0..3")
            items.append(item)
    if not items:
        raise DataError(f"{path}: no items")
    return items


def ending_losses(model, ctx: str, ending: str, window: int, dtype=torch.float32,
                  evaluation: FinalEvaluation | None = None) -> torch.Tensor:
    """Cross-entropy (nats) of each token of " " + ending, given EOT + ctx. `evaluation` set: a
    `RecordGPT` read through its decoder with those windows, scale and frequencies (`window` unused)."""
    from speedrun.data.tokenizer import EOT, encode

    ctx_ids, end_ids = [EOT, *encode(ctx)], encode(" " + ending)
    seq = ctx_ids + end_ids
    n = len(seq)
    if evaluation is not None:
        device = model.embed.device
        decoder = RecordDecoder(model, evaluation.windows, evaluation.attn_scale, evaluation.freqs, dtype)
        logits = decoder.extend(torch.tensor(seq, device=device))
    else:
        block = model.attn_cfg.block_size
        device = model.embed.weight.device
        row = torch.tensor(seq + [0] * ((-n) % block), device=device)
        logits = model.logits(row, torch.tensor(window, device=device), dtype)
    pred = logits[len(ctx_ids) - 1: n - 1].float()
    return F.cross_entropy(pred, torch.tensor(end_ids, device=device), reduction="none")


@torch.no_grad()
def score_item(model, item: dict, window: int, dtype=torch.float32, evaluation: FinalEvaluation | None = None) -> dict:
    """Summed and mean ending losses, and the two predictions."""
    losses = [ending_losses(model, item["ctx"], e, window, dtype, evaluation) for e in item["endings"]]
    sums = [float(l.sum()) for l in losses]
    means = [float(l.mean()) for l in losses]
    return {"sum": sums, "mean": means, "pred": min(range(4), key=sums.__getitem__),
            "pred_norm": min(range(4), key=means.__getitem__)}


def evaluate(model, items: list[dict], window: int | None = None, dtype=torch.float32, progress: bool = False,
             evaluation: FinalEvaluation | None = None) -> dict:
    from tqdm import tqdm

    w = 0 if evaluation is not None else final_window(model) if window is None else window
    correct = correct_norm = 0
    for item in tqdm(items, disable=not progress, unit="item"):
        s = score_item(model, item, w, dtype, evaluation)
        correct += s["pred"] == item["label"]
        correct_norm += s["pred_norm"] == item["label"]
    n = len(items)
    return {"items": n, "acc": correct / n, "acc_norm": correct_norm / n}


def register(subparsers) -> None:
    p = subparsers.add_parser("eval", help="evaluate a trained model (hellaswag)")
    sub = p.add_subparsers(dest="eval_task", metavar="TASK", required=True)
    h = sub.add_parser("hellaswag", help="HellaSwag validation accuracy (10,042 items)")
    h.add_argument("--ckpt", required=True, help="model folder (a finished run)")
    h.add_argument("--file", help="local hellaswag_val.jsonl (default: download once into the cache)")
    h.add_argument("--limit", type=int, help="only the first N items")
    h.add_argument("--device", default="auto", help="cpu, cuda, cuda:N or auto (default)")
    h.add_argument("--json", action="store_true", help="print JSON")
    h.set_defaults(func=cli_hellaswag)


def cli_hellaswag(args: argparse.Namespace) -> int:
    if args.limit is not None and args.limit < 1:
        raise ConfigError(f"--limit: must be >= 1, got {args.limit}")
    path = Path(args.file) if args.file else cached_file()
    if not args.file and not path.exists():
        download(path)
    items = load_items(path, args.limit)
    model, cfg = load_model(Path(args.ckpt), resolve_device(args.device))
    ev = (final_evaluation(cfg.stages, cfg.model.rope_pairs, cfg.model.rope_base)
          if isinstance(cfg, RecordRunConfig) else None)
    t0 = time.perf_counter()
    r = evaluate(model, items, progress=not args.json, evaluation=ev)
    r.update(seconds=round(time.perf_counter() - t0, 1), source=str(path), ckpt=str(args.ckpt))
    if args.json:
        print(json.dumps(r, indent=2))
    else:
        print(f"| model | items | acc | acc_norm |\n|---|---|---|---|\n"
              f"| {args.ckpt} | {r['items']} | {r['acc']:.4f} | {r['acc_norm']:.4f} |")
    return 0
