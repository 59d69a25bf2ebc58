"""Google Cloud's detailed usage cost export (billing source `gcp-detailed`) on DuckDB: the fixture as BigQuery exports
it to Parquet (records nested) and to CSV (the flattening query of docs/billing.md), totals to the cent against a
plain-Python sum of the same file, credits netted, a GCE VM's cost per VM / team / project meeting the VM as the GCE
listing (tests/gcestub.py) names it, its idle cost from stored verdicts, and a malformed file refused by name."""

from __future__ import annotations

import csv
import json
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from gpufinops.cli import main
from gpufinops.collect.billing.errors import BillingDataError
from gpufinops.collect.billing.gcp_detailed import detailed_files, detailed_lines, totals
from gpufinops.collect.billing.load import load_cost_table, load_cost_totals
from gpufinops.config import BillingSettings, load_settings
from gpufinops.model import Decision, ReasonCode, Verdict, gce_vm_id, resolve_gce_ids
from gpufinops.store.store import Store

DATA = Path(__file__).resolve().parents[1] / "data" / "gcp_detailed"
FOCUS = Path(__file__).resolve().parents[1] / "data" / "focus"
SEP, OCT = datetime(2024, 9, 1, tzinfo=timezone.utc), datetime(2024, 10, 1, tzinfo=timezone.utc)
BS = BillingSettings(gpu_families=("g5",))
A100 = "gce:sunbird-ml/us-central1-a/train-a100-1"
L4 = "gce:sunbird-ml/us-east4-a/infer-l4-2"
T4 = "gce:sunbird-ml/us-central1-b/asr-t4-1"  # an n1-standard-8 with an attached T4
FORMATS = ["detailed_export.parquet", "detailed_export.csv"]


def plain_rows(name: str) -> list[dict]:
    """The file's rows as plain dicts of Google's logical fields, read without DuckDB (pyarrow / the csv module)."""
    if name.endswith(".parquet"):
        return [{"service": r["service"]["description"], "start": r["usage_start_time"], "project": r["project"]["id"],
                 "zone": r["location"]["zone"], "name": r["resource"]["name"], "labels": r["labels"],
                 "sku": r["sku"]["description"],
                 "system_labels": r["system_labels"], "cost": r["cost"], "unit": r["usage"]["unit"],
                 "credits": r["credits"]} for r in pq.read_table(DATA / name).to_pylist()]
    with open(DATA / name, newline="") as fh:
        return [{"service": r["service_description"],
                 "start": datetime.strptime(r["usage_start_time"], "%Y-%m-%d %H:%M:%S UTC").replace(
                     tzinfo=timezone.utc),
                 "project": r["project_id"], "zone": r["location_zone"], "name": r["resource_name"],
                 "sku": r["sku_description"],
                 "labels": json.loads(r["labels"]), "system_labels": json.loads(r["system_labels"]),
                 "cost": float(r["cost"]), "unit": r["usage_unit"], "credits": json.loads(r["credits"])}
                for r in csv.DictReader(fh)]


def independent_totals(name: str, key) -> dict[str, float]:
    """Net cost (cost + credits) of the GPU VM rows of September per key, in plain Python: the rows of a VM of an
    A2/G2 machine type or billed for a GPU SKU."""
    out: dict[str, float] = {}
    rows = plain_rows(name)
    with_gpu_sku = {(r["project"], r["zone"], r["name"]) for r in rows if " GPU " in f" {r['sku']} "}
    for r in rows:
        machine = {x["key"]: x["value"] for x in r["system_labels"]}.get("compute.googleapis.com/machine_spec", "")
        gpu_vm = machine.startswith(("a2-", "g2-")) or (machine and (r["project"], r["zone"], r["name"]) in with_gpu_sku)
        if r["service"] != "Compute Engine" or not gpu_vm or not SEP <= r["start"] < OCT or not r["unit"].endswith(
                "seconds"):
            continue
        k = key(r)
        out[k] = out.get(k, 0.0) + r["cost"] + sum(c["amount"] for c in r["credits"])
    return out


def lines(name: str):
    return detailed_lines(detailed_files(str(DATA / name)), str(DATA / name), SEP, OCT, BS)


@pytest.mark.parametrize("name", FORMATS)
def test_totals_per_vm_team_and_project_equal_an_independent_sum_to_the_cent(name):
    d = lines(name)
    for by, key in (("instance", lambda r: f"gce:{r['project']}/{r['zone']}/{r['name']}"),
                    ("team", lambda r: {x["key"]: x["value"] for x in r["labels"]}.get("team", "")),
                    ("account", lambda r: r["project"])):
        got = {k: round(cost, 2) for k, _currency, cost, _hours in totals(d, by)}
        want = {k: round(v, 2) for k, v in independent_totals(name, key).items()}
        assert got == want, by
    per_vm = {k: (cost, hours) for k, _c, cost, hours in totals(d, "instance")}
    # Three hours of an a2-highgpu-1g (GPU + 12 vCPUs - their sustained use credit + RAM), two of a spot g2 (its GPU's
    # promotion credit netted): one VM-hour per hour, not 1 GPU-hour + 12 vCPU-hours.
    assert per_vm[A100] == pytest.approx((3 * (2.93391 + 0.379188 - 0.075838 + 0.360292), 3.0))
    assert per_vm[L4] == pytest.approx((2 * (0.2240 - 0.1 + 0.0698 + 0.0327), 2.0))
    # The N1 VM's machine type names no GPU; its T4's SKU does, in a row after its vCPU and RAM rows: all counted.
    assert per_vm[T4] == pytest.approx((0.35 + 0.2534 + 0.034, 1.0))
    assert {k for k, *_ in totals(d, "project")} == {"detector", ""}  # the `project` label, as on every source


def test_credits_are_netted_not_ignored():
    gross = sum(r["cost"] for r in plain_rows("detailed_export.parquet")
                if r["name"] == "train-a100-1" and r["unit"].endswith("seconds") and r["start"] < OCT
                and r["service"] == "Compute Engine" and r["system_labels"])
    net = {k: cost for k, _c, cost, _h in totals(lines("detailed_export.parquet"), "instance")}[A100]
    assert net == pytest.approx(gross - 3 * 0.075838) and round(net, 2) != round(gross, 2)


def test_parquet_and_csv_exports_give_the_same_lines():
    assert lines("detailed_export.parquet").lines == lines("detailed_export.csv").lines


def test_the_cost_table_names_the_vm_as_the_listing_does(tmp_path):
    settings = load_settings(billing={"source": "gcp-detailed", "path": str(DATA / "detailed_export.parquet")})
    loaded = load_cost_table(settings, SEP, OCT, datetime(2024, 10, 5, tzinfo=timezone.utc))
    t = loaded.table.set_index("resource_id")
    assert loaded.source == "gcp-detailed" and set(t.index) == {A100, L4, T4}
    assert t.loc[A100, ["provider", "account", "region", "instance_type", "pricing_model", "team", "project"]].tolist() \
        == ["gcp", "sunbird-ml", "us-central1", "a2-highgpu-1g", "on-demand", "vision", "detector"]
    assert t.loc[L4, ["instance_type", "pricing_model", "team"]].tolist() == ["g2-standard-8", "spot", "search"]
    assert t.loc[T4, ["instance_type", "pricing_model", "team"]].tolist() == ["n1-standard-8", "on-demand", "speech"]
    assert json.loads(t.loc[A100, "tags"]) == {"project": "detector", "team": "vision"}
    totals_ = load_cost_totals(settings, SEP, OCT, datetime(2024, 10, 5, tzinfo=timezone.utc), "team").table
    assert dict(zip(totals_["key"], totals_["cost"].round(6))) == {"vision": 10.792656, "search": 0.453,
                                                                   "speech": 0.6374}


def test_costs_by_instance_on_the_command_line(tmp_path, capsys):
    rc = main(["costs", "--source", "gcp-detailed", "--path", str(DATA / "detailed_export.csv"), "--month", "2024-09",
               "--by", "instance", "-o", "json"])
    out = capsys.readouterr()
    assert rc == 0, out.err
    rows = {r["instance"]: r for r in json.loads(out.out)}
    assert set(rows) == {A100, L4, T4} and round(rows[A100]["cost"], 2) == 10.79 and rows[A100]["usage_hours"] == 3.0


def test_idle_cost_joins_the_stored_verdicts_of_the_vm(tmp_path, capsys):
    db = tmp_path / "g.db"
    store = Store(f"sqlite:///{db}")
    t0 = datetime(2024, 9, 21, 1, 0, tzinfo=timezone.utc)

    def d(verdict, minutes):
        code = ReasonCode.IDLE_STAYS_BELOW if verdict is Verdict.IDLE else ReasonCode.BUSY
        return Decision(A100, "idle", verdict, code, "t", t0 + timedelta(minutes=minutes), hourly_cost=5.0)

    # Idle for an hour, then busy for half an hour, a tick a minute: priced at the billed rate (net of credits), not
    # the stored $5/h. The last tick covers 2 minutes (twice evaluate_every_s).
    for minute in range(90):
        store.record_decisions(f"r{minute}", [d(Verdict.IDLE if minute < 60 else Verdict.ACTIVE, minute)],
                               dry_run=True, types={A100: "a2-highgpu-1g"})
    cfg = tmp_path / "gpufinops.yaml"
    cfg.write_text(f"database_url: sqlite:///{db}\n")
    rate = 3 * (2.93391 + 0.379188 - 0.075838 + 0.360292) / 3
    for by, key in (("instance", A100), ("team", "vision")):
        rc = main(["-c", str(cfg), "costs", "--month", "2024-09", "--idle", "--source", "gcp-detailed", "--path",
                   str(DATA / "detailed_export.parquet"), "--by", by, "-o", "json"])
        out = capsys.readouterr()
        assert rc == 0, out.err
        rows = {r[by]: r for r in json.loads(out.out)}
        assert rows[key]["idle_cost"] == pytest.approx(rate) and rows[key]["active_cost"] == pytest.approx(rate * 31 / 60)


def test_a_listed_gce_vm_meets_its_bill_by_name_and_by_numeric_id(gce, monkeypatch):
    from gpufinops.collect.billing.focus import read_focus
    from gpufinops.places.gcp.cloud import GceCloud, gce_ids
    from gpufinops.prices.catalog import load_catalog

    gce.projects = ("sunbird-ml",)
    gce.add("train-a100-1", "us-central1-a", "a2-highgpu-1g", project="sunbird-ml", labels={"team": "vision"})
    # The VM Google's FOCUS view names only by its numeric id (its ResourceName there is the id too).
    vm = gce.add("eval-a100", "us-central1-a", "a2-highgpu-1g", project="sunbird-ml")
    vm["id"] = "4120387516662251"
    monkeypatch.setenv("GPUFINOPS_GCP_ACCESS_TOKEN", "t")
    settings = load_settings(gcp={"projects": ["sunbird-ml"], "api_endpoint": gce.url})
    listed = GceCloud(settings.gcp, catalog=load_catalog(), sleep=lambda s: None).list_gpu_instances()
    by_id = {i.instance_id: i for i in listed}

    # The detailed export names project/zone/name: the listed VM's id, directly.
    billed = {k for k, *_ in totals(lines("detailed_export.parquet"), "instance")}
    assert A100 in by_id and A100 in billed and by_id[A100].team() == "vision"
    # The FOCUS view's numeric id: unknown to the bill alone, the listing's numeric id makes it the VM.
    focus = read_focus(str(FOCUS / "gcp_focus_view_gpu.csv"), SEP, OCT, BS).table
    unlisted = "gce-unlisted:sunbird-ml/us-central1-a/4120387516662251"
    assert list(focus["resource_id"]) == [unlisted]
    assert by_id["gce:sunbird-ml/us-central1-a/eval-a100"].cloud_id == "4120387516662251"
    assert resolve_gce_ids(focus["resource_id"], gce_ids(listed)) == ["gce:sunbird-ml/us-central1-a/eval-a100"]
    # A VM gone before any listing keeps its id that says so, still costed under its project and zone.
    assert resolve_gce_ids([unlisted], {}) == [unlisted]


def test_gce_subject_ids_from_a_bill():
    g = "//compute.googleapis.com/projects/{p}/zones/us-west1-b/instances/{i}"
    assert gce_vm_id(g.format(p="ml", i="8812"), "gpu-box-3") == "gce:ml/us-west1-b/gpu-box-3"
    # The full name may carry the project's number: the bill's project.id wins.
    assert gce_vm_id(g.format(p="4829103", i="8812"), "gpu-box-3", project="ml") == "gce:ml/us-west1-b/gpu-box-3"
    assert gce_vm_id(g.format(p="ml", i="8812"), "8812") == "gce-unlisted:ml/us-west1-b/8812"
    assert gce_vm_id(g.format(p="ml", i="8812"), "") == "gce-unlisted:ml/us-west1-b/8812"
    assert gce_vm_id("//compute.googleapis.com/projects/ml/zones/us-west1-b/disks/d1", "d1") == ""
    assert gce_vm_id("i-0abc") == ""


# --------------------------------------------------------------------------- malformed files


def csv_rows() -> tuple[list[str], list[dict]]:
    with open(DATA / "detailed_export.csv", newline="") as fh:
        reader = csv.DictReader(fh)
        return list(reader.fieldnames), list(reader)


def write_csv(path: Path, header: list[str], rows: list[dict]) -> Path:
    with open(path, "w", newline="") as fh:
        w = csv.DictWriter(fh, header, extrasaction="ignore")
        w.writeheader()
        w.writerows(rows)
    return path


@pytest.mark.parametrize("column,value,message", [
    ("cost", "lots", r"column 'cost' is not a number on data row 3 \(value 'lots'\)"),
    ("usage_amount", "3600s", r"column 'usage.amount' is not a number on data row 3"),
    ("credits", "[{name: SUD", r"column 'credits' is not JSON text \(the export query's TO_JSON_STRING\) on data row 3"),
    ("usage_start_time", "yesterday", r"column 'usage_start_time' is not a date on data row 3"),
])
def test_a_bad_value_is_an_error_naming_file_column_and_row(tmp_path, capsys, column, value, message):
    header, rows = csv_rows()
    rows[1][column] = value
    bad = write_csv(tmp_path / "bad.csv", header, rows)
    with pytest.raises(BillingDataError, match=r"bad\.csv: " + message):
        detailed_lines(detailed_files(str(bad)), str(bad), SEP, OCT, BS)
    rc = main(["costs", "--source", "gcp-detailed", "--path", str(bad), "--month", "2024-09"])
    err = capsys.readouterr().err
    assert rc == 1 and "bad.csv: column" in err and "Traceback" not in err


def test_a_missing_column_or_an_unreadable_file_is_named(tmp_path, capsys):
    header, rows = csv_rows()
    short = write_csv(tmp_path / "short.csv", [h for h in header if h not in ("cost", "resource_name")], rows)
    with pytest.raises(BillingDataError, match=r"short\.csv: missing column\(s\) \['resource.name', 'cost'\]"):
        detailed_lines(detailed_files(str(short)), str(short), SEP, OCT, BS)
    broken = tmp_path / "broken.parquet"
    broken.write_bytes((DATA / "detailed_export.parquet").read_bytes()[:600])
    rc = main(["costs", "--source", "gcp-detailed", "--path", str(broken), "--month", "2024-09", "--idle"])
    err = capsys.readouterr().err
    assert rc != 0 and "broken.parquet: cannot read the detailed usage cost export" in err and "Traceback" not in err


def test_two_currencies_are_refused(tmp_path):
    header, rows = csv_rows()
    rows[0]["currency"] = "EUR"
    mixed = write_csv(tmp_path / "mixed.csv", header, rows)
    with pytest.raises(BillingDataError, match=r"mixes currencies \['EUR', 'USD'\]"):
        detailed_lines(detailed_files(str(mixed)), str(mixed), SEP, OCT, BS)


def test_google_focus_rows_naming_the_vm_meet_it_on_both_focus_readers(tmp_path):
    """Google's FOCUS export names the VM in ResourceName (the detailed export's resource.name): the pandas table
    and the DuckDB totals both key its cost by the listing's `gce:` id."""
    import pandas as pd

    from gpufinops.collect.billing.duck import focus_files, focus_total_rows
    from gpufinops.collect.billing.focus import read_focus

    df = pd.read_csv(FOCUS / "gcp_focus_view_gpu.csv", dtype=str, keep_default_na=False)
    df["ResourceName"] = df["ResourceId"].map(lambda g: {"4120387516662251": "eval-a100"}.get(g.rsplit("/", 1)[-1],
                                                                                               "web-1"))
    df.to_csv(tmp_path / "named.csv", index=False)
    vm = "gce:sunbird-ml/us-central1-a/eval-a100"
    table = read_focus(str(tmp_path / "named.csv"), SEP, OCT, BS).table
    duck = focus_total_rows(focus_files(str(tmp_path / "named.csv")), str(tmp_path), SEP, OCT, BS, "instance").rows
    assert list(table["resource_id"]) == [vm] and [r[0] for r in duck] == [vm]
    assert duck[0][2] == pytest.approx(table["cost"].sum())


def test_idle_cost_meets_a_vm_the_bill_names_only_by_its_numeric_id(tmp_path, capsys):
    """Google's FOCUS view names the VM only by its numeric id: the id the service recorded when it listed the VM
    (instance_labels.cloud_id) makes the billed rate price its verdicts."""
    from gpufinops.model import GpuInstance

    db = tmp_path / "g.db"
    store = Store(f"sqlite:///{db}")
    vm = "gce:sunbird-ml/us-central1-a/eval-a100"
    t0 = datetime(2024, 9, 21, 1, 0, tzinfo=timezone.utc)
    store.record_instances([GpuInstance(vm, "a2-highgpu-1g", "us-central1", "running", t0, account="sunbird-ml",
                                        provider="gcp", cloud_id="4120387516662251")], t0)
    for minute in range(60):
        store.record_decisions(f"r{minute}", [Decision(vm, "idle", Verdict.IDLE, ReasonCode.IDLE_STAYS_BELOW, "t",
                                                       t0 + timedelta(minutes=minute), hourly_cost=5.0)],
                               dry_run=True, types={vm: "a2-highgpu-1g"})
    cfg = tmp_path / "gpufinops.yaml"
    cfg.write_text(f"database_url: sqlite:///{db}\n")
    rc = main(["-c", str(cfg), "costs", "--month", "2024-09", "--idle", "--source", "focus", "--path",
               str(FOCUS / "gcp_focus_view_gpu.csv"), "--by", "instance", "-o", "json"])
    out = capsys.readouterr()
    assert rc == 0, out.err
    rows = {r["instance"]: r for r in json.loads(out.out)}
    # An hour idle (59 one-minute ticks and the last tick's 2 minutes) at the billed $/h, not the stored $5/h.
    rate = 2.93391 + 0.379188 + 0.360292
    assert rows[vm]["idle_cost"] == pytest.approx(rate * 61 / 60)
    assert store.cloud_ids() == {"4120387516662251": vm}


@pytest.mark.parametrize("name", FORMATS)
def test_a_plain_total_imports_neither_pandas_nor_pyarrow(name):
    import subprocess
    import sys

    code = ("import sys, contextlib, io\nfrom gpufinops.cli import main\n"
            "with contextlib.redirect_stdout(io.StringIO()):\n"
            f"    assert main(['costs', '--month', '2024-09', '--source', 'gcp-detailed', '--path', "
            f"{str(DATA / name)!r}, '--by', 'team']) == 0\n"
            "print(sorted(m for m in ('pandas', 'pyarrow', 'numpy') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_a_tick_records_each_gce_vms_numeric_id(gce, prometheus_factory, slack_stub, tmp_path, monkeypatch):
    """The real tick over the GCE stand-in stores each VM's numeric id (instance_labels.cloud_id) beside its `gce:`
    id: what `costs --idle` names a bill's `gce-unlisted:` VM by."""
    from tests.run.test_gce_e2e import GceFleet

    f = GceFleet(gce, prometheus_factory, slack_stub, tmp_path, monkeypatch)
    f.tick(20)
    listed = {inst["id"]: f"gce:{p}/{z}/{n}" for (p, z, n), inst in gce.instances.items()}
    assert f.store.cloud_ids() == listed and len(listed) == 3


def test_costs_save_stores_the_months_rows_under_their_source(tmp_path, capsys):
    from datetime import date

    from gpufinops.collect.billing.schema import load_costs

    db = tmp_path / "g.db"
    cfg = tmp_path / "gpufinops.yaml"
    cfg.write_text(f"database_url: sqlite:///{db}\n")
    rc = main(["-c", str(cfg), "costs", "--save", "--source", "gcp-detailed", "--path",
               str(DATA / "detailed_export.parquet"), "--month", "2024-09", "--by", "instance", "-o", "json"])
    err = capsys.readouterr().err
    assert rc == 0 and "stored 3 rows for 2024-09 from gcp-detailed" in err, err  # a VM-day each
    stored = load_costs(Store(f"sqlite:///{db}"), date(2024, 9, 1), date(2024, 10, 1), "gcp-detailed")
    assert set(stored["resource_id"]) == {A100, L4, T4} and round(stored["cost"].sum(), 2) == 11.88


def test_a_vms_gpu_row_in_another_file_of_the_export_still_makes_it_a_gpu_vm(tmp_path):
    """BigQuery's EXPORT DATA spreads rows over files: the N1 VM's T4 row in one file, its vCPU and RAM in another."""
    header, rows = csv_rows()
    gpu = [r for r in rows if "T4 GPU" in r["sku_description"]]
    (tmp_path / "export").mkdir()
    write_csv(tmp_path / "export" / "part-0.csv", header, [r for r in rows if r not in gpu])
    write_csv(tmp_path / "export" / "part-1.csv", header, gpu)
    split = detailed_lines(detailed_files(str(tmp_path / "export")), str(tmp_path), SEP, OCT, BS)
    assert split.lines == lines("detailed_export.csv").lines
    assert {k: round(c, 4) for k, _cur, c, _h in totals(split, "instance")}[T4] == 0.6374


@pytest.mark.parametrize("name", FORMATS)
def test_a_total_per_vm_type_or_account_read_without_the_labels_is_the_same(name):
    """`costs --by instance` reads no labels (DuckDB skips the nested lists): the same totals as with them."""
    path = str(DATA / name)
    bare = detailed_lines(detailed_files(path), path, SEP, OCT, BS, labels=False)
    for by in ("instance", "instance_type", "account"):
        want = [(k, cur, round(cost, 2), round(hours, 6)) for k, cur, cost, hours in totals(lines(name), by)]
        assert [(k, cur, round(cost, 2), round(hours, 6)) for k, cur, cost, hours in totals(bare, by)] == want, by
    assert {k[6:10] for k in bare.lines} == {("", "", "", ())}


def test_the_machine_label_read_in_sql_is_the_one_the_json_text_names(tmp_path):
    """Google's (key, value) list has the machine_spec label read in DuckDB; the same list as JSON text is read by
    focus_tags in Python: the same lines, the last machine_spec winning in both (web-1's a2 makes it a GPU VM)."""
    import duckdb

    machine = "compute.googleapis.com/machine_spec"
    listed, as_text = tmp_path / "listed" / "e.parquet", tmp_path / "text" / "e.parquet"
    listed.parent.mkdir(), as_text.parent.mkdir()
    con = duckdb.connect()
    con.execute(f"""COPY (SELECT * REPLACE (CASE WHEN resource.name = 'web-1'
                                                  THEN [{{'key': '{machine}', 'value': 'n2-standard-4'}},
                                                        {{'key': '{machine}', 'value': 'a2-highgpu-1g'}},
                                                        {{'key': 'other', 'value': NULL}}]
                                                  ELSE system_labels END AS system_labels)
                         FROM read_parquet('{DATA / "detailed_export.parquet"}')) TO '{listed}' (FORMAT PARQUET)""")
    con.execute(f"""COPY (SELECT * REPLACE (to_json(system_labels) AS system_labels) FROM read_parquet('{listed}'))
                    TO '{as_text}' (FORMAT PARQUET)""")
    got = [detailed_lines(detailed_files(str(p)), str(p), SEP, OCT, BS).lines for p in (listed, as_text)]
    assert got[0] == got[1]
    assert {(k[3], k[4]) for k in got[0]} >= {("gce:sunbird-ml/us-central1-a/web-1", "a2-highgpu-1g")}


def test_a_parquet_export_with_text_costs_still_has_its_bad_value_named(tmp_path):
    """A bad value is ruled out only by the file's own type: a Parquet whose cost is text is checked row by row."""
    import duckdb

    text = tmp_path / "text.parquet"
    duckdb.connect().execute(f"""
      COPY (SELECT * REPLACE (CASE WHEN row_number() OVER () = 2 THEN 'lots' ELSE CAST(cost AS VARCHAR) END AS cost)
            FROM read_parquet('{DATA / "detailed_export.parquet"}')) TO '{text}' (FORMAT PARQUET)""")
    with pytest.raises(BillingDataError, match=r"text\.parquet: column 'cost' is not a number on data row 2 "
                                               r"\(value 'lots'\)"):
        detailed_lines(detailed_files(str(text)), str(text), SEP, OCT, BS)
