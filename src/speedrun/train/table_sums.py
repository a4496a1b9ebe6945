"""The 2026 record's looked-up tables: their gradients summed over a step's micro-steps row by row.

The record's token, bigram and value tables (`RecordGPT.lookup_table_names`: 38.6M + 290M + 193M
bf16 entries at its size) are only looked up. Left to autograd, every micro-step's backward fills a
float32 table-sized buffer with zeros, scatters the tokens' gradient rows into it, casts the whole of
it to bf16, and AccumulateGrad then adds that into `.grad`: about 8 GB of memory traffic a micro-step
whatever the tokens (an H100's stage-0 profile, 2026-12-07, in ms a step: the value tables' table-sized
gradient kernel 9.4, the bf16 `.grad` adds of all parameters 9.4, zero fills 2.8), where a micro-step's
tokens touch a few percent of the rows.

Here each table gets a sum and a float32 scratch table of its shape, kept for the run, which the
micro-step's forward receives (`MicroLoss` passes them as `table_sums`); the model looks the table
up by `kernels.lookup` (`embed_rows.lookup_into`), whose backward adds the gradient rows into the
scratch and then only the touched rows, rounded to bf16, into the sum, and gives the table no
gradient. `start` readies the sums before a step's first micro-step and `finish` hands them to the
tables as `.grad` after the last, so the optimiser sees what autograd would have left there:

- an even step starts from zero; an odd step from the table's `.grad` as `RecordAdam.
  restore_pending_grads` left it (the even step's kept sum), onto which autograd would add;
- each micro-step's rows are float32 sums rounded once to bf16 and added as AccumulateGrad adds
  bf16 (`grad_accum.add_gradient`), the compiled dense path's values (`tests/test_table_sums.py`
  holds them to it bit for bit).

A `.grad` that is the sum itself at `start` is a step that never reached the optimiser (a fault
stopped it): it is dropped, not added onto. Where the kernels have no `lookup` (the CPU, the
references) the trainer makes no sums and autograd's dense path runs.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn


class TableSums:
    """A (sum, scratch) pair for each named table of `model` (`pairs`, by name, as the model's forward
    takes them), `start`ed before a step's micro-steps and `finish`ed after them (module docstring)."""

    def __init__(self, model: nn.Module, names: list[str]):
        named = dict(model.named_parameters())
        unknown = [n for n in names if n not in named]
        if unknown:
            raise ValueError(f"TableSums: the model has no parameter named {unknown[0]!r}")
        self.params = {n: named[n] for n in names}
        self.pairs: dict[str, tuple[Tensor, Tensor]] = {
            n: (torch.zeros_like(p), torch.zeros_like(p, dtype=torch.float32)) for n, p in self.params.items()}

    @torch.no_grad()
    def start(self) -> None:
        """Each sum from its table's `.grad` (an odd step's restored pending sum), else zero; `.grad` None."""
        for name, p in self.params.items():
            total = self.pairs[name][0]
            if p.grad is None or p.grad is total:
                total.zero_()
            else:
                total.copy_(p.grad)
            p.grad = None

    def finish(self) -> None:
        """The sums become the tables' `.grad`, for the optimiser."""
        for name, p in self.params.items():
            p.grad = self.pairs[name][0]
