"""Headless Chromium for tests that look at a page as a person would (Debian's ``chromium`` package).

:func:`probe` loads a page with a small script added to a copy of it (the page itself holds none)
and returns what the script saw after the load event: every image's natural size, the sections
and the page height. :func:`dom_after` returns a page's DOM after it has run a while (e.g. a form
a script filled in and sent). :func:`screenshot` takes a picture of the page at a given window size.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

CANDIDATES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--hide-scrollbars",
    "--no-first-run",
    "--disable-extensions",
    "--disable-background-networking",
    "--mute-audio",
)
TIMEOUT_S = 120

PROBE = """<script>
window.addEventListener('load', function () {
  var images = Array.prototype.map.call(document.images, function (img) {
    return {src: img.getAttribute('src'), cls: img.className, complete: img.complete,
            width: img.naturalWidth, height: img.naturalHeight};
  });
  var sections = Array.prototype.map.call(document.querySelectorAll('section'), function (s) { return s.id; });
  var out = document.createElement('pre');
  out.id = 'xmesh-probe';
  out.textContent = JSON.stringify({images: images, sections: sections, title: document.title,
                                    height: document.documentElement.scrollHeight,
                                    text: document.body.innerText.length});
  document.body.appendChild(out);
});
</script>"""


def chromium() -> str | None:
    """The path of a Chromium (or Chrome) executable, or None."""
    for name in CANDIDATES:
        path = shutil.which(name)
        if path:
            return path
    return None


def needs_chromium(test):
    """Skip ``test`` where no Chromium is installed, except in CI (``CI`` set), whose ``.ci/run`` installs
    Debian's: there a missing browser fails the test rather than skipping the check."""
    import pytest

    missing = chromium() is None and not os.environ.get("CI")
    return pytest.mark.skipif(missing, reason="needs Chromium: apt-get install chromium (see README)")(test)


def _run(args: list[str]) -> subprocess.CompletedProcess:
    executable = chromium()
    if executable is None:
        raise AssertionError(f"no Chromium on the PATH (looked for {', '.join(CANDIDATES)}): apt-get install chromium")
    return subprocess.run([executable, *FLAGS, *args], capture_output=True, text=True, timeout=TIMEOUT_S)


def probe(page: Path) -> dict:
    """What a script sees in ``page`` after its load event (see the module docstring)."""
    page = Path(page)
    copy = page.with_name(f"_probe_{page.name}")
    text = page.read_text(encoding="utf-8")
    copy.write_text(text.replace("</body>", PROBE + "</body>", 1), encoding="utf-8")
    try:
        done = _run(["--virtual-time-budget=10000", "--dump-dom", copy.resolve().as_uri()])
    finally:
        copy.unlink()
    match = re.search(r'<pre id="xmesh-probe">(.*?)</pre>', done.stdout, re.S)
    if not match:
        raise AssertionError(f"chromium did not run the probe (rc {done.returncode}): {done.stderr[-2000:]}")
    return json.loads(
        match.group(1).replace("&quot;", '"').replace("&lt;", "<").replace("&gt;", ">").replace("&amp;", "&")
    )


def dom_after(page: Path, *flags: str, budget_ms: int = 10000) -> str:
    """The DOM of ``page`` once it has run for ``budget_ms`` of virtual time (network fetches pending
    hold that time still), loaded with Chromium's extra ``flags``."""
    done = _run([*flags, f"--virtual-time-budget={budget_ms}", "--dump-dom", Path(page).resolve().as_uri()])
    return done.stdout


def screenshot(page: Path, out: Path, width: int, height: int) -> Path:
    """A PNG of ``page`` in a ``width`` x ``height`` window."""
    done = _run(
        [f"--window-size={width},{height}", f"--screenshot={Path(out).resolve()}", Path(page).resolve().as_uri()]
    )
    if not Path(out).is_file():
        raise AssertionError(f"chromium wrote no screenshot (rc {done.returncode}): {done.stderr[-2000:]}")
    return Path(out)
