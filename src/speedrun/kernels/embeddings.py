"""Several embedding tables looked up with the same tokens, and where their gradients go.

The record looks one row of tokens up in four (V, D) bfloat16 tables: the
token embedding and three value embeddings. The lookups stay `F.embedding`
inside the compiled graph (Inductor fuses them with what reads them); only
their backward differs, by who takes the gradients:

- a trainer's in-place sums (`train.grad_accum.GradBuffers`) give a
  (sum, scratch) pair for each table that only the lookups read: its
  gradient is added into the sum row by row (`embed_rows.lookup_into`), with
  no dense float32 table filled and read each micro-step (-1.87 ms a step on
  the bench, -1.59 in full runs, one H200; e24b82b, 2026-12-03);
- everything else (a model used without a trainer: evaluation, tools, tests;
  a table also read elsewhere, as a tied head) gets autograd's dense
  embedding backward (`reference`), which the rows path is held to.

Summing each run of equal tokens in one sorted pass over all the tables
(the same gradients from run to run) made no faster step (656.19 against
656.25 ms, 7d32cb7, 2026-12-01; 1e8865a, 2026-12-02): Inductor fuses its
atomic adds into the kernels that produce the upstream gradients.
"""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor

from speedrun.kernels import embed_rows


def reference(tokens: Tensor, tables: list[Tensor]) -> list[Tensor]:
    """The lookups as the model writes them: autograd's dense backward for every table."""
    return [F.embedding(tokens, w) for w in tables]


def lookups(tokens: Tensor, tables: list[Tensor],
            table_sums: list[tuple[Tensor, Tensor] | None] | None = None, impl: str = "auto") -> list[Tensor]:
    """[F.embedding(tokens, w) for w in tables]. A table whose entry of `table_sums` is a (sum, scratch)
    pair (a trainer's `grad_accum.GradBuffers`) adds its gradient into the sum row by row
    (`embed_rows.lookup_into`, impl its kernel's choice) and gets none; the others, and all without
    table_sums, are `reference`'s."""
    if table_sums is None:
        return reference(tokens, tables)
    if len(table_sums) != len(tables):
        raise ValueError(f"embeddings.lookups: {len(table_sums)} sums for {len(tables)} tables")
    return [F.embedding(tokens, w) if s is None else embed_rows.lookup_into(tokens, w, *s, impl)
            for w, s in zip(tables, table_sums)]
