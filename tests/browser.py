"""The report as a person's browser shows it: headless Chromium (Debian's ``chromium`` package, which
``envs/setup.sh`` installs where it can) opens a copy of ``report.html`` with a probe script in its head, and
returns what the page showed.

The probe records every script error and ``console.error`` call from the first line on, and once the page has
loaded, each image's decoded size and the caption of its figure, into a ``<pre>`` that ``--dump-dom`` prints.
"""

from __future__ import annotations

import html
import json
import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

#: Debian's package installs ``chromium``; other systems name it otherwise.
BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")

PROBE = """<script>
window.__probeErrors = [];
window.addEventListener("error", e => window.__probeErrors.push(
  e.message ? String(e.message) : "failed to load " + ((e.target && (e.target.src || e.target.href)) || "a resource")
    .slice(0, 80)), true);
window.addEventListener("unhandledrejection", e => window.__probeErrors.push(String(e.reason)));
(function () {
  const error = console.error.bind(console);
  console.error = (...args) => { window.__probeErrors.push(args.map(String).join(" ")); error(...args); };
})();
window.addEventListener("load", () => {
  const images = Array.from(document.images).map(image => {
    const figure = image.closest("figure");
    const caption = figure && figure.querySelector("figcaption");
    return {alt: image.alt, decoded: image.complete && image.naturalWidth > 0, width: image.naturalWidth,
            height: image.naturalHeight, caption: caption ? caption.textContent.trim() : null};
  });
  const out = document.createElement("pre");
  out.id = "qwen-onnx-probe";
  out.textContent = JSON.stringify({title: document.title, images: images, errors: window.__probeErrors});
  document.body.appendChild(out);
});
</script>"""


def find_browser() -> str | None:
    """The path of a Chromium-family browser on ``PATH``, or None."""
    return next((path for name in BROWSERS if (path := shutil.which(name))), None)


def open_in_browser(page: str | os.PathLike, browser: str, timeout_s: float = 120.0) -> dict[str, Any]:
    """What headless ``browser`` shows of the HTML file ``page``: ``{"title": str, "images": [{"alt", "decoded",
    "width", "height" (pixels), "caption" (its figure's text, or None)}], "errors": [str]}``.

    Raises:
        RuntimeError: the browser printed no probe (it failed to start or to load the page); the message holds its
            stderr's last lines.
    """
    text = Path(page).read_text(encoding="utf-8")
    probed = re.sub(r"(<head[^>]*>)", lambda m: m.group(1) + PROBE, text, count=1, flags=re.IGNORECASE)
    if probed == text:
        probed = PROBE + text
    with tempfile.TemporaryDirectory(prefix="qwen-onnx-browser-") as scratch:
        copy = Path(scratch) / "report.html"
        copy.write_text(probed, encoding="utf-8")
        run = subprocess.run(
            [browser, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run",
             f"--user-data-dir={scratch}/profile", "--virtual-time-budget=15000", "--dump-dom", copy.as_uri()],
            capture_output=True, text=True, timeout=timeout_s)
    found = re.search(r'<pre id="qwen-onnx-probe">(.*?)</pre>', run.stdout, flags=re.DOTALL)
    if found is None:
        tail = "\n".join(run.stderr.strip().splitlines()[-5:])
        raise RuntimeError(f"{browser} printed no probe (exit {run.returncode}): {tail}")
    return json.loads(html.unescape(found.group(1)))
