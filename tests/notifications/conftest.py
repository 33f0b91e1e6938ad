"""A real HTTP receiver on 127.0.0.1, an independent Standard Webhooks verifier, and helpers that
run the dispatcher and the delivery service in this process (as the worker's tasks would)."""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import hmac
import json
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from audit.context import Actor
from notifications import delivery, dispatch, selectors, services
from outbox import services as outbox


@pytest.fixture(autouse=True)
def webhook_settings(settings):
    """Receivers in these tests listen on 127.0.0.1 over plain HTTP; retries are immediate."""
    settings.WEBHOOK_ALLOWED_NETWORKS = ["127.0.0.0/8"]
    settings.WEBHOOK_ALLOW_HTTP = True
    settings.WEBHOOK_RETRY_SCHEDULE = [0, 0, 0, 0, 0, 0, 0, 0]
    settings.WEBHOOK_RETRY_JITTER = 0
    settings.WEBHOOK_TIMEOUT_SECONDS = 5
    return settings


@pytest.fixture
def eager_tasks():
    """Celery tasks run in this process when sent (for the on-commit email tasks)."""
    from config.celery import app

    previous = app.conf.task_always_eager
    app.conf.task_always_eager = True
    yield
    app.conf.task_always_eager = previous


# --- verification, written from the specification (not from notifications/signing.py) ---------


def verify(secret: str, headers: dict[str, str], body: bytes) -> bool:
    """Standard Webhooks: the key is the base64-decoded part of the secret after ``whsec_``; the
    signed content is ``msg_id.timestamp.body``; the header holds space-separated ``v1,<sig>``
    entries, any of which may match."""
    key = base64.b64decode(secret.split("_", 1)[1])
    content = f"{headers['webhook-id']}.{headers['webhook-timestamp']}.".encode() + body
    expected = base64.b64encode(hmac.new(key, content, hashlib.sha256).digest()).decode()
    for entry in headers["webhook-signature"].split(" "):
        version, _, signature = entry.partition(",")
        if version == "v1" and hmac.compare_digest(signature, expected):
            return True
    return False


# --- the receiver ------------------------------------------------------------------------------


@dataclasses.dataclass
class Received:
    path: str
    headers: dict[str, str]
    body: bytes

    @property
    def json(self) -> dict:
        return json.loads(self.body)

    @property
    def signatures(self) -> list[str]:
        return self.headers["webhook-signature"].split(" ")


Reply = tuple[int, dict[str, str], bytes]


class Receiver:
    """Records every request; answers with the next scripted reply (then ``default``)."""

    def __init__(self):
        self.requests: list[Received] = []
        self.replies: list[Reply | Callable[[Received], Reply]] = []
        self.default: Reply = (200, {}, b"ok")
        self.lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self):
                length = int(self.headers.get("Content-Length", 0))
                headers = {k.lower(): v for k, v in self.headers.items()}
                item = Received(self.path, headers, self.rfile.read(length))
                with receiver.lock:
                    receiver.requests.append(item)
                    reply = receiver.replies.pop(0) if receiver.replies else receiver.default
                status, headers, body = reply(item) if callable(reply) else reply
                self.send_response(status)
                for name, value in headers.items():
                    self.send_header(name, value)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def url(self, path: str = "/hook") -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def receiver():
    server = Receiver()
    yield server
    server.close()


# --- driving the pipeline in this process -------------------------------------------------------


def pump() -> None:
    """What the dispatch task and the delivery tasks do: fan out, then drain every due
    endpoint until nothing is due now."""
    for _ in range(20):
        touched = dispatch.events_dispatch() | dispatch.audit_dispatch()
        due = set(selectors.endpoints_due()) | touched
        if not due:
            return
        for endpoint_id in sorted(due):
            delivery.endpoint_deliver(endpoint_id)
        if not selectors.endpoints_due():
            return


def make_endpoint(world, url: str, *, org_level: bool = False, event_types=("*",), who="owner"):
    return services.webhook_create(
        actor=Actor.for_user(world.users[who]),
        organization=world.org,
        workspace=None if org_level else world.ws,
        url=url,
        event_types=list(event_types),
    )


def emit(world, type_: str = "job.succeeded", workspace="default", **payload):
    return outbox.event_emit(
        type=type_,
        organization=world.org,
        workspace=world.ws if workspace == "default" else workspace,
        payload=payload or {"job": {"id": 1, "name": "n"}, "reason": "", "actor": "a@b"},
    )
