"""`speedrun export hf`: a finished run's model as a folder `transformers` loads with trust_remote_code.

One command for both model families: the run's config.json says which one it trained (the 2025-08
`GPT`, written by export_hf.py, or the 2026 record's `RecordGPT`, written by export_record_hf.py with
the final validation's windows, softmax scale and rotary frequencies, the function the run's last
val loss measured). The output folder is checked before the model loads, so a bad --out costs nothing.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from speedrun.config import RecordRunConfig
from speedrun.errors import ConfigError
from speedrun.run.checkpoint import load_model
from speedrun.run.outpaths import check_folder
from speedrun.tools import export_hf, export_record_hf
from speedrun.train.stages import final_evaluation


def export(ckpt: Path, out: Path, overwrite: bool = False) -> Path:
    """Write the Hugging Face folder for the model in run folder `ckpt`; returns `out`."""
    out = check_folder(out, "--out")
    if out.exists() and any(out.iterdir()) and not overwrite:
        raise ConfigError(f"--out {out}: folder exists and is not empty; pass --overwrite")
    model, cfg = load_model(Path(ckpt), "cpu")
    if isinstance(cfg, RecordRunConfig):
        ev = final_evaluation(cfg.stages, cfg.model.rope_pairs, cfg.model.rope_base)
        return export_record_hf.export(model, cfg.model, ev.windows, ev.attn_scale, ev.freqs, out,
                                       overwrite=True)
    return export_hf.export_gpt(model, cfg, out)


def register(subparsers) -> None:
    p = subparsers.add_parser("export", help="export a trained model (hf: a transformers folder)")
    sub = p.add_subparsers(dest="export_format", metavar="FORMAT", required=True)
    hf = sub.add_parser("hf", help="folder for AutoModelForCausalLM.from_pretrained(..., trust_remote_code=True)")
    hf.add_argument("--ckpt", required=True, help="model folder (a finished run)")
    hf.add_argument("--out", required=True, help="folder to write")
    hf.add_argument("--overwrite", action="store_true", help="write into a non-empty --out")
    hf.set_defaults(func=cli_export_hf)


def cli_export_hf(args: argparse.Namespace) -> int:
    out = export(Path(args.ckpt), Path(args.out), args.overwrite)
    files = sorted(p.name for p in out.iterdir())
    print(f"wrote {out}: {', '.join(files)}")
    print(f"load with: AutoModelForCausalLM.from_pretrained({str(out)!r}, trust_remote_code=True)")
    return 0
