"""Make the proxy subsets that one device call can carry for the 2026 record's runs.

The tree (6.2 MB on 2026-12-07) and the whole proxy corpus (58.6 MiB of xz) pass the 64 MiB a call carries.
`proxy161` trains on 42.5M tokens, but the record's loader drops the rest of every document past the
stage's cut length (896 tokens in stage 0, 2,048 after), so it runs through all four shards (52M
tokens) and wraps at step 154. `.proxy161` therefore holds all four training shards with every token
that no `proxy161` step reads set to 0 (document starts kept, so the loader's walk is unchanged) and
the whole val shard; `main` replays the run's loader on the result and checks that every batch is
the original's. `proxy322` reads 84.9M tokens (1.6 passes over all four shards; the loader wraps at
step 198): `.proxy322` holds the four training shards alone (58.4 MB), since with the val shard the
tree passed the 64 MiB by 2026-12-07; `record_runs.sh 322` takes the val shard from the `.proxy161`
that an earlier call of the same lease left on the machine. Both folders are git-ignored; name them
in the call's `carry`.

usage: python scripts/bench/record_carry_sets.py [PROXY_DIR]     (default ../shared/proxy)
"""

from __future__ import annotations

import lzma
import shutil
import sys
import tempfile
import warnings
from pathlib import Path

import numpy as np

from speedrun.data import documents
from speedrun.data.shards import read_shard, write_shard
from speedrun.recipes.registry import get_preset
from speedrun.train import stages

BOS = 50256


def _unpacked(proxy: Path, tmp: Path) -> list[Path]:
    """The training shards of `proxy`, decompressed into tmp, in name order."""
    out = []
    for src in sorted(proxy.glob("fineweb_train_*.bin.xz")):
        out.append(tmp / src.name[:-3])
        with lzma.open(src) as f, open(out[-1], "wb") as raw:
            shutil.copyfileobj(f, raw)
    return out


def replay(files: list[Path], preset: str) -> tuple[list[np.ndarray], list[list]]:
    """The preset's loader over `files` on one rank: each shard's mask of the tokens some piece reads
    (a piece's inputs and its one target past them), and every step's batches."""
    cfg = get_preset(preset)
    loader = documents.DocumentLoader(files, 0, 1, cfg.docs)
    used = [np.zeros(len(read_shard(f)), dtype=bool) for f in files]
    step_sets = loader._micro_step

    def recording(pos, n_loc, l_max):
        sets, after = step_sets(pos, n_loc, l_max)
        for piece_set in sets:
            for start, length in zip(piece_set.starts, piece_set.lengths):
                used[loader._open.number][start:start + length + 1] = True
        return sets, after

    loader._micro_step = recording
    batches = []
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="training data wrapped around")
        for step in range(cfg.stages.total_steps):
            p = stages.step_plan(cfg.stages, step, cfg.docs)
            batches.append(loader.next_step(p.local_tokens, p.max_doc_len, p.max_docs))
    return used, batches


def read_only_set(proxy: Path, dst: Path, preset: str) -> None:
    """dst: the training shards with the tokens no step of `preset` reads set to 0 (module docstring),
    checked by replaying the loader on them."""
    with tempfile.TemporaryDirectory() as tmp:
        files = _unpacked(proxy, Path(tmp))
        used, want = replay(files, preset)
        for f, mask in zip(files, used):
            t = np.asarray(read_shard(f))
            write_shard(f, np.where(mask | (t == BOS), t, 0).astype(np.uint16))
        _, got = replay(files, preset)
        same = all(torch_equal(a, b) for w, g in zip(want, got) for a, b in zip(w, g))
        if not same:
            raise SystemExit(f"{dst}: the masked shards change a batch of {preset}")
        for f in files:
            with open(f, "rb") as raw, lzma.open(dst / (f.name + ".xz"), "wb", preset=9 | lzma.PRESET_EXTREME) as out:
                shutil.copyfileobj(raw, out)
        print(f"{dst}: {sum(m.sum() for m in used):,} of {sum(m.size for m in used):,} training tokens read")


def torch_equal(a: documents.DocBatch, b: documents.DocBatch) -> bool:
    return all(bool((x == y).all()) and x.shape == y.shape for x, y in zip(a, b))


def main(proxy: Path) -> None:
    for name in ("proxy161", "proxy322"):
        (Path("." + name)).mkdir(exist_ok=True)
    read_only_set(proxy, Path(".proxy161"), "proxy161")
    shutil.copyfile(proxy / "fineweb_val_000000.bin.xz", ".proxy161/fineweb_val_000000.bin.xz")
    for i in (1, 2, 3, 4):
        shutil.copyfile(proxy / f"fineweb_train_00000{i}.bin.xz", f".proxy322/fineweb_train_00000{i}.bin.xz")
    Path(".proxy322/fineweb_val_000000.bin.xz").unlink(missing_ok=True)


if __name__ == "__main__":
    main(Path(sys.argv[1] if len(sys.argv) > 1 else "../shared/proxy"))
