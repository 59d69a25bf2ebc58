"""Write a MonthlyAudit as one self-contained HTML file, one CSV per table, and one JSON document.

Every user-controlled string (tag values, instance names, reasons) reaches the HTML only through
Jinja2 with autoescaping on, and the charts are PNG pixels, never markup. CSV cells that a spreadsheet
would run as a formula (=, +, -, @ first) are prefixed with a quote.
"""

from __future__ import annotations

import csv
import io
import json
import math
import re
import shutil
import subprocess
import tempfile
from datetime import timedelta
from pathlib import Path
from typing import Iterable

import pandas as pd
from jinja2 import Environment, FileSystemLoader, StrictUndefined

from ..config import REPORTS_DIR
from ..cost.slurm import NONE as SLURM_NONE
from ..model import FALSE_STOP_COST_H, RESTART_COST_S
from . import charts
from .audit import MonthlyAudit
from .formats import money as _money, num as _num, pct as _pct, plain_value, share as _share
from .observed import FORECAST_LABEL
from .sections import SORTED_BY
from .words import action_words, words

TEMPLATES_DIR = REPORTS_DIR
HTML_TEMPLATE = "monthly_audit.html.j2"
FORMATS = ("html", "csv", "json")  # written by default
ALL_FORMATS = (*FORMATS, "pdf")  # pdf: the HTML printed by headless Chromium (for attachments)
PDF_TIMEOUT_S = 120
STOPS_TOP = 15  # instances in the page's stops table; the rest are in the CSV
K8S_TOP = 15  # workloads in the page's Kubernetes table; the rest are in the CSV
# Tables whose CSV file is named otherwise than the table (gpu-audit-YYYY-MM-k8s-namespaces.csv).
CSV_NAMES = {"k8s_namespaces": "k8s-namespaces", "k8s_workloads": "k8s-workloads", "k8s_node_pools": "k8s-node-pools",
             "slurm_accounts": "slurm-accounts", "slurm_users": "slurm-users", "slurm_partitions": "slurm-partitions",
             "slurm_qos": "slurm-qos"}


def csv_tables(a: MonthlyAudit) -> dict[str, pd.DataFrame]:
    """The CSV files of the audit by file suffix (the table's name, or its CSV_NAMES entry)."""
    return {CSV_NAMES.get(name, name): df for name, df in a.tables().items()}


_FORMULA_START = ("=", "+", "-", "@", "\t", "\r")


def records(df: pd.DataFrame) -> list[dict]:
    return [{k: plain_value(v) for k, v in row.items()} for row in df.to_dict("records")]


def report_document(a: MonthlyAudit) -> dict:
    """The JSON document: the same numbers and tables as the HTML."""
    p = a.period
    return {
        "report": {
            "kind": "gpufinops monthly GPU audit", "month": p.month, "period_start": p.start.isoformat(),
            "period_end": p.end.isoformat(), "as_of": p.as_of.isoformat(), "generated_at": p.now.isoformat(),
            "partial_month": p.partial, "currency": a.currency, "rules": a.rules,
            "settings": a.options.model_dump(),
        },
        "headline": plain_value(a.headline),
        "coverage": plain_value(a.coverage),
        "summary": plain_value(a.summary),
        "finance": plain_value(a.finance),
        "previous_month": a.previous_month,
        "data_quality": plain_value(a.data_quality),
        "notes": list(a.notes),
        "tables": {name: records(df) for name, df in a.tables().items()},
    }


# --------------------------------------------------------------------------- files


def file_stem(month: str) -> str:
    return f"gpu-audit-{month}"


def _csv_cell(v):
    v = plain_value(v)
    if isinstance(v, str) and v.startswith(_FORMULA_START):
        return "'" + v
    return "" if v is None else v


def _write_atomic(path: Path, text: str) -> Path:
    """Readers (a web server, a mail job) never see half a file: write aside, then rename."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text, encoding="utf-8", newline="")
    tmp.replace(path)
    return path


# How a CSV column is written for finance (a spreadsheet): money to the cent with the currency in the header,
# hours and percentages to two decimals, shares to four, whole numbers as integers, booleans as true/false.
_MONEY_SUFFIXES = ("cost", "savings", "_usd")
_RATE_COLUMNS = ("hourly_rate",)  # $/h: to a tenth of a cent
# Money columns whose names do not say so (budgets, the trend): amounts in the report's currency.
_MONEY_COLUMNS = ("amount", "actual", "forecast", "this_month", "previous_month", "change")


def csv_column(name: str, values: pd.Series, currency: str) -> tuple[str, list]:
    """(header, cells) of one report column as written to its CSV."""
    cells = [plain_value(v) for v in values]
    if any(isinstance(v, bool) for v in cells) and all(isinstance(v, bool) or v is None for v in cells):
        return name, ["" if v is None else ("true" if v else "false") for v in cells]
    if not all(v is None or (isinstance(v, (int, float)) and not isinstance(v, bool)) for v in cells):
        return name, [_csv_cell(v) for v in cells]  # text (or mixed): as it is
    numbers = [v for v in cells if v is not None]
    unit = currency.lower()
    if name in _RATE_COLUMNS:
        return f"{unit}_per_hour", [_rounded(v, 4) for v in cells]
    if name.endswith(_MONEY_SUFFIXES) or name in _MONEY_COLUMNS:
        return f"{name}_{unit}", [_rounded(v, 2) for v in cells]
    if all(float(v).is_integer() for v in numbers) and not name.endswith(("_pct", "_share", "hours")):
        return name, ["" if v is None else int(v) for v in cells]
    digits = 4 if name.endswith("share") else 2
    return name, [_rounded(v, digits) for v in cells]


def _rounded(v, digits: int):
    if v is None:
        return ""
    r = round(float(v), digits)
    return int(r) if digits == 0 else r


def write_csv(df: pd.DataFrame, path: Path, currency: str = "USD") -> Path:
    columns = [csv_column(str(c), df[c], currency) for c in df.columns]
    if any(header != name for header, name in zip((h for h, _ in columns), df.columns)):  # a money column
        columns.append(("currency", [currency] * len(df)))
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow([h for h, _ in columns])
    for row in zip(*(cells for _, cells in columns)) if columns else ():
        w.writerow(list(row))
    return _write_atomic(path, buf.getvalue())


def write_json(a: MonthlyAudit, path: Path) -> Path:
    return _write_atomic(path, json.dumps(report_document(a), indent=2, allow_nan=False) + "\n")


# --------------------------------------------------------------------------- HTML


def _when(v, fmt: str = "%Y-%m-%d %H:%M") -> str:
    if v is None or v is pd.NaT or (isinstance(v, float) and math.isnan(v)):
        return "–"
    if isinstance(v, str):
        v = pd.Timestamp(v)
    return v.strftime(fmt)


def environment(templates_dir: Path = TEMPLATES_DIR) -> Environment:
    env = Environment(loader=FileSystemLoader(str(templates_dir)), autoescape=True, undefined=StrictUndefined,
                      trim_blocks=True, lstrip_blocks=True)
    env.filters.update(num=_num, money=_money, share=_share, pct=_pct, when=_when, words=words)
    return env


_TABLE = re.compile(r"<table>(.*?)</table>", re.S)
_ROW = re.compile(r"<tr([^>]*)>(.*?)</tr>", re.S)
_HEAD_CELL = re.compile(r"<th[^>]*>(.*?)</th>", re.S)
_CELL_OPEN = re.compile(r"<td(?=[\s>])")


def label_cells(html: str) -> str:
    """Each table cell gets its column's header as `data-label`, so that on a phone (the stylesheet's narrow
    layout) a row reads as a card of "Header: value" lines instead of running off the screen. The headers are
    the template's own text (already escaped); no script is needed, so a forwarded file reads the same."""

    def one_table(m: re.Match) -> str:
        rows = _ROW.findall(m.group(1))
        if not rows:
            return m.group(0)
        labels = [re.sub(r"<[^>]+>", "", h).strip() for h in _HEAD_CELL.findall(rows[0][1])]

        def one_row(r: re.Match) -> str:
            if "<th" in r.group(2):
                return r.group(0)
            cells = iter(labels)
            body = _CELL_OPEN.sub(lambda _: f'<td data-label="{next(cells, "")}"', r.group(2))
            return f"<tr{r.group(1)}>{body}</tr>"

        return "<table>" + _ROW.sub(one_row, m.group(1)) + "</table>"

    return _TABLE.sub(one_table, html)


def render_html(a: MonthlyAudit, templates_dir: Path = TEMPLATES_DIR) -> str:
    top = a.options.top_n
    def drawn(width_in: float) -> dict[str, str | None]:
        return {
            "daily": charts.data_uri(charts.daily_cost_chart(a.daily, a.currency, a.period.start.date(),
                                                            math.ceil(a.period.hours / 24), width_in)),
            "teams": charts.data_uri(charts.team_verdict_chart(a.teams, width_in)),
            "top_idle": charts.data_uri(charts.top_idle_chart(a.instances, a.currency, top, width_in)),
        }

    chart_uris, phone_uris = drawn(charts.DESKTOP_WIDTH_IN), drawn(charts.PHONE_WIDTH_IN)
    tables = {name: records(df) for name, df in a.tables().items()}
    return label_cells(environment(templates_dir).get_template(HTML_TEMPLATE).render(
        a=a, p=a.period, h=a.headline, q=a.data_quality, cur=a.currency, notes=a.notes, t=tables,
        charts=chart_uris, phone_charts=phone_uris, top=top, stem=file_stem(a.period.month), has_data=a.has_data,
        last_day=(a.period.end - timedelta(days=1)).date().isoformat(), sorted_by=SORTED_BY, stops_top=STOPS_TOP,
        k8s_top=K8S_TOP, csv_names=CSV_NAMES, forecast_label=FORECAST_LABEL, slurm_none=SLURM_NONE,
        action_words=action_words, restart_cost_s=RESTART_COST_S, false_stop_cost_h=FALSE_STOP_COST_H,
    ))


class PdfError(RuntimeError):
    """The PDF rendition could not be made (no Chromium, or it failed): said in one line."""


def chromium_path() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")


def render_pdf(html_path: Path, pdf_path: Path, chromium: str | None = None) -> Path:
    """Print the HTML page to PDF with headless Chromium (the flags the browser tests use): the page's print
    stylesheet puts the finance page on a page of its own, first. Written aside and renamed."""
    exe = chromium or chromium_path()
    if exe is None:
        raise PdfError("the PDF rendition needs Chromium (Debian: apt-get install chromium); none found on PATH")
    tmp = pdf_path.with_name(f".{pdf_path.name}.tmp")
    tmp.unlink(missing_ok=True)
    with tempfile.TemporaryDirectory(prefix="gpufinops-chromium-") as profile:
        try:
            done = subprocess.run(
                [exe, "--headless", "--no-sandbox", "--disable-gpu", f"--user-data-dir={profile}",
                 "--no-pdf-header-footer", f"--print-to-pdf={tmp}", html_path.resolve().as_uri()],
                capture_output=True, text=True, timeout=PDF_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            raise PdfError(f"Chromium did not print {html_path.name} within {PDF_TIMEOUT_S} s") from None
    if not tmp.is_file() or tmp.stat().st_size == 0 or not tmp.read_bytes().startswith(b"%PDF"):
        last = (done.stderr or "").strip().splitlines()[-1:] or ["no output"]
        raise PdfError(f"Chromium did not print {html_path.name} to PDF (exit {done.returncode}): {last[0][:200]}")
    tmp.replace(pdf_path)
    return pdf_path


def write_report(a: MonthlyAudit, out_dir: Path, formats: Iterable[str] = FORMATS) -> list[Path]:
    formats = list(formats)
    bad = [f for f in formats if f not in ALL_FORMATS]
    if bad:
        raise ValueError(f"unknown report format(s) {bad}; expected some of {', '.join(ALL_FORMATS)}")
    out_dir.mkdir(parents=True, exist_ok=True)
    stem = file_stem(a.period.month)
    written: list[Path] = []
    if "html" in formats or "pdf" in formats:
        html = _write_atomic(out_dir / f"{stem}.html", render_html(a))
        if "html" in formats:
            written.append(html)
        if "pdf" in formats:
            written.append(render_pdf(html, out_dir / f"{stem}.pdf"))
            if "html" not in formats:
                html.unlink()
    if "csv" in formats:
        written += [write_csv(df, out_dir / f"{stem}-{name}.csv", a.currency) for name, df in csv_tables(a).items()]
    if "json" in formats:
        written.append(write_json(a, out_dir / f"{stem}.json"))
    return written
