"""Random tokens in documents: what a benchmark or a compile warm-up feeds a model when the numbers it
computes do not matter but the shapes do (document lengths set the attention's work and the packing)."""

from __future__ import annotations

import numpy as np

EOT = 50256
MEAN_DOC = 1000  # the geometric lengths' mean without a corpus (FineWeb's order of magnitude)


def random_documents(n: int, lengths: np.ndarray | None, seed: int, bos: int = EOT, vocab: int = EOT) -> np.ndarray:
    """n uint16 random tokens below min(bos, vocab), `bos` at document starts whose gaps are drawn from
    `lengths` (or geometric)."""
    rng = np.random.default_rng(seed)
    tokens = rng.integers(0, min(bos, vocab), size=n, dtype=np.uint16)
    draws = n // 16 + 16  # documents are at least 1 token; 16 on average is far below any corpus's mean
    gaps = rng.choice(lengths, size=draws) if lengths is not None else rng.geometric(1.0 / MEAN_DOC, size=draws)
    starts = np.concatenate([[0], np.cumsum(gaps)])
    tokens[starts[starts < n]] = bos
    return tokens
