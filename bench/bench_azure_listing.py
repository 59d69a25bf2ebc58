"""One tick's Azure listing through the official clients against the stand-in ARM (tests/armstub.py, issue 39).

    python bench/bench_azure_listing.py                       # 2,000 VMs (1,500 of GPU sizes), 100 a page
    python bench/bench_azure_listing.py --vms 10000 --page 1000

Fills the stand-in (https on 127.0.0.1, the shipped role enforced) with VMs of four sizes (three GPU sizes and a
D4s v5) across 20 resource groups, then times AzureCloud.list_gpu_instances(): the VM list and the statusOnly
list, each paged by nextLink, deserialised by azure-mgmt-compute. Prints the best of `--repeat` runs, the GPU VMs
found and the HTTP requests one listing made, as JSON. The stand-in is a Python http.server: the figure measures
gpufinops and the SDK plus that server on this machine, not ARM's own latency.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from tests.armstub import ArmStub, Vm  # noqa: E402
from tests.places.azure.world import ROLE, SUB, azure_cloud  # noqa: E402

SIZES = ("Standard_NC24ads_A100_v4", "Standard_ND96isr_H100_v5", "Standard_NV36ads_A10_v5", "Standard_D4s_v5")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vms", type=int, default=2000)
    parser.add_argument("--page", type=int, default=100)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        stub = ArmStub(Path(tmp), role=ROLE, page_size=args.page)
        try:
            for i in range(args.vms):
                stub.add(Vm(SUB, f"rg{i % 20}", f"vm-{i:05d}", SIZES[i % 4], tags={"team": f"t{i % 7}"}))
            cloud = azure_cloud(stub)
            best, found, requests = float("inf"), 0, 0
            for _ in range(args.repeat):
                stub.requests.clear()
                start = time.perf_counter()
                found = len(cloud.list_gpu_instances())
                best = min(best, time.perf_counter() - start)
                requests = len(stub.requests)
        finally:
            stub.close()
    print(json.dumps({"vms": args.vms, "gpu_vms": found, "page": args.page, "best_s": round(best, 2),
                      "requests": requests}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
