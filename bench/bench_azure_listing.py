"""One tick's Azure listing through the official clients against the stand-in ARM (tests/armstub.py, issues 39
and 41 item 4).

    python bench/bench_azure_listing.py                 # 2,000 VMs (1,500 of GPU sizes)
    python bench/bench_azure_listing.py --vms 10000     # a large subscription

Fills the stand-in (https on 127.0.0.1, the shipped role enforced) with VMs of four sizes (three GPU sizes and a
D4s v5) across 20 resource groups, then times AzureCloud.list_gpu_instances(): the VM list and the statusOnly
list, each paged by nextLink (`--page` VMs a page: ARM's list-all of a subscription pages by `nextLink` with no
page size the caller can set, so the stand-in's default is a guess at ARM's), deserialised by azure-mgmt-compute.
Prints, as JSON, the median wall of `--repeat` listings, the time the stand-in spent answering (routing and JSON
encoding, in its own threads) so that what remains is the client's (TLS, HTTP, JSON decoding, the SDK's model
deserialisation and gpufinops's GpuInstance building), the requests one listing made, the client's share of a
60 s tick, and peak Python memory of one more listing under tracemalloc (the client's and the stand-in's
allocations together: they share the process). The stand-in is a Python http.server: the wall says little of
ARM's own latency, the client's share is what a tick spends here.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import threading
import time
import tracemalloc
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from tests import armstub  # noqa: E402
from tests.armstub import ArmStub, Vm  # noqa: E402
from tests.places.azure.world import ROLE, SUB, azure_cloud  # noqa: E402

SIZES = ("Standard_NC24ads_A100_v4", "Standard_ND96isr_H100_v5", "Standard_NV36ads_A10_v5", "Standard_D4s_v5")
TICK_S = 60.0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vms", type=int, default=2000)
    parser.add_argument("--page", type=int, default=1000, help="VMs a page of the stand-in's list")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args(argv)
    served = {"s": 0.0}
    lock = threading.Lock()
    handler_answer, route = None, armstub._route

    def timed_route(*a, **kw):
        t = time.thread_time()
        try:
            return route(*a, **kw)
        finally:
            with lock:
                served["s"] += time.thread_time() - t

    armstub._route = timed_route
    with tempfile.TemporaryDirectory() as tmp:
        stub = ArmStub(Path(tmp), role=ROLE, page_size=args.page)
        # The answer's encoding and write happen in the handler's _answer: timed too (the stand-in's CPU).
        handler_cls = stub.server.RequestHandlerClass
        handler_answer = handler_cls._answer

        def timed_answer(self, *a, **kw):
            t = time.thread_time()
            try:
                return handler_answer(self, *a, **kw)
            finally:
                with lock:
                    served["s"] += time.thread_time() - t

        handler_cls._answer = timed_answer
        try:
            for i in range(args.vms):
                stub.add(Vm(SUB, f"rg{i % 20}", f"vm-{i:05d}", SIZES[i % 4], tags={"team": f"t{i % 7}"}))
            cloud = azure_cloud(stub)
            cloud.list_gpu_instances()  # warm: connection pool, imports, the token
            walls, serve_s, found, requests = [], [], 0, 0
            for _ in range(args.repeat):
                stub.requests.clear()
                served["s"] = 0.0
                start = time.perf_counter()
                found = len(cloud.list_gpu_instances())
                walls.append(time.perf_counter() - start)
                serve_s.append(served["s"])
                requests = len(stub.requests)
            tracemalloc.start()
            cloud.list_gpu_instances()
            peak = tracemalloc.get_traced_memory()[1]
            tracemalloc.stop()
        finally:
            stub.close()
    wall, stand_in = statistics.median(walls), statistics.median(serve_s)
    client = max(0.0, wall - stand_in)
    print(json.dumps({"vms": args.vms, "gpu_vms": found, "page": args.page, "requests": requests,
                      "wall_s": round(wall, 3), "stand_in_s": round(stand_in, 3), "client_s": round(client, 3),
                      "client_ms_per_vm": round(client * 1000 / args.vms, 3),
                      "client_share_of_60s_tick": f"{client / TICK_S:.1%}",
                      "peak_python_mib": round(peak / 2**20, 1), "loadavg_1m": round(os.getloadavg()[0], 2)},
                     indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
