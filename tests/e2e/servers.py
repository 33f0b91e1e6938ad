"""Real servers an end-to-end test starts and stops itself, by pid, on free loopback ports:
a Redis, a Ray head with token authentication, the API under gunicorn."""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import redis
import requests

from tests.e2e.conftest import ROOT


def free_ports(count: int) -> list[int]:
    """``count`` distinct loopback ports nobody listens on right now."""
    sockets = []
    try:
        for _ in range(count):
            sock = socket.socket()
            sock.bind(("127.0.0.1", 0))
            sockets.append(sock)
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


def wait_until(condition, timeout: float, what, interval: float = 0.3):
    """Poll ``condition`` until it is true; fail saying ``what()`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not (result := condition()):
        if time.monotonic() > deadline:
            raise AssertionError(f"after {timeout:g} s: {what()}")
        time.sleep(interval)
    return result


class RedisServer:
    """A redis-server on a free loopback port, nothing kept on disk, started and stopped by pid."""

    def __init__(self, workdir: Path):
        [self.port] = free_ports(1)
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.workdir, self.proc = workdir, None

    def start(self) -> None:
        log = open(self.workdir / "redis.log", "a")  # noqa: SIM115  (kept for the process's lifetime)
        self.proc = subprocess.Popen(
            ["redis-server", "--bind", "127.0.0.1", "--port", str(self.port), "--save", "",
             "--appendonly", "no", "--dir", str(self.workdir)],
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
        client = redis.Redis.from_url(self.url, socket_timeout=1)
        wait_until(lambda: self._answers(client), 10, lambda: "redis-server did not start")

    @staticmethod
    def _answers(client) -> bool:
        try:
            return client.ping()
        except redis.RedisError:
            return False

    def kill(self) -> None:
        """SIGKILL: the broker is gone, and with it every message it held."""
        self.proc.kill()
        self.proc.wait(timeout=10)

    def freeze(self) -> None:
        """SIGSTOP: the broker keeps its connections and its messages but answers nothing."""
        os.kill(self.proc.pid, signal.SIGSTOP)

    def thaw(self) -> None:
        os.kill(self.proc.pid, signal.SIGCONT)

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.thaw()
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


class RayHead:
    """One real Ray head (`ray start --head --block`), token authentication on, every port free
    and on loopback; stopped by the pid of that command, and nothing of it may outlive it."""

    def __init__(self):
        self.temp_dir = tempfile.mkdtemp(prefix="mft-", dir="/tmp")  # Ray's socket paths: short
        self.token = secrets.token_hex(16)
        gcs, dash, *ports = free_ports(9)
        self.address = f"http://127.0.0.1:{dash}"
        flags = ["--ray-client-server-port", "--dashboard-agent-listen-port",
                 "--dashboard-agent-grpc-port", "--metrics-export-port", "--runtime-env-agent-port",
                 "--node-manager-port", "--object-manager-port"]  # fmt: skip
        self.command = [
            str(Path(sys.executable).parent / "ray"), "start", "--head", "--block",
            f"--port={gcs}", f"--dashboard-port={dash}", "--dashboard-host=127.0.0.1",
            "--node-ip-address=127.0.0.1", "--num-cpus=2", f"--temp-dir={self.temp_dir}",
            "--include-dashboard=true", "--disable-usage-stats",
            "--min-worker-port=0", "--max-worker-port=0",
            *(f"{flag}={port}" for flag, port in zip(flags, ports, strict=True)),
        ]  # fmt: skip
        self.proc = None

    def start(self) -> None:
        env = {**os.environ, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": self.token,
               "RAY_USAGE_STATS_ENABLED": "0"}  # fmt: skip
        log = open(Path(self.temp_dir) / "head.log", "a")  # noqa: SIM115
        self.proc = subprocess.Popen(self.command, env=env, stdout=log, stderr=subprocess.STDOUT,
                                     start_new_session=True)  # fmt: skip
        headers = {"Authorization": f"Bearer {self.token}"}

        def up() -> bool:
            assert self.proc.poll() is None, self.log()
            with contextlib.suppress(requests.RequestException):
                return requests.get(f"{self.address}/api/jobs/", headers=headers, timeout=2).ok
            return False

        wait_until(up, 120, lambda: f"the Ray head did not start:\n{self.log()}", interval=1)

    def log(self) -> str:
        return (Path(self.temp_dir) / "head.log").read_text(errors="replace")[-3000:]

    def processes(self) -> list[int]:
        """Every process of this cluster: its temp dir on the command line, or its token in the
        environment (job drivers carry neither on their command line)."""
        markers = (self.temp_dir.encode(), f"RAY_AUTH_TOKEN={self.token}".encode())
        found = []
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit():
                with contextlib.suppress(OSError):
                    seen = (entry / "cmdline").read_bytes() + (entry / "environ").read_bytes()
                    if any(marker in seen for marker in markers):
                        found.append(int(entry.name))
        return found

    def stop(self) -> list[str]:
        """SIGTERM the head's `ray start`, give its processes 10 s to follow, then SIGKILL by pid
        whatever of it is left; returns the command lines of those."""
        if self.proc.poll() is None:
            self.proc.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=60)
        with contextlib.suppress(AssertionError):
            wait_until(lambda: not self.processes(), 10, str, interval=0.2)
        killed = []
        for pid in self.processes():
            with contextlib.suppress(OSError):
                command = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")
                os.kill(pid, signal.SIGKILL)
                killed.append(command.decode(errors="replace")[:200])
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)
        with contextlib.suppress(AssertionError):
            wait_until(lambda: not self.processes(), 10, str, interval=0.2)
        shutil.rmtree(self.temp_dir, ignore_errors=True)
        return killed


class Api:
    """The API under gunicorn on a free loopback port, with the worker's environment."""

    def __init__(self, env: dict[str, str], log: Path):
        self.env, self.log, self.proc = env, log, None
        self.base = f"http://127.0.0.1:{free_ports(1)[0]}"

    def start(self) -> None:
        out = open(self.log, "a")  # noqa: SIM115  (kept for the process's lifetime)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "gunicorn", "config.wsgi", "-b", self.base[7:], "-w", "2"],
            cwd=ROOT, env=self.env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip

        def up() -> bool:
            assert self.proc.poll() is None, self.log.read_text()[-3000:]
            with contextlib.suppress(requests.RequestException):
                return requests.get(f"{self.base}/healthz", timeout=2).ok
            return False

        try:
            wait_until(up, 60, lambda: f"the API did not start:\n{self.log.read_text()[-3000:]}")
        except BaseException:
            self.stop()
            raise

    def call(self, token: str, method: str, path: str, body=None) -> requests.Response:
        return requests.request(method, self.base + path, json=body, timeout=60,
                                headers={"Authorization": f"Bearer {token}"})  # fmt: skip

    def kill(self) -> None:
        """SIGKILL the whole server, as if its host process died."""
        os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            self.proc.wait(timeout=30)
