"""The HTML report as a real browser draws it: headless Chromium (Debian's `chromium`) through
`scripts/report_screenshot.sh`. The page loads offline without a console message, every embedded
plot decodes, and the screenshot shows the verdict banner, the tables and the plots.

Without Chromium the test is skipped, unless GRADALIGN_REQUIRE_CHROMIUM=1 (set by `.ci/run`,
which installs it), where a missing browser fails."""

from __future__ import annotations

import os
import re
import shutil
import subprocess

import pytest

from gradalign.config import TrainConfig
from gradalign.record.faults import get_fault
from gradalign.record.loop import train

from .conftest import ROOT, SMALL

SCRIPT = ROOT / "scripts" / "report_screenshot.sh"
# A copy of the page with the Content-Security-Policy removed and a probe that counts the images
# the browser decoded, written into the DOM once the page has loaded.
PROBE = (
    "<script>window.addEventListener('load', () => { const ok = [...document.images].filter("
    "i => i.complete && i.naturalWidth > 0).length; document.body.dataset.images = ok + '/' + "
    "document.images.length; });</script></body>"
)


@pytest.fixture(scope="module")
def browser() -> str:
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found is None:
        if os.environ.get("GRADALIGN_REQUIRE_CHROMIUM") == "1":
            pytest.fail("GRADALIGN_REQUIRE_CHROMIUM=1 but chromium is not installed")
        pytest.skip("chromium is not installed (apt-get install chromium)")
    return found


def _shoot(html, shot, size="1200,1400") -> tuple[str, str]:
    done = subprocess.run(
        ["bash", str(SCRIPT), str(html), str(shot), size],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    log = shot.with_name(shot.name + ".log").read_text(errors="replace")
    dom = shot.with_name(shot.name + ".dom.html").read_text(errors="replace")
    return log, dom


def _console(log: str) -> list[str]:
    return [line for line in log.splitlines() if "CONSOLE" in line or "net::ERR" in line]


def test_the_report_renders_in_chromium(browser, cli, tmp_path):
    base = train(SMALL.replace(accum_steps=1), tmp_path / "base")
    fault = get_fault("no-loss-scale", TrainConfig())
    merged = train(SMALL, tmp_path / "merged", fault=fault)
    html = tmp_path / "report.html"
    assert cli("compare", base, merged, "--reference", "none", "--html", html).code == 1

    shot = tmp_path / "shot.png"
    log, dom = _shoot(html, shot)
    assert _console(log) == []  # no script error, no refused or failed load
    assert "gradalign: FAIL" in dom and "loss-scale" in dom
    assert dom.count("<table") == 2 and len(re.findall(r'<img [^>]*src="data:image/png', dom)) == 3

    probe = tmp_path / "probe.html"
    text = re.sub(r"<meta http-equiv=\"Content-Security-Policy\"[^>]*>", "", html.read_text())
    probe.write_text(text.replace("</body>", PROBE))
    _, probed = _shoot(probe, tmp_path / "probe.png")
    assert 'data-images="3/3"' in probed  # every plot decoded

    from PIL import Image

    image = Image.open(shot).convert("RGB")
    assert image.size == (1200, 1400)
    r, g, b = image.getpixel((600, 30))  # the verdict banner: red for a failure
    assert r > 150 and g < 90 and b < 90, (r, g, b)
    assert len(image.getcolors(1 << 24)) > 500  # text, tables and plots, not a blank page


def test_the_console_check_can_fail(browser, tmp_path):
    page = tmp_path / "broken.html"
    page.write_text("<html><body><script>console.error('boom')</script></body></html>")
    log, _ = _shoot(page, tmp_path / "broken.png")
    assert any("boom" in line for line in _console(log))
