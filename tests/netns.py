"""A test host on a private address: an HTTP server in a network namespace of its own, joined to
the host's by a veth pair (10.213.N.1 on the host's side, 10.213.N.2 on the test host's). It
stands for what a job must not reach by default (a private service, a neighbour on the LAN) and
what an org admin may allow-list (a package mirror). Only what this makes is ever removed."""

from __future__ import annotations

import contextlib
import secrets
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass

SERVE = """
import http.server, sys
class Answer(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = sys.argv[2].encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *args):
        pass
http.server.ThreadingHTTPServer((sys.argv[1], 8080), Answer).serve_forever()
"""


@dataclass(frozen=True)
class PrivateHost:
    address: str
    port: int
    answer: str

    @property
    def url(self) -> str:
        return f"http://{self.address}:{self.port}/"


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, timeout=20)


@contextlib.contextmanager
def private_host() -> Iterator[PrivateHost]:
    tag = secrets.token_hex(3)
    subnet = 100 + int(tag[:2], 16) % 100
    ns, outside, inside = f"manta-th-{tag}", f"mth{tag}", f"mtn{tag}"
    host_ip, test_ip = f"10.213.{subnet}.1", f"10.213.{subnet}.2"
    answer = f"test host {tag}"
    server = None
    _ip("netns", "add", ns)
    try:
        _ip("link", "add", outside, "type", "veth", "peer", "name", inside)
        _ip("link", "set", inside, "netns", ns)
        _ip("addr", "add", f"{host_ip}/30", "dev", outside)
        _ip("link", "set", outside, "up")
        _ip("-n", ns, "addr", "add", f"{test_ip}/30", "dev", inside)
        _ip("-n", ns, "link", "set", inside, "up")
        _ip("-n", ns, "link", "set", "lo", "up")
        server = subprocess.Popen(
            ["ip", "netns", "exec", ns, sys.executable, "-I", "-c", SERVE, test_ip, answer],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        host = PrivateHost(test_ip, 8080, answer)
        deadline = time.monotonic() + 20
        while True:
            probe = subprocess.run(
                ["curl", "-s", "--max-time", "2", host.url], capture_output=True, text=True
            )
            if probe.stdout == answer:
                break
            if time.monotonic() > deadline or server.poll() is not None:
                raise RuntimeError(f"the test host at {host.url} did not come up")
            time.sleep(0.2)
        yield host
    finally:
        if server is not None:
            server.kill()
            server.wait()
        with contextlib.suppress(subprocess.CalledProcessError):
            _ip("link", "del", outside)
        with contextlib.suppress(subprocess.CalledProcessError):
            _ip("netns", "del", ns)
