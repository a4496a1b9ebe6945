"""Corpus tokenisation into shards: formats, split, sizes, determinism, bad input."""

from __future__ import annotations

import gzip
import json
import lzma

import numpy as np
import pytest

from speedrun.data.corpus import read_documents, split_document, tokenize_files
from speedrun.errors import DataError
from speedrun.data.shards import read_shard
from speedrun.data.tokenizer import EOT, encode_document

DOCS = [f"Document {i}. " + " ".join(f"word{j}" for j in range(i * 7 % 40 + 5)) for i in range(60)]


def _jsonl(path, docs, opener=open):
    with opener(path, "wt", encoding="utf-8") as f:
        for d in docs:
            f.write(json.dumps({"text": d, "id": 1}) + "\n")
    return path


def _stream(docs):
    return np.concatenate([encode_document(d) for d in docs])


def _run(inputs, out, **kw):
    kw = {"prefix": "t", "val_tokens": 100, "shard_tokens": 500, "workers": 1, "progress": False} | kw
    return tokenize_files(inputs, out, **kw)


def test_jsonl_compressed_and_txt_inputs(tmp_path):
    a = _jsonl(tmp_path / "a.jsonl", DOCS[:20])
    b = _jsonl(tmp_path / "b.jsonl.gz", DOCS[20:40], gzip.open)
    c = _jsonl(tmp_path / "c.json.xz", DOCS[40:55], lzma.open)
    (tmp_path / "d.txt").write_text(f"{DOCS[55]}\n\n{DOCS[56]}\n")  # blank line: still one document
    (tmp_path / "e.txt").write_text(f"{DOCS[57]}\n<|endoftext|>\n{DOCS[58]}\n<|endoftext|>\n")
    assert list(read_documents(tmp_path / "e.txt")) == [DOCS[57] + "\n", DOCS[58] + "\n"]
    s = _run([a, b, c, tmp_path / "d.txt", tmp_path / "e.txt"], tmp_path / "out")
    expected_docs = DOCS[:55] + [f"{DOCS[55]}\n\n{DOCS[56]}\n", DOCS[57] + "\n", DOCS[58] + "\n"]
    assert s["documents"] == len(expected_docs)
    out = [read_shard(p) for p in map(type(tmp_path), s["files"])]
    assert np.array_equal(np.concatenate(out), _stream(expected_docs))


def test_val_split_whole_documents_then_fixed_train_shards(tmp_path):
    src = _jsonl(tmp_path / "a.jsonl", DOCS)
    s = _run([src], tmp_path / "out", val_tokens=300)
    names = [p.rsplit("/", 1)[1] for p in s["files"]]
    assert names[0] == "t_val_000000.bin" and names[1] == "t_train_000000.bin"
    val = read_shard(tmp_path / "out" / names[0])
    lengths = [len(encode_document(d)) for d in DOCS]
    cut = int(np.searchsorted(np.cumsum(lengths), 301))  # documents needed to reach 301 tokens
    assert val.size == sum(lengths[:cut + 1]) >= 301 and val.size - lengths[cut] < 301
    assert val[0] == EOT
    trains = [read_shard(tmp_path / "out" / n) for n in names[1:]]
    assert all(t.size == 500 for t in trains[:-1]) and 0 < trains[-1].size <= 500
    train = np.concatenate(trains)
    assert train[0] == EOT  # first train document is whole: no overlap with val
    assert np.array_equal(np.concatenate([val, train]), _stream(DOCS))
    assert s["val_tokens"] == val.size and s["train_tokens"] == train.size


def test_parallel_output_is_identical(tmp_path, monkeypatch):
    monkeypatch.setattr("speedrun.data.corpus.CHUNK_CHARS", 300)  # many chunks
    src = _jsonl(tmp_path / "a.jsonl", DOCS)
    one = _run([src], tmp_path / "one", workers=1)
    two = _run([src], tmp_path / "two", workers=2)
    assert len(one["files"]) == len(two["files"]) > 2
    for p, q in zip(one["files"], two["files"]):
        assert open(p, "rb").read() == open(q, "rb").read()


def test_split_document_at_paragraphs():
    text = "\n\n".join(f"para {i} " + "x" * 50 for i in range(20))
    pieces = split_document(text, 200)
    assert "\n\n".join(pieces) == text
    assert all(len(p) >= 200 for p in pieces[:-1]) and all(len(p) < 200 + 60 for p in pieces)
    assert split_document("short", 200) == ["short"] and split_document(text, 0) == [text]


def test_split_chars_makes_more_documents(tmp_path):
    long = "\n\n".join("paragraph " + "y " * 30 for _ in range(40))
    src = _jsonl(tmp_path / "a.jsonl", [long])
    s = _run([src], tmp_path / "out", val_tokens=0, split_chars=300)
    tokens = np.concatenate([read_shard(p) for p in s["files"]])
    assert s["documents"] == int((tokens == EOT).sum()) > 5


@pytest.mark.parametrize("content,match", [
    ('{"text": "ok"}\nnot json\n', r"bad\.jsonl:2: not valid JSON"),
    ('{"title": "no text"}\n', r"bad\.jsonl:1: JSON line has no string 'text' field"),
])
def test_bad_json_lines(tmp_path, content, match):
    (tmp_path / "bad.jsonl").write_text(content)
    with pytest.raises(DataError, match=match):
        _run([tmp_path / "bad.jsonl"], tmp_path / "out")


def test_bad_inputs(tmp_path):
    with pytest.raises(DataError, match=r"missing\.jsonl: input file not found"):
        _run([tmp_path / "missing.jsonl"], tmp_path / "out")
    (tmp_path / "x.csv").write_text("a,b")
    with pytest.raises(DataError, match=r"x\.csv: unsupported input type"):
        _run([tmp_path / "x.csv"], tmp_path / "out")
    (tmp_path / "broken.jsonl.xz").write_bytes(b"not xz at all")
    with pytest.raises(DataError, match=r"broken\.jsonl\.xz: cannot read"):
        _run([tmp_path / "broken.jsonl.xz"], tmp_path / "out")
    (tmp_path / "empty").mkdir()
    with pytest.raises(DataError, match="folder holds no"):
        _run([tmp_path / "empty"], tmp_path / "out")


def test_corpus_too_small_for_val(tmp_path):
    src = _jsonl(tmp_path / "a.jsonl", DOCS[:3])
    with pytest.raises(DataError, match="fewer than the 100001 needed for the validation split"):
        _run([src], tmp_path / "out", val_tokens=100_000)
    with pytest.raises(DataError, match="all taken by the validation split"):
        _run([src], tmp_path / "out2", val_tokens=int(_stream(DOCS[:3]).size - 1))


def test_existing_shards_need_force(tmp_path):
    src = _jsonl(tmp_path / "a.jsonl", DOCS)
    first = _run([src], tmp_path / "out", shard_tokens=200)
    with pytest.raises(DataError, match=r"already holds \d+ t_\*\.bin shards; pass --force"):
        _run([src], tmp_path / "out")
    second = _run([src], tmp_path / "out", shard_tokens=100_000, force=True)
    assert len(second["files"]) == 2 < len(first["files"])
    assert sorted(p.name for p in (tmp_path / "out").glob("t_*.bin")) == ["t_train_000000.bin",
                                                                          "t_val_000000.bin"]
