"""The layer map of docs/ARCHITECTURE.md, as the import-linter contracts in pyproject.toml state it:
the package keeps them, and an import planted against each (upward, in a circle, into the command
line) breaks that contract, so ``lint-imports`` in CI fails on it."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("importlinter")

ROOT = Path(__file__).resolve().parents[1]
LINT = "import sys; from importlinter.cli import lint_imports_command; sys.exit(lint_imports_command())"


def lint(package_root: Path) -> subprocess.CompletedProcess:
    """``lint-imports`` with the project's contracts over the ``xmesh`` package found in ``package_root``."""
    env = dict(os.environ, PYTHONPATH=str(package_root))
    return subprocess.run(
        [sys.executable, "-c", LINT, "--config", str(ROOT / "pyproject.toml"), "--no-cache"],
        cwd=package_root,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.fixture(scope="module")
def package_copy(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("tree")
    shutil.copytree(ROOT / "xmesh", root / "xmesh", ignore=shutil.ignore_patterns("__pycache__"))
    return root


def test_the_package_keeps_its_contracts():
    result = lint(ROOT)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Contracts: 3 kept, 0 broken." in result.stdout


@pytest.mark.parametrize(
    "module, planted, contract, shown",
    [
        # the results store reading the evaluation front-end: upward
        (
            "results/summary.py",
            "from xmesh.evaluate import evaluate_dataset",
            "xmesh layers",
            "xmesh.results.summary -> xmesh.evaluate",
        ),
        # the photo preparation reading the views that call it: a circle inside xmesh.photo
        (
            "photo/prepare.py",
            "from xmesh.photo.views import PhotoCameras",
            "no import circles",
            "No cycles are allowed in xmesh.photo",
        ),
        # the cluster executor reaching into the command line's helpers
        (
            "cluster/driver.py",
            "from xmesh.commands.common import resolve_weights",
            "only the command line",
            "xmesh.cluster.driver -> xmesh.commands.common",
        ),
    ],
)
def test_a_planted_import_breaks_its_contract(package_copy, module, planted, contract, shown):
    path = package_copy / "xmesh" / module
    original = path.read_text()
    path.write_text(f"{original}\n{planted}\n")
    try:
        result = lint(package_copy)
    finally:
        path.write_text(original)
    assert result.returncode != 0
    report = result.stdout
    broken = [line for line in report.splitlines() if line.endswith(" BROKEN") or " BROKEN (" in line]
    assert any(line.startswith(contract) for line in broken), report
    assert shown in report, report


def test_the_copy_without_a_planted_import_keeps_them(package_copy):
    """The copy itself is clean, so each planted import alone broke its contract."""
    result = lint(package_copy)
    assert result.returncode == 0, result.stdout + result.stderr
