"""`speedrun data fineweb` against a local Hub-compatible server, with the real client."""

from __future__ import annotations

import hashlib
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np
import pytest

from speedrun.errors import DataError
from speedrun.data.fineweb import fetch_fineweb, shard_names
from speedrun.data.shards import read_shard, write_shard

COMMIT = "a" * 40


class Hub(BaseHTTPRequestHandler):
    """HEAD/GET /datasets/{repo}/resolve/{revision}/{filename}, as huggingface_hub expects."""

    files: dict[str, bytes] = {}
    fail: set[str] = set()
    log: list[tuple[str, str]] = []

    def log_message(self, *args):  # keep pytest output clean
        pass

    def _file(self):
        parts = self.path.split("?")[0].split("/")
        if len(parts) < 7 or parts[1] != "datasets" or parts[4] != "resolve":
            return None, None
        return "/".join(parts[2:4]), "/".join(parts[6:])

    def _headers(self, data: bytes) -> None:
        self.send_header("X-Repo-Commit", COMMIT)
        self.send_header("ETag", '"' + hashlib.sha256(data).hexdigest() + '"')
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()

    def _lookup(self):
        repo, name = self._file()
        self.log.append((self.command, name))
        data = self.files.get(f"{repo}/{name}")
        if data is None:
            self.send_response(404)
            self.send_header("X-Error-Code", "EntryNotFound")
            self.send_header("X-Repo-Commit", COMMIT)
            self.send_header("Content-Length", "0")
            self.end_headers()
        return name, data

    def do_HEAD(self):
        name, data = self._lookup()
        if data is not None:
            self.send_response(200)
            self._headers(data)

    def do_GET(self):
        name, data = self._lookup()
        if data is None:
            return
        if name in self.fail:
            self.send_response(500)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        self.send_response(200)
        self._headers(data)
        self.wfile.write(data)


def _shard_bytes(tmp_path, n: int, seed: int) -> bytes:
    p = write_shard(tmp_path / f"src{seed}.bin", np.random.default_rng(seed).integers(0, 50257, n))
    return p.read_bytes()


@pytest.fixture
def hub(tmp_path, monkeypatch):
    Hub.files = {}
    for i, name in enumerate(shard_names("10B", 2)):
        Hub.files[f"kjj0/fineweb10B-gpt2/{name}"] = _shard_bytes(tmp_path, 1000 + i, i)
    Hub.fail, Hub.log = set(), []
    server = ThreadingHTTPServer(("127.0.0.1", 0), Hub)
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{server.server_address[1]}")
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setenv("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf_home"))  # no user token or cache leaks in
    yield Hub
    server.shutdown()
    server.server_close()


def _gets(hub):
    """Shard downloads (the client may also GET /api/... endpoints, which answer 404)."""
    return [name for method, name in hub.log if method == "GET" and name]


def test_names_and_variants():
    assert shard_names("10B", 2) == ["fineweb_val_000000.bin", "fineweb_train_000001.bin",
                                     "fineweb_train_000002.bin"]
    assert shard_names("edu10B", 1)[1] == "finewebedu_train_000001.bin"
    with pytest.raises(DataError, match="unknown FineWeb variant"):
        shard_names("7B", 1)


def test_download_then_skip_when_complete(hub, tmp_path):
    out = tmp_path / "fw"
    paths = fetch_fineweb("10B", 2, out, log=lambda m: None)
    assert [p.name for p in paths] == shard_names("10B", 2)
    for p in paths:
        assert p.read_bytes() == hub.files[f"kjj0/fineweb10B-gpt2/{p.name}"]
    assert len(_gets(hub)) == 3
    hub.log.clear()
    fetch_fineweb("10B", 2, out, log=lambda m: None)
    assert _gets(hub) == [] and not [m for m, n in hub.log if n]  # complete shards: no shard request


def test_truncated_shard_is_fetched_again(hub, tmp_path):
    out = tmp_path / "fw"
    fetch_fineweb("10B", 2, out, log=lambda m: None)
    victim = out / "fineweb_train_000001.bin"
    victim.write_bytes(victim.read_bytes()[:1500])
    hub.log.clear()
    fetch_fineweb("10B", 2, out, log=lambda m: None)
    assert _gets(hub) == ["fineweb_train_000001.bin"]
    assert read_shard(victim).size == 1001


def test_server_error_is_one_clear_line(hub, tmp_path):
    hub.fail.add("fineweb_train_000002.bin")
    with pytest.raises(DataError) as e:
        fetch_fineweb("10B", 2, tmp_path / "fw", log=lambda m: None)
    msg = str(e.value)
    assert "\n" not in msg
    assert "fineweb_train_000002.bin" in msg and "500" in msg
    assert "retry with: speedrun data fineweb --variant 10B --train-shards 2" in msg
    assert (tmp_path / "fw" / "fineweb_train_000001.bin").is_file()
    assert not (tmp_path / "fw" / "fineweb_train_000002.bin").exists()


def test_missing_file_on_server(hub, tmp_path):
    with pytest.raises(DataError, match=r"fineweb_train_000003.bin: download .* failed \(HTTP 404"):
        fetch_fineweb("10B", 3, tmp_path / "fw", log=lambda m: None)


def test_offline_mode_uses_complete_shards_only(hub, tmp_path, monkeypatch):
    out = tmp_path / "fw"
    fetch_fineweb("10B", 1, out, log=lambda m: None)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    hub.log.clear()
    assert len(fetch_fineweb("10B", 1, out, log=lambda m: None)) == 2
    with pytest.raises(DataError, match="HF_HUB_OFFLINE is set"):
        fetch_fineweb("10B", 2, out, log=lambda m: None)
    assert not [m for m, n in hub.log if n]


def test_no_network_is_said_in_those_words(tmp_path, monkeypatch):
    """The real client against a local port where nothing listens: the connection is refused."""
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setenv("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf_home"))
    with pytest.raises(DataError) as e:
        fetch_fineweb("10B", 0, tmp_path / "fw", log=lambda m: None)
    msg = str(e.value)
    assert "\n" not in msg
    assert msg.startswith("fineweb_val_000000.bin: no network: cannot reach http://127.0.0.1:9 (Connection refused); "
                          f"fetch the shards on a machine with network and copy them to {tmp_path / 'fw'}")
    assert "Force download failed" not in msg


def test_a_name_that_does_not_resolve(tmp_path, monkeypatch):
    """As huggingface_hub raises it: its ValueError from the client's ConnectError from the socket's error."""
    import socket

    class ConnectError(Exception):  # httpx's, by name: the client is an implementation detail
        pass

    def offline(*args):
        try:
            try:
                raise socket.gaierror(-2, "Name or service not known")
            except socket.gaierror as inner:
                raise ConnectError("[Errno -2] Name or service not known") from inner
        except ConnectError as outer:
            raise ValueError("Force download failed due to the above error.") from outer

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setattr("speedrun.data.fineweb._download", offline)
    with pytest.raises(DataError, match=r"^fineweb_val_000000.bin: no network: cannot reach \S+ "
                                         r"\(Name or service not known\); fetch the shards"):
        fetch_fineweb("10B", 0, tmp_path / "fw", log=lambda m: None)
