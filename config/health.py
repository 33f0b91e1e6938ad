"""Liveness and readiness probes (no authentication, no database writes).

A probe answers anyone, so it names no host, port, path or user: what failed and the kind of
error only; the details go to the log.
"""

import logging
import os

from django.db import connection
from django.http import JsonResponse

logger = logging.getLogger(__name__)


def _failed(check: str, exc: Exception) -> str:
    logger.warning("readiness: %s check failed: %s", check, exc, exc_info=exc)
    return f"error: {exc.__class__.__name__}"


class BrokerFolderNotWritable(OSError):
    """The filesystem transport "connects" to anything; a publish needs this folder."""


def healthz(request):
    return JsonResponse({"status": "ok"})


def readyz(request):
    from config.celery import app

    checks = {}
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
        checks["database"] = "ok"
    except Exception as exc:  # a probe reports, it does not raise
        checks["database"] = _failed("database", exc)
    try:
        with app.connection_for_write() as conn:
            conn.ensure_connection(max_retries=1, timeout=2)
            conn.default_channel  # noqa: B018  (opens a channel: what a publish needs)
        folder = app.conf.broker_transport_options.get("data_folder_out")
        if folder and not os.access(folder, os.W_OK):
            # The filesystem transport "connects" to anything; a publish needs this folder.
            raise BrokerFolderNotWritable(folder)
        checks["broker"] = "ok"
    except BrokerFolderNotWritable as exc:
        _failed("broker", exc)
        checks["broker"] = "error: the embedded broker's folder is not writable"
    except Exception as exc:
        checks["broker"] = _failed("broker", exc)
    ready = all(value == "ok" for value in checks.values())
    return JsonResponse({"status": "ok" if ready else "unavailable", "checks": checks},
                        status=200 if ready else 503)  # fmt: skip
