"""Prices of rented GPU hosts without a cloud bill (issue 17 item 4): the pure lookup and the `hosts:` settings.

The order is the host's own price, then the price per GPU of its model, then an estimate from the bundled GPU
catalog (the lowest on-demand $/GPU-h of the model, x the GPU count), which says that it is one. An unknown model
has no price and says why, never $0.
"""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

from gpufinops.prices.catalog import DATA_DIR, INSTANCES_FILE, load_catalog
from gpufinops.config import ConfigError, load_settings
from gpufinops.prices.host_prices import (
    KIND_ESTIMATE, KIND_GPU_MODEL, KIND_HOST, HostPriceTable, host_price, is_estimate,
)

CATALOG = load_catalog()
TABLE = HostPriceTable(per_host={"gpu-box-1": 19.9}, per_gpu={"H100": 2.49}, origin="the test's hosts:")


def lowest_per_gpu_from_csv(gpu: str) -> tuple[float, str]:
    """Independently of gpufinops.catalog: the lowest on-demand price per GPU of `gpu` in instances.csv."""
    with (Path(DATA_DIR) / INSTANCES_FILE).open(newline="") as f:
        rows = [r for r in csv.DictReader(f) if r["gpu"] == gpu]
    best = min(rows, key=lambda r: float(r["on_demand_usd_h"]) / int(r["gpu_count"]))
    return float(best["on_demand_usd_h"]) / int(best["gpu_count"]), best["instance_type"]


def test_the_hosts_own_price_beats_the_models_which_beats_the_catalog():
    own = host_price("GPU-BOX-1", "NVIDIA H100 80GB HBM3", 8, TABLE, CATALOG)
    assert (own.usd_per_hour, own.kind, own.is_estimate) == (19.9, KIND_HOST, False)
    assert own.source == "the price of GPU-BOX-1 in the test's hosts:" and own.why == ""

    model = host_price("gpu-box-2", "NVIDIA H100 80GB HBM3", 8, TABLE, CATALOG)
    assert (model.usd_per_hour, model.kind, model.is_estimate) == (pytest.approx(8 * 2.49), KIND_GPU_MODEL, False)
    assert model.source == "8 × H100 at $2.49/GPU-h from the test's hosts:"

    guess = host_price("gpu-box-2", "NVIDIA H200", 8, TABLE, CATALOG)
    assert guess.kind == KIND_ESTIMATE and guess.is_estimate and is_estimate(guess.source)
    assert guess.source.startswith("estimate: 8 × H200 at $")


def test_h100_times_8_from_the_catalog_equals_the_csvs_lowest_price_per_gpu():
    unit, itype = lowest_per_gpu_from_csv("H100")
    price = host_price("rented-1", "NVIDIA H100 80GB HBM3", 8, None, CATALOG)
    assert price.usd_per_hour == pytest.approx(unit * 8)
    assert price.currency == "USD" and price.kind == KIND_ESTIMATE
    assert (f"estimate: 8 × H100 at ${unit:,.2f}/GPU-h, the lowest on-demand price per H100 in the GPU catalog ("
            in price.source) and itype in price.source


@pytest.mark.parametrize("model,count,words", [
    ("NVIDIA RTX 5090", 2, "GPU model 'NVIDIA RTX 5090' is not one gpufinops knows"),
    ("", 8, "the GPU model of box is not known"),
    ("NVIDIA H100 80GB HBM3", 0, "the GPU count of box is not known"),
])
def test_no_price_is_none_with_the_reason_never_zero(model, count, words):
    price = host_price("box", model, count, TABLE, CATALOG)
    assert price.usd_per_hour is None and price.source == "" and price.kind == ""
    assert words in price.why


def test_without_a_catalog_the_reason_says_why_there_is_no_estimate():
    price = host_price("box", "NVIDIA L40S", 4, TABLE, None, catalog_problem="the GPU catalog could not be read: x")
    assert price.usd_per_hour is None
    assert price.why == ("no price for 4 × L40S in the test's hosts:, and no catalog estimate: the GPU catalog could "
                         "not be read: x")


# --------------------------------------------------------------------------- the hosts: settings

GOOD = """\
hosts:
  currency: USD
  usd_per_gpu_hour:
    H100: 2.49
    NVIDIA A100-SXM4-80GB: 1.6
  inventory:
    - hostname: gpu-box-1
      gpu_model: NVIDIA H100 80GB HBM3
      gpu_count: 8
      usd_per_hour: 19.9
      tags: {owner: alice, team: ml}
    - hostname: gpu-box-2
      gpu_model: RTX 5090
      gpu_count: 2
      usd_per_hour: 3.1
"""


def test_hosts_section_loads_typed(tmp_path):
    settings = load_settings(write(tmp_path, GOOD))
    hosts = settings.hosts
    assert hosts.usd_per_gpu_hour == {"H100": 2.49, "A100-80GB": 1.6}  # keys are the catalog's names
    assert [(h.hostname, h.gpu_count, h.usd_per_hour) for h in hosts.inventory] == [
        ("gpu-box-1", 8, 19.9), ("gpu-box-2", 2, 3.1)]
    assert hosts.inventory[0].tags == {"owner": "alice", "team": "ml"}
    assert load_settings(None).hosts is None


@pytest.mark.parametrize("old,new,line,key,words", [
    ("H100: 2.49", 'H100: "2.49"', 3, "hosts.usd_per_gpu_hour", "H100: expected a price in USD per hour"),
    ("H100: 2.49", "H100: 0", 3, "hosts.usd_per_gpu_hour", "H100: a price must be above 0"),
    ("H100: 2.49", "H10O: 2.49", 3, "hosts.usd_per_gpu_hour", "unknown GPU model 'H10O'"),
    ("usd_per_hour: 19.9", "usd_per_hour: -19.9", 10, "hosts.inventory.0.usd_per_hour", "must be above 0"),
    ("usd_per_hour: 19.9", "usd_per_hour: true", 10, "hosts.inventory.0.usd_per_hour", "expected a price"),
    ("usd_per_hour: 19.9", "usd_per_hour: 19.9\n      price: 3", 11, "hosts.inventory.0.price",
     "Extra inputs are not permitted"),
    ("      usd_per_hour: 3.1\n", "", 13, "hosts.inventory.1.gpu_model",
     "unknown GPU model 'RTX 5090'"),
    ("gpu_count: 8", "gpu_count: 0", 9, "hosts.inventory.0.gpu_count", "greater than or equal to 1"),
    ("currency: USD", "currency: EUR", 2, "hosts.currency", "only USD ('EUR' given)"),
    ("hostname: gpu-box-2", "hostname: gpu-box-1", 6, "hosts.inventory", "host 'gpu-box-1' is listed twice"),
    ("hostname: gpu-box-1", "hostname: 'gpu box 1'", 7, "hosts.inventory.0.hostname", "is not a hostname"),
])
def test_bad_hosts_settings_name_file_line_and_key(old, new, line, key, words, tmp_path):
    assert old in GOOD
    path = write(tmp_path, GOOD.replace(old, new, 1))
    with pytest.raises(ConfigError) as err:
        load_settings(path)
    msg = str(err.value)
    assert msg.startswith(f"{path}:{line}: key '{key}': "), msg
    assert words in msg, msg


def write(folder: Path, text: str) -> Path:
    path = folder / "gpufinops.yaml"
    path.write_text(text)
    return path
