"""Liveness and readiness probes (no authentication, no database writes)."""

import os

from django.db import connection
from django.http import JsonResponse


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
        checks["database"] = f"error: {exc.__class__.__name__}: {exc}"
    try:
        with app.connection_for_write() as conn:
            conn.ensure_connection(max_retries=1, timeout=2)
            conn.default_channel  # noqa: B018  (opens a channel: what a publish needs)
        folder = app.conf.broker_transport_options.get("data_folder_out")
        if folder and not os.access(folder, os.W_OK):
            # The filesystem transport "connects" to anything; a publish needs this folder.
            raise OSError(f"the embedded broker's folder {folder} is not writable")
        checks["broker"] = "ok"
    except Exception as exc:
        checks["broker"] = f"error: {exc.__class__.__name__}: {exc}"
    ready = all(value == "ok" for value in checks.values())
    return JsonResponse({"status": "ok" if ready else "unavailable", "checks": checks},
                        status=200 if ready else 503)  # fmt: skip
