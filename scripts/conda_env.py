"""Writes a variant of environment.yml (conda-forge's prebuilt TensorFlow 2.21 + Horovod 0.28.1) to stdout.

    python scripts/conda_env.py --cuda 13.0 --mpi mpich > env.yml && conda env create -f env.yml

Only the variants conda-forge builds (conda-forge/horovod-feedstock at main 8423402: .ci_support/ lists CUDA 12.9,
13.0 and CPU x Open MPI, MPICH x Python 3.10-3.12, linux-64); another choice is one line on stderr and exit 2, and
nothing is written. Pure Python, no conda needed: the file it writes has never been solved here either.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

ENVIRONMENT = Path(__file__).resolve().parent.parent / "environment.yml"
CUDA = ("12.9", "13.0", "cpu")
MPI = ("openmpi", "mpich")
PYTHON = ("3.10", "3.11", "3.12")
MPI_PIN = {"openmpi": "openmpi=5", "mpich": "mpich=5"}


class VariantError(ValueError):
    """A variant conda-forge does not build."""


def variant(text: str, cuda: str, mpi: str, python: str) -> str:
    """environment.yml's text with the python, tensorflow, cuda-version, horovod and MPI lines of the variant."""
    for name, value, choices in (("--cuda", cuda, CUDA), ("--mpi", mpi, MPI), ("--python", python, PYTHON)):
        if value not in choices:
            raise VariantError(f"{name} {value}: conda-forge builds horovod 0.28.1 for {', '.join(choices)} only")
    kind = "cpu" if cuda == "cpu" else "cuda"
    tf_build = "cpu_*" if cuda == "cpu" else f"cuda{cuda.replace('.', '')}*"
    lines = {
        "python": f"python={python}",
        "tensorflow": f"tensorflow=2.21.0={tf_build}",
        "horovod": f"horovod[version='0.28.1',build='{kind}_mpi_{mpi}_*',build_number='>=21']",
        "mpi": MPI_PIN[mpi],
    }
    out = []
    for line in text.splitlines(keepends=True):
        m = re.match(r"^(\s*-\s*)(python|tensorflow|cuda-version|horovod|openmpi|mpich)[=\[]([^\s#]*)(.*)$", line, re.S)
        if not m:
            out.append(line)
            continue
        lead, name, _, rest = m.groups()
        if name == "cuda-version":
            if cuda != "cpu":
                out.append(f"{lead}cuda-version={cuda}{rest}")
            continue
        key = "mpi" if name in MPI else name
        out.append(f"{lead}{lines[key]}{rest}")
    return "".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cuda", default="12.9", help=f"one of {', '.join(CUDA)} (default 12.9)")
    ap.add_argument("--mpi", default="openmpi", help=f"one of {', '.join(MPI)} (default openmpi)")
    ap.add_argument("--python", default="3.12", help=f"one of {', '.join(PYTHON)} (default 3.12)")
    args = ap.parse_args(argv)
    try:
        text = variant(ENVIRONMENT.read_text(), args.cuda, args.mpi, args.python)
    except VariantError as e:
        print(f"conda_env: {e}", file=sys.stderr)
        return 2
    sys.stdout.write(f"# Written by scripts/conda_env.py --cuda {args.cuda} --mpi {args.mpi} --python {args.python}\n")
    sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
