"""Azure GPU VM sizes: the GPU model and count of each, and its on-demand and spot price per region.

Read from the bundled `gpufinops/data/azure_gpu_vms.csv` (SkyPilot's Azure catalog of 2026-05-20, every size with an
accelerator; gpufinops/data/SOURCES.md): ARM's VM listing names a size, never its GPUs. A size of the NC, ND or NV
families that the table lacks is still listed as a GPU VM, with its GPU model and count unknown (judged on every
GPU series its host exports; priced at nothing, never guessed).

Pure: reads one bundled file, no network.
"""

from __future__ import annotations

import csv
import functools
import math
from dataclasses import dataclass
from pathlib import Path

DATA_FILE = Path(__file__).resolve().parents[2] / "data" / "azure_gpu_vms.csv"
PRICES_AS_OF = "2026-05-20"
PRICE_SOURCE = f"Azure pay-as-you-go Linux price of {PRICES_AS_OF} (bundled, SkyPilot catalog)"

# Memory of one GPU, GiB, by the table's model names (NVIDIA and AMD data sheets). The NC H100 v5 sizes carry the
# H100 NVL (94 GB); the ND H100 v5 sizes the SXM H100 (80 GB): told apart by the family in `gpu_memory_gib`.
_MEMORY_GIB = {"A10": 24.0, "A100": 40.0, "A100-80GB": 80.0, "H100": 80.0, "H200": 141.0, "M60": 8.0,
               "MI25": 16.0, "MI300X": 192.0, "T4": 16.0, "V100": 16.0, "V100-32GB": 32.0}
_H100_NVL_GIB = 94.0


@dataclass(frozen=True)
class SizeInfo:
    size: str
    gpu_model: str
    gpu_count: int  # visible devices: a fraction of one GPU (NVads A10 v5) is one device
    gpu_share: float  # the table's count: 0.167 for a sixth of an A10
    gpu_memory_gib: float  # per visible device


@dataclass(frozen=True)
class SizePrice:
    on_demand: float | None
    spot: float | None
    as_of: str = PRICES_AS_OF


def gpu_memory_gib(size: str, model: str, share: float) -> float:
    full = _H100_NVL_GIB if model == "H100" and size.startswith("Standard_NC") else _MEMORY_GIB.get(model, 0.0)
    return round(full * share, 2) if share < 1 else full


class AzureSizes:
    """The bundled table: `info(size)`, `price(size, region, spot)`."""

    def __init__(self, rows: list[dict[str, str]], origin: str = "bundled, SkyPilot catalog"):
        self.origin = origin
        self._info: dict[str, SizeInfo] = {}
        self._prices: dict[tuple[str, str], SizePrice] = {}
        for r in rows:
            size = r["size"]
            share = float(r["gpu_count"])
            self._info.setdefault(size.lower(), SizeInfo(
                size, r["gpu_model"], max(1, int(math.floor(share))), share,
                gpu_memory_gib(size, r["gpu_model"], share)))
            self._prices[(size.lower(), r["region"].lower())] = SizePrice(
                _usd(r["usd_per_hour"]), _usd(r["spot_usd_per_hour"]), r.get("as_of") or PRICES_AS_OF)

    @classmethod
    @functools.lru_cache(maxsize=1)
    def load_default(cls) -> "AzureSizes":
        return cls.load(DATA_FILE)

    @classmethod
    def load(cls, path: str | Path, origin: str = "") -> "AzureSizes":
        """A size table: the bundled one, or one `tools/refresh_azure_prices.py` wrote (`azure.price_file`)."""
        with Path(path).open(newline="", encoding="utf-8") as f:
            rows = list(csv.DictReader(f))
        missing = {"size", "gpu_model", "gpu_count", "region", "usd_per_hour", "spot_usd_per_hour"} - set(
            rows[0] if rows else ())
        if missing:
            raise ValueError(f"{path}: not an Azure size table (no column {', '.join(sorted(missing))})")
        return cls(rows, origin or ("bundled, SkyPilot catalog" if Path(path) == DATA_FILE else f"{path}"))

    def info(self, size: str) -> SizeInfo | None:
        return self._info.get(size.lower())

    def sizes(self) -> list[str]:
        return sorted(i.size for i in self._info.values())

    def price_source(self, size: str, region: str) -> str:
        found = self._prices.get((size.lower(), region.lower()))
        as_of = found.as_of if found else PRICES_AS_OF
        return f"Azure pay-as-you-go Linux price of {as_of} ({self.origin})"

    def price(self, size: str, region: str, spot: bool) -> float | None:
        """USD/h of the whole VM in `region` (ARM's location name, e.g. eastus); None where the table has none."""
        found = self._prices.get((size.lower(), region.lower()))
        if found is None:
            return None
        return found.spot if spot else found.on_demand


def _usd(text: str) -> float | None:
    try:
        value = float(text)
    except (TypeError, ValueError):
        return None
    return value if value > 0 and math.isfinite(value) else None
