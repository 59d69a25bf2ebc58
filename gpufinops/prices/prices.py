"""Small AWS GPU on-demand price and GPU-spec lookup, bundled with the package.

Used for the "$/h" in verdicts and as the fallback for GpuInfo when
describe_instance_types does not know a type. It is deliberately small: the
multi-cloud sizing catalog lives in gpufinops/catalog.py.

An unknown price is None, never 0: a zero would read as "this idle GPU costs
nothing" in every report. Spot prices are not bundled (they move hourly), so
`hourly(..., lifecycle="spot")` is None; Ec2Cloud asks DescribeSpotPriceHistory.

The bundled CSV is derived from two files in shared/data/gpu_prices (see
gpufinops/data/SOURCES.md); `python -m gpufinops.prices SRC_DIR OUT.csv`
regenerates it, and a test checks the shipped file matches the regeneration.
"""

from __future__ import annotations

import argparse
import csv
import io
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Mapping

DEFAULT_CSV = Path(__file__).resolve().parents[1] / "data" / "aws_gpu_ondemand_prices.csv"
KARPENTER_FILE = "aws_ec2_ondemand_prices_karpenter_us-east-1.csv"
VANTAGE_FILE = "aws_gpu_instances_vantage_via_tsaol_flat.csv"

COLUMNS = (
    "instance_type",
    "region",
    "on_demand_usd_per_hour",
    "gpu_manufacturer",
    "gpu_model",
    "gpu_count",
    "gpu_memory_gib",
    "source",
)

# Accelerators in the vantage data that are not GPUs: no DCGM, not our business.
_ASIC_PREFIXES = ("AWS Inferentia", "AWS Trainium", "Qualcomm", "Habana", "Intel Gaudi")
# Vantage quotes some memory figures for the whole instance (p4d: "320 GB" for
# 8 x 40 GB) and others per GPU (g5.12xlarge: "24 GB" for 4 x 24 GB). No single
# GPU has more than ~288 GB today, so a larger figure is an instance total.
_MAX_SINGLE_GPU_GB = 300.0
# Vantage names vs the names describe_instance_types reports.
_MODEL_ALIASES = {"B200 Blackwell": "B200", "B300 Blackwell": "B300"}


class PriceCatalogError(ValueError):
    """The price CSV is malformed; the message names file and line."""


@dataclass(frozen=True)
class GpuSpec:
    """GPUs of one instance type. gpu_count may be fractional (g6f: 1/8 of a GPU)."""

    gpu_count: float
    gpu_model: str
    gpu_memory_gib: float  # of one whole GPU; a fractional type gets gpu_count of it
    manufacturer: str = ""


class OnDemandPrices:
    """On-demand USD/h per (instance type, region) plus GPU specs per type.

    Instances are callable as the Cloud price lookup: `prices(type, region, lifecycle)`.
    """

    def __init__(self, prices: Mapping[tuple[str, str], float], specs: Mapping[str, GpuSpec]) -> None:
        self._prices = dict(prices)
        self._specs = dict(specs)

    # ------------------------------------------------------------------ loading
    @classmethod
    def load_default(cls) -> "OnDemandPrices":
        return cls.load(DEFAULT_CSV)

    @classmethod
    def load(cls, path: str | Path) -> "OnDemandPrices":
        path = Path(path)
        try:
            text = path.read_text()
        except OSError as exc:
            raise PriceCatalogError(f"{path}: cannot read: {exc.strerror or exc}") from exc
        prices: dict[tuple[str, str], float] = {}
        specs: dict[str, GpuSpec] = {}
        lines = [(n, line) for n, line in enumerate(text.splitlines(), start=1) if line.strip() and not line.startswith("#")]
        if not lines:
            raise PriceCatalogError(f"{path}: empty price catalog")
        header_line, header = lines[0]
        reader = csv.DictReader(io.StringIO("\n".join(line for _, line in lines)))
        missing = set(COLUMNS) - set(reader.fieldnames or ())
        if missing:
            raise PriceCatalogError(f"{path}:{header_line}: missing columns {sorted(missing)}")
        for (lineno, _), row in zip(lines[1:], reader):
            itype, region = row["instance_type"].strip(), row["region"].strip()
            try:
                price = float(row["on_demand_usd_per_hour"])
                count = float(row["gpu_count"]) if row["gpu_count"] else 0.0
                memory = float(row["gpu_memory_gib"]) if row["gpu_memory_gib"] else 0.0
            except ValueError as exc:
                raise PriceCatalogError(f"{path}:{lineno}: {exc}") from None
            if not itype or not region or price <= 0:
                raise PriceCatalogError(f"{path}:{lineno}: need instance_type, region and a positive price")
            prices[(itype, region)] = price
            if itype not in specs and count > 0:
                specs[itype] = GpuSpec(count, row["gpu_model"], memory, row["gpu_manufacturer"])
        return cls(prices, specs)

    # ------------------------------------------------------------------ lookups
    def hourly(self, instance_type: str, region: str, lifecycle: str = "on-demand") -> float | None:
        """On-demand USD/h of the whole instance; None when not known (never 0)."""
        if lifecycle != "on-demand":
            return None
        return self._prices.get((instance_type, region))

    __call__ = hourly

    def gpu_spec(self, instance_type: str) -> GpuSpec | None:
        return self._specs.get(instance_type)

    def instance_types(self) -> list[str]:
        return sorted({t for t, _ in self._prices})

    def __len__(self) -> int:
        return len(self._prices)


# ---------------------------------------------------------------------- building the bundled CSV


def _split_model(name: str) -> tuple[str, str]:
    """'NVIDIA A10G' -> ('NVIDIA', 'A10G')."""
    for maker in ("NVIDIA", "AMD", "ARM", "Xilinx"):
        if name.startswith(maker + " "):
            model = name[len(maker) + 1 :].strip()
            return maker, _MODEL_ALIASES.get(model, model)
    return "", name.strip()


def _num(value: float) -> str:
    """Shortest exact text: 8.0 -> '8', 21.957642 -> '21.957642'."""
    return str(int(value)) if value == int(value) else repr(value)


def _per_gpu_gib(memory: str, count: float) -> float | None:
    match = re.match(r"\s*([0-9.]+)\s*GB", memory or "")
    if not match or count <= 0:
        return None
    value = float(match.group(1))
    return value / count if value > _MAX_SINGLE_GPU_GB else value


def build_rows(karpenter_csv: Path, vantage_csv: Path) -> list[dict[str, str]]:
    """Rows of the bundled catalog: every GPU (not ASIC) type x region in the vantage
    data, with us-east-1 prices taken from Karpenter's newer generated table."""
    karpenter = {
        row["instance_type"]: row["on_demand_usd_per_hour"]
        for row in csv.DictReader(karpenter_csv.open())
        if row["region"] == "us-east-1"
    }
    rows: dict[tuple[str, str], dict[str, str]] = {}
    for row in csv.DictReader(vantage_csv.open()):
        if not row["gpu"] or row["gpu"].startswith(_ASIC_PREFIXES):
            continue
        itype, region = row["instance_type"], row["region"]
        count = float(row["gpu_count"] or 0)
        maker, model = _split_model(row["gpu"])
        per_gpu = _per_gpu_gib(row["gpu_memory"], count)
        price, source = row["on_demand_usd_per_hour"], "vantage"
        if region == "us-east-1" and itype in karpenter:
            price, source = karpenter[itype], "karpenter"
        if not price or float(price) <= 0:
            continue
        rows[(itype, region)] = {
            "instance_type": itype,
            "region": region,
            "on_demand_usd_per_hour": _num(float(price)),
            "gpu_manufacturer": maker,
            "gpu_model": model,
            "gpu_count": _num(count),
            "gpu_memory_gib": "" if per_gpu is None else _num(round(per_gpu, 3)),
            "source": source,
        }
    return [rows[k] for k in sorted(rows)]


HEADER_COMMENT = (
    "# AWS GPU instance on-demand prices (Linux, USD/h) and GPU specs per type.\n"
    "# Generated by `python -m gpufinops.prices shared/data/gpu_prices OUT` from\n"
    f"# {KARPENTER_FILE} (aws/karpenter-provider-aws, us-east-1, Apache-2.0) and\n"
    f"# {VANTAGE_FILE} (tsaol/aws-gpu, from instances.vantage.sh).\n"
    "# gpu_memory_gib is per GPU (nominal GB as published). See gpufinops/data/SOURCES.md.\n"
)


def render_csv(rows: Iterable[dict[str, str]]) -> str:
    out = io.StringIO()
    out.write(HEADER_COMMENT)
    writer = csv.DictWriter(out, fieldnames=COLUMNS, lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    return out.getvalue()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Regenerate the bundled AWS GPU price CSV.")
    parser.add_argument("src_dir", type=Path, help="folder holding the shared gpu_prices files")
    parser.add_argument("out", type=Path, nargs="?", default=DEFAULT_CSV)
    args = parser.parse_args(argv)
    rows = build_rows(args.src_dir / KARPENTER_FILE, args.src_dir / VANTAGE_FILE)
    args.out.write_text(render_csv(rows))
    print(f"wrote {len(rows)} rows to {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
