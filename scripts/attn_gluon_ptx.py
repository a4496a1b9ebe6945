"""The sm_90 PTX of every `attn_gluon` kernel, compiled here without a GPU, to show that a change to the
kernels' source leaves what runs on the GPU untouched.

usage: PYTHONPATH=src python3 scripts/attn_gluon_ptx.py DIR [REFERENCE_DIR]

Writes one DIR/<kernel>-s<STAGES>-<docs dtype>.ptx per variant (the forward and dQ at both ring depths,
dK/dV at the model's two; the document ids as int32, the model's where they fit, and int64), stripped of
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

VARIANTS = [("fwd", 2), ("fwd", 3), ("dq", 2), ("dq", 3), ("dkdv", 2)]  # (kernel, STAGES)
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
        for which, stages in VARIANTS:
            kernel = A.compile_offline(which, {"STAGES": stages}, docs_dtype=docs)
            name = f"{which}-s{stages}-{docs}"
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
