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
    assert len(seen["charts"]) == 3
    for c in seen["charts"]:
        assert 0 < c["shown"] <= width
        # Drawn for about this width: shrunk to under half its pixels, 8-pt text would read at ~4 px.
        assert c["shown"] / c["natural"] >= 0.6, c

