"""The PyPI distribution is `xmesh-p2mpp` (`xmesh` on PyPI is someone else's package): every install
hint in the code, README, docs, scripts and examples names it, and the installed metadata agrees."""

from __future__ import annotations

import importlib.metadata
import re
from pathlib import Path

import pytest

import xmesh

ROOT = Path(__file__).resolve().parents[1]
DISTRIBUTION = "xmesh-p2mpp"
SEARCHED = (
    "xmesh",
    "kernels",
    "README.md",
    "docs",
    "scripts",
    "examples",
    "asv_benchmarks/benchmarks",
    "asv_benchmarks/asv.conf.json",
    "asv_benchmarks/run_device.py",
    ".ci",
)
TEXT_SUFFIXES = {"", ".py", ".md", ".txt", ".sh", ".json", ".toml", ".cfg", ".rst", ".cu", ".cuh", ".html"}
OLD_HINT = re.compile(r"(?<![\w-])xmesh\[")  # `xmesh[extra]`, not `xmesh-p2mpp[extra]`


def _text_files():
    for name in SEARCHED:
        path = ROOT / name
        files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
        for file in files:
            if file.suffix in TEXT_SUFFIXES and "__pycache__" not in file.parts:
                yield file


def test_no_install_hint_names_the_old_distribution():
    files = list(_text_files())
    assert len(files) > 50 and ROOT / "README.md" in files  # the search reaches the repository
    found = [
        f"{file.relative_to(ROOT)}:{number}: {line.strip()}"
        for file in files
        for number, line in enumerate(file.read_text(errors="replace").splitlines(), 1)
        if OLD_HINT.search(line)
    ]
    assert not found, "install hints naming the PyPI package 'xmesh' (someone else's):\n" + "\n".join(found)


def test_the_pattern_finds_old_hints_and_passes_new_ones():
    assert OLD_HINT.search('pip install "xmesh[dask]"') and OLD_HINT.search("pip install xmesh[report]")
    assert not OLD_HINT.search(f'pip install "{DISTRIBUTION}[dask]"') and not OLD_HINT.search('pip install ".[dask]"')


def test_pyproject_names_the_distribution_and_keeps_the_command():
    text = (ROOT / "pyproject.toml").read_text()
    assert re.search(r'^name = "xmesh-p2mpp"$', text, re.M)
    assert re.search(r'^xmesh = "xmesh\.cli:command"$', text, re.M)  # main, then the process ends at once


def test_the_installed_distribution_is_xmesh_p2mpp():
    owners = importlib.metadata.packages_distributions().get("xmesh")
    if not owners:
        pytest.skip("xmesh is imported from a source tree, not installed (pip install . installs it)")
    assert set(owners) == {DISTRIBUTION}
    assert importlib.metadata.version(DISTRIBUTION) == xmesh.__version__
