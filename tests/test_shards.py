"""Shard format: round trip, and one clear DataError per kind of bad file."""

from __future__ import annotations

import numpy as np
import pytest

from speedrun.errors import DataError
from speedrun.data.paths import demo_data_dir, resolve_files
from speedrun.data.shards import (HEADER_BYTES, read_shard, require_tokens, shard_num_tokens, validate_shard,
                             write_shard)


def _one_line(e) -> str:
    msg = str(e.value)
    assert "\n" not in msg
    return msg


def test_round_trip_is_memmap(tmp_path):
    tokens = np.array([50256, 1, 2, 65535 - 15279, 42], dtype=np.int64)
    p = write_shard(tmp_path / "a.bin", tokens)
    assert p.stat().st_size == HEADER_BYTES + 2 * tokens.size
    got = read_shard(p)
    assert isinstance(got, np.memmap) and got.dtype == np.uint16
    assert got.tolist() == tokens.tolist()
    assert shard_num_tokens(p) == 5
    assert validate_shard(p) == 5
    header = np.fromfile(p, dtype="<i4", count=3)
    assert header.tolist() == [20240520, 1, 5]


def test_missing_file(tmp_path):
    with pytest.raises(DataError) as e:
        read_shard(tmp_path / "nope.bin")
    assert "nope.bin" in _one_line(e) and "not found" in str(e.value)


def _patch_header(path, index, value):
    data = bytearray(path.read_bytes())
    data[4 * index:4 * index + 4] = np.int32(value).tobytes()
    path.write_bytes(bytes(data))


def test_wrong_magic(tmp_path):
    p = write_shard(tmp_path / "m.bin", [1, 2, 3])
    _patch_header(p, 0, 12345)
    with pytest.raises(DataError, match=r"m\.bin: wrong magic number 12345") as e:
        read_shard(p)
    _one_line(e)


def test_unknown_version(tmp_path):
    p = write_shard(tmp_path / "v.bin", [1, 2, 3])
    _patch_header(p, 1, 7)
    with pytest.raises(DataError, match=r"v\.bin: unknown shard version 7"):
        shard_num_tokens(p)


def test_shorter_and_longer_than_header(tmp_path):
    p = write_shard(tmp_path / "s.bin", list(range(100)))
    p.write_bytes(p.read_bytes()[:-10])
    with pytest.raises(DataError, match=r"s\.bin: file is \d+ bytes, shorter than") as e:
        read_shard(p)
    _one_line(e)
    q = write_shard(tmp_path / "l.bin", list(range(100)))
    q.write_bytes(q.read_bytes() + b"\0\0")
    with pytest.raises(DataError, match=r"l\.bin: file is \d+ bytes, longer than"):
        read_shard(q)
    r = tmp_path / "tiny.bin"
    r.write_bytes(b"\0" * 100)
    with pytest.raises(DataError, match="shorter than the 1024-byte shard header"):
        read_shard(r)


def test_token_outside_vocab(tmp_path):
    p = write_shard(tmp_path / "t.bin", [50256, 5, 50257, 7])
    assert read_shard(p).size == 4  # reading does not scan ids
    with pytest.raises(DataError, match=r"t\.bin: token id 50257 at position 2 is outside the vocabulary"):
        validate_shard(p)
    assert validate_shard(p, vocab_size=50304) == 4


def test_write_refuses_ids_over_uint16(tmp_path):
    with pytest.raises(DataError, match="uint16"):
        write_shard(tmp_path / "x.bin", [70000])


def test_validation_shard_too_short(tmp_path):
    p = write_shard(tmp_path / "val.bin", list(range(10)))
    assert require_tokens(p, 10).size == 10
    with pytest.raises(DataError, match=r"val\.bin: validation shard has 10 tokens, fewer than the 11"):
        require_tokens(p, 11)


def test_resolve_files(tmp_path):
    for name in ("b_train_000001.bin", "b_train_000000.bin", "b_val_000000.bin"):
        write_shard(tmp_path / name, [1])
    assert [p.name for p in resolve_files(tmp_path, "b_train_*.bin")] == ["b_train_000000.bin",
                                                                         "b_train_000001.bin"]
    with pytest.raises(DataError, match=r"no files match 'fineweb_train_\*\.bin'") as e:
        resolve_files(tmp_path, "fineweb_train_*.bin")
    assert str(tmp_path) in _one_line(e)
    with pytest.raises(DataError, match="data folder not found"):
        resolve_files(tmp_path / "absent", "*.bin")


def test_demo_corpus_unpacks_once_and_repairs(tmp_path, monkeypatch):
    monkeypatch.setenv("SPEEDRUN_HOME", str(tmp_path))
    d = demo_data_dir()
    assert d.is_relative_to(tmp_path)
    train, val = resolve_files(d, "demo_train_*.bin"), resolve_files(d, "demo_val_*.bin")
    assert validate_shard(val[0]) >= 65_537
    tokens = read_shard(train[0])
    assert tokens.size > 1_000_000 and tokens[0] == 50256
    mtime = train[0].stat().st_mtime_ns
    assert demo_data_dir() == d and train[0].stat().st_mtime_ns == mtime
    val[0].write_bytes(val[0].read_bytes()[:5000])  # a damaged cache is unpacked again
    demo_data_dir()
    assert validate_shard(val[0]) >= 65_537
    assert not list(d.glob(".*tmp"))
