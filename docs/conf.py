"""Sphinx settings of the xmesh manual: MyST pages, the API reference from the docstrings (autodoc,
NumPy style through napoleon), the command-line reference from xmesh's own argparse parser.

Built by .ci/run with warnings as errors; nitpicky for xmesh's own objects only (nothing is fetched,
so references to NumPy, SciPy or the standard library have no target and are not checked).
"""

import os
import sys

sys.path.insert(0, os.path.abspath(".."))

project = "xmesh"
author = "the xmesh developers"
copyright = "the xmesh developers"

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "sphinx.ext.autosummary",
    "sphinx.ext.napoleon",
    "sphinxarg.ext",
]
source_suffix = {".md": "markdown", ".rst": "restructuredtext"}
root_doc = "index"
exclude_patterns = ["_build", "_static/*.md"]
myst_enable_extensions = ["colon_fence", "deflist"]
myst_heading_anchors = 3
# help texts and docstrings keep their "--option" as written
smartquotes = False

# code blocks without a language (usage lines, shell sessions) are shown as written
highlight_language = "none"
html_theme = "furo"
html_title = "xmesh"
html_static_path = ["_static"]

autodoc_default_options = {"members": True, "undoc-members": True, "member-order": "bysource"}
autodoc_typehints = "signature"
autosummary_generate = False
napoleon_google_docstring = False
napoleon_numpy_docstring = True

nitpicky = True
# every reference to an xmesh object must resolve; others (NumPy, the standard library) cannot, offline
nitpick_ignore_regex = [(r"py:.*", r"(?!xmesh\b).*")]


def _drop_type_docstrings(app, what, name, obj, options, lines):
    """A constant without a doc comment shows its value alone, not the docstring of its type (str, tuple)."""
    doc = type(obj).__doc__
    own = doc.strip().splitlines() if isinstance(doc, str) else []
    if what in ("data", "attribute") and lines and own and lines[0].strip() == own[0].strip():
        lines.clear()


def _annotation_as_text(app, env, node, contnode):
    """A signature's type annotation naming an xmesh class the manual does not document shows as text;
    references a docstring makes (``:class:``, ``:func:``, type fields) must resolve."""
    if (
        node.get("refdomain") == "py"
        and "refexplicit" not in node.attributes
        and node.get("reftarget", "").startswith("xmesh.")
    ):
        return contnode
    return None


def setup(app):
    app.connect("autodoc-process-docstring", _drop_type_docstrings)
    app.connect("missing-reference", _annotation_as_text)
