"""Cost Explorer -> cost table against a moto server (results seeded through moto's API)."""

from __future__ import annotations

from datetime import datetime, timezone

import pytest

from gpufinops.collect.billing.ce import fetch_ce
from gpufinops.collect.billing.schema import BillingDataError, COLUMNS
from gpufinops.collect.billing.settings import CeSettings
from gpufinops.config import AwsSettings

pytestmark = pytest.mark.integration

SEP = datetime(2024, 9, 1, tzinfo=timezone.utc)
OCT = datetime(2024, 10, 1, tzinfo=timezone.utc)
NOW = datetime(2024, 9, 15, 10, 0, tzinfo=timezone.utc)
CE = CeSettings(purchase_types={"On Demand Instances": "on-demand", "Spot Instances": "spot"})


def group(itype: str, tag: str, cost: str, hours: str, unit: str = "USD") -> dict:
    return {"Keys": [itype, tag], "Metrics": {"UnblendedCost": {"Amount": cost, "Unit": unit},
                                              "UsageQuantity": {"Amount": hours, "Unit": "Hrs"}}}


def day(d: str, nxt: str, groups: list[dict], estimated: bool = False) -> dict:
    return {"TimePeriod": {"Start": d, "End": nxt}, "Total": {}, "Groups": groups, "Estimated": estimated}


def seed(aws, pages: list[dict]) -> None:
    aws.set_cost_and_usage(pages)


def test_pages_and_purchase_types_become_one_table(aws):
    seed(aws, [
        # on-demand, page 1 of 2
        {"ResultsByTime": [day("2024-09-13", "2024-09-14", [
            group("p4d.24xlarge", "team$ml", "786.54", "24"),
            group("m5.xlarge", "team$ml", "4.60", "24"),  # not GPU: dropped
            group("g5.xlarge", "team$", "24.14", "24"),  # untagged
        ])], "NextPageToken": "page-2", "DimensionValueAttributes": []},
        # on-demand, page 2
        {"ResultsByTime": [day("2024-09-14", "2024-09-15", [group("p4d.24xlarge", "team$ml", "393.27", "12")],
                               estimated=True)], "DimensionValueAttributes": []},
        # spot
        {"ResultsByTime": [day("2024-09-14", "2024-09-15", [group("g5.2xlarge", "team$vision", "11.52", "24")])],
         "DimensionValueAttributes": []},
    ])
    res = fetch_ce(aws.client("ce"), SEP, OCT, NOW, AwsSettings().gpu_families, CE)
    assert res.requests == 3
    t = res.table
    assert list(t.columns) == list(COLUMNS)
    got = {(r.date.strftime("%m-%d"), r.instance_type, r.team, r.pricing_model): (r.cost, r.usage_hours)
           for r in t.itertuples()}
    assert got == {
        ("09-13", "p4d.24xlarge", "ml", "on-demand"): (786.54, 24.0),
        ("09-13", "g5.xlarge", "", "on-demand"): (24.14, 24.0),
        ("09-14", "p4d.24xlarge", "ml", "on-demand"): (393.27, 12.0),
        ("09-14", "g5.2xlarge", "vision", "spot"): (11.52, 24.0),
    }
    assert set(t["source"]) == {"ce"} and set(t["resource_id"]) == {""}
    assert t.loc[t.team == "ml", "tags"].iloc[0] == '{"team": "ml"}'
    # CE lags up to a day: complete through the start of yesterday.
    assert res.data_through == datetime(2024, 9, 14, tzinfo=timezone.utc)


def test_the_request_is_daily_grouped_and_filtered(aws):
    seed(aws, [{"ResultsByTime": [], "DimensionValueAttributes": []}])
    ce = aws.client("ce")
    calls = []
    ce.meta.events.register("provide-client-params.ce.GetCostAndUsage", lambda params, **kw: calls.append(dict(params)))
    fetch_ce(ce, SEP, OCT, NOW, AwsSettings().gpu_families, CeSettings(purchase_types={"Spot Instances": "spot"}))
    (params,) = calls
    assert params["Granularity"] == "DAILY"
    # End capped at tomorrow: CE has nothing later.
    assert params["TimePeriod"] == {"Start": "2024-09-01", "End": "2024-09-16"}
    assert params["GroupBy"] == [{"Type": "DIMENSION", "Key": "INSTANCE_TYPE"}, {"Type": "TAG", "Key": "team"}]
    assert {"Dimensions": {"Key": "PURCHASE_TYPE", "Values": ["Spot Instances"]}} in params["Filter"]["And"]


def test_mixed_currencies_are_an_error(aws):
    seed(aws, [{"ResultsByTime": [day("2024-09-13", "2024-09-14", [
        group("p4d.24xlarge", "team$ml", "786.54", "24"), group("g5.xlarge", "team$ml", "20.0", "24", unit="EUR")])],
        "DimensionValueAttributes": []}])
    with pytest.raises(BillingDataError, match=r"Cost Explorer GetCostAndUsage .*: column 'currency' mixes currencies \['EUR', 'USD'\]"):
        fetch_ce(aws.client("ce"), SEP, OCT, NOW, AwsSettings().gpu_families,
                 CeSettings(purchase_types={"On Demand Instances": "on-demand"}))


def test_missing_metric_names_the_metric(aws):
    seed(aws, [{"ResultsByTime": [day("2024-09-13", "2024-09-14", [
        {"Keys": ["p4d.24xlarge", "team$ml"], "Metrics": {"UsageQuantity": {"Amount": "1", "Unit": "Hrs"}}}])],
        "DimensionValueAttributes": []}])
    with pytest.raises(BillingDataError, match=r"metric 'UnblendedCost' missing for p4d.24xlarge on 2024-09-13"):
        fetch_ce(aws.client("ce"), SEP, OCT, NOW, AwsSettings().gpu_families,
                 CeSettings(purchase_types={"On Demand Instances": "on-demand"}))


def test_aws_forecast_request_and_answer_with_a_stubbed_client():
    """moto has no GetCostForecast: botocore's Stubber checks the exact request a real client sends."""
    from datetime import datetime, timezone

    import boto3
    from botocore.stub import Stubber

    from gpufinops.collect.billing.ce import fetch_ce_forecast
    from gpufinops.collect.billing.settings import CeSettings

    client = boto3.session.Session(aws_access_key_id="x", aws_secret_access_key="y").client("ce", region_name="us-east-1")
    ce = CeSettings()
    now = datetime(2026, 11, 20, 15, tzinfo=timezone.utc)
    end = datetime(2026, 12, 1, tzinfo=timezone.utc)
    with Stubber(client) as stub:
        stub.add_response(
            "get_cost_forecast",
            {"Total": {"Amount": "1234.5", "Unit": "USD"}, "ForecastResultsByTime": []},
            {"TimePeriod": {"Start": "2026-11-20", "End": "2026-12-01"}, "Metric": "UNBLENDED_COST",
             "Granularity": "MONTHLY", "Filter": {"Dimensions": {"Key": "SERVICE", "Values": [ce.service]}}},
        )
        assert fetch_ce_forecast(client, now, end, ce) == (1234.5, "USD")
        stub.assert_no_pending_responses()
    # nothing left of the month: no call at all
    assert fetch_ce_forecast(client, datetime(2026, 12, 1, 1, tzinfo=timezone.utc), end, ce) is None
