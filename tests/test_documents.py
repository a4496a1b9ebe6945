"""The 2026-07 document loader (spec record-2026-07.md, "Data" and "Validation and timing"): pieces against a
token-by-token reading of the piece rules, truncation, world sizes, shard skips, wrap, resume, N_max, val chunks."""

from __future__ import annotations

import json
import warnings

import numpy as np
import pytest
import torch

from speedrun.data.documents import (DocumentConfig, DocumentLoader, bos_positions, grad_accum_steps,
                                     local_tokens, train_max_docs, val_batches, val_max_docs)
from speedrun.data.shards import write_shard
from speedrun.errors import ConfigError, DataError

BOS = 50256


def doc(d: int, length: int) -> list[int]:
    """Document d of `length` tokens: BOS, then ids that name the document and the offset."""
    return [BOS, *[(100 * d + j) % 50000 for j in range(1, length)]]


def write(tmp_path, name, docs, prefix=()):
    """A shard of `prefix` (tokens before the first BOS) then the documents (d, length)."""
    tokens = [*prefix, *[t for d, n in docs for t in doc(d, n)]]
    return write_shard(tmp_path / name, tokens), tokens


def reference(shards, schedule, world, n_max=128, start=(0, 0)):
    """The piece rules read literally, walking token by token: the global piece sets of each step in set
    order, and the shard of every micro-step (a shard too short for one is left for the next one's start)."""
    (shard, pos), out, visits = start, [], []
    for n_loc, l_max in schedule:
        step = []
        while len(step) < 8:
            sets, end = micro_step(shards[shard], pos, n_loc, l_max, world)
            if sets is None:
                shard, pos = (shard + 1) % len(shards), 0
                continue
            step += [(x, y, cu + [n_loc] * (n_max - len(cu))) for x, y, cu in sets]
            pos = end
            visits.append(shard)
        out.append(step)
    return out, visits


def micro_step(toks, pos, n_loc, l_max, world):
    """`world` buffers of n_loc + 1 tokens from the first BOS at or after pos; None if the shard runs out."""
    bos = [i for i, t in enumerate(toks) if t == BOS and i >= pos]
    sets = []
    for _ in range(world):
        buf, bounds = [], [0]
        while len(buf) < n_loc + 1:
            if not bos:
                return None, None
            start = bos.pop(0)
            p = start
            while True:
                buf.append(toks[p])
                p += 1
                if p == len(toks) or toks[p] == BOS or p == start + l_max or len(buf) == n_loc + 1:
                    break
            bounds.append(len(buf))
        bounds[-1] -= 1
        sets.append((buf[:-1], buf[1:], bounds))
    return sets, (bos[0] if bos else len(toks))


def as_lists(batch, n_max):
    """(inputs, targets, cu_seqlens) of a loader batch as lists, after checking dtypes and shapes."""
    x, y, cu = batch
    assert x.dtype == torch.int32 and y.dtype == torch.int64 and cu.dtype == torch.int32
    assert x.shape == y.shape and cu.shape == (n_max,)
    return x.tolist(), y.tolist(), cu.tolist()


def global_steps(files, schedule, world, n_max=128, state=None):
    """Every rank's loader over the schedule, merged in (m*W + r) order."""
    loaders = [DocumentLoader(files, r, world) for r in range(world)]
    for ld in loaders:
        if state is not None:
            ld.load_state_dict(state)
    out = []
    for n_loc, l_max in schedule:
        per_rank = [ld.next_step(n_loc, l_max, n_max) for ld in loaders]
        out.append([as_lists(per_rank[i % world][i // world], n_max) for i in range(8)])
    return out, loaders


@pytest.fixture
def corpus(tmp_path):
    rng = np.random.default_rng(7)
    files, tokens, d = [], [], 0
    for s, (ndocs, prefix) in enumerate([(40, ()), (1, (5, 6)), (45, (9,)), (30, ())]):  # shard 1: too short
        lengths = rng.integers(1, 40, ndocs)
        f, t = write(tmp_path, f"x_train_{s:06d}.bin", [(d + i, int(n)) for i, n in enumerate(lengths)], prefix)
        files.append(f)
        tokens.append(t)
        d += ndocs
    return files, tokens


SCHEDULE = [(24, 12)] * 4 + [(40, 20)] * 5 + [(16, 6)] * 4  # three stages, cursor carried over


@pytest.mark.parametrize("world", [1, 2, 4, 8])
def test_batches_match_the_piece_rules(corpus, world):
    files, tokens = corpus
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        got, _ = global_steps(files, SCHEDULE, world)
    want, visits = reference(tokens, SCHEDULE, world)
    assert got == want
    wraps = [b < a for a, b in zip(visits, visits[1:])]
    assert 1 not in visits and {0, 2, 3} <= set(visits) and any(wraps)  # a skip and a wrap


def test_truncation_and_the_last_target(tmp_path):
    lengths = [20, 5, 30, 3, 8, 40, 30] + [12] * 18
    f, toks = write(tmp_path, "t.bin", list(enumerate(lengths)))
    first, second, *rest = DocumentLoader([f], 0, 1).next_step(24, 12, 8)
    x, y, cu = first
    d = [doc(i, n) for i, n in enumerate(lengths)]
    assert x.tolist() == d[0][:12] + d[1] + d[2][:7]  # doc 0 cut at L_max, doc 2 at the buffer
    assert y.tolist() == d[0][1:12] + d[1] + d[2][:8]
    assert y[11] == BOS and y[16] == BOS and y[23] == d[2][7]  # a truncated piece's last target is the next BOS
    assert cu.tolist() == [0, 12, 17, 24, 24, 24, 24, 24]
    x, y, cu = second  # the rest of doc 2 is dropped: the next set starts at doc 3
    assert x.tolist() == d[3] + d[4] + d[5][:12] + d[6][:1]
    assert y.tolist()[-2:] == [BOS, d[6][1]] and cu.tolist() == [0, 3, 11, 23, 24, 24, 24, 24]
    assert [b.inputs[:2].tolist() for b in rest] == [d[i][:2] for i in range(7, 25, 3)]  # 12 + 12 + 1 tokens


def test_same_global_batch_on_every_world_size(tmp_path):
    rng = np.random.default_rng(11)
    f, _ = write(tmp_path, "big.bin", [(i, int(n)) for i, n in enumerate(rng.integers(1, 40, 400))])
    schedule = [(24, 12)] * 2 + [(40, 20)] * 2  # one shard holds these four steps
    runs = [global_steps([f], schedule, w)[0] for w in (1, 2, 4, 8)]
    assert runs[0] == runs[1] == runs[2] == runs[3]
    flat = [s for step in runs[0] for s in step]
    assert len({tuple(x) for x, _, _ in flat}) == len(flat)  # 32 distinct piece sets


@pytest.mark.parametrize("world, want", [
    (8, ["b"] * 8),  # W = 8 takes the whole step from the next shard
    (4, ["a"] * 4 + ["b"] * 4),  # W < 8 fills the earlier micro-steps from the old shard
    (2, ["a"] * 4 + ["b"] * 4),
    (1, ["a"] * 5 + ["b"] * 3),
])
def test_shard_running_out_mid_step(tmp_path, world, want):
    a, _ = write(tmp_path, "s_train_000000.bin", [(i, 10) for i in range(5)])  # exactly 5 sets of 9 + 1
    b, _ = write(tmp_path, "s_train_000001.bin", [(100 + i, 10) for i in range(20)], prefix=(7, 7, 7))
    got, loaders = global_steps([a, b], [(9, 16)], world, n_max=4)
    ids = [x[1] // 100 for x, _, _ in got[0]]
    assert ["a" if i < 100 else "b" for i in ids] == want
    assert all(x[0] == BOS for x, _, _ in got[0])  # b's leading tokens are skipped: its first BOS
    b_docs = [i - 100 for i in ids if i >= 100]
    assert b_docs == list(range(len(b_docs)))
    assert loaders[0].state_dict()["shard"] == 1 and loaders[0].state_dict()["pos"] == 3 + 10 * len(b_docs)


def test_wrap_to_the_first_shard_warns_once(corpus):
    files, tokens = corpus
    loader = DocumentLoader(files, 0, 8)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        first = as_lists(loader.next_step(40, 20, 128)[0], 128)
        for steps in range(2, 100):
            last = as_lists(loader.next_step(40, 20, 128)[0], 128)
            if loader.passes:
                break
        for _ in range(40):
            loader.next_step(40, 20, 128)
    assert last == first and steps > 2  # the step after the last shard restarts at shard 0's first BOS
    wraps = [w for w in caught if "wrapped around" in str(w.message)]
    assert len(wraps) == 1 and loader.passes >= 2


def test_resume_is_bit_exact_across_stages_and_world_sizes(corpus):
    files, tokens = corpus
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        a = DocumentLoader(files, 1, 2)
        for n_loc, l_max in SCHEDULE[:5]:
            a.next_step(n_loc, l_max)
        state = json.loads(json.dumps(a.state_dict()))
        want = [a.next_step(n, l) for n, l in SCHEDULE[5:]]
        b = DocumentLoader(files, 1, 2)
        b.next_step(16, 6)  # its own history first
        b.load_state_dict(state)
        got = [b.next_step(n, l) for n, l in SCHEDULE[5:]]
        for gs, ws in zip(got, want):
            for g, w in zip(gs, ws):
                assert all(torch.equal(p, q) for p, q in zip(g, w))
        assert b.state_dict() == a.state_dict()
        whole, _ = global_steps(files, SCHEDULE[5:], 4, state=state)  # resumed on 4 ranks
    assert whole == reference(tokens, SCHEDULE[5:], 4, start=(state["shard"], state["pos"]))[0]


def test_state_is_checked(corpus):
    files, _ = corpus
    state = DocumentLoader(files, 0, 1).state_dict()
    assert state["shard"] == 0 and state["pos"] == 0
    with pytest.raises(DataError, match="points outside the data"):
        DocumentLoader(files, 0, 1).load_state_dict(state | {"pos": 10**9})
    with pytest.raises(DataError, match="files were"):
        DocumentLoader(files[:2], 0, 1).load_state_dict(state)


def test_too_many_pieces_names_the_setting(tmp_path):
    f, _ = write(tmp_path, "short.bin", [(i, 2) for i in range(300)])
    loader = DocumentLoader([f], 0, 1)
    before = loader.state_dict()
    with pytest.raises(DataError) as err:
        loader.next_step(32, 8, 17)  # 33 tokens in pieces of 2 are 17 pieces: 16 slots
    msg = str(err.value)
    assert "\n" not in msg and "max_docs_mult" in msg and "N_max - 1 = 16" in msg and "17 documents" in msg
    assert loader.state_dict() == before  # a failed step moves nothing
    x, y, cu = loader.next_step(32, 8, 18)[0]  # 17 pieces fit in 18 entries exactly
    assert cu.tolist() == [*range(0, 33, 2), 32]


def test_too_many_pieces_fails_on_every_rank(tmp_path):
    f, _ = write(tmp_path, "mixed.bin", [(0, 40)] + [(i, 2) for i in range(1, 300)])
    for rank in (0, 1):  # set 0 (rank 0) is one piece; set 1 (rank 1) needs 17
        with pytest.raises(DataError, match="N_max - 1 = 16"):
            DocumentLoader([f], rank, 8).next_step(32, 64, 17)


def test_bos_scan_in_chunks():
    tokens = np.random.default_rng(5).integers(50250, 50258, 1000).astype(np.uint16)
    tokens[[0, -1]] = BOS
    want = np.flatnonzero(tokens == BOS)
    assert want.size > 50
    for chunk in (1, 7, 1000, 1 << 24):
        got = bos_positions(tokens, BOS, chunk)
        assert got.dtype == np.int64 and got.tolist() == want.tolist()


def test_bounds_and_batch_arithmetic():
    assert [train_max_docs(n) for n in (16_384, 32_768, 49_152)] == [64, 96, 128]
    proxy = DocumentConfig(max_docs_mult=4)
    assert [train_max_docs(n, proxy) for n in (16_384, 32_768, 49_152)] == [256, 384, 512]
    assert [train_max_docs(n) for n in (1, 8_192, 38_699, 38_700, 65_536)] == [128, 128, 128, 256, 256]
    assert val_max_docs() == 896 and val_max_docs(proxy) == 3584
    assert [local_tokens(b) for b in (131_072, 262_144, 393_216)] == [16_384, 32_768, 49_152]
    assert [grad_accum_steps(w) for w in (1, 2, 4, 8)] == [8, 4, 2, 1]
    with pytest.raises(ConfigError, match="world size 3"):
        grad_accum_steps(3)
    with pytest.raises(ConfigError):
        local_tokens(100)


def test_data_too_small_for_one_micro_step(tmp_path):
    f, _ = write(tmp_path, "tiny.bin", [(0, 10)])
    with pytest.raises(DataError, match="no shard holds 2 micro-batches of 33 tokens"):
        DocumentLoader([f], 0, 2).next_step(32, 16)


def test_validation_chunks(tmp_path):
    rng = np.random.default_rng(3)
    toks = rng.integers(0, 50000, 140)
    bos_at = [0, 5, 16, 31, 40, 47, 48, 64]  # chunk starts, a chunk's last input, target-only BOSes (48, 64)
    toks[bos_at] = BOS
    first = write_shard(tmp_path / "v_val_000000.bin", toks[:40])  # the chunks span both shards
    second = write_shard(tmp_path / "v_val_000001.bin", toks[40:])
    cfg = DocumentConfig(val_tokens=64, val_chunk=16, val_max_docs=3)  # 2 BOS a chunk at most
    for world in (1, 2, 4):
        per_rank = [list(val_batches([first, second], r, world, cfg)) for r in range(world)]
        assert all(len(b) == 4 // world for b in per_rank)
        chunks = [per_rank[c % world][c // world] for c in range(4)]
        for c, (x, y, cu) in enumerate(chunks):
            s = 16 * c
            assert x.dtype == torch.int32 and y.dtype == torch.int64 and cu.dtype == torch.int32
            assert x.tolist() == toks[s:s + 16].tolist() and y.tolist() == toks[s + 1:s + 17].tolist()
        assert [cu.tolist() for _, _, cu in chunks] == [[0, 0, 5], [0, 0, 15], [0, 8, 15], [0, 0, 16]]
    with pytest.raises(DataError, match=r"validation chunk .* N_max - 1 = 1;.*max_docs_mult"):
        list(val_batches([first, second], 0, 1, DocumentConfig(val_tokens=64, val_chunk=16, val_max_docs=2)))
    with pytest.raises(DataError, match="hold 140 tokens, fewer than the 141"):
        list(val_batches([first, second], 0, 1, DocumentConfig(val_tokens=140, val_chunk=14)))
    with pytest.raises(ConfigError, match="multiple of world size"):
        list(val_batches([first, second], 0, 8, cfg))
