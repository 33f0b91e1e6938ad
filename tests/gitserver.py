"""A git repository served read-only by ``git daemon`` on 127.0.0.1, for code source tests."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
from pathlib import Path


def git(*args: str, cwd: Path) -> str:
    command = ["git", "-c", "user.email=dev@acme.test", "-c", "user.name=dev", *args]
    return subprocess.run(command, cwd=cwd, check=True, capture_output=True, text=True).stdout


class Repository:
    """A repository served read-only by ``git daemon`` on 127.0.0.1 (stopped by pid)."""

    def __init__(self, root: Path) -> None:
        self.work, self.served = root / "work", root / "served"
        self.work.mkdir()
        git("init", "-q", "-b", "main", cwd=self.work)
        self.commit(
            {
                "train.py": "import lib.helper\nprint(lib.helper.GREETING)\n",
                "lib/__init__.py": "",
                "lib/helper.py": "GREETING = 'hello from git'\n",
            }
        )
        self.served.mkdir()
        git("clone", "-q", "--bare", str(self.work), str(self.served / "repo.git"), cwd=root)
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.daemon = subprocess.Popen(
            ["git", "daemon", "--reuseaddr", "--listen=127.0.0.1", f"--port={self.port}",
             f"--base-path={self.served}", "--export-all", str(self.served)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
        )  # fmt: skip
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", self.port)) == 0:
                    break
            time.sleep(0.05)
        self.url = f"git://127.0.0.1:{self.port}/repo.git"

    def commit(self, files: dict[str, str]) -> str:
        for name, text in files.items():
            (self.work / name).parent.mkdir(parents=True, exist_ok=True)
            (self.work / name).write_text(text)
        git("add", "-A", cwd=self.work)
        git("commit", "-q", "-m", "change", cwd=self.work)
        return git("rev-parse", "HEAD", cwd=self.work).strip()

    def push(self) -> str:
        git("push", "-q", str(self.served / "repo.git"), "main", cwd=self.work)
        return git("rev-parse", "HEAD", cwd=self.work).strip()

    def stop(self) -> None:
        # `git daemon` runs git-daemon as a child: end the whole group it leads.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.daemon.pid, signal.SIGKILL)
        self.daemon.wait()
