"""Writes the detailed usage cost export fixtures (run from the repository root:
`.venv/bin/python tests/data/gcp_detailed/make_fixtures.py`): the same rows as BigQuery exports them to Parquet
(records nested, repeated records as lists) and to CSV (a flattening query: docs/billing.md). SOURCES.md says what
is Google's and what is made up."""

from __future__ import annotations

import json
import zlib
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq

HERE = Path(__file__).parent
ACCOUNT = "01A2B3-C4D5E6-F7G8H9"
PROJECT = {"id": "sunbird-ml", "number": "482910375561", "name": "sunbird-ml"}
GLOBAL = "//compute.googleapis.com/projects/sunbird-ml/zones/{zone}/instances/{id}"
MACHINE = "compute.googleapis.com/machine_spec"
T0 = datetime(2024, 9, 21, 1, 0, tzinfo=timezone.utc)


def row(hour: int, service: str, sku: str, zone: str, name: str, vm_id: str, machine: str, labels: dict, cost: float,
        amount: float, unit: str, credits: list[tuple[str, float, str]] = (), day: int = 0) -> dict:
    start = T0 + timedelta(days=day, hours=hour)
    region = zone.rsplit("-", 1)[0] if zone else ""
    return {
        "billing_account_id": ACCOUNT,
        "service": {"id": "6F81-5844-456A" if service == "Compute Engine" else "24E6-581D-38E5",
                    "description": service},
        "sku": {"id": f"{zlib.crc32(sku.encode()) % 0xFFFF:04X}-{zlib.crc32(sku[::-1].encode()) % 0xFFFF:04X}", "description": sku},
        "usage_start_time": start, "usage_end_time": start + timedelta(hours=1),
        "project": PROJECT,
        "labels": [{"key": k, "value": v} for k, v in labels.items()],
        "system_labels": ([{"key": MACHINE, "value": machine}] if machine else [])
        + ([{"key": "compute.googleapis.com/cores", "value": "12"}] if machine.startswith("a2") else []),
        "location": {"location": zone or "us", "country": "US", "region": region, "zone": zone},
        "resource": {"name": name, "global_name": GLOBAL.format(zone=zone, id=vm_id) if vm_id else ""},
        "cost": cost, "currency": "USD",
        "usage": {"amount": amount, "unit": unit, "amount_in_pricing_units": amount / 3600.0, "pricing_unit": "hour"},
        "credits": [{"name": n, "amount": a, "full_name": n, "id": "", "type": t} for n, a, t in credits],
        "cost_type": "regular",
    }


def rows() -> list[dict]:
    a100 = dict(zone="us-central1-a", name="train-a100-1", vm_id="4120387516662251", machine="a2-highgpu-1g",
                labels={"team": "vision", "project": "detector"})
    l4 = dict(zone="us-east4-a", name="infer-l4-2", vm_id="5529016683210044", machine="g2-standard-8",
              labels={"team": "search"})
    n2 = dict(zone="us-central1-a", name="web-1", vm_id="7734021185519930", machine="n2-standard-4",
              labels={"team": "vision"})
    out = []
    for h in range(3):  # an on-demand a2-highgpu-1g, three hours; a sustained use credit on its cores
        out.append(row(h, "Compute Engine", "Nvidia Tesla A100 GPU running in Americas", **a100, cost=2.93391,
                       amount=3600, unit="seconds"))
        out.append(row(h, "Compute Engine", "A2 Instance Core running in Americas", **a100, cost=0.379188,
                       amount=43200, unit="seconds",
                       credits=[("Sustained Usage Discount", -0.075838, "SUSTAINED_USAGE_DISCOUNT")]))
        out.append(row(h, "Compute Engine", "A2 Instance Ram running in Americas", **a100, cost=0.360292,
                       amount=3.28565e14, unit="byte-seconds"))
    for h in range(2):  # a spot g2-standard-8 (one L4), two hours; a promotion credit on its GPU
        out.append(row(h, "Compute Engine", "Spot Preemptible Nvidia L4 GPU attached to Spot Preemptible VMs running "
                       "in Virginia", **l4, cost=0.2240, amount=3600, unit="seconds",
                       credits=[("Free trial", -0.1, "PROMOTION")]))
        out.append(row(h, "Compute Engine", "Spot Preemptible G2 Instance Core running in Virginia", **l4,
                       cost=0.0698, amount=28800, unit="seconds"))
        out.append(row(h, "Compute Engine", "Spot Preemptible G2 Instance Ram running in Virginia", **l4,
                       cost=0.0327, amount=1.1544e14, unit="byte-seconds"))
    # An n1-standard-8 with an attached T4: its machine type names no GPU, its GPU SKU does. Its GPU row is the last
    # row of the file, after its vCPU and RAM rows.
    t4 = dict(zone="us-central1-b", name="asr-t4-1", vm_id="6630118854400127", machine="n1-standard-8",
              labels={"team": "speech"})
    out.append(row(0, "Compute Engine", "N1 Predefined Instance Core running in Americas", **t4, cost=0.2534,
                   amount=28800, unit="seconds"))
    out.append(row(0, "Compute Engine", "N1 Predefined Instance Ram running in Americas", **t4, cost=0.034,
                   amount=1.1063e14, unit="byte-seconds"))
    # Not GPU VM usage: an n2 VM, its boot disk (no machine_spec label), BigQuery, the A100 in October.
    out.append(row(0, "Compute Engine", "N2 Instance Core running in Americas", **n2, cost=0.126, amount=14400,
                   unit="seconds"))
    out.append(row(0, "Compute Engine", "Balanced PD Capacity", zone="us-central1-a", name="train-a100-1",
                   vm_id="", machine="", labels={"team": "vision"}, cost=0.0137, amount=3.6e13,
                   unit="byte-seconds"))
    out.append(row(0, "BigQuery", "Analysis", zone="", name="", vm_id="", machine="", labels={}, cost=0.31,
                   amount=5.2e10, unit="bytes"))
    out.append(row(0, "Compute Engine", "Nvidia Tesla A100 GPU running in Americas", **a100, cost=2.93391,
                   amount=3600, unit="seconds", day=10))
    out.append(row(0, "Compute Engine", "Nvidia Tesla T4 GPU running in Americas", **t4, cost=0.35, amount=3600,
                   unit="seconds"))
    return out


def flat(r: dict) -> dict:
    """A row as the export query in docs/billing.md writes it to CSV."""
    return {
        "billing_account_id": r["billing_account_id"], "service_description": r["service"]["description"],
        "sku_description": r["sku"]["description"],
        "usage_start_time": r["usage_start_time"].strftime("%Y-%m-%d %H:%M:%S UTC"),
        "usage_end_time": r["usage_end_time"].strftime("%Y-%m-%d %H:%M:%S UTC"),
        "project_id": r["project"]["id"], "labels": json.dumps(r["labels"]),
        "system_labels": json.dumps(r["system_labels"]), "location_region": r["location"]["region"],
        "location_zone": r["location"]["zone"], "resource_name": r["resource"]["name"],
        "resource_global_name": r["resource"]["global_name"], "cost": r["cost"], "currency": r["currency"],
        "usage_amount": r["usage"]["amount"], "usage_unit": r["usage"]["unit"], "credits": json.dumps(r["credits"]),
        "cost_type": r["cost_type"],
    }


def main() -> None:
    data = rows()
    kv = pa.list_(pa.struct([("key", pa.string()), ("value", pa.string())]))
    schema = pa.schema([
        ("billing_account_id", pa.string()),
        ("service", pa.struct([("id", pa.string()), ("description", pa.string())])),
        ("sku", pa.struct([("id", pa.string()), ("description", pa.string())])),
        ("usage_start_time", pa.timestamp("us", tz="UTC")), ("usage_end_time", pa.timestamp("us", tz="UTC")),
        ("project", pa.struct([("id", pa.string()), ("number", pa.string()), ("name", pa.string())])),
        ("labels", kv), ("system_labels", kv),
        ("location", pa.struct([("location", pa.string()), ("country", pa.string()), ("region", pa.string()),
                                ("zone", pa.string())])),
        ("resource", pa.struct([("name", pa.string()), ("global_name", pa.string())])),
        ("cost", pa.float64()), ("currency", pa.string()),
        ("usage", pa.struct([("amount", pa.float64()), ("unit", pa.string()), ("amount_in_pricing_units", pa.float64()),
                             ("pricing_unit", pa.string())])),
        ("credits", pa.list_(pa.struct([("name", pa.string()), ("amount", pa.float64()), ("full_name", pa.string()),
                                        ("id", pa.string()), ("type", pa.string())]))),
        ("cost_type", pa.string()),
    ])
    pq.write_table(pa.Table.from_pylist(data, schema=schema), HERE / "detailed_export.parquet")
    pacsv.write_csv(pa.Table.from_pylist([flat(r) for r in data]), HERE / "detailed_export.csv")


if __name__ == "__main__":
    main()
