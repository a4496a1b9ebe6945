"""Embedding lookups: the reference is the plain lookups, and `lookups` sends a table's gradient into a
trainer's sum row by row exactly where it is given a (sum, scratch) pair (embed_rows), elsewhere to
autograd's dense backward."""

import pytest
import torch

from speedrun.kernels import embeddings as E


def test_reference_is_the_plain_lookups():
    tok = torch.tensor([3, 0, 3, 1])
    tables = [torch.randn(5, 4) for _ in range(2)]
    for got, w in zip(E.reference(tok, tables), tables):
        assert torch.equal(got, w[tok])


def test_lookups_take_the_rows_path_only_where_sums_are_given():
    gen = torch.Generator().manual_seed(0)
    tok = torch.tensor([3, 0, 3, 1, 3])
    tables = [torch.randn(5, 4, generator=gen, requires_grad=True) for _ in range(2)]
    up = [torch.randn(5, 4, generator=gen) for _ in tables]
    dense = torch.autograd.grad(sum((o * u).sum() for o, u in zip(E.reference(tok, tables), up)), tables)

    plain = E.lookups(tok, tables)  # no sums (a model without a trainer): the reference's lookups
    assert all(torch.equal(a, b) for a, b in zip(plain, E.reference(tok, tables)))

    total, scratch = torch.zeros(5, 4), torch.zeros(5, 4)
    out = E.lookups(tok, tables, [None, (total, scratch)])
    sum((o * u).sum() for o, u in zip(out, up)).backward()
    assert torch.equal(out[1], tables[1][tok])
    assert torch.equal(tables[0].grad, dense[0])  # None: autograd's dense backward
    assert tables[1].grad is None and torch.equal(total, dense[1]) and not scratch.any()  # into the sum
    with pytest.raises(ValueError, match="1 sums for 2 tables"):
        E.lookups(tok, tables, [None])
