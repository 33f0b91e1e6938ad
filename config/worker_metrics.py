"""A Celery worker's metrics: its tasks' wait and run time, and the exporter that serves
everything its pool counted (admission, launches, retries, preemptions, webhook deliveries) on
``MANTA_WORKER_METRICS_ADDRESS:MANTA_WORKER_METRICS_PORT``.

Why an exporter of its own: in production the API and the workers run on different hosts, and
a pool child's counters live in files on its own host (prometheus-client's multiprocess mode,
``config/multiprocess.py``), so each worker host answers for its own processes and Prometheus
adds them up. It answers scrapers only, as ``/metrics`` does: an address in
``MANTA_METRICS_ALLOWED_NETWORKS`` or the bearer token ``MANTA_METRICS_TOKEN``.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import json
import logging
import os
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from django.conf import settings
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from .metrics import TASK_RUNTIME, TASK_WAIT, scrape_registry

logger = logging.getLogger(__name__)
PUBLISHED_HEADER = "manta_published_at"
_started: dict[str, float] = {}  # task id → monotonic start, in the process running it


def task_started(task_id: str, task) -> None:
    published = getattr(task.request, PUBLISHED_HEADER, None)
    if published is None:
        published = (getattr(task.request, "headers", None) or {}).get(PUBLISHED_HEADER)
    if isinstance(published, int | float):
        TASK_WAIT.labels(task=task.name).observe(max(0.0, time.time() - published))
    _started[task_id] = time.monotonic()


def task_finished(task_id: str, task, state: str | None) -> None:
    started = _started.pop(task_id, None)
    if started is not None:
        TASK_RUNTIME.labels(task=task.name, outcome=(state or "unknown").lower()).observe(
            time.monotonic() - started
        )


def refusal(address: str, authorization: str) -> tuple[int, str, str] | None:
    """Why a scrape from ``address`` with this ``Authorization`` header is refused (status,
    error type, message), or None: the rule and the answers of ``jobs/metrics.py``'s
    ``/metrics``."""
    token = settings.MANTA_METRICS_TOKEN.encode()
    if authorization:
        scheme, _, secret = authorization.encode().partition(b" ")
        digest = hashlib.sha256
        if (
            scheme.lower() != b"bearer"
            or not token
            or not hmac.compare_digest(digest(secret.strip()).digest(), digest(token).digest())
        ):
            # Without a configured token no credential would do: 403, as DRF answers.
            return (401 if token else 403), "authentication_failed", "wrong metrics token"
        return None
    try:
        client = ipaddress.ip_address(address)
    except ValueError:
        client = None
    if isinstance(client, ipaddress.IPv6Address) and client.ipv4_mapped is not None:
        client = client.ipv4_mapped
    networks = (ipaddress.ip_network(n) for n in settings.MANTA_METRICS_ALLOWED_NETWORKS)
    if client is not None and any(client in network for network in networks):
        return None
    if token:
        return 401, "not_authenticated", "/metrics needs the metrics token from this address"
    return 403, "permission_denied", "/metrics does not answer this address"


class _Handler(BaseHTTPRequestHandler):
    def do_GET(self):
        if self.path.split("?")[0] != "/metrics":
            body = {"type": "not_found", "detail": "only /metrics is served here", "errors": {}}
            self._answer(404, json.dumps(body).encode(), "json")
            return
        refused = refusal(self.client_address[0], self.headers.get("Authorization", ""))
        if refused:
            status, kind, detail = refused
            body = json.dumps({"type": kind, "detail": detail, "errors": {}}).encode()
            self._answer(status, body, "json", bearer=status == 401)
            return
        self._answer(200, generate_latest(scrape_registry()), CONTENT_TYPE_LATEST)

    def _answer(self, status: int, body: bytes, content_type: str, bearer: bool = False):
        self.send_response(status)
        kind = "application/json" if content_type == "json" else content_type
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        if bearer:
            self.send_header("WWW-Authenticate", "Bearer")
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


def exporter_start(address: str, port: int) -> ThreadingHTTPServer:
    """Serve this worker's metrics from a daemon thread of its main process."""
    server = ThreadingHTTPServer((address, port), _Handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, name="metrics-exporter", daemon=True)
    thread.start()
    logger.info("worker metrics on http://%s:%s/metrics (pid %s)", address, port, os.getpid())
    return server


def process_exited(pid: int) -> None:
    from prometheus_client import multiprocess as prometheus_multiprocess

    prometheus_multiprocess.mark_process_dead(pid)
