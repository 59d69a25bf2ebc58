"""GCP GPU VM prices refreshed from the Cloud Billing Catalog, only when asked (prices/gcp_refresh.py,
places/gcp/billing_catalog.py): a stand-in of the Catalog API on 127.0.0.1 answers Compute Engine's SKUs in pages,
shaped as the API answers them (description, category, serviceRegions, pricingInfo with units and nanos); a VM
listed afterwards carries the refreshed price."""

from __future__ import annotations

import json
import threading
from datetime import datetime, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlparse

import pytest

from gpufinops.cli.recommend import refresh_gcp_prices
from gpufinops.config import load_settings
from gpufinops.prices.catalog import load_catalog
from gpufinops.prices.gcp_refresh import load_gcp_refresh, machine_prices, part_prices, parts_from_skus
from gpufinops.run.compose import live_gce

NOW = datetime(2026, 12, 7, 9, 0, tzinfo=timezone.utc)
TOKEN = "ya29.billing"
AMERICAS = ["us-central1", "us-east4", "us-west1"]


def sku(description: str, usage: str, group: str, regions: list[str], usd: float, unit: str = "h") -> dict:
    units, nanos = int(usd), round((usd - int(usd)) * 1e9)
    return {"name": f"services/6F81-5844-456A/skus/{abs(hash(description)) % 10**8:08d}",
            "skuId": f"{abs(hash(description)) % 10**4:04X}-0000-0000", "description": description,
            "category": {"serviceDisplayName": "Compute Engine", "resourceFamily": "Compute",
                         "resourceGroup": group, "usageType": usage},
            "serviceRegions": regions,
            "pricingInfo": [{"effectiveTime": "2026-12-01T00:00:00Z", "pricingExpression": {
                "usageUnit": unit, "displayQuantity": 1,
                "tieredRates": [{"startUsageAmount": 0, "unitPrice": {
                    "currencyCode": "USD", "units": str(units), "nanos": nanos}}]}}],
            "serviceProviderName": "Google"}


SKUS = [
    sku("G2 Instance Core running in Americas", "OnDemand", "CPU", AMERICAS, 0.024988),
    sku("G2 Instance Ram running in Americas", "OnDemand", "RAM", AMERICAS, 0.002927, "GiBy.h"),
    sku("Nvidia L4 GPU running in Americas", "OnDemand", "GPU", AMERICAS, 0.560040),
    sku("Spot Preemptible G2 Instance Core running in Americas", "Preemptible", "CPU", AMERICAS, 0.009996),
    sku("Spot Preemptible G2 Instance Ram running in Americas", "Preemptible", "RAM", AMERICAS, 0.001171, "GiBy.h"),
    sku("Nvidia L4 GPU attached to Spot Preemptible VMs running in Americas", "Preemptible", "GPU", AMERICAS, 0.224016),
    sku("A2 Instance Core running in Americas", "OnDemand", "CPU", ["us-central1"], 0.031599),
    sku("A2 Instance Ram running in Americas", "OnDemand", "RAM", ["us-central1"], 0.004237, "GiBy.h"),
    sku("Nvidia Tesla A100 GPU running in Americas", "OnDemand", "GPU", ["us-central1"], 2.933908),
    sku("E2 Instance Core running in Americas", "OnDemand", "CPU", AMERICAS, 0.021811),
    # An N1 VM with an attached T4: N1's predefined types bill "N1 Predefined" core and RAM SKUs, the GPU its own.
    sku("N1 Predefined Instance Core running in Americas", "OnDemand", "CPU", AMERICAS, 0.031611),
    sku("N1 Predefined Instance Ram running in Americas", "OnDemand", "RAM", AMERICAS, 0.004237, "GiBy.h"),
    sku("Nvidia Tesla T4 GPU running in Americas", "OnDemand", "GPU", AMERICAS, 0.35),
    sku("Spot Preemptible N1 Predefined Instance Core running in Americas", "Preemptible", "CPU", AMERICAS, 0.006655),
    sku("Spot Preemptible N1 Predefined Instance Ram running in Americas", "Preemptible", "RAM", AMERICAS, 0.000892,
        "GiBy.h"),
    sku("Nvidia Tesla T4 GPU attached to Spot Preemptible VMs running in Americas", "Preemptible", "GPU", AMERICAS,
        0.069),
    sku("Commitment v1: Nvidia Tesla T4 GPU in Americas for 1 Year", "Commit1Yr", "GPU", AMERICAS, 0.22),
    sku("Storage PD Capacity", "OnDemand", "PDStandard", AMERICAS, 0.04, "GiBy.mo"),
]


class Catalog:
    def __init__(self, page_size: int = 4):
        self.asked: list[dict] = []
        stub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *_):
                pass

            def do_GET(self):  # noqa: N802
                url = urlparse(self.path)
                query = {k: v[0] for k, v in parse_qs(url.query).items()}
                stub.asked.append({"path": url.path, **query, "auth": self.headers.get("Authorization")})
                if self.headers.get("Authorization") != f"Bearer {TOKEN}":
                    status, body = 401, {"error": {"code": 401, "message": "unauthenticated"}}
                elif url.path != "/v1/services/6F81-5844-456A/skus":
                    status, body = 404, {"error": {"code": 404, "message": "not found"}}
                else:
                    start = int(query.get("pageToken") or 0)
                    page = SKUS[start:start + page_size]
                    body = {"skus": page, "nextPageToken": str(start + page_size)
                            if start + page_size < len(SKUS) else ""}
                    status = 200
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


@pytest.fixture
def billing():
    c = Catalog()
    yield c
    c.server.shutdown()
    c.server.server_close()


def test_a_machine_type_is_priced_from_its_parts_to_the_cent():
    offers = [o for o in load_catalog().offers if o.provider == "gcp"]
    prices, kept = machine_prices(parts_from_skus(SKUS, {"us-central1", "us-east4"}), offers)
    g2 = prices["g2-standard-8@us-central1"]
    assert g2["on_demand"] == pytest.approx(8 * 0.024988 + 32 * 0.002927 + 0.560040)
    assert g2["spot"] == pytest.approx(8 * 0.009996 + 32 * 0.001171 + 0.224016)
    assert round(g2["on_demand"], 2) == 0.85  # the bundled price (0.85362) to the cent
    a2 = prices["a2-highgpu-1g@us-central1"]
    assert a2["on_demand"] == pytest.approx(12 * 0.031599 + 85 * 0.004237 + 2.933908) and "spot" not in a2
    assert "a2-highgpu-1g@europe-west4" in kept  # no SKU for that region: the bundled price stays
    assert "a3-highgpu-8g@us-central1" in kept  # no A3 parts in this catalog


def test_the_parts_of_an_n1_vm_are_priced_from_their_skus_to_the_cent():
    catalog = load_catalog()
    prices, kept = part_prices(parts_from_skus(SKUS, {"us-central1", "europe-west4"}), catalog.parts)
    n1 = prices["machine:n1-standard-8@us-central1"]
    assert n1["on_demand"] == pytest.approx(8 * 0.031611 + 30 * 0.004237)
    assert round(n1["on_demand"], 2) == catalog.part("machine", "n1-standard-8", "us-central1").on_demand_usd_h
    assert n1["spot"] == pytest.approx(8 * 0.006655 + 30 * 0.000892)
    assert prices["gpu:T4@us-central1"] == {"on_demand": 0.35, "spot": 0.069}  # never the 1-year commitment's
    assert "gpu:P100@us-central1" in kept and "machine:n1-standard-8@europe-west4" in kept  # no SKU: bundled stays


def test_refreshed_only_when_asked_then_a_listed_vm_carries_it(billing, gce, tmp_path, monkeypatch):
    monkeypatch.setenv("GPUFINOPS_GCP_ACCESS_TOKEN", TOKEN)
    cache = tmp_path / "gcp-prices.json"
    settings = load_settings(gcp={"projects": ["ml-prod"], "api_endpoint": gce.url,
                                  "billing_catalog_endpoint": billing.url, "price_cache_path": str(cache)})
    gce.add("l4", "us-central1-a", "g2-standard-8")
    gce.add("t4", "us-central1-a", "n1-standard-8", accelerators=[("nvidia-tesla-t4", 1)])
    gce.add("t4-spot", "us-central1-b", "n1-standard-8", accelerators=[("nvidia-tesla-t4", 1)], spot=True)
    before = {v.instance_id.rsplit("/", 1)[1]: v for v in live_gce(settings).list_gpu_instances()}
    assert before["l4"].hourly_cost == pytest.approx(0.85362)  # bundled
    assert before["t4-spot"].hourly_cost == pytest.approx(0.13954 + 0.1654)  # bundled parts
    assert billing.asked == []  # listing never reads the Catalog

    refresh_gcp_prices(settings, load_catalog(), NOW)
    assert [a.get("pageToken", "") for a in billing.asked] == ["", "4", "8", "12", "16"]
    assert all(a["currencyCode"] == "USD" and a["auth"] == f"Bearer {TOKEN}" for a in billing.asked)
    assert load_gcp_refresh(cache).fetched_at == NOW

    vms = {v.instance_id.rsplit("/", 1)[1]: v for v in live_gce(settings).list_gpu_instances()}
    assert vms["l4"].hourly_cost == pytest.approx(8 * 0.024988 + 32 * 0.002927 + 0.560040)
    assert vms["t4"].hourly_cost == pytest.approx(8 * 0.031611 + 30 * 0.004237 + 0.35)
    assert round(vms["t4"].hourly_cost, 2) == 0.73  # the bundled parts' price to the cent
    assert vms["t4-spot"].hourly_cost == pytest.approx(8 * 0.006655 + 30 * 0.000892 + 0.069)
    assert vms["t4-spot"].price_source.endswith("as of 2026-12-07")  # both parts refreshed


def test_a_failed_refresh_keeps_the_earlier_prices(billing, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("GPUFINOPS_GCP_ACCESS_TOKEN", "ya29.wrong")
    cache = tmp_path / "gcp-prices.json"
    settings = load_settings(gcp={"projects": ["ml-prod"], "billing_catalog_endpoint": billing.url,
                                  "price_cache_path": str(cache), "read_attempts": 1})
    refresh_gcp_prices(settings, load_catalog(), NOW)
    assert not cache.exists() and "GCP price refresh failed" in capsys.readouterr().err
