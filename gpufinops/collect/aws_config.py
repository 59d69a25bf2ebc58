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


def session(settings):
    """The boto3 session of the configured profile, else boto3's default credential chain. `settings`:
    config.Settings."""
    import boto3  # here, not at import: a local CUR or FOCUS file needs no AWS SDK (~10 MiB resident)

    return (boto3.session.Session(profile_name=settings.aws.profile) if settings.aws.profile
            else boto3.session.Session())


def read_client(settings, service: str, region: str):
    """A read client (Cost Explorer, Athena, S3, Pricing) with the configuration above and the configured
    endpoint (moto in tests)."""
    return session(settings).client(service, region_name=region, endpoint_url=settings.aws.endpoint_url,
                                    config=read_config())
