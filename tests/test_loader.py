"""The distributed loader: BOS alignment, rank split, exact resume, wrap-around, validation."""

from __future__ import annotations

import json
import warnings

import numpy as np
import pytest
import torch

from speedrun.errors import ConfigError, DataError
from speedrun.data.loader import TrainLoader, val_batches
from speedrun.data.shards import write_shard

EOT = 50256
T, B = 64, 8


def _docs(rng, n_tokens, max_len=150):
    out, size = [], 0
    while size < n_tokens:
        doc = [EOT, *rng.integers(0, 50000, int(rng.integers(3, max_len))).tolist()]
        out += doc
        size += len(doc)
    return out[:n_tokens]


@pytest.fixture
def shards(tmp_path):
    rng = np.random.default_rng(0)
    sizes = [3000, 200, 2500, 4000]  # the 200-token shard can never hold a step
    return [write_shard(tmp_path / f"s_train_{i:06d}.bin", _docs(rng, n)) for i, n in enumerate(sizes)]


def reference(files, seq_len, batch_seqs, steps, bos_align=True):
    """The spec read literally, one process, plain Python (shard switch, wrap)."""
    data = [np.fromfile(f, dtype=np.uint16, offset=1024).tolist() for f in files]
    shard, pos, out = 0, 0, []
    while len(out) < steps:
        toks = data[shard]
        if bos_align:
            starts, want = [], pos
            for i in range(pos, len(toks)):
                if toks[i] == EOT and i >= want and len(starts) <= batch_seqs:
                    starts.append(i)
                    want = i + seq_len
            ok = len(starts) == batch_seqs + 1
        else:
            starts = [pos + j * seq_len for j in range(batch_seqs + 1)]
            ok = pos + batch_seqs * seq_len + 1 <= len(toks)
        if not ok:
            shard, pos = (shard + 1) % len(files), 0
            continue
        out.append([toks[s:s + seq_len + 1] for s in starts[:-1]])
        pos = starts[-1]
    return out


def _take(loader, steps):
    got = []
    for _ in range(steps):
        pairs = loader.next_step()
        for x, y in pairs:
            assert x.dtype == torch.int32 and y.dtype == torch.int64 and x.shape == y.shape == (loader.seq_len,)
            assert torch.equal(x[1:].long(), y[:-1])
        got.append([torch.cat([x[:1].long(), y]).tolist() for x, y in pairs])
    return got


@pytest.mark.parametrize("bos_align", [True, False])
def test_single_process_matches_spec(shards, bos_align):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with TrainLoader(shards, T, B, 0, 1, bos_align=bos_align) as loader:
            got = _take(loader, 12)
    assert got == reference(shards, T, B, 12, bos_align)
    if bos_align:
        assert all(seq[0] == EOT for step in got for seq in step)


@pytest.mark.parametrize("world", [1, 2, 4, 8])
def test_ranks_together_equal_one_process(shards, world):
    want = reference(shards, T, B, 8)
    per_rank = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for r in range(world):
            with TrainLoader(shards, T, B, r, world, prefetch=1 + r % 3) as loader:
                per_rank.append(_take(loader, 8))
    for k in range(8):
        assert all(len(per_rank[r][k]) == B // world for r in range(world))
        merged = [per_rank[i % world][k][i // world] for i in range(B)]  # sequence a*W + r
        assert merged == want[k]


def test_restored_position_continues_exactly(shards):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        a = TrainLoader(shards, T, B, 0, 1, prefetch=3)
        _take(a, 5)
        state = json.loads(json.dumps(a.state_dict()))  # the thread has run ahead by now
        rest = _take(a, 6)
        assert a.state_dict() != state
        b = TrainLoader(shards, T, B, 0, 1, prefetch=2)
        _take(b, 2)  # a loader with its own history and a running thread
        b.load_state_dict(state)
        assert b.passes == state["passes"]
        assert _take(b, 6) == rest
        c = [TrainLoader(shards, T, B, r, 2, prefetch=0) for r in range(2)]  # resume on another world size
        for loader in c:
            loader.load_state_dict(state)
        halves = [_take(loader, 6) for loader in c]
        assert [[halves[i % 2][k][i // 2] for i in range(B)] for k in range(6)] == rest
        for loader in (a, b, *c):
            loader.close()


def test_state_mismatch_is_refused(shards):
    state = TrainLoader(shards, T, B, 0, 1, prefetch=0).state_dict()
    with pytest.raises(DataError, match="seq_len was 64, now 128"):
        TrainLoader(shards, 128, B, 0, 1).load_state_dict(state)
    with pytest.raises(DataError, match="points outside the data"):
        TrainLoader(shards, T, B, 0, 1).load_state_dict(state | {"pos": 10**9})


def test_wrap_around_warns_once(shards):
    loader = TrainLoader(shards, T, B, 0, 1)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(40):
            loader.next_step()
    loader.close()
    wraps = [w for w in caught if "wrapped around" in str(w.message)]
    assert len(wraps) == 1 and loader.passes >= 2


def test_passes_do_not_leak_from_prefetch(shards):
    loader = TrainLoader(shards, T, B, 0, 1, prefetch=8)  # the thread runs far past the wrap
    n = 0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        while loader.passes == 0:
            n += 1
            assert loader.state_dict()["passes"] == 0
            loader.next_step()
    loader.close()
    want = reference(shards, T, B, n + 1)
    assert n > 2 and want[n - 1] == want[0]  # the step that set passes=1 restarted at shard 0
    assert all(want[k] != want[0] for k in range(1, n - 1))


def test_corpus_too_small_and_bad_arguments(tmp_path, shards):
    tiny = write_shard(tmp_path / "tiny.bin", [EOT] + [5] * 100)
    with pytest.raises(DataError, match="no shard holds one step of 8 x 65"):
        TrainLoader([tiny], T, B, 0, 1, prefetch=0).next_step()
    with pytest.raises(DataError, match="no shard holds one step"):  # raised through the prefetch thread
        TrainLoader([tiny], T, B, 0, 1, prefetch=2).next_step()
    with pytest.raises(ConfigError, match="multiple of world size 3"):
        TrainLoader(shards, T, B, 0, 3)
    with pytest.raises(DataError, match="shard file not found"):
        TrainLoader([tmp_path / "gone.bin"], T, B, 0, 1)


def test_val_batches_layout(tmp_path):
    tokens = np.arange(1000) % 50000
    val = write_shard(tmp_path / "val.bin", tokens)
    L, W, n = 16, 4, 256
    seen = []
    for r in range(W):
        batches = list(val_batches(val, n, L, r, W))
        assert len(batches) == n // (W * L)
        for k, (x, y) in enumerate(batches):
            s = k * W * L + r * L
            assert x.dtype == torch.int32 and y.dtype == torch.int64
            assert x.tolist() == tokens[s:s + L].tolist() and y.tolist() == tokens[s + 1:s + L + 1].tolist()
            seen += x.tolist()
    assert sorted(seen) == tokens[:n].tolist()


def test_val_shard_too_short(tmp_path):
    val = write_shard(tmp_path / "val.bin", np.arange(256))
    assert len(list(val_batches(val, 255 - 255 % 5, 5, 0, 1))) == 51
    with pytest.raises(DataError, match=r"val\.bin: validation shard has 256 tokens, fewer than the 257"):
        list(val_batches(val, 256, 16, 0, 1))
    with pytest.raises(ConfigError, match="multiple of world size"):
        list(val_batches(val, 100, 16, 0, 2))
