"""Run a page in headless Chromium: load it with a check script injected, read back what the script
recorded (``--dump-dom``), and screenshot the page in the state the script left it."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

BROWSERS = ("chromium", "chromium-browser", "google-chrome", "chrome")
ERRORS = """<script>window.__errors = [];
window.addEventListener("error", (e) => window.__errors.push(String(e.message)));</script>"""
RECORD = """<script>(function () {
  let out;
  try { out = (%s)(); } catch (e) { out = {exception: String(e && e.stack || e)}; }
  out.errors = window.__errors;
  const pre = document.createElement("pre");
  pre.id = "check-result"; pre.hidden = true; pre.textContent = JSON.stringify(out);
  document.body.append(pre);
})();</script>"""


def browser() -> str:
    """The Chromium binary, or skip the test saying how to get one."""
    for name in BROWSERS:
        path = shutil.which(name)
        if path:
            return path
    pytest.skip("no Chromium found: apt-get install -y chromium (.ci/run installs it when it can)")


def run_page(page: Path, check_js: str, screenshot: Path | None = None) -> dict:
    """Open a copy of ``page`` with ``check_js`` (a JS function expression returning a JSON-able
    object) run after the page's own scripts; returns that object (plus ``errors``: uncaught errors)."""
    html = page.read_text(encoding="utf-8")
    html = html.replace("<head>", "<head>" + ERRORS, 1).replace("</body>", RECORD % check_js + "</body>", 1)
    checked = page.with_name(page.stem + ".checked.html")
    checked.write_text(html, encoding="utf-8")
    profile = page.parent / ".chromium-profile"
    base = [
        browser(), "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-extensions",
        f"--user-data-dir={profile}", "--window-size=1280,2400",
    ]  # fmt: skip
    url = checked.resolve().as_uri()
    dom = subprocess.run([*base, "--dump-dom", url], capture_output=True, text=True, timeout=60, check=True)
    match = re.search(r'<pre id="check-result" hidden="">(.*?)</pre>', dom.stdout, re.S)
    assert match, f"the check script left no result; browser said: {dom.stderr[-2000:]}"
    import html as html_lib

    result = json.loads(html_lib.unescape(match.group(1)))
    if screenshot is not None:
        subprocess.run(
            [*base, f"--screenshot={screenshot}", url], capture_output=True, timeout=60, check=True
        )
        assert screenshot.is_file() and screenshot.stat().st_size > 10_000, "no screenshot written"
    return result
