"""The monthly audit as a person sees it: rendered by headless Chromium (Debian `chromium`) at a desktop width
(1280 px) and a phone width (400 px), measured by a probe script added to a copy of the page (the report itself
has no script). Checked: the headline, page 1's caveat (how much of the month was observed), the coverage banner
and the executive summary are there (banner and summary before the first figure), the page does not scroll
sideways, no table runs off the screen (on a phone each row is a card of "Header: value" lines), every chart is
drawn with its text large enough to read.
The phone width is an iframe of 400 px: Chromium's headless window is at least 500 px wide."""

from __future__ import annotations

import io
import json
import re
import shutil
import subprocess

import pytest

from gpufinops.demo.run import run_demo
from gpufinops.report import write_monthly_report
from gpufinops.store.store import Store
from tests.report.test_report import MONTH, NOW

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="needs Debian's chromium (.ci/run installs it)")

PROBE = """<script>
window.addEventListener('load', function () {
  var doc = document.documentElement, out = {viewport: window.innerWidth, page: doc.scrollWidth, tables: [], charts: []};
  document.querySelectorAll('table').forEach(function (t) {
    var wrap = t.parentElement;
    out.tables.push({right: t.getBoundingClientRect().right, scrolls: wrap.scrollWidth > wrap.clientWidth + 1,
                     labelled: t.querySelectorAll('td[data-label]').length, cells: t.querySelectorAll('td').length});
  });
  document.querySelectorAll('.chart img').forEach(function (i) {
    out.charts.push({shown: i.getBoundingClientRect().width, natural: i.naturalWidth, src: i.currentSrc.slice(0, 40)});
  });
  var h = document.querySelector('#headline');
  out.headline = h ? h.textContent : '';
  ['finance', 'observed', 'coverage', 'summary', 'toc'].forEach(function (id) {
    var e = document.getElementById(id), box = e ? (id === 'summary' ? e.nextElementSibling : e) : null;
    out[id] = box ? {text: box.textContent, right: box.getBoundingClientRect().right,
                     scrolls: box.scrollWidth > box.clientWidth + 1, top: box.getBoundingClientRect().top} : null;
  });
  var table = document.querySelector('#finance table');
  out.finance_table_top = table ? table.getBoundingClientRect().top : null;
  var first = document.querySelector('.card');
  out.first_card_top = first ? first.getBoundingClientRect().top : null;
  out.title = (document.querySelector('h1') || {}).textContent || '';
  var pre = document.createElement('pre'); pre.id = 'probe'; pre.textContent = JSON.stringify(out);
  (window.parent === window ? document.body : window.parent.document.body).appendChild(pre);
});
</script>"""


@pytest.fixture(scope="module")
def page(tmp_path_factory):
    """A real month (the demo's simulated hours through the real pipeline), its HTML with the probe added."""
    out = tmp_path_factory.mktemp("browser")
    db = out / "demo.db"
    run_demo(out=io.StringIO(), hours=3, db_path=str(db), quiet=True)
    store = Store(f"sqlite:///{db}")
    try:
        paths = write_monthly_report(store, MONTH, out, NOW, formats=["html"])
    finally:
        store.close()
    html = paths[0].read_text()
    probed = out / "probed.html"
    probed.write_text(html.replace("</body>", PROBE + "</body>"))
    (out / "phone.html").write_text('<!DOCTYPE html><html><body style="margin:0">'
                                    '<iframe src="probed.html" style="width:400px;height:900px;border:0"></iframe>'
                                    '</body></html>')
    return out


def measure(url: str, width: int) -> dict:
    dom = subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--allow-file-access-from-files",
                          f"--window-size={width},900", "--virtual-time-budget=5000", "--dump-dom", url],
                         capture_output=True, text=True, timeout=120).stdout
    found = re.search(r'<pre id="probe">(.*?)</pre>', dom, re.S)
    assert found, f"the probe did not run: {dom[:300]!r}"
    return json.loads(found.group(1).replace("&quot;", '"').replace("&amp;", "&"))


@pytest.mark.parametrize("width", [1280, 400])
def test_the_report_reads_at_desktop_and_phone_widths(page, width):
    url = (page / ("probed.html" if width > 500 else "phone.html")).as_uri()
    seen = measure(url, width)
    assert seen["viewport"] == width
    assert "GPU FinOps audit" in seen["title"] and MONTH in seen["title"] and "Headline" in seen["headline"]
    assert seen["page"] <= width  # nothing makes the page scroll sideways
    assert seen["tables"], "the month has tables"
    for t in seen["tables"]:
        assert t["labelled"] == t["cells"]  # every cell knows its column's header
        assert not t["scrolls"] and t["right"] <= width, t  # no table runs off the screen, none scrolls inside
    # The coverage banner (a partial month: 3 simulated hours, no billing) and the executive summary come
    # before the first figure, and fit the width.
    for box in ("finance", "observed", "coverage", "summary", "toc"):
        assert seen[box], f"#{box} missing"
        assert seen[box]["right"] <= width and not seen[box]["scrolls"], (box, seen[box])
    assert "cover part of" in seen["coverage"]["text"] and "Top actions" in seen["summary"]["text"]
    assert seen["finance"]["top"] < seen["coverage"]["top"] < seen["summary"]["top"] < seen["first_card_top"]
    assert "For finance" in seen["finance"]["text"] and "In plain words" in seen["finance"]["text"]
    # Page 1 says first how little of the month its figures saw (issue 35), on a phone as on a desktop: inside
    # the finance section, before its figures, within the first screen.
    observed = " ".join(seen["observed"]["text"].split())
    assert observed.startswith("Observed: 3.0 h of 720 h (0.4%) of September 2022")
    assert "whole month" not in seen["finance"]["text"]
    assert seen["finance"]["top"] < seen["observed"]["top"] < seen["finance_table_top"] < seen["coverage"]["top"]
    assert seen["observed"]["top"] < 900
    # Page 1 in plain words for finance (issue 40): its four teams under "Spend by team", no "Top 4 team(s)", no
    # "Rows in a fixed order." under its figures.
    finance = " ".join(seen["finance"]["text"].split())
    assert "Spend by team" in finance and "team(s)" not in finance and "Rows in a fixed order" not in finance
    assert len(seen["charts"]) == 3
    for c in seen["charts"]:
        assert 0 < c["shown"] <= width
        # Drawn for about this width: shrunk to under half its pixels, 8-pt text would read at ~4 px.
        assert c["shown"] / c["natural"] >= 0.6, c



@pytest.mark.parametrize("width", [1280, 400])
def test_page_one_as_a_picture_has_its_figures_and_teams_on_the_first_screen(page, width, tmp_path):
    """A screenshot of the first screen, as a person opening the report sees it: ink across the page (not a blank
    or clipped render), and the probe says the team table starts on it at a desktop width."""
    from PIL import Image

    url = (page / ("probed.html" if width > 500 else "phone.html")).as_uri()
    shot = tmp_path / f"page1-{width}.png"
    subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--allow-file-access-from-files",
                    "--hide-scrollbars", f"--window-size={max(width, 500)},900", "--virtual-time-budget=5000",
                    f"--screenshot={shot}", url], capture_output=True, timeout=120, check=True)
    with Image.open(shot) as img:
        grey = img.convert("L").crop((0, 0, width, 900))
        columns = [sum(1 for y in range(0, 900, 3) if grey.getpixel((x, y)) < 128) for x in range(0, width, 4)]
        inked = [x for x, n in enumerate(columns) if n]
        # Text from the left margin to well across the width, and nothing drawn past the page's own width.
        assert inked and inked[0] * 4 < 0.1 * width and inked[-1] * 4 > 0.6 * width, (inked[:3], inked[-3:])
