"""The one botocore configuration of gpufinops' AWS read clients (EC2, Auto Scaling, Cost Explorer, Athena,
S3, Pricing, STS): standard retries with backoff, and connect/read timeouts, so a slow or throttling AWS API
is retried a bounded number of times and never hangs a run."""

from __future__ import annotations

from botocore.config import Config

MAX_ATTEMPTS = 5  # retries after the first attempt
CONNECT_TIMEOUT_S = 5.0
READ_TIMEOUT_S = 30.0


def read_config(max_attempts: int = MAX_ATTEMPTS, connect_timeout_s: float = CONNECT_TIMEOUT_S,
                read_timeout_s: float = READ_TIMEOUT_S) -> Config:
    """botocore's standard retry mode (max_attempts retries after the first attempt) and timeouts."""
    return Config(
        connect_timeout=connect_timeout_s,
        read_timeout=read_timeout_s,
        retries={"max_attempts": max_attempts, "mode": "standard"},
        user_agent_extra="gpufinops",
    )
