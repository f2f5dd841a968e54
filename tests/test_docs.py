"""The manual (docs/, Sphinx): every public name is in its API reference. The manual is built here
into a temporary folder and its inventory (objects.inv, what Sphinx indexed) is read back; .ci/run
builds it again with warnings as errors."""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import os
import pkgutil
import re
import zlib
from pathlib import Path

import pytest

import xmesh

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
REFERENCE_PAGES = ("api.md", "internals.md")
TOOLS = ("sphinx", "myst_parser", "furo", "sphinxarg")  # the docs extra
# Sphinx's own deprecation notices about its extensions, raised while the manual builds
pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore::PendingDeprecationWarning")


def documented_modules() -> list[str]:
    """The modules the reference pages document with ``automodule``."""
    text = "\n".join((DOCS / page).read_text(encoding="utf-8") for page in REFERENCE_PAGES)
    return re.findall(r"^\.\. automodule:: (\S+)$", text, flags=re.M)


def read_inventory(path: Path) -> set[str]:
    """The Python objects' names in a Sphinx objects.inv (version 2: four header lines, then zlib)."""
    body = path.read_bytes().split(b"\n", 4)[4]
    entries = [line.split(" ", 2) for line in zlib.decompress(body).decode("utf-8").splitlines()]
    return {name for name, role, _ in entries if role.startswith("py:")}


def resolve(dotted: str):
    """The object a dotted name stands for: the longest importable module, then attributes."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for attribute in parts[cut:]:
            obj = getattr(obj, attribute, None)
        return obj
    return None


def public_names(module) -> list[str]:
    """``__all__``, else the classes and functions the module itself defines without a leading underscore."""
    if hasattr(module, "__all__"):
        return list(module.__all__)
    return [
        name
        for name, obj in vars(module).items()
        if not name.startswith("_")
        and (inspect.isclass(obj) or inspect.isfunction(obj))
        and obj.__module__ == module.__name__
    ]


@pytest.fixture(scope="module")
def documented(tmp_path_factory):
    """The manual built once (nitpicky): the names in its inventory, the ids of the objects they stand for,
    and its warnings."""
    missing = [name for name in TOOLS if importlib.util.find_spec(name) is None]
    if missing:
        if os.environ.get("CI"):
            pytest.fail(f"the docs extra is not installed ({', '.join(missing)} missing): pip install '.[docs]'")
        pytest.skip(f"needs the docs extra: pip install '.[docs]' ({', '.join(missing)} missing)")
    from sphinx.cmd.build import build_main

    out = tmp_path_factory.mktemp("manual")
    warnings = out / "warnings.txt"
    status = build_main(["-q", "-n", "-w", str(warnings), "-b", "html", str(DOCS), str(out / "html")])
    assert status == 0, f"sphinx-build failed: {warnings.read_text()}"
    names = read_inventory(out / "html" / "objects.inv")
    return names, {id(resolve(name)) for name in names}, warnings.read_text()


def test_the_manual_builds_without_warnings(documented):
    """What .ci/run's ``sphinx-build -W -n`` refuses: a docstring's reference to an xmesh object the
    manual does not document, a docstring docutils cannot parse, a page outside every toctree."""
    assert not documented[2], documented[2]


def is_documented(documented, qualified: str, obj) -> bool:
    names, objects, _ = documented
    canonical = f"{getattr(obj, '__module__', '')}.{getattr(obj, '__qualname__', '')}"
    return (
        qualified in names
        or canonical in names
        or (inspect.ismodule(obj) and obj.__name__ in names)
        or id(obj) in objects
    )


def test_every_name_of_xmesh_all_is_in_the_api_reference(documented):
    assert set(xmesh.__all__) >= {"reconstruct", "Reconstructor", "Mesh"}
    missing = [name for name in xmesh.__all__ if not is_documented(documented, f"xmesh.{name}", getattr(xmesh, name))]
    assert not missing, f"xmesh.__all__ names without an entry in docs/api.md: {missing}"


def test_every_public_name_of_the_documented_modules_is_in_the_reference(documented):
    modules = documented_modules()
    assert len(modules) > 20 and "xmesh.cameras" in modules
    missing = []
    for module_name in modules:
        module = importlib.import_module(module_name)
        for name in public_names(module):
            if not is_documented(documented, f"{module_name}.{name}", getattr(module, name)):
                missing.append(f"{module_name}.{name}")
    assert not missing, f"public names the manual does not document: {missing}"


def test_every_module_that_declares_its_public_names_is_documented():
    """A module with an ``__all__`` says it is public: it belongs in the reference pages."""
    declared = []
    for info in pkgutil.walk_packages(xmesh.__path__, "xmesh.", onerror=lambda name: None):
        if info.name.endswith("__main__"):
            continue  # running it is the command line
        try:
            module = importlib.import_module(info.name)
        except ImportError:  # it needs an extra that is not installed here
            continue
        if hasattr(module, "__all__"):
            declared.append(info.name)
    assert "xmesh.metrics" in declared
    undocumented = sorted(set(declared) - set(documented_modules()))
    assert not undocumented, f"modules with an __all__ that docs/api.md or docs/internals.md leaves out: {undocumented}"
