"""GPT-2 BPE, built offline from vocabulary files shipped in the package.

`tiktoken.get_encoding("gpt2")` downloads `vocab.bpe` and `encoder.json` on
first use, which fails on air-gapped GPU machines. The same two files (byte
for byte OpenAI's) live in `speedrun/assets/gpt2/`, and the encoding is built
from them with tiktoken's own loader, so ids equal FineWeb's shards.
"""

from __future__ import annotations

import functools
from importlib import resources

import tiktoken
from tiktoken.load import data_gym_to_mergeable_bpe_ranks

from speedrun.errors import DataError

EOT = 50256
EOT_TEXT = "<|endoftext|>"
VOCAB_SIZE = 50257
# The r50k / gpt2 split pattern (same string as tiktoken_ext.openai_public.r50k_pat_str).
R50K_PATTERN = r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""


def _pattern() -> str:
    try:
        from tiktoken_ext.openai_public import r50k_pat_str
        return r50k_pat_str
    except ImportError:  # older tiktoken: the literal is the same
        return R50K_PATTERN


@functools.cache
def get_encoding() -> tiktoken.Encoding:
    """The GPT-2 encoding (cached; safe to call in every worker process)."""
    assets = resources.files("speedrun") / "assets" / "gpt2"
    bpe, enc = assets / "vocab.bpe", assets / "encoder.json"
    if not (bpe.is_file() and enc.is_file()):
        raise DataError(f"{assets}: GPT-2 vocabulary files missing from the package; reinstall speedrun")
    with resources.as_file(bpe) as bpe_path, resources.as_file(enc) as enc_path:
        ranks = data_gym_to_mergeable_bpe_ranks(str(bpe_path), str(enc_path))
    return tiktoken.Encoding(name="gpt2-offline", pat_str=_pattern(), mergeable_ranks=ranks,
                             special_tokens={EOT_TEXT: EOT})


def encode(text: str) -> list[int]:
    """Encode ordinary text; `<|endoftext|>` inside the text is kept as plain text."""
    return get_encoding().encode_ordinary(text)


def encode_document(text: str) -> list[int]:
    """One document as it goes into a shard: EOT first, then its tokens."""
    return [EOT, *get_encoding().encode_ordinary(text)]


def decode(ids) -> str:
    """Token ids (any iterable of ints, tensors or arrays included) back to text."""
    return get_encoding().decode([int(i) for i in ids])
