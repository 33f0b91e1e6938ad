"""A tiny in-memory stand-in for the Kubernetes API server, for the kuberay launcher's tests.

No Kubernetes API server can run where these tests run, so this serves just the endpoints the
launcher's ``kubernetes`` client calls, with the API server's status codes and ``Status`` error
bodies, on 127.0.0.1 and a free port:

* ``POST /api/v1/namespaces``, ``GET|DELETE /api/v1/namespaces/{ns}``
* ``POST|GET /apis/ray.io/v1/namespaces/{ns}/rayjobs``, ``GET|DELETE .../rayjobs/{name}``
* the same for ``rayclusters`` (the list takes a ``labelSelector`` with ``k=v[,k=v]``)
* ``GET /api/v1/namespaces/{ns}/pods`` (``labelSelector`` with ``k=v[,k=v]``)
* ``GET /api/v1/namespaces/{ns}/pods/{name}/log`` (``container``, ``tailLines``)

It records every request (method, path, query, headers, JSON body) in :attr:`KubeStub.requests`.
It does not run KubeRay: tests set ``status`` on stored RayJobs and add pods themselves.
"""

from __future__ import annotations

import copy
import dataclasses
import datetime
import itertools
import json
import re
import threading
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

RAYJOBS = re.compile(r"^/apis/ray\.io/v1/namespaces/(?P<ns>[^/]+)/rayjobs(?:/(?P<name>[^/]+))?$")
RAYCLUSTERS = re.compile(
    r"^/apis/ray\.io/v1/namespaces/(?P<ns>[^/]+)/rayclusters(?:/(?P<name>[^/]+))?$"
)
NAMESPACES = re.compile(r"^/api/v1/namespaces(?:/(?P<ns>[^/]+))?$")
PODS = re.compile(r"^/api/v1/namespaces/(?P<ns>[^/]+)/pods$")
POD_LOG = re.compile(r"^/api/v1/namespaces/(?P<ns>[^/]+)/pods/(?P<name>[^/]+)/log$")


@dataclasses.dataclass(frozen=True)
class RecordedRequest:
    method: str
    path: str
    query: dict[str, str]  # last value of each query parameter
    headers: dict[str, str]  # lower-cased names
    body: Any  # the decoded JSON body, or None


class KubeStub:
    """The fake API server's state plus the HTTP server that serves it.

    Use as a context manager (or call :meth:`start` / :meth:`stop`). All state is guarded by one
    lock because the server handles each request on its own thread.
    """

    def __init__(self) -> None:
        self.namespaces: dict[str, dict[str, Any]] = {}
        self.rayjobs: dict[tuple[str, str], dict[str, Any]] = {}
        self.rayclusters: dict[tuple[str, str], dict[str, Any]] = {}
        self.pods: dict[tuple[str, str], dict[str, Any]] = {}
        self.pod_logs: dict[tuple[str, str, str], str] = {}  # (ns, pod, container) -> text
        self.requests: list[RecordedRequest] = []
        self.errors: list[tuple[str, re.Pattern[str], int]] = []  # injected failures
        self.lock = threading.Lock()
        self._versions = itertools.count(1)
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # -- lifecycle ------------------------------------------------------------------------------

    def start(self) -> KubeStub:
        stub = self

        class Handler(_Handler):
            pass

        Handler.stub = stub
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def __enter__(self) -> KubeStub:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def url(self) -> str:
        assert self._server is not None, "start() the stub first"
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def kubeconfig(self, token: str = "stub-token") -> str:
        """Kubeconfig YAML text pointing at this stub, authenticating with a bearer token."""
        return (
            "apiVersion: v1\n"
            "kind: Config\n"
            "clusters:\n"
            f"- name: stub\n  cluster:\n    server: {self.url}\n"
            "users:\n"
            f"- name: stub\n  user:\n    token: {token}\n"
            "contexts:\n"
            "- name: stub\n  context:\n    cluster: stub\n    user: stub\n"
            "current-context: stub\n"
        )

    # -- test helpers ---------------------------------------------------------------------------

    def inject_error(self, method: str, path_regex: str, code: int) -> None:
        """Answer the next request matching ``method`` and ``path_regex`` with ``code``."""
        self.errors.append((method, re.compile(path_regex), code))

    def set_rayjob_status(self, namespace: str, name: str, status: dict[str, Any] | None) -> None:
        """Set (or with None, remove) the stored RayJob's ``status``, as KubeRay would."""
        with self.lock:
            obj = self.rayjobs[(namespace, name)]
            if status is None:
                obj.pop("status", None)
            else:
                obj["status"] = copy.deepcopy(status)

    def add_pod(
        self,
        namespace: str,
        name: str,
        *,
        labels: dict[str, str],
        created: datetime.datetime,
        logs: dict[str, str],
    ) -> None:
        """Store a running pod whose containers (the keys of ``logs``) have logged ``logs``."""
        with self.lock:
            self.pods[(namespace, name)] = {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {
                    "name": name,
                    "namespace": namespace,
                    "labels": dict(labels),
                    "uid": str(uuid.uuid4()),
                    "creationTimestamp": created.strftime("%Y-%m-%dT%H:%M:%SZ"),
                },
                "spec": {"containers": [{"name": c, "image": "img"} for c in logs]},
                "status": {"phase": "Running"},
            }
            for container, text in logs.items():
                self.pod_logs[(namespace, name, container)] = text

    def requests_to(self, method: str, path: str) -> list[RecordedRequest]:
        with self.lock:
            return [r for r in self.requests if r.method == method and r.path == path]

    # -- request handling (called on server threads) --------------------------------------------

    def handle(self, request: RecordedRequest) -> tuple[int, str, bytes]:
        with self.lock:
            self.requests.append(request)
            for index, (method, pattern, code) in enumerate(self.errors):
                if method == request.method and pattern.search(request.path):
                    del self.errors[index]
                    return _status(code, "Injected", f"injected {code}")
            return self._route(request)

    def _route(self, req: RecordedRequest) -> tuple[int, str, bytes]:
        if match := RAYJOBS.match(req.path):
            return self._objects(req, match["ns"], match["name"], self.rayjobs, "RayJob")
        if match := RAYCLUSTERS.match(req.path):
            return self._objects(req, match["ns"], match["name"], self.rayclusters, "RayCluster")
        if match := POD_LOG.match(req.path):
            return self._pod_log(req, match["ns"], match["name"])
        if match := PODS.match(req.path):
            return self._pods(req, match["ns"])
        if match := NAMESPACES.match(req.path):
            return self._namespaces(req, match["ns"])
        return _status(404, "NotFound", f"the server could not find {req.path}")

    def _namespaces(self, req: RecordedRequest, ns: str | None) -> tuple[int, str, bytes]:
        if ns is None and req.method == "POST":
            name = req.body["metadata"]["name"]
            if name in self.namespaces:
                return _status(409, "AlreadyExists", f'namespaces "{name}" already exists')
            obj = self._stamp(copy.deepcopy(req.body), kind="Namespace", api_version="v1")
            obj["status"] = {"phase": "Active"}
            self.namespaces[name] = obj
            return _json(201, obj)
        if ns is not None and req.method == "GET":
            if ns not in self.namespaces:
                return _status(404, "NotFound", f'namespaces "{ns}" not found')
            return _json(200, self.namespaces[ns])
        if ns is not None and req.method == "DELETE":
            if self.namespaces.pop(ns, None) is None:
                return _status(404, "NotFound", f'namespaces "{ns}" not found')
            return _status(200, "", "deleted", status="Success")
        return _status(405, "MethodNotAllowed", f"{req.method} {req.path}")

    def _objects(
        self,
        req: RecordedRequest,
        ns: str,
        name: str | None,
        store: dict[tuple[str, str], dict[str, Any]],
        kind: str,
    ) -> tuple[int, str, bytes]:
        plural = f"{kind.lower()}s.ray.io"
        if name is None and req.method == "POST":
            if ns not in self.namespaces:
                return _status(404, "NotFound", f'namespaces "{ns}" not found')
            body = copy.deepcopy(req.body)
            name = body["metadata"]["name"]
            if (ns, name) in store:
                return _status(
                    409, "AlreadyExists", f'{plural} "{name}" already exists', kind=kind.lower()
                )
            body["metadata"]["namespace"] = ns
            obj = self._stamp(body, kind=kind, api_version="ray.io/v1")
            store[(ns, name)] = obj
            return _json(201, obj)
        if name is None and req.method == "GET":
            wanted = _selector(req)
            items = [
                obj
                for (n, _), obj in sorted(store.items())
                if n == ns
                and all(obj["metadata"].get("labels", {}).get(k) == v for k, v in wanted.items())
            ]
            return _json(200, {"apiVersion": "ray.io/v1", "kind": f"{kind}List", "items": items})
        if name is not None and req.method == "GET":
            if (ns, name) not in store:
                return _status(404, "NotFound", f'{plural} "{name}" not found')
            return _json(200, store[(ns, name)])
        if name is not None and req.method == "DELETE":
            if store.pop((ns, name), None) is None:
                return _status(404, "NotFound", f'{plural} "{name}" not found')
            return _status(200, "", f'{plural} "{name}" deleted', status="Success")
        return _status(405, "MethodNotAllowed", f"{req.method} {req.path}")

    def _pods(self, req: RecordedRequest, ns: str) -> tuple[int, str, bytes]:
        if req.method != "GET":
            return _status(405, "MethodNotAllowed", f"{req.method} {req.path}")
        wanted = _selector(req)
        items = [
            pod
            for (n, _), pod in sorted(self.pods.items())
            if n == ns and all(pod["metadata"]["labels"].get(k) == v for k, v in wanted.items())
        ]
        return _json(
            200,
            {
                "apiVersion": "v1",
                "kind": "PodList",
                "metadata": {"resourceVersion": "1"},
                "items": items,
            },
        )

    def _pod_log(self, req: RecordedRequest, ns: str, name: str) -> tuple[int, str, bytes]:
        if (ns, name) not in self.pods:
            return _status(404, "NotFound", f'pods "{name}" not found')
        containers = [c["name"] for c in self.pods[(ns, name)]["spec"]["containers"]]
        container = req.query.get("container") or (containers[0] if len(containers) == 1 else "")
        if container not in containers:
            return _status(
                400, "BadRequest", f"container {container!r} is not valid for pod {name}"
            )
        text = self.pod_logs.get((ns, name, container), "")
        if "tailLines" in req.query:
            lines = text.splitlines(keepends=True)
            count = int(req.query["tailLines"])
            text = "".join(lines[-count:]) if count > 0 else ""
        return 200, "text/plain", text.encode()

    def _stamp(self, obj: dict[str, Any], *, kind: str, api_version: str) -> dict[str, Any]:
        obj.setdefault("apiVersion", api_version)
        obj.setdefault("kind", kind)
        meta = obj.setdefault("metadata", {})
        meta["uid"] = str(uuid.uuid4())
        meta["resourceVersion"] = str(next(self._versions))
        meta["creationTimestamp"] = datetime.datetime.now(datetime.UTC).strftime(
            "%Y-%m-%dT%H:%M:%SZ"
        )
        return obj


class _Handler(BaseHTTPRequestHandler):
    stub: KubeStub
    protocol_version = "HTTP/1.1"  # keep-alive, like the real API server

    def _serve(self) -> None:
        parts = urlsplit(self.path)
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        request = RecordedRequest(
            method=self.command,
            path=parts.path,
            query={k: v[-1] for k, v in parse_qs(parts.query).items()},
            headers={k.lower(): v for k, v in self.headers.items()},
            body=json.loads(raw) if raw else None,
        )
        code, content_type, payload = self.stub.handle(request)
        self.send_response(code)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    do_GET = do_POST = do_DELETE = _serve

    def log_message(self, format: str, *args: Any) -> None:
        pass  # keep test output quiet; requests are recorded on the stub instead


def _selector(req: RecordedRequest) -> dict[str, str]:
    """A ``labelSelector`` of equalities (``k=v[,k=v]``), as a mapping."""
    terms = req.query.get("labelSelector", "").split(",")
    return dict(term.split("=", 1) for term in terms if term)


def _json(code: int, obj: Any) -> tuple[int, str, bytes]:
    return code, "application/json", json.dumps(obj).encode()


def _status(
    code: int, reason: str, message: str, *, status: str = "Failure", kind: str | None = None
) -> tuple[int, str, bytes]:
    """A ``metav1.Status`` body, which is how the API server reports errors (and deletions)."""
    body: dict[str, Any] = {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": status,
        "message": message,
        "reason": reason,
        "code": code,
    }
    if kind:
        body["details"] = {"kind": kind}
    return _json(code, body)
