"""The Cloud Billing Catalog API's page reader, for prices.gcp_refresh (only when asked: `recommend
--refresh-prices` with a `gcp:` section). GET {endpoint}/v1/services/6F81-5844-456A/skus, USD, the largest pages the
API gives, with the same credentials as the Compute client (any authenticated caller may read the public SKU list:
no role needed); a throttle or a 5xx is tried again as the inventory's reads are."""

from __future__ import annotations

from typing import Any, Callable, Mapping

from gpufinops.config import GcpSettings

from .cloud import _default_credentials, fate_of, is_transient, retry_after_s

PAGE_SIZE = 5000


def catalog_fetcher(settings: GcpSettings, *, credentials: Any = None, timeout_s: float = 30.0,
                    sleep: Callable[[float], None] | None = None) -> Callable[[str], Mapping[str, Any]]:
    import time

    from google.auth.transport.requests import AuthorizedSession

    session = AuthorizedSession(credentials if credentials is not None else _default_credentials(settings))
    url = f"{settings.billing_catalog_endpoint.rstrip('/')}/v1/services/6F81-5844-456A/skus"
    wait = sleep or time.sleep

    def fetch(page_token: str) -> Mapping[str, Any]:
        params = {"currencyCode": "USD", "pageSize": str(PAGE_SIZE)}
        if page_token:
            params["pageToken"] = page_token
        for attempt in range(1, settings.read_attempts + 1):
            try:
                response = session.get(url, params=params, timeout=timeout_s)
                if response.status_code == 429 or response.status_code >= 500:
                    from google.api_core.exceptions import from_http_response

                    raise from_http_response(response)
                response.raise_for_status()
                return response.json()
            except Exception as exc:  # noqa: BLE001 - a final failure is raised; the refresh saves nothing
                if not is_transient(exc) or attempt == settings.read_attempts:
                    raise RuntimeError(f"Cloud Billing Catalog page failed: {fate_of(exc)[1]}") from exc
                wait(min(retry_after_s(exc) or 2.0 ** attempt, 30.0))
        raise AssertionError("unreachable")

    return fetch
