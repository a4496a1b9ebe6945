"""The sm_90 PTX of every `attn_gluon` kernel variant, compiled here without a GPU, to show that a change
to the kernels' source leaves what runs on the GPU untouched.

usage: PYTHONPATH=src python3 scripts/attn_gluon_ptx.py DIR [REFERENCE_DIR]

Writes one DIR/<kernel>-s<STAGES>-q<Q_REG>-<docs dtype>.ptx per variant (the forward at both ring depths
and with Q in registers, its OVERLAP form, dQ at both depths and with Q in registers (DQ_Q_REG), dK/dV
plain and with lse, delta and ids through shared memory (DKDV_SMEM, named q1); docs as int64 and int32),
stripped of
what only debugging reads: `.loc` / `.file` lines, comments, the debug sections and the `$L__tmpN:` labels
that mark source lines. With REFERENCE_DIR (an earlier run's DIR, e.g. from the commit before the change),
compares the two file by file and exits 1 if any differs.

Why a script and not a test: a refactor is meant to keep the PTX identical, but a kernel change is meant
to alter it; the comparison is the evidence for the first kind (first used for `79c3465`).
Triton's version matters: run it under the GPU machine's Triton as well (a wheel installed with
`pip install --target`, put first on PYTHONPATH).
"""

import re
import sys
from pathlib import Path

from speedrun.kernels import attn_gluon as A
from speedrun.kernels.relu2_gluon import resource_usage

VARIANTS = [("fwd", 2, 0), ("fwd", 3, 0), ("fwd", 2, 1), ("fwd_overlap", 2, 0), ("fwd_overlap", 2, 1),
            ("dq", 2, 0), ("dq", 3, 0), ("dq", 2, 1), ("dkdv", 2, 0), ("dkdv", 2, 1)]
_DEBUG_LINE = re.compile(r"\s*(\.loc|\.file|//)|\$L__tmp\d+:$")


def plain_ptx(ptx: str) -> str:
    """The PTX without its debug sections, source-line records, comments and line-marker labels."""
    body = ptx.split(".section\t.debug")[0]
    return "\n".join(line for line in body.splitlines() if not _DEBUG_LINE.match(line.strip()))


def dump(out: Path) -> list[str]:
    """Compile every variant and write its plain PTX into out; a line per variant: registers, the stack
    ptxas spilled to (Triton-version dependent: Triton 3.6's dK/dV kernel has 48 bytes, 3.9's none) and
    shared memory."""
    out.mkdir(parents=True, exist_ok=True)
    lines = []
    for docs in ("i64", "i32"):
        for which, stages, q_reg in VARIANTS:
            kernel = A.compile_offline(which, {"STAGES": stages, "Q_REG": q_reg, "DQ_Q_REG": q_reg,
                                                 "DKDV_SMEM": q_reg},
                                       docs_dtype=docs)
            name = f"{which}-s{stages}-q{q_reg}-{docs}"
            (out / f"{name}.ptx").write_text(plain_ptx(kernel.asm["ptx"]))
            usage = resource_usage(kernel.asm["cubin"])
            lines.append(f"{name}: {usage['REG']} registers, {usage.get('STACK', 0)} B stack (spills), "
                         f"{usage.get('LOCAL', 0)} B local, {kernel.metadata.shared} B shared")
    return lines


def differing(out: Path, reference: Path) -> list[str]:
    """The names of the files in reference whose counterpart in out is missing or not the same text."""
    return [ref.name for ref in sorted(reference.glob("*.ptx"))
            if not (out / ref.name).exists() or (out / ref.name).read_text() != ref.read_text()]


def main(argv: list[str]) -> int:
    if len(argv) not in (2, 3):
        print(__doc__.split("\n\n")[1], file=sys.stderr)
        return 2
    if not A.available():
        print("attn_gluon_ptx: Triton's Gluon (Hopper) does not import here", file=sys.stderr)
        return 2
    out = Path(argv[1])
    print("\n".join(dump(out)))
    if len(argv) == 3:
        reference = Path(argv[2])
        if not any(reference.glob("*.ptx")):
            print(f"attn_gluon_ptx: {reference} holds no .ptx files", file=sys.stderr)
            return 2
        bad = differing(out, reference)
        print(f"{len(bad)} of {len(list(reference.glob('*.ptx')))} differ from {reference}" + (": " + ", ".join(bad) if bad else ""))
        return 1 if bad else 0
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
