"""Which generated Triton kernels were compiled without 16-byte alignment hints on a pointer argument.

Inductor writes, in each kernel's `triton_meta`, the argument signature and the arguments it may assume
16-byte divisible (`'configs': [{(0,): [['tt.divisibility', 16]], ...}]`). A pointer argument missing
there is one Inductor could not prove aligned (a view at an odd offset, or a custom op's output once any
of its inputs was such a view), and Triton then emits narrower loads for it. On 2026-12-02 (`ae2e367`)
half the layers' FlexAttention forward were found compiled that way. This script lists every such kernel in
an Inductor cache folder, so the next one is found by a scan rather than by a profile.

    python3 scripts/kernel_alignment.py INDUCTOR_CACHE_DIR [--json OUT]

Each distinct kernel (name and metadata) is listed once, with the pointer arguments it may not assume
aligned. Scalar loads of a single element (an argument named like `in_ptr` whose kernel reads one
value) also appear; whether a listed argument matters is for the reader, with the profile beside it.
"""

import argparse
import json
import os
import re
import sys

META = re.compile(r"triton_meta=\{'signature': \{(?P<sig>[^}]*)\}.*?'configs': \[(?P<cfg>\{.*?\})\]", re.S)
SIG_ITEM = re.compile(r"'(?P<name>\w+)': '(?P<type>[^']*)'")
DIVISIBLE = re.compile(r"\((?P<idx>\d+),\): \[\['tt\.divisibility', 16\]\]")
DEF = re.compile(r"\ndef (?P<name>triton_\w+)\(")


def kernels_in(text):
    """(kernel name, signature [(arg, type)], divisible argument indices) for each kernel in a source."""
    for m in META.finditer(text):
        d = DEF.search(text, m.end())
        if d is None:
            continue
        sig = [(s["name"], s["type"]) for s in SIG_ITEM.finditer(m["sig"])]
        div = {int(x["idx"]) for x in DIVISIBLE.finditer(m["cfg"])}
        yield d["name"], sig, div


def unaligned(sig, div):
    """The pointer arguments of a signature not among the divisible indices."""
    return [name for i, (name, typ) in enumerate(sig) if typ.startswith("*") and i not in div]


def scan(root):
    """{kernel name: sorted unaligned pointer args} over every .py file under root, each kernel once."""
    seen, found = set(), {}
    for folder, _, files in os.walk(root):
        for f in files:
            if not f.endswith(".py"):
                continue
            with open(os.path.join(folder, f), errors="replace") as fh:
                text = fh.read()
            for name, sig, div in kernels_in(text):
                key = (name, tuple(sig), tuple(sorted(div)))
                if key in seen:
                    continue
                seen.add(key)
                bad = unaligned(sig, div)
                if bad:
                    found.setdefault(name, set()).update(bad)
    return {k: sorted(v) for k, v in sorted(found.items())}, len(seen)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("root", help="an Inductor cache folder (TORCHINDUCTOR_CACHE_DIR)")
    p.add_argument("--json", help="write the result here as JSON")
    a = p.parse_args(argv)
    if not os.path.isdir(a.root):
        sys.exit(f"kernel_alignment: {a.root}: not a folder")
    found, total = scan(a.root)
    print(f"{total} distinct kernels, {len(found)} with a pointer argument not assumed 16-byte aligned")
    for name, args in found.items():
        print(f"  {name}: {', '.join(args)}")
    if a.json:
        with open(a.json, "w") as fh:
            json.dump({"kernels": total, "unaligned": found}, fh, indent=1)


if __name__ == "__main__":
    main()
