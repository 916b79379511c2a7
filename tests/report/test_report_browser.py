"""The report as a browser shows it: headless Chromium opens the tiny workflow's ``report.html`` (``tests/browser.py``)."""

from __future__ import annotations

import pytest
from browser import find_browser, open_in_browser

from qwen_onnx.report.plots import CAPTIONS

BROWSER = find_browser()
needs_browser = pytest.mark.skipif(BROWSER is None, reason="no Chromium on PATH (envs/setup.sh installs Debian's "
                                                           "chromium package where apt-get may run)")


@needs_browser
def test_the_probe_sees_a_broken_image_and_a_script_error(tmp_path):
    page = tmp_path / "broken.html"
    page.write_text("<html><head><title>t</title></head><body><figure><img alt='missing' src='data:image/png;base64,"
                    "AAAA'><figcaption>a caption</figcaption></figure><script>console.error('drawn wrong');"
                    "undefinedFunction();</script></body></html>")
    shown = open_in_browser(page, BROWSER)
    assert shown["images"] == [{"alt": "missing", "decoded": False, "width": 0, "height": 0, "caption": "a caption"}]
    assert shown["errors"][0] == "drawn wrong"
    assert "undefinedFunction" in shown["errors"][1]


@needs_browser
@pytest.mark.workflow
def test_the_report_shows_every_figure_decoded_and_captioned_without_a_console_error(finished_run):
    shown = open_in_browser(finished_run / "results" / "report.html", BROWSER)
    assert shown["errors"] == []
    assert shown["title"] == "qwen-onnx report"
    # every figure the report draws, each image decoded (a panel is 550 pixels wide), under its own caption
    assert [image["alt"] for image in shown["images"]] == list(CAPTIONS)
    for image in shown["images"]:
        assert image["decoded"] and image["width"] >= 550 and image["height"] >= 300, image
        assert image["caption"] == CAPTIONS[image["alt"]], image["alt"]
