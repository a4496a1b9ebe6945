"""Where `speedrun::add_rows_`'s Triton kernels and the reference differ on a GPU, at several launch shapes.

Run from the repository root: `python3 scripts/device/rows_debug.py`. For each shape it prints the
launch, how many elements of the sums differ, the column range they fall in, and a few of them: the
scratch value, the sum before, the kernel's sum and the reference's, and how many tokens share the
row. Used in the thirty-sixth session to find the race between the loads and the stored zeros
(docs/benchmarks.md)."""

import sys

import torch

sys.path.insert(0, "src")
from speedrun import embed_rows  # noqa: E402

SHAPES = [  # (V, D, N, launch overrides)
    (50304, 768, 49152, {"BLOCK_D": 128}), (50304, 768, 49152, {"BLOCK_D": 1024}),
    (50304, 768, 49152, {"BLOCK_T": 4}), (50304, 768, 4096, None), (5000, 768, 49152, None),
]


def case(V: int, D: int, N: int, gen: torch.Generator):
    """Skewed tokens (many repeats), a scratch table with sums on their rows, a bfloat16 total."""
    tokens = (torch.randint(0, V, (N,), generator=gen) ** 2 // V).to(torch.int32)
    scratch = torch.zeros(V, D)
    scratch[tokens.long()] = torch.randn(N, D, generator=gen) * 3
    total = torch.randn(V, D, generator=gen).to(torch.bfloat16)
    return tokens.cuda(), scratch.cuda(), total.cuda()


def main() -> None:
    gen = torch.Generator().manual_seed(0)
    for V, D, N, cfg in SHAPES:
        tokens, scratch, total = case(V, D, N, gen)
        s2, t2, s0, t0 = scratch.clone(), total.clone(), scratch.clone(), total.clone()
        embed_rows.launch(tokens, scratch, total, cfg)
        embed_rows.reference(tokens, s2, t2)
        d = (total.view(torch.int16) != t2.view(torch.int16)).nonzero()
        cols = f"columns {d[:, 1].min().item()}-{d[:, 1].max().item()}" if len(d) else "no columns"
        print(f"V={V} D={D} N={N} {cfg}: {len(d)} elements differ ({cols}); scratch left nonzero: "
              f"{int((scratch != 0).sum())}, reference {int((s2 != 0).sum())}")
        for r, c in d[:2].tolist():
            print(f"  row {r} col {c}: scratch {s0[r, c].item()}, before {t0[r, c].item()}, kernel "
                  f"{total[r, c].item()}, reference {t2[r, c].item()}, tokens on the row {int((tokens == r).sum())}")


if __name__ == "__main__":
    main()
