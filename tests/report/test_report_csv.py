"""The report's CSV files, as a spreadsheet reads them (issue 14)."""

from __future__ import annotations

import csv
from datetime import datetime, timezone

import pandas as pd

from gpufinops.report.period import report_period
from gpufinops.report.render import write_csv

NOW = datetime(2026, 11, 3, 9, 0, tzinfo=timezone.utc)


def test_csv_is_written_for_a_spreadsheet(tmp_path):
    """Money to the cent with its currency in the header and a currency column, whole numbers as integers,
    true/false, shares to four decimals; text (and a formula-looking tag value) as it is, defused."""
    df = pd.DataFrame({"team": ["ml", "=HYPERLINK(1)"], "gpus": [8.0, 1.0], "hourly_rate": [32.77312, None],
                       "idle_cost": [1234.5678, 0.004], "billed_cost": [None, None], "idle_share": [0.123456, 0.5],
                       "idle_hours": [1.0, 2.345], "false_stop": [True, False], "savings": ["saved", "none"]})
    rows = list(csv.reader(write_csv(df, tmp_path / "t.csv").open()))
    assert rows[0] == ["team", "gpus", "usd_per_hour", "idle_cost_usd", "billed_cost_usd", "idle_share", "idle_hours",
                       "false_stop", "savings", "currency"]
    assert rows[1] == ["ml", "8", "32.7731", "1234.57", "", "0.1235", "1.0", "true", "saved", "USD"]
    assert rows[2] == ["'=HYPERLINK(1)", "1", "", "0.0", "", "0.5", "2.35", "false", "none", "USD"]
    assert report_period("2022-9", NOW).month == "2022-09"  # normalised: file names and titles say 2022-09
