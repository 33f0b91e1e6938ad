"""The webhook policy over the SSRF guard (``config/ssrf.py``): a webhook URL may only lead to
the public internet, or to ``WEBHOOK_ALLOWED_NETWORKS``; ``http://`` only with
``WEBHOOK_ALLOW_HTTP``. Checked when an endpoint is saved and before every delivery."""

from __future__ import annotations

from django.conf import settings

from config import ssrf as _ssrf
from config.ssrf import Destination, IPAddress, UnsafeURL

__all__ = ["Destination", "UnsafeURL", "check_url", "refusal"]


def refusal(address: IPAddress) -> str | None:
    return _ssrf.refusal(address, settings.WEBHOOK_ALLOWED_NETWORKS)


def check_url(url: str) -> Destination:
    return _ssrf.check_url(
        url,
        allowed_networks=settings.WEBHOOK_ALLOWED_NETWORKS,
        allow_http=settings.WEBHOOK_ALLOW_HTTP,
    )
