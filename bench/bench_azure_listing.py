"""One tick's Azure listing through the official clients against the stand-in ARM (tests/armstub.py, issues 39
and 41 item 4).

    python bench/bench_azure_listing.py                 # 2,000 VMs (1,500 of GPU sizes)
    python bench/bench_azure_listing.py --vms 10000     # a large subscription
    python bench/bench_azure_listing.py --scale-sets 200 --instances 50   # and 200 scale sets of 50 instances

Fills the stand-in (https on 127.0.0.1, the shipped role enforced) with VMs of four sizes (three GPU sizes and a
D4s v5) across 20 resource groups, then times AzureCloud.list_gpu_instances(): the VM list and the statusOnly
list, each paged by nextLink (`--page` VMs a page: ARM's list-all of a subscription pages by `nextLink` with no
page size the caller can set, so the stand-in's default is a guess at ARM's), deserialised by azure-mgmt-compute.
With `--scale-sets`, as many scale sets of `--instances` instances beside them, one in four of each kind (Uniform of
a GPU size, Uniform of a GPU size but empty, Flexible of a GPU size, Uniform of a CPU size): the scale set list, then
the instance list (with instance views) of the Uniform GPU sets with instances only.
Prints, as JSON, medians of `--repeat` listings: the wall, the client's CPU time (this thread: TLS, HTTP, JSON
decoding, the SDK's model deserialisation and gpufinops's GpuInstance building) and the stand-in's (its server
threads: the rest of the process's CPU time), so that time spent waiting for a core on a loaded machine counts in
neither; the requests one listing made, the client's share of a 60 s tick (its CPU seconds over 60), and peak Python
memory of one more listing under tracemalloc (the client's and the stand-in's allocations together: they share the
process). The stand-in is a Python http.server: the wall says little of ARM's own latency; the client's CPU is what
a tick spends here.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from tests.armstub import ArmStub, ScaleSet, Vm  # noqa: E402
from tests.places.azure.world import ROLE, SUB, azure_cloud  # noqa: E402

SIZES = ("Standard_NC24ads_A100_v4", "Standard_ND96isr_H100_v5", "Standard_NV36ads_A10_v5", "Standard_D4s_v5")
TICK_S = 60.0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vms", type=int, default=2000)
    parser.add_argument("--page", type=int, default=1000, help="VMs a page of the stand-in's list")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--scale-sets", type=int, default=0, help="scale sets beside the VMs")
    parser.add_argument("--instances", type=int, default=20, help="instances of each scale set")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        stub = ArmStub(Path(tmp), role=ROLE, page_size=args.page)
        try:
            for i in range(args.vms):
                stub.add(Vm(SUB, f"rg{i % 20}", f"vm-{i:05d}", SIZES[i % 4], tags={"team": f"t{i % 7}"}))
            for i in range(args.scale_sets):
                kind = i % 4  # 0 Uniform GPU, 1 Uniform GPU empty, 2 Flexible GPU, 3 Uniform CPU
                stub.add_scale_set(ScaleSet(
                    SUB, f"rg{i % 20}", f"set-{i:04d}", SIZES[3] if kind == 3 else SIZES[i % 3],
                    powers=[] if kind == 1 else ["running"] * args.instances,
                    orchestration="Flexible" if kind == 2 else "Uniform", tags={"team": f"t{i % 7}"}))
            cloud = azure_cloud(stub)
            cloud.list_gpu_instances()  # warm: connection pool, imports, the token
            walls, clients, stand_ins, found, requests = [], [], [], 0, 0
            for _ in range(args.repeat):
                stub.requests.clear()
                wall, cpu, client = time.perf_counter(), time.process_time(), time.thread_time()
                found = len(cloud.list_gpu_instances())
                # The client runs in this thread (HTTP, TLS, JSON, the SDK's models, gpufinops): its CPU time is
                # this thread's; the stand-in's is every other thread's (its server threads), so a loaded machine
                # (time waiting for a core) counts in neither.
                client = time.thread_time() - client
                walls.append(time.perf_counter() - wall)
                clients.append(client)
                stand_ins.append(max(0.0, time.process_time() - cpu - client))
                requests = len(stub.requests)
            tracemalloc.start()
            cloud.list_gpu_instances()
            peak = tracemalloc.get_traced_memory()[1]
            tracemalloc.stop()
        finally:
            stub.close()
    client = statistics.median(clients)
    print(json.dumps({"vms": args.vms, "scale_sets": args.scale_sets, "instances": args.instances,
                      "gpu_vms": found, "page": args.page, "requests": requests,
                      "wall_s": round(statistics.median(walls), 3),
                      "stand_in_cpu_s": round(statistics.median(stand_ins), 3), "client_cpu_s": round(client, 3),
                      "client_cpu_ms_per_vm": round(client * 1000 / args.vms, 3),
                      "client_share_of_60s_tick": f"{client / TICK_S:.1%}",
                      "peak_python_mib": round(peak / 2**20, 1), "loadavg_1m": round(os.getloadavg()[0], 2)},
                     indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
