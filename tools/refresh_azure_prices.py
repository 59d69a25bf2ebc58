"""Refresh the Azure GPU VM prices from the Azure Retail Prices API, only when a person runs it.

    python tools/refresh_azure_prices.py OUT.csv [--size Standard_NC24ads_A100_v4 ...] [--url URL]

Writes the size table (GPU model and count from the bundled table, the Linux pay-as-you-go and Spot price of each
size in each region, the date asked) to OUT.csv; point `azure.price_file` at it. Nothing is written unless every
size answered. The public API needs no sign-in; `--url` names another endpoint (a proxy, a test's stand-in).
"""

from __future__ import annotations

import argparse
import sys
from datetime import datetime, timezone
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from gpufinops.places.azure.retail import RETAIL_PRICES_URL, RetailPricesError, refresh  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--size", action="append", default=[], help="only this size (repeatable)")
    parser.add_argument("--url", default=RETAIL_PRICES_URL)
    args = parser.parse_args(argv)
    as_of = datetime.now(timezone.utc).strftime("%Y-%m-%d")
    try:
        n = refresh(args.out, as_of, base_url=args.url, only=args.size)
    except (RetailPricesError, OSError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(f"{n} (size, region) prices of {as_of} written to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
