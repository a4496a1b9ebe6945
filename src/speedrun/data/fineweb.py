"""Download the public GPT-2-tokenised FineWeb shards.

The shards are plain files in Hugging Face dataset repos, fetched one by one
with `huggingface_hub.hf_hub_download` into a flat folder (`local_dir`), so
the trainer's patterns find them with no symlinks into the HF cache.

Resuming works per shard: before touching the network, each file already in
the folder gets the cheap shard check (header + exact size, see `shards.py`).
A complete one is skipped; a truncated or corrupt one is deleted and fetched
again with `force_download=True` (the client's own metadata would otherwise
call a truncated file up to date). Files arrive through the client's temp
file + rename, so an interrupted download never leaves a plausible shard.

The endpoint and offline mode are read from the environment at call time
(`HF_ENDPOINT`, `HF_HUB_OFFLINE`); huggingface_hub reads them at import,
which is too early for tests and for users who set them in the same shell
session as a Python process that already imported it. Every failure becomes
one `DataError` line: which file, why, and the command that retries. A
connection that cannot be made (no network, a name that does not resolve)
says so in those words, not as the client's wrapper exception.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path

from speedrun.errors import DataError
from speedrun.run.outpaths import check_folder
from speedrun.data.paths import VARIANTS, default_fineweb_dir
from speedrun.data.shards import read_header

REPOS = {
    "10B": ("kjj0/fineweb10B-gpt2", "fineweb"),
    "100B": ("kjj0/fineweb100B-gpt2", "fineweb"),
    "edu10B": ("kjj0/finewebedu10B-gpt2", "finewebedu"),
}
DEFAULT_ENDPOINT = "https://huggingface.co"
DEFAULT_TRAIN_SHARDS = 8  # 800M tokens: the record's 1695 x 393,216 = 667M, with margin


def shard_names(variant: str, train_shards: int) -> list[str]:
    """Val shard first, then train shards 000001..N (the repos number train from 1)."""
    if variant not in REPOS:
        raise DataError(f"unknown FineWeb variant {variant!r}; choose one of {', '.join(VARIANTS)}")
    if train_shards < 0:
        raise DataError(f"--train-shards must be >= 0, got {train_shards}")
    prefix = REPOS[variant][1]
    return [f"{prefix}_val_000000.bin"] + [f"{prefix}_train_{i:06d}.bin" for i in range(1, train_shards + 1)]


def endpoint() -> str:
    return (os.environ.get("HF_ENDPOINT") or DEFAULT_ENDPOINT).rstrip("/")


def offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").strip().upper() in ("1", "ON", "YES", "TRUE")


def is_complete(path: Path) -> bool:
    """Header valid and size exact (ids are not scanned: the download is the publisher's data)."""
    try:
        read_header(path)
        return True
    except DataError:
        return False


def _why(e: Exception) -> str:
    status = getattr(getattr(e, "response", None), "status_code", None)
    first = (str(e).strip().splitlines() or [""])[0][:200]
    return f"HTTP {status}: {first}" if status else f"{type(e).__name__}: {first}"


# A connection that was never made: httpx's (huggingface_hub's client) ConnectError and ConnectTimeout, or
# the socket errors they wrap. A timeout or reset after connecting is another failure, reported as such.
_CONNECT_ERRORS = ("ConnectError", "ConnectTimeout")


def no_connection(e: BaseException) -> str | None:
    """The innermost reason, e.g. "Name or service not known", when `e` or an exception it was raised
    from is a connection that could not be made; None for any other failure (an HTTP error, a full disk).

    huggingface_hub raises its own exception from the client's ("Force download failed due to the
    above error."), so the whole chain is searched."""
    chain = []
    while e is not None and e not in chain:
        chain.append(e)
        e = e.__cause__ or e.__context__
    if not any(isinstance(x, (ConnectionRefusedError, socket.gaierror))
               or any(c.__name__ in _CONNECT_ERRORS for c in type(x).__mro__) for x in chain):
        return None
    inner = chain[-1]
    return getattr(inner, "strerror", None) or str(inner) or type(inner).__name__


def _download(repo: str, name: str, folder: Path, revision: str) -> None:
    from huggingface_hub import hf_hub_download  # imported late: `speedrun --help` stays fast

    hf_hub_download(repo, name, repo_type="dataset", revision=revision, local_dir=folder,
                    endpoint=endpoint(), force_download=True)


def fetch_fineweb(variant: str = "10B", train_shards: int = DEFAULT_TRAIN_SHARDS,
                  folder: str | os.PathLike | None = None, revision: str = "main",
                  log=print) -> list[Path]:
    """Make `folder` hold the val shard and train shards 1..N, complete; returns their paths."""
    names = shard_names(variant, train_shards)
    repo = REPOS[variant][0]
    option = "--dir" if folder else "FineWeb folder"
    folder = Path(folder).expanduser() if folder else default_fineweb_dir(variant)
    check_folder(folder, option)
    folder.mkdir(parents=True, exist_ok=True)
    retry = f"speedrun data fineweb --variant {variant} --train-shards {train_shards} --dir {folder}"
    paths = []
    for i, name in enumerate(names, 1):
        path = folder / name
        paths.append(path)
        if is_complete(path):
            log(f"[{i}/{len(names)}] {name}: complete, skipped")
            continue
        if offline():
            raise DataError(f"{path}: missing or incomplete and HF_HUB_OFFLINE is set; "
                            f"unset it and retry: {retry}")
        state = "incomplete, fetching again" if path.exists() else "downloading"
        log(f"[{i}/{len(names)}] {name}: {state} from {endpoint()}/datasets/{repo}")
        path.unlink(missing_ok=True)
        try:
            _download(repo, name, folder, revision)
        except Exception as e:  # any client/network failure: one line, with the retry command
            reason = no_connection(e)
            if reason:
                raise DataError(f"{name}: no network: cannot reach {endpoint()} ({reason}); fetch the shards on a "
                                f"machine with network and copy them to {folder}, or set HF_ENDPOINT to a mirror "
                                f"this machine reaches; then: {retry}") from None
            raise DataError(f"{name}: download from {endpoint()}/datasets/{repo} failed ({_why(e)}); "
                            f"retry with: {retry}") from None
        try:
            read_header(path)
        except DataError as e:
            raise DataError(f"{e}; retry with: {retry}") from None
    log(f"{len(names)} shard(s) ready in {folder}")
    return paths

