"""GPU workloads for bench/gpu_check_gpm.py (copied from ../shared/device/load.py): busy, hold (memory held, no work), duty (bursty).

    python3 load.py busy SECONDS
    python3 load.py hold GIB SECONDS
    python3 load.py duty FRACTION SECONDS      # busy FRACTION of every 200 ms
"""
import sys
import time

import torch

mode = sys.argv[1]
dev = torch.device("cuda:0")


def matmul_for(seconds, a, b):
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        for _ in range(4):
            a @ b
        torch.cuda.synchronize()


if mode == "busy":
    secs = float(sys.argv[2])
    a = torch.randn(8192, 8192, device=dev, dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device=dev, dtype=torch.bfloat16)
    matmul_for(secs, a, b)
elif mode == "hold":
    gib, secs = float(sys.argv[2]), float(sys.argv[3])
    x = torch.empty(int(gib * 2**30), dtype=torch.uint8, device=dev)
    x.fill_(1)
    torch.cuda.synchronize()
    time.sleep(secs)
elif mode == "duty":
    frac, secs = float(sys.argv[2]), float(sys.argv[3])
    a = torch.randn(4096, 4096, device=dev, dtype=torch.bfloat16)
    b = torch.randn(4096, 4096, device=dev, dtype=torch.bfloat16)
    end = time.monotonic() + secs
    period = 0.2
    while time.monotonic() < end:
        t0 = time.monotonic()
        matmul_for(frac * period, a, b)
        rest = period - (time.monotonic() - t0)
        if rest > 0:
            time.sleep(rest)
else:
    sys.exit(f"unknown mode {mode}")
