"""Azure GPU VM prices: the bundled size table (source and date), and the refresh from the Azure Retail Prices API
only when a person asks, against a stand-in of the API on 127.0.0.1 answering as the API documents (Items,
NextPageLink pages; Linux, Windows, Spot and Low Priority meters of a size)."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

import pytest

from gpufinops.places.azure.retail import RetailPricesError, meter_of, refresh
from gpufinops.places.azure.sizes import DATA_FILE, AzureSizes

SIZE = "Standard_NC24ads_A100_v4"


def item(region: str, price: float, *, sku: str = "NC24ads A100 v4", product: str = "Virtual Machines NCadsA100v4 "
         "Series", kind: str = "Consumption") -> dict:
    return {"currencyCode": "USD", "tierMinimumUnits": 0.0, "retailPrice": price, "unitPrice": price,
            "armRegionName": region, "location": region, "effectiveStartDate": "2026-06-01T00:00:00Z",
            "meterId": f"m-{region}-{sku}", "meterName": sku, "productId": "DZH318Z08M9V", "skuId": "DZH318Z08M9V/00TG",
            "productName": product, "skuName": sku, "serviceName": "Virtual Machines", "serviceId": "DZH313Z7MMC8",
            "serviceFamily": "Compute", "unitOfMeasure": "1 Hour", "type": kind, "isPrimaryMeterRegion": True,
            "armSkuName": SIZE}


ITEMS = [item("eastus", 3.9), item("eastus", 1.1, sku="NC24ads A100 v4 Spot"),
         item("eastus", 4.6, product="Virtual Machines NCadsA100v4 Series Windows"),
         item("eastus", 0.9, sku="NC24ads A100 v4 Low Priority"), item("eastus", 20000.0, kind="Reservation"),
         item("westeurope", 4.1)]


@pytest.fixture()
def retail_api():
    asked: list[dict] = []

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *_a):
            pass

        def do_GET(self):
            query = parse_qs(urlsplit(self.path).query)
            asked.append(query)
            page = int((query.get("page") or ["0"])[0])
            wanted = [i for i in ITEMS if f"armSkuName eq '{i['armSkuName']}'" in query["$filter"][0]]
            # Two items a page, as the API's (1,000-item) pages, with its NextPageLink.
            body = {"BillingCurrency": "USD", "CustomerEntityId": "Default", "CustomerEntityType": "Retail",
                    "Items": wanted[2 * page: 2 * page + 2], "Count": len(wanted[2 * page: 2 * page + 2])}
            if 2 * page + 2 < len(wanted):
                body["NextPageLink"] = f"{url}?{urlsplit(self.path).query.split('&page=')[0]}&page={page + 1}"
            data = json.dumps(body).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    url = f"http://127.0.0.1:{server.server_address[1]}/api/retail/prices"
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield url, asked
    server.shutdown()


def test_the_bundled_table_names_each_gpu_size_its_gpus_and_prices_with_its_date():
    sizes = AzureSizes.load_default()
    a10 = sizes.info("standard_nv6ads_a10_v5")  # ARM's size names are case-insensitive
    assert (a10.gpu_model, a10.gpu_count, a10.gpu_share, a10.gpu_memory_gib) == ("A10", 1, 0.167, 4.01)
    nd = sizes.info("Standard_ND96isr_H100_v5")
    assert (nd.gpu_model, nd.gpu_count, nd.gpu_memory_gib) == ("H100", 8, 80.0)
    assert sizes.info("Standard_NC40ads_H100_v5").gpu_memory_gib == 94.0  # the NC H100 v5 carry the H100 NVL
    assert (sizes.price(SIZE, "eastus", spot=False), sizes.price(SIZE, "eastus", spot=True)) == (3.673, 0.746721)
    assert sizes.price(SIZE, "nowhere", spot=False) is None and sizes.info("Standard_D4s_v5") is None
    assert sizes.price_source(SIZE, "eastus") == ("Azure pay-as-you-go Linux price of 2026-05-20 "
                                                  "(bundled, SkyPilot catalog)")
    assert "azure_gpu_vms.csv" in (DATA_FILE.parent / "SOURCES.md").read_text()


def test_only_linux_pay_as_you_go_and_spot_hourly_meters_are_prices():
    assert meter_of(ITEMS[0]).usd_per_hour == 3.9 and not meter_of(ITEMS[0]).spot
    assert meter_of(ITEMS[1]).spot
    assert [meter_of(i) for i in ITEMS[2:5]] == [None, None, None]  # Windows, Low Priority, reservation


def test_a_refresh_asks_the_api_per_size_follows_its_pages_and_writes_a_table_the_place_reads(retail_api, tmp_path):
    url, asked = retail_api
    out = tmp_path / "azure_prices.csv"
    assert refresh(out, "2026-12-07", base_url=url, only=[SIZE]) == 2
    assert len(asked) == 3 and asked[0]["$filter"] == [f"armSkuName eq '{SIZE}' and priceType eq 'Consumption'"]
    table = AzureSizes.load(out)
    assert (table.price(SIZE, "eastus", spot=False), table.price(SIZE, "eastus", spot=True)) == (3.9, 1.1)
    assert table.price(SIZE, "westeurope", spot=True) is None and table.info(SIZE).gpu_model == "A100-80GB"
    assert table.price_source(SIZE, "eastus") == f"Azure pay-as-you-go Linux price of 2026-12-07 ({out})"


def test_a_refresh_that_finds_nothing_writes_nothing(retail_api, tmp_path):
    url, _ = retail_api
    out = tmp_path / "azure_prices.csv"
    with pytest.raises(RetailPricesError, match="nothing written"):
        refresh(out, "2026-12-07", base_url=url, only=["Standard_D4s_v5"])
    assert not out.exists()


def test_the_tool_writes_the_table_and_a_bad_endpoint_is_one_error_line(retail_api, tmp_path, capsys):
    import importlib.util

    spec = importlib.util.spec_from_file_location("refresh_tool", DATA_FILE.parents[2] / "tools" /
                                                  "refresh_azure_prices.py")
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    url, _ = retail_api
    assert tool.main([str(tmp_path / "p.csv"), "--size", SIZE, "--url", url]) == 0
    assert "2 (size, region) prices" in capsys.readouterr().out
    assert tool.main([str(tmp_path / "q.csv"), "--size", SIZE, "--url", "http://127.0.0.1:9/none"]) == 1
    assert capsys.readouterr().err.startswith("error: ")
