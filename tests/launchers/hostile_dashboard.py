"""A job's own server in place of its cluster's dashboard (the dashboard runs as the job's user,
so a job can kill it and listen on its port): plain sockets on 127.0.0.1, one thread per
connection, answering each request as ``answer(method, path)`` says.

An answer is bytes sent at once, or a :class:`Drip` sent one byte at a time, or a
:class:`Flood` of body bytes sent as fast as the reader takes them, or a list of those sent one
after the other. ``ray_version`` answers
``GET /api/version`` as Ray would, so that a JobSubmissionClient can be built against it.
"""

from __future__ import annotations

import dataclasses
import json
import socket
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


@dataclasses.dataclass(frozen=True)
class Drip:
    """An answer sent one byte every ``every`` seconds, headers and body alike."""

    data: bytes
    every: float = 0.5


@dataclasses.dataclass(frozen=True)
class Flood:
    """A 200 answer whose body is ``size`` bytes of ``b"x"``, announced or not."""

    size: int
    announce: bool = False


Answer = bytes | Drip | Flood | list


def http_answer(status: int, body: bytes = b"", headers: dict[str, str] | None = None) -> bytes:
    head = [f"HTTP/1.1 {status} Whatever", f"Content-Length: {len(body)}", "Connection: close"]
    head += [f"{k}: {v}" for k, v in (headers or {}).items()]
    return ("\r\n".join(head) + "\r\n\r\n").encode() + body


def json_answer(data, status: int = 200) -> bytes:
    body = json.dumps(data).encode()
    return http_answer(status, body, {"Content-Type": "application/json"})


def ray_version(method: str, path: str) -> bytes | None:
    """Ray's answer to the version check, or None for any other request."""
    if method == "GET" and path == "/api/version":
        return json_answer({"version": "4", "ray_version": "2.60.0", "ray_commit": "x"})
    return None


class HostileDashboard:
    def __init__(self, answer: Callable[[str, str], Answer]) -> None:
        self.answer = answer
        self.requests: list[tuple[str, str]] = []
        self.sent = 0  # body bytes of floods written
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._listener.settimeout(0.2)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._listener.getsockname()[1]}"

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self._listener.close()

    def __enter__(self) -> HostileDashboard:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            threading.Thread(target=self._handle, args=(conn,), daemon=True).start()

    def _handle(self, conn: socket.socket) -> None:
        with conn:
            try:
                request = b""
                while b"\r\n\r\n" not in request:
                    piece = conn.recv(65536)
                    if not piece:
                        return
                    request += piece
                line = request.split(b"\r\n", 1)[0].decode()
                method, path, _ = line.split(" ", 2)
                self.requests.append((method, path))
                self._send(conn, self.answer(method, path))
            except OSError:
                pass  # the client hung up: that is what these answers are for

    def _send(self, conn: socket.socket, answer: Answer) -> None:
        if isinstance(answer, list):
            for part in answer:
                self._send(conn, part)
        elif isinstance(answer, bytes):
            conn.sendall(answer)
        elif isinstance(answer, Drip):
            for byte in answer.data:
                if self._stop.is_set():
                    return
                conn.sendall(bytes([byte]))
                time.sleep(answer.every)
        else:
            length = f"Content-Length: {answer.size}\r\n" if answer.announce else ""
            conn.sendall(f"HTTP/1.1 200 OK\r\n{length}Connection: close\r\n\r\n".encode())
            chunk = b"x" * 65536
            while self.sent < answer.size and not self._stop.is_set():
                conn.sendall(chunk)
                self.sent += len(chunk)


class Recorder:
    """A plain HTTP server on 127.0.0.1 that notes every request it gets (the service a
    redirect would send Manta's request to)."""

    def __init__(self) -> None:
        self.contacted: list[str] = []
        recorder = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                recorder.contacted.append(self.path)
                self.send_response(200)
                self.end_headers()
                self.wfile.write(b'{"secret": "the host\'s own service"}')

            do_POST = do_PUT = do_GET

            def log_message(self, *args) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
