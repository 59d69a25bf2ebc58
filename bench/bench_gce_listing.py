"""One tick's Compute Engine listing through the official client (google-cloud-compute, REST), against the GCE
stand-in (tests/gcestub.py) on 127.0.0.1 (issue 39).

    python bench/bench_gce_listing.py                 # 2,000 VMs
    python bench/bench_gce_listing.py --vms 10000     # a large project

The stand-in holds `--vms` VMs over 12 zones, a quarter of them GPU VMs (G2, A2, A3; MIG members among them), the
rest without GPUs (listed by GCE, dropped by gpufinops). GceCloud.list_gpu_instances() is timed `--repeat` times
(median), with the requests it sent (aggregatedList pages of 500), the bytes of their answers, and the time the
stand-in spent answering (its JSON encoding), so that what remains is the client's: HTTP, JSON and proto-plus
decoding, and gpufinops's own GpuInstance building. Peak Python memory from one more listing under tracemalloc.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
import tracemalloc

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from gpufinops.config import load_settings  # noqa: E402
from gpufinops.places.gcp.cloud import GceCloud  # noqa: E402
from gpufinops.prices.catalog import load_catalog  # noqa: E402
from tests import gcestub  # noqa: E402

ZONES = [f"{r}-{z}" for r in ("us-central1", "us-east4", "europe-west4", "asia-southeast1") for z in "abc"]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--vms", type=int, default=2000)
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    stub = gcestub.Stub()
    for i in range(args.vms):
        zone = ZONES[i % len(ZONES)]
        if i % 4 == 0:
            mt = ("g2-standard-8", "a2-highgpu-8g", "a3-highgpu-8g")[i % 3]
            mig = f"projects/1/zones/{zone}/instanceGroupManagers/pool-{i % 7}" if i % 8 == 0 else ""
            stub.add(f"gpu-{i:06d}", zone, mt, labels={"team": f"t{i % 9}", "owner": f"u{i % 31}"}, created_by=mig)
        else:
            stub.add(f"web-{i:06d}", zone, "e2-standard-4", labels={"team": f"t{i % 9}"})
    served = {"bytes": 0, "s": 0.0}
    handle, answer = stub.handle, gcestub._Handler._answer

    def timed_handle(*a, **kw):
        t = time.perf_counter()
        try:
            return handle(*a, **kw)
        finally:
            served["s"] += time.perf_counter() - t

    def timed_answer(self, status, headers, body):
        t = time.perf_counter()
        try:
            return answer(self, status, headers, body)
        finally:
            served["s"] += time.perf_counter() - t
            served["bytes"] += int(self._bytes_sent) if hasattr(self, "_bytes_sent") else 0

    stub.handle = timed_handle
    gcestub._Handler._answer = timed_answer
    server, _ = gcestub.start(stub)
    from google.auth.credentials import AnonymousCredentials

    settings = load_settings(gcp={"projects": ["ml-prod"], "api_endpoint": stub.url})
    cloud = GceCloud(settings.gcp, credentials=AnonymousCredentials(), catalog=load_catalog())
    cloud.list_gpu_instances()  # warm: connection pool, imports
    walls, serve_s, pages, bytes_ = [], [], 0, 0
    for _ in range(args.repeat):
        served.update(bytes=0, s=0.0)
        before = len(stub.requests)
        t = time.perf_counter()
        found = cloud.list_gpu_instances()
        walls.append(time.perf_counter() - t)
        serve_s.append(served["s"])
        pages, bytes_ = len(stub.requests) - before, served["bytes"]
    tracemalloc.start()
    cloud.list_gpu_instances()
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    server.shutdown()
    wall, stand_in = statistics.median(walls), statistics.median(serve_s)
    print(json.dumps({"vms": args.vms, "gpu_vms": len(found), "managed": sum(bool(i.managed_by) for i in found),
                      "requests": pages, "answer_mib": round(bytes_ / 2**20, 2), "wall_s": round(wall, 3),
                      "stand_in_s": round(stand_in, 3), "client_s": round(wall - stand_in, 3),
                      "client_ms_per_vm": round((wall - stand_in) * 1000 / args.vms, 3),
                      "peak_python_mib": round(peak / 2**20, 1)}, indent=1))


if __name__ == "__main__":
    main()
