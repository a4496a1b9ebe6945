"""`speedrun data ...`: tokenise a corpus, download FineWeb, validate shards.

Only argument parsing lives here; the work is in corpus.py, fineweb.py and
shards.py so that it can be called and tested without a command line.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from speedrun.errors import DataError


def _int(text: str) -> int:
    """Integers as people write them: 100_000_000, 1e8, 65536."""
    try:
        value = float(text.replace("_", "").replace(",", ""))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not value.is_integer():
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number")
    return int(value)


def _err(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def cmd_tokenize(args) -> int:
    from speedrun.data.corpus import tokenize_files
    from speedrun.run.outpaths import check_folder

    check_folder(args.out, "--out")  # one line, before any text is read
    s = tokenize_files(args.inputs, args.out, prefix=args.prefix, val_tokens=args.val_tokens,
                       shard_tokens=args.shard_tokens, split_chars=args.split_chars,
                       workers=args.workers, force=args.force, progress=not args.quiet)
    mb = s["text_bytes"] / 1e6
    print(f"{s['documents']:,} documents, {mb:.1f} MB of text -> {s['val_tokens']:,} val + "
          f"{s['train_tokens']:,} train tokens in {len(s['files'])} shard(s) under {args.out}")
    print(f"{s['seconds']:.2f} s on {s['workers']} worker(s): {mb / max(s['seconds'], 1e-9):.2f} MB/s")
    return 0


def cmd_fineweb(args) -> int:
    from speedrun.data.fineweb import fetch_fineweb

    fetch_fineweb(args.variant, args.train_shards, args.dir, revision=args.revision, log=_err)
    return 0


def shard_files(paths: list[Path]) -> list[Path]:
    """The shards to check: each file as given, and every *.bin directly inside each folder given."""
    out = []
    for path in paths:
        if path.is_dir():
            found = sorted(path.glob("*.bin"))
            if not found:
                raise DataError(f"{path}: folder holds no shard files (*.bin)")
            out += found
        else:
            out.append(path)
    return out


def cmd_validate(args) -> int:
    from speedrun.data.shards import validate_shard

    bad = 0
    files = shard_files(args.paths)
    for path in files:
        try:
            n = validate_shard(path, args.vocab_size)
            print(f"{path}: ok, {n:,} tokens")
        except DataError as e:
            _err(f"speedrun: error: {e}")
            bad += 1
    if bad:
        raise DataError(f"{bad} of {len(files)} shard(s) failed validation")
    return 0


def _add_tokenize(sub) -> None:
    p = sub.add_parser("tokenize", help="tokenise .txt/.jsonl files into FineWeb-format shards",
                       description="Tokenise text with GPT-2 BPE into shards the trainer reads. A .txt file is "
                                   "one document unless a line holding only <|endoftext|> separates documents; "
                                   "a .jsonl line is one document (its 'text' field); .gz/.xz are read directly.")
    p.add_argument("inputs", nargs="+", help="files or folders (.txt, .jsonl, .json, optionally .gz/.xz)")
    p.add_argument("--out", type=Path, required=True, help="output folder")
    p.add_argument("--prefix", default="fineweb", help="shard name prefix (default: fineweb, what train looks for)")
    p.add_argument("--val-tokens", type=_int, default=10_485_760,
                   help="validation tokens the trainer will read; the val shard holds whole documents, at "
                        "least this + 1 tokens (default 10,485,760; 0 = no val shard)")
    p.add_argument("--shard-tokens", type=_int, default=100_000_000, help="tokens per train shard (default 1e8)")
    p.add_argument("--split-chars", type=_int, default=0,
                   help="cut documents longer than this at paragraph breaks (0 = keep whole; books: 8192)")
    p.add_argument("--workers", type=int, default=None, help="processes (default: all cores)")
    p.add_argument("--force", action="store_true", help="replace existing <prefix>_*.bin shards in --out")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=cmd_tokenize)


def _add_fineweb(sub) -> None:
    from speedrun.data.fineweb import DEFAULT_TRAIN_SHARDS, REPOS

    p = sub.add_parser("fineweb", help="download GPT-2-tokenised FineWeb shards from Hugging Face",
                       description="Fetch the val shard and train shards 1..N. Complete shards are skipped, "
                                   "truncated ones fetched again; honours HF_ENDPOINT and HF_HUB_OFFLINE.")
    p.add_argument("--variant", choices=list(REPOS), default="10B", help="which corpus (default 10B)")
    p.add_argument("--train-shards", type=_int, default=DEFAULT_TRAIN_SHARDS,
                   help=f"train shards of 100M tokens (default {DEFAULT_TRAIN_SHARDS}: enough for the record)")
    p.add_argument("--dir", type=Path, default=None, help="target folder (default: see `speedrun info`)")
    p.add_argument("--revision", default="main", help="repo revision (default main)")
    p.set_defaults(func=cmd_fineweb)


def _add_validate(sub) -> None:
    p = sub.add_parser("validate", help="check shards fully (header, size, every token id)",
                       description="Check each shard's header, size and that every id is below the vocabulary. "
                                   "A folder stands for every *.bin file directly inside it.")
    p.add_argument("paths", nargs="+", type=Path, metavar="PATH", help="shard files or folders of them")
    p.add_argument("--vocab-size", type=_int, default=50257, help="ids must be below this (default 50257)")
    p.set_defaults(func=cmd_validate)


def register(subparsers) -> None:
    parser = subparsers.add_parser("data", help="prepare training data (tokenize, fineweb, validate)",
                                   description="Prepare training data.")
    sub = parser.add_subparsers(dest="data_command", metavar="SUBCOMMAND")
    _add_tokenize(sub)
    _add_fineweb(sub)
    _add_validate(sub)
    parser.set_defaults(func=lambda args: parser.print_help() or 2)
