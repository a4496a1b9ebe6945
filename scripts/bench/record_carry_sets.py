"""Make the proxy subsets that one device call can carry for the 2026 record's runs.

The tree and the whole proxy corpus (58.6 MiB of xz) pass the 64 MiB a call carries. `proxy161` reads
42.5M tokens: `.proxy161` holds training shards 1-3, shard 4 cut at the first document start after
6,000,000 tokens, and the val shard (53.8 MB). `proxy322` reads 84.9M tokens (1.6 passes over all four
shards): `.proxy322` holds the four training shards and the val shard cut after 2,100,000 tokens, of
which a run reads 2,097,153 (60.9 MB). Both folders are git-ignored; name them in the call's `carry`.

usage: python scripts/bench/record_carry_sets.py [PROXY_DIR]     (default ../shared/proxy)
"""

from __future__ import annotations

import lzma
import shutil
import sys
from pathlib import Path

import numpy as np

from speedrun.data.shards import read_shard, write_shard

BOS = 50256


def cut_shard(src: Path, dst: Path, tokens: int, at_document: bool) -> None:
    """dst.xz: src's first `tokens` tokens (up to the next document start when `at_document`)."""
    raw = dst.with_suffix("")
    with lzma.open(src) as f, open(raw, "wb") as out:
        shutil.copyfileobj(f, out)
    t = read_shard(raw)
    end = int(np.flatnonzero(t[tokens:] == BOS)[0]) + tokens if at_document else tokens
    write_shard(raw, np.asarray(t[:end]))
    with open(raw, "rb") as f, lzma.open(dst, "wb", preset=9 | lzma.PRESET_EXTREME) as out:
        shutil.copyfileobj(f, out)
    raw.unlink()


def main(proxy: Path) -> None:
    for name in ("proxy161", "proxy322"):
        (Path("." + name)).mkdir(exist_ok=True)
    for i in (1, 2, 3):
        shutil.copyfile(proxy / f"fineweb_train_00000{i}.bin.xz", f".proxy161/fineweb_train_00000{i}.bin.xz")
    cut_shard(proxy / "fineweb_train_000004.bin.xz", Path(".proxy161/fineweb_train_000004.bin.xz"), 6_000_000, True)
    shutil.copyfile(proxy / "fineweb_val_000000.bin.xz", ".proxy161/fineweb_val_000000.bin.xz")
    for i in (1, 2, 3, 4):
        shutil.copyfile(proxy / f"fineweb_train_00000{i}.bin.xz", f".proxy322/fineweb_train_00000{i}.bin.xz")
    cut_shard(proxy / "fineweb_val_000000.bin.xz", Path(".proxy322/fineweb_val_000000.bin.xz"), 2_100_000, False)


if __name__ == "__main__":
    main(Path(sys.argv[1] if len(sys.argv) > 1 else "../shared/proxy"))
