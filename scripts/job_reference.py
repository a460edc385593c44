"""The job-key reference of docs/jobs.md, generated from the code so it cannot drift.

Keys, types and defaults come from the ``Job`` dataclass (``common/workload/job.py``), each key's meaning from the
comment on its line there (or, failing that, the comment lines directly above it); the builtin models and datasets from
the registries ``common.workload.models.MODELS`` and ``common.workload.datasets.DATASETS``. No TensorFlow is imported.

    python scripts/job_reference.py           # print the reference (Markdown)
    python scripts/job_reference.py --write   # replace the block between the markers in docs/jobs.md
    python scripts/job_reference.py --check   # exit 1 (one line) if docs/jobs.md's block is not what --write writes
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import io
import sys
import textwrap
import tokenize
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from common.workload import job as job_module  # noqa: E402
from common.workload.datasets import DATASETS  # noqa: E402
from common.workload.models import MODELS  # noqa: E402

JOB_SOURCE = REPO / "common" / "workload" / "job.py"
DOC = REPO / "docs" / "jobs.md"
START = "<!-- job-keys:start -->"
END = "<!-- job-keys:end -->"
TYPE_NAMES = {"str": "string", "int": "integer", "float": "float", "bool": "boolean",
              "tuple[int, ...]": "list of integers", "tuple[str, ...]": "list of strings", "dict[str, Any]": "table"}


def _comments(source: str) -> dict[int, str]:
    """Line number -> the text of the comment on that line (without '#')."""
    out: dict[int, str] = {}
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:
            out[tok.start[0]] = tok.string.lstrip("#").strip()
    return out


def _is_section_header(text: str) -> bool:
    return text.startswith("---") and text.endswith("---")


def _comment_above(lines: list[str], comments: dict[int, str], lineno: int) -> str:
    """The comment-only lines directly above ``lineno`` (a section header such as '# --- data ---' ends them)."""
    block: list[str] = []
    n = lineno - 1
    while n >= 1 and lines[n - 1].strip().startswith("#") and not _is_section_header(comments.get(n, "")):
        block.insert(0, comments[n])
        n -= 1
    return " ".join(block)


def field_docs(source: str) -> dict[str, tuple[str, str]]:
    """Job field -> (annotation, meaning): the trailing comment of its line, else the comment block above it."""
    tree = ast.parse(source)
    comments = _comments(source)
    lines = source.splitlines()
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Job")
    out: dict[str, tuple[str, str]] = {}
    for node in cls.body:
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            meaning = comments.get(node.end_lineno or node.lineno, "")
            out[node.target.id] = (ast.unparse(node.annotation), meaning or _comment_above(lines, comments,
                                                                                         node.lineno))
    return out


def toml_value(value: Any) -> str:
    """A default as it is written in a job file."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return f'"{value}"'
    if isinstance(value, tuple | list):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k} = {toml_value(v)}" for k, v in value.items()) + "}"
    return repr(value)


def cell(text: str) -> str:
    """Text safe in a Markdown table cell: pipes escaped, angle brackets as entities (not HTML tags)."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;").replace("|", "\\|")


def _para(text: str) -> str:
    """A prose paragraph wrapped at 116 columns, as the rest of the docs."""
    return textwrap.fill(text, width=116, break_on_hyphens=False, break_long_words=False)


def _codes(names: Any) -> str:
    return ", ".join(f"`{n}`" for n in names) or "none"


def key_table(docs: dict[str, tuple[str, str]]) -> list[str]:
    rows = ["| key | type | default | meaning |", "|---|---|---|---|"]
    for f in dataclasses.fields(job_module.Job):
        annotation, meaning = docs[f.name]
        kind = TYPE_NAMES.get(annotation, annotation)
        rows.append(f"| `{f.name}` | {kind} | `{toml_value(job_module.default_of(f.name))}` | {cell(meaning)} |")
    return rows


def registry_tables() -> list[str]:
    rows = [_para("Builtin models (`model`; any other name must be a `keras.applications` constructor, such as "
                  "`ResNet50`, built with `weights=None` from the applications of the job's Keras family: tf_keras', "
                  "or Keras 3's with `keras = 3`):"), "",
            "| model | what | job keys it reads |", "|---|---|---|"]
    rows += [f"| `{m.name}` | {cell(m.description)} | {_codes(m.job_fields)} |" for m in MODELS.values()]
    rows += ["", "Datasets (`dataset`):", "",
             "| dataset | what | needs `data_dir` | job keys it reads |", "|---|---|---|---|"]
    rows += [f"| `{d.name}` | {cell(d.description)} | {'yes' if d.needs_data_dir else 'no'} | "
             f"{_codes(d.job_fields)} |" for d in DATASETS.values()]
    return rows


def generate() -> str:
    """The Markdown between the markers (without them)."""
    docs = field_docs(JOB_SOURCE.read_text())
    lines = ["<!-- generated by scripts/job_reference.py --write from common/workload/job.py, "
             "common/workload/models.py and "
             "common/workload/datasets.py: edit those, not this block -->", ""]
    lines += key_table(docs)
    lines += ["", _para(f"Hashed only when the job's model or dataset reads them: {_codes(job_module.OPTIONAL_KEYS)}. "
                        "Hashed only when not at their default (added after jobs were first hashed): "
                        f"{_codes(job_module.LATER_KEYS)}. Never hashed: "
                        f"{_codes(job_module.UNHASHED_KEYS)}. A record is published, so it writes every home "
                        "directory as `~` (yours, and any `/home/USER`: the job's paths, the command line; "
                        "`common/core/privacy.py`), and the hash is of that form: a reader recomputing it from the "
                        "record's job gets the record's hash, and `data_dir = \"/home/alice/data\"` run by alice is "
                        "the job `\"~/data\"`."), ""]
    lines += registry_tables()
    return "\n".join(lines) + "\n"


def replace_block(text: str, block: str) -> str | None:
    """``text`` with the block between the markers replaced, or None when the markers are missing."""
    start, end = text.find(START), text.find(END)
    if start < 0 or end < start:
        return None
    return text[:start + len(START)] + "\n" + block + text[end:]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    mode = ap.add_mutually_exclusive_group()
    mode.add_argument("--write", action="store_true", help="replace the block between the markers in the doc")
    mode.add_argument("--check", action="store_true", help="exit 1 if the doc's block differs from the generated one")
    ap.add_argument("--doc", type=Path, default=DOC, help="the page holding the markers (default docs/jobs.md)")
    args = ap.parse_args(argv)
    block = generate()
    shown = args.doc.resolve().relative_to(REPO) if args.doc.resolve().is_relative_to(REPO) else args.doc
    if not (args.write or args.check):
        sys.stdout.write(block)
    else:
        text = args.doc.read_text() if args.doc.is_file() else ""
        new = replace_block(text, block)
        if new is None:
            print(f"{shown}: no '{START}' ... '{END}' block", file=sys.stderr)
            return 1
        if args.check:
            if new != text:
                print(f"{shown}: the job key reference is out of date; run python scripts/job_reference.py "
                      "--write", file=sys.stderr)
                return 1
            return 0
        args.doc.write_text(new)
    missing = [k for k, (_, meaning) in field_docs(JOB_SOURCE.read_text()).items() if not meaning]
    if missing:
        print(f"job_reference: no comment for job key(s) {', '.join(missing)} in common/workload/job.py",
              file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
