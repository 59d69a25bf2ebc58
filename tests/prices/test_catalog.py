"""The bundled GPU catalog: real data, name normalisation, bad rows, AWS refresh over moto."""

from __future__ import annotations

import ast
import csv
import filecmp
import importlib.util
import json
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path

import pytest

from gpufinops.prices.catalog import (
    DATA_DIR, CatalogError, UnknownGpuError, canonical_gpu, load_catalog, load_refresh,
    refresh_from_aws, save_refresh,
)

REPO = Path(__file__).resolve().parents[2]
SHARED = REPO.parent / "shared" / "data"
BUILDER = REPO / "tools" / "build_catalog.py"  # offline script, not in the wheel: loaded by path


@pytest.fixture(scope="module")
def builder():
    spec = importlib.util.spec_from_file_location("build_catalog", BUILDER)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def catalog():
    return load_catalog()


def test_bundled_catalog_covers_providers_and_is_clean(catalog):
    assert catalog.skipped == ()
    providers = {o.provider for o in catalog.offers}
    assert {"aws", "gcp", "azure", "lambda", "runpod"} <= providers
    for p in providers:
        offers = catalog.offers_for([p])
        assert all(o.on_demand_usd_h > 0 and o.gpu in catalog.gpus and o.prices_as_of for o in offers)
    # spot prices where the sources have them (GCP, Azure, some RunPod), never invented for AWS
    assert any(o.spot_usd_h for o in catalog.offers_for(["gcp"]))
    assert any(o.spot_usd_h for o in catalog.offers_for(["azure"]))
    assert not any(o.spot_usd_h for o in catalog.offers_for(["aws"]))
    size = sum(f.stat().st_size for f in DATA_DIR.iterdir())
    assert size < 1_000_000


def test_known_aws_types_have_the_right_gpus(catalog):
    p4d = catalog.offer("aws", "p4d.24xlarge", "us-east-1")
    p4de = catalog.offer("aws", "p4de.24xlarge", "us-east-1")
    p5 = catalog.offer("aws", "p5.48xlarge", "us-east-1")
    g6e = catalog.offer("aws", "g6e.12xlarge", "us-east-1")
    assert (p4d.gpu, p4d.gpu_count, p4d.gpu_memory_gb) == ("A100-40GB", 8, 40.0)
    assert (p4de.gpu, p4de.gpu_memory_gb) == ("A100-80GB", 80.0)
    assert (p5.gpu, p5.gpu_count) == ("H100", 8)
    assert (g6e.gpu, g6e.gpu_count, g6e.gpu_memory_gb) == ("L40S", 4, 48.0)


def test_gpu_specs_fill_the_datasheet_gaps(catalog):
    for key in ("L40S", "A10G", "T4"):
        assert catalog.gpus[key].bf16_tflops > 0
        assert "datasheet" in catalog.gpus[key].source
    notes = (DATA_DIR / "SOURCES.md").read_text()
    for key in ("L40S", "A10G", "T4"):
        assert key in notes
    assert catalog.gpus["H100"].fp8_tflops and catalog.gpus["A100-80GB"].fp8_tflops is None


@pytest.mark.parametrize("name,memory,expected", [
    ("A100-80GB", None, "A100-80GB"),
    ("NVIDIA A100-SXM4-80GB", None, "A100-80GB"),
    ("A100 80GB", None, "A100-80GB"),
    ("A100_SXM_80GB", None, "A100-80GB"),
    ("NVIDIA A100", 40.0, "A100-40GB"),
    ("A100", 80.0, "A100-80GB"),
    ("Tesla T4", None, "T4"),
    ("NVIDIA L4", None, "L4"),
    ("NVIDIA L40S", None, "L40S"),
    ("L40", None, "L40"),
    ("NVIDIA A10G", None, "A10G"),
    ("A10", None, "A10"),
    ("NVIDIA H100 80GB HBM3", None, "H100"),
    ("H100-PCIe", None, "H100-PCIE"),
    ("NVIDIA H100 NVL", None, "H100-NVL"),
    ("NVIDIA H200", None, "H200"),
    ("GH200", None, "GH200"),
    ("Tesla V100-SXM2-32GB", None, "V100-32GB"),
    ("RTX6000-Ada", None, "RTX-6000-ADA"),
    ("AMD Instinct MI300X", None, "MI300X"),
])
def test_gpu_names_normalise_to_one_key(name, memory, expected):
    assert canonical_gpu(name, memory) == expected


@pytest.mark.parametrize("name", ["RTX6000", "AWS Inferentia2", "Qualcomm AI 100", "", "NVIDIA K80"])
def test_unknown_gpu_names_are_refused(name):
    with pytest.raises(UnknownGpuError):
        canonical_gpu(name)


@pytest.mark.skipif(not SHARED.is_dir(), reason="shared/data not present")
def test_build_regenerates_the_bundled_files(builder, tmp_path):
    counts = builder.build(SHARED, tmp_path)
    assert counts["instances"] > 100 and counts["gpus"] >= 20
    assert any(k.startswith("skipped: unknown GPU") for k in counts)  # e.g. Inferentia, M60: counted, not guessed
    for name in ("gpus.csv", "instances.csv", "gcp_parts.csv"):
        assert filecmp.cmp(tmp_path / name, DATA_DIR / name, shallow=False), f"{name} differs from build()"


@pytest.mark.skipif(not SHARED.is_dir(), reason="shared/data not present")
def test_builder_command_writes_where_told_and_prints_counts(tmp_path):
    done = subprocess.run([sys.executable, str(BUILDER), str(SHARED), "--out", str(tmp_path / "out")],
                          capture_output=True, text=True, check=True)
    counts = json.loads(done.stdout)
    assert counts["gpus"] == len((DATA_DIR / "gpus.csv").read_text().splitlines()) - 1
    assert filecmp.cmp(tmp_path / "out" / "instances.csv", DATA_DIR / "instances.csv", shallow=False)


def test_builder_names_a_missing_data_folder(tmp_path):
    done = subprocess.run([sys.executable, str(BUILDER), str(tmp_path / "nope"), "--out", str(tmp_path)],
                          capture_output=True, text=True)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert f"{tmp_path / 'nope' / 'gpu_specs'}" in done.stderr
    assert not (tmp_path / "gpus.csv").exists()


def test_the_package_never_imports_the_offline_builder():
    # tools/ is not shipped in the wheel: an import of it would break every installed copy.
    for path in (REPO / "gpufinops").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else (
                [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            assert not any(n == "tools" or n.startswith(("tools.", "build_catalog")) for n in names), path


def _copy_catalog(tmp_path: Path, extra_rows: list[dict]) -> Path:
    (tmp_path / "gpus.csv").write_text((DATA_DIR / "gpus.csv").read_text())
    with (DATA_DIR / "instances.csv").open() as fh:
        reader = csv.DictReader(fh)
        fields = reader.fieldnames
        rows = [r for _, r in zip(range(5), reader)]
    with (tmp_path / "instances.csv").open("w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=fields)
        w.writeheader()
        for r in rows + extra_rows:
            w.writerow({k: r.get(k, "") for k in fields})
    return tmp_path


BAD_ROWS = [
    {"provider": "aws", "instance_type": "x.1", "gpu": "Quadro RTX 6000", "gpu_count": "1", "on_demand_usd_h": "1"},
    {"provider": "aws", "instance_type": "x.2", "gpu": "L4", "gpu_count": "1", "on_demand_usd_h": "cheap"},
    {"provider": "aws", "instance_type": "x.3", "gpu": "L4", "gpu_count": "0.5", "on_demand_usd_h": "0.2"},
    {"provider": "aws", "instance_type": "x.4", "gpu": "L4", "gpu_count": "1", "on_demand_usd_h": "-1"},
]


def test_bad_rows_are_skipped_with_file_and_line(tmp_path):
    folder = _copy_catalog(tmp_path, BAD_ROWS)
    cat = load_catalog(folder)
    assert len(cat.offers) == 5
    assert len(cat.skipped) == 4
    assert cat.skipped[0].startswith(f"{folder / 'instances.csv'}:7:") and "Quadro RTX 6000" in cat.skipped[0]
    assert "'on_demand_usd_h'" in cat.skipped[1] and ":8:" in cat.skipped[1]
    assert "fractional" in cat.skipped[2]
    assert "positive" in cat.skipped[3]


def test_gcp_parts_are_optional_and_their_bad_rows_skipped_with_file_and_line(tmp_path):
    folder = _copy_catalog(tmp_path, [])
    assert load_catalog(folder).parts == ()  # a catalog folder without gcp_parts.csv prices no VM in parts
    (folder / "gcp_parts.csv").write_text(
        "part,name,region,vcpus,memory_gib,on_demand_usd_h,spot_usd_h,prices_as_of,source\n"
        "machine,n1-standard-8,us-central1,8,30,0.38,0.13954,2026-05-20,x\n"
        "gpus,T4,us-central1,,,0.35,,2026-05-20,x\n"
        "gpu,T4,us-central1,,,0,,2026-05-20,x\n")
    cat = load_catalog(folder)
    assert [p.name for p in cat.parts] == ["n1-standard-8"]
    assert cat.skipped[0].startswith(f"{folder / 'gcp_parts.csv'}:3: column 'part': 'gpus'")
    assert cat.skipped[1].startswith(f"{folder / 'gcp_parts.csv'}:4: column 'on_demand_usd_h'")
    price, why = cat.price_from_parts("n1-standard-8", "us-central1", [("T4", 1)], spot=False)
    assert price is None and why == "unpriced: no bundled price of an attached T4 in us-central1"


def test_strict_mode_raises_on_the_first_bad_row(tmp_path):
    folder = _copy_catalog(tmp_path, BAD_ROWS[1:2])
    with pytest.raises(CatalogError, match=r"instances.csv:7: column 'on_demand_usd_h'"):
        load_catalog(folder, strict=True)


def test_missing_column_names_the_file(tmp_path):
    (tmp_path / "gpus.csv").write_text("gpu,vendor,memory_gb\nL4,NVIDIA,24\n")
    (tmp_path / "instances.csv").write_text((DATA_DIR / "instances.csv").read_text())
    with pytest.raises(CatalogError, match=r"gpus.csv:1: missing column\(s\) bf16_tflops"):
        load_catalog(tmp_path)


def test_refresh_from_aws_over_moto(aws, tmp_path, catalog):
    now = datetime(2026, 11, 29, 12, 0, tzinfo=timezone.utc)
    cache = refresh_from_aws(aws.client("ec2"), aws.client("pricing"), "us-east-1",
                             ["g5.xlarge", "p4d.24xlarge", "g6.xlarge", "m5.large"], now)
    assert cache.instance_types["g5.xlarge"]["gpu"] == "A10G"
    assert cache.instance_types["p4d.24xlarge"] == {"gpu": "A100-40GB", "gpu_count": 8, "gpu_memory_gb": 40.0}
    assert "m5.large" not in cache.instance_types  # no GpuInfo: not a GPU type
    assert set(cache.spot) >= {"g5.xlarge", "g6.xlarge"}
    # The Pricing API may be unavailable (moto does not implement it): recorded, bundled prices kept.
    assert not cache.on_demand and any("pricing" in e for e in cache.errors)

    path = tmp_path / "prices.json"
    save_refresh(cache, path)
    loaded = load_refresh(path)
    assert loaded == cache
    merged = catalog.with_aws_refresh(loaded)
    g5 = merged.offer("aws", "g5.xlarge", "us-east-1")
    assert g5.spot_usd_h == cache.spot["g5.xlarge"]
    assert g5.on_demand_usd_h == catalog.offer("aws", "g5.xlarge", "us-east-1").on_demand_usd_h
    assert g5.prices_as_of == now.date() and merged.refreshed_at == now


def test_corrupt_price_cache_is_a_clear_error(tmp_path):
    path = tmp_path / "prices.json"
    path.write_text("{not json")
    with pytest.raises(CatalogError, match="prices.json: unreadable AWS price cache"):
        load_refresh(path)
