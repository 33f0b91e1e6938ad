"""The ``manta`` CLI against the real API: pytest-django's ``live_server`` serves it, the world is
committed (``transactional_db``) so the server's thread sees it, and the CLI runs in-process
through typer's CliRunner or, where signals or a real stdin matter, as a subprocess."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

# Until the project's lock installs cli/ (pip install -e ./cli), these tests are skipped, not
# errors: the rest of the suite does not need the CLI.
pytest.importorskip("manta", reason="the manta CLI is not installed: pip install -e ./cli")

from manta import Client
from manta.cli import app
from typer.testing import CliRunner, Result

from tests.conftest import World, build_world, sigint_as_in_a_terminal
from tests.factories import JobTemplateFactory

ENV_NAMES = ("MANTA_URL", "MANTA_TOKEN", "MANTA_ORG", "MANTA_WORKSPACE")
CLI_OVERRIDES = ["entrypoint", "image", "runtime_env", "worker_groups", "priority"]


@pytest.fixture
def live_world(transactional_db, settings) -> World:
    # These tests move jobs through their states by hand: a submission leaves its job queued,
    # as with no worker, instead of admitting it in its own request.
    settings.MANTA_INLINE_ADMISSION_MAX_QUEUED = 0
    return build_world()


@pytest.fixture
def counter(live_world):
    """The counter template in acme/ml, with what the CLI overrides allowed."""
    return JobTemplateFactory(
        workspace=live_world.ws,
        name="counter",
        created_by=live_world.users["ws_admin"],
        version__allowed_overrides=CLI_OVERRIDES,
    )


@pytest.fixture
def config_home(tmp_path, monkeypatch) -> Path:
    """A config dir of the test's own, and none of the MANTA_* variables from outside."""
    home = tmp_path / "xdg-config"
    monkeypatch.setenv("XDG_CONFIG_HOME", str(home))
    for name in ENV_NAMES:
        monkeypatch.delenv(name, raising=False)
    return home


@dataclasses.dataclass
class Manta:
    """Runs ``manta`` against the live server."""

    url: str
    world: World
    config_home: Path
    processes: list[CliProcess] = dataclasses.field(default_factory=list)

    def env(self, who: str, **extra: str) -> dict[str, str]:
        """The environment a CI job of ``who`` would have."""
        return {
            "MANTA_URL": self.url,
            "MANTA_TOKEN": self.world.tokens[who],
            "MANTA_ORG": "acme",
            "MANTA_WORKSPACE": "ml",
            **extra,
        }

    def __call__(self, *args: str, input: str | None = None, env: dict | None = None) -> Result:
        return CliRunner().invoke(app, list(args), input=input, env=env)

    def as_user(self, who: str, *args: str, **kwargs) -> Result:
        return self(*args, env=self.env(who), **kwargs)

    def client(self, who: str) -> Client:
        return Client(self.url, self.world.tokens[who], org="acme", workspace="ml")

    def process(self, who: str, *args: str, **extra_env: str) -> CliProcess:
        env = {**os.environ, **self.env(who, **extra_env)}
        env.setdefault("MANTA_POLL_SECONDS", "0.1")
        process = CliProcess([sys.executable, "-m", "manta", *args], env)
        self.processes.append(process)
        return process


@pytest.fixture
def manta(live_server, live_world, config_home) -> Iterator[Manta]:
    runner = Manta(url=live_server.url, world=live_world, config_home=config_home)
    yield runner
    for process in runner.processes:
        process.kill()


class CliProcess:
    """``manta`` as a process of its own, its stdout and stderr read as they come (a prompt
    without a newline included)."""

    def __init__(self, argv: list[str], env: dict[str, str]):
        self.proc = subprocess.Popen(
            argv, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            preexec_fn=sigint_as_in_a_terminal,
        )  # fmt: skip
        self._out = {"stdout": bytearray(), "stderr": bytearray()}
        self._readers = [
            threading.Thread(target=self._read, args=(name, stream), daemon=True)
            for name, stream in (("stdout", self.proc.stdout), ("stderr", self.proc.stderr))
        ]
        for reader in self._readers:
            reader.start()

    def _read(self, name: str, stream) -> None:
        while chunk := os.read(stream.fileno(), 4096):
            self._out[name] += chunk

    @property
    def stdout(self) -> str:
        return self._out["stdout"].decode(errors="replace")

    @property
    def stderr(self) -> str:
        return self._out["stderr"].decode(errors="replace")

    def answer(self, text: str | None) -> None:
        """Type ``text`` on its stdin (None: close it, as when there is no one to answer)."""
        if text is None:
            self.proc.stdin.close()
        else:
            self.proc.stdin.write(text.encode())
            self.proc.stdin.flush()

    def expect(self, text: str, *, on: str = "stdout", timeout: float = 30) -> None:
        """Wait until ``text`` was written on ``on``."""
        deadline = time.monotonic() + timeout
        while text not in getattr(self, on):
            ended = self.proc.poll() is not None
            if ended:
                self._join()
            if time.monotonic() > deadline or (ended and text not in getattr(self, on)):
                raise AssertionError(
                    f"{text!r} never came on {on}:\nstdout: {self.stdout}\nstderr: {self.stderr}"
                )
            time.sleep(0.05)

    def _join(self) -> None:
        for reader in self._readers:
            reader.join(timeout=5)

    def wait(self, timeout: float = 30) -> int:
        code = self.proc.wait(timeout=timeout)
        self._join()
        return code

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def wait_until(predicate, timeout: float = 30, message: str = "condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {message}")
