"""The README's Python snippets read only names they define, import or get from Python itself, and
no paragraph runs into the heading after it."""
from __future__ import annotations

import builtins
import re
import symtable
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"


def python_blocks(text: str) -> list[str]:
    return re.findall(r"^```python\n(.*?)^```", text, flags=re.M | re.S)


def undefined_names(code: str) -> set[str]:
    """Names a snippet reads at module level or in its functions that nothing in it binds."""
    table = symtable.symtable(code, "<readme>", "exec")
    bound = {s.get_name() for s in table.get_symbols() if s.is_assigned() or s.is_imported()}
    read: set[str] = set()
    tables = [table]
    while tables:
        current = tables.pop()
        tables.extend(current.get_children())
        read |= {s.get_name() for s in current.get_symbols()
                 if s.is_referenced() and (current is table or s.is_global())}
    return read - bound - set(dir(builtins))


@pytest.mark.parametrize("index", range(len(python_blocks(README.read_text(encoding="utf-8")))))
def test_each_python_snippet_defines_what_it_reads(index):
    code = python_blocks(README.read_text(encoding="utf-8"))[index]
    assert not undefined_names(code), code


def test_the_snippet_check_finds_an_undefined_name():
    assert undefined_names("import xmesh\nmeshes = xmesh.f([imgs_a], [cams_a])\n") == {"imgs_a", "cams_a"}


def test_no_paragraph_runs_into_a_heading():
    lines = README.read_text(encoding="utf-8").splitlines()
    fenced = False
    for number, line in enumerate(lines):
        if line.startswith("```"):
            fenced = not fenced
        if fenced or not line.startswith("#"):
            continue
        before = next((lines[i] for i in range(number - 1, -1, -1) if lines[i].strip()), "")
        assert not before.rstrip().endswith(":"), f"README line {number}: {before!r} runs into {line!r}"
