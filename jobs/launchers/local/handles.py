"""A local cluster's handle: the plain JSON that finds the cluster again from any process on
this host, and its copy in the cluster's dir (``handle.json``, mode 0600: it holds the token), by
which a cluster whose caller died before storing the handle is found again."""

from __future__ import annotations

import json
import os
import tempfile
from typing import Any

from .files import write_whole
from .sandbox import Sandbox

KIND = "local"
CLUSTER_DIR_PREFIX = "mr-"  # short: Ray's unix sockets live below it (see startup.py)
HANDLE_FILE = "handle.json"


def write_handle(handle: dict[str, Any]) -> None:
    """Write the handle into its cluster's dir, replacing what was there in one step: a
    caller killed mid-write leaves the previous handle, never a truncated one (which would
    hide a running cluster from the sweeps that stop orphans). Mode 0600: it holds the token."""
    write_whole(os.path.join(handle["temp_dir"], HANDLE_FILE), json.dumps(handle))


def read_handle(cluster_dir: str) -> dict[str, Any] | None:
    """The handle in ``cluster_dir`` (None when there is none, or not a local cluster's)."""
    try:
        with open(os.path.join(cluster_dir, HANDLE_FILE)) as f:
            handle = json.load(f)
    except (OSError, ValueError):
        return None
    return handle if isinstance(handle, dict) and handle.get("kind") == KIND else None


def discover_handles(work_dir: str | None = None) -> list[dict[str, Any]]:
    """Handles of the local clusters whose temp dirs exist under ``work_dir`` (default: the
    system temp dir), running or not. For sweeping clusters whose handle never got stored."""
    base = work_dir or tempfile.gettempdir()
    handles = []
    try:
        names = sorted(os.listdir(base))
    except OSError:
        return []
    for name in names:
        if name.startswith(CLUSTER_DIR_PREFIX):
            handle = read_handle(os.path.join(base, name))
            if handle is not None:
                handles.append(handle)
    return handles


def sandbox_of(handle: dict[str, Any] | None) -> Sandbox | None:
    """The cluster's sandbox (None in single-user mode)."""
    state = (handle or {}).get("sandbox")
    return Sandbox(state) if state else None
