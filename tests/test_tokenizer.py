"""The offline GPT-2 tokenizer."""

from __future__ import annotations

import subprocess
import sys
import textwrap

from speedrun.data.tokenizer import EOT, decode, encode, encode_document, get_encoding


def test_known_ids():
    enc = get_encoding()
    assert enc.encode("Hello world<|endoftext|>", allowed_special={"<|endoftext|>"}) == [15496, 995, 50256]
    assert enc.n_vocab == 50257 and EOT == 50256
    assert get_encoding() is enc  # cached


def test_documents_and_decode():
    assert encode_document("Hello world") == [50256, 15496, 995]
    text = "It is a truth universally acknowledged.\n\n  Ünïcödé — ok?"
    assert decode(encode(text)) == text
    assert EOT not in encode("a <|endoftext|> b")  # special text inside a document stays text


def test_works_without_network(tmp_path):
    code = textwrap.dedent("""
        import socket
        def refuse(*a, **k):
            raise OSError("network disabled in this test")
        socket.socket.connect = refuse
        socket.create_connection = refuse
        from speedrun.data.tokenizer import get_encoding
        print(get_encoding().encode("Hello world"))
    """)
    env = {"TIKTOKEN_CACHE_DIR": str(tmp_path), "PATH": "/usr/bin:/bin"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[15496, 995]"
