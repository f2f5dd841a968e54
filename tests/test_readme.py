"""The README's and the manual's Python snippets read only names they define, import or get from
Python itself, and no paragraph runs into the heading after it."""

from __future__ import annotations

import builtins
import re
import symtable
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def python_blocks(text: str) -> list[str]:
    return re.findall(r"^```python\n(.*?)^```", text, flags=re.M | re.S)


SNIPPETS = [(page, code) for page in PAGES for code in python_blocks(page.read_text(encoding="utf-8"))]


def undefined_names(code: str) -> set[str]:
    """Names a snippet reads at module level or in its functions that nothing in it binds."""
    table = symtable.symtable(code, "<snippet>", "exec")
    bound = {s.get_name() for s in table.get_symbols() if s.is_assigned() or s.is_imported()}
    read: set[str] = set()
    tables = [table]
    while tables:
        current = tables.pop()
        tables.extend(current.get_children())
        read |= {
            s.get_name() for s in current.get_symbols() if s.is_referenced() and (current is table or s.is_global())
        }
    return read - bound - set(dir(builtins))


@pytest.mark.parametrize(("page", "code"), SNIPPETS, ids=[f"{p.name}-{i}" for i, (p, _) in enumerate(SNIPPETS)])
def test_each_python_snippet_defines_what_it_reads(page, code):
    assert not undefined_names(code), f"{page.name}:\n{code}"


def test_the_snippet_check_finds_an_undefined_name():
    assert len(SNIPPETS) >= 3
    assert undefined_names("import xmesh\nmeshes = xmesh.f([imgs_a], [cams_a])\n") == {"imgs_a", "cams_a"}


@pytest.mark.parametrize("page", PAGES, ids=[p.name for p in PAGES])
def test_no_paragraph_runs_into_a_heading(page):
    lines = page.read_text(encoding="utf-8").splitlines()
    fenced = False
    for number, line in enumerate(lines, start=1):
        if line.startswith("```"):
            fenced = not fenced
        if fenced or not line.startswith("#"):
            continue
        before = next((lines[i] for i in range(number - 2, -1, -1) if lines[i].strip()), "")
        assert not before.rstrip().endswith(":"), f"{page.name} line {number}: {before!r} runs into {line!r}"
