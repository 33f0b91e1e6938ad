"""Where prometheus-client keeps a process group's metrics when its processes fork.

The API runs as several gunicorn workers and a Celery worker as a pool of children: each process
counts its own events, so each writes them to files in one folder per process group
(prometheus-client's multiprocess mode), and whichever process answers a scrape adds them up.

prometheus-client chooses how it stores values when it is first imported, so :func:`prepare`
must run before that: ``gunicorn.conf.py`` calls it when gunicorn reads its settings, and
``config/celery.py`` when a worker with an exporter starts. Nothing here imports it.
"""

from __future__ import annotations

import os
from pathlib import Path

ENV = "PROMETHEUS_MULTIPROC_DIR"
ROOT = Path(__file__).resolve().parent.parent


def folder_for(group: str) -> Path:
    """``PROMETHEUS_MULTIPROC_DIR`` if the operator set one, else ``var/metrics/<group>``."""
    configured = os.environ.get(ENV)
    if configured:
        return Path(configured)
    return Path(os.environ.get("MANTA_VAR_DIR") or ROOT / "var") / "metrics" / group


def prepare(group: str) -> Path:
    """Point this process, and every process it forks, at ``group``'s folder, emptied: the
    files of a previous run belong to processes that are gone (Prometheus reads the drop of a
    counter as a restart, as it does for a single process)."""
    path = folder_for(group)
    path.mkdir(parents=True, exist_ok=True)
    for stale in path.glob("*.db"):
        stale.unlink(missing_ok=True)
    os.environ[ENV] = str(path)
    return path


def enabled() -> bool:
    return bool(os.environ.get(ENV))
