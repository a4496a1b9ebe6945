"""Where `softcap_ce.launch_transposed`'s two layouts disagree (issue 4, nineteenth session).

The seventeenth and eighteenth sessions' head benches printed "transpose exact False": the (V, N)
gradient the tile kernel stores is not byte for byte the transpose of its own (N, V) gradient. This
script counts the differing bytes at the record's size and at small shapes, for every tile shape, and
prints the first few (row, column, row-major byte, transposed byte, logit, target). Its nineteenth-session
run (docs/runs/2026-12-01-h200-s/call3/) was of commit 35c7a95's kernel, byte-wise and packed
(TILE_CONFIG["PACK"], since removed); the kernel now only packs, with the words built in inline PTX.
Usage: python3 ce_transposed_check.py OUT.json
"""

import json
import sys

import torch

from speedrun import softcap_ce as sc

TILES = [(64, 256, 8), (64, 128, 4), (32, 256, 4), (128, 128, 8)]


def inputs(n, v, seed):
    g = torch.Generator("cuda").manual_seed(seed)
    z = (torch.randn(n, v, generator=g, device="cuda") * 8).bfloat16()
    t = torch.randint(0, min(v, 50257), (n,), generator=g, device="cuda")
    t[5 % n] = sc.IGNORE_INDEX
    return z, t


def compare(z, t, tile):
    sc.TILE_CONFIG.update(BLOCK_M=tile[0], BLOCK_V=tile[1], num_warps=tile[2])
    _, g, gt = sc.launch_transposed(z, t, 30.0, torch.float8_e5m2, 448.0)
    torch.cuda.synchronize()
    a, b = g.view(torch.uint8), gt.view(torch.uint8).T  # both (N, V)
    bad = []
    count = 0
    for i in range(0, a.shape[0], 4096):
        d = (a[i:i + 4096] != b[i:i + 4096]).nonzero()
        count += d.shape[0]
        for r, c in d[:8 - len(bad)].tolist():
            bad.append({"row": i + r, "col": c, "row_major": int(a[i + r, c]), "transposed": int(b[i + r, c]),
                        "z": float(z[i + r, c]), "target": int(t[i + r])})
    nan = int(torch.isnan(g.float()[:4096]).sum())
    return {"tile": tile, "differing": count, "fraction": count / a.numel(), "first": bad,
            "nan_in_first_4096_rows": nan}


def main(path):
    keep = dict(sc.TILE_CONFIG)
    res = []
    for n, v in ((256, 512), (4096, 50304), (49152, 50304)):
        z, t = inputs(n, v, 3)
        for tile in TILES:
            r = compare(z, t, tile)
            r["shape"] = (n, v)
            res.append(r)
            print(n, v, tile, "differing", r["differing"], r["first"][:3], flush=True)
        del z, t
    sc.TILE_CONFIG.clear()
    sc.TILE_CONFIG.update(keep)
    json.dump(res, open(path, "w"), indent=1)


if __name__ == "__main__":
    main(sys.argv[1])
