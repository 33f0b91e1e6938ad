"""Launchers: how a job attempt becomes a Ray job, one implementation per compute target kind."""

from __future__ import annotations

from typing import Any

from .base import Launcher, LaunchError


def launcher_for(kind: str, config: dict[str, Any]) -> Launcher:
    # Imported on use: each pulls in a heavy client (ray, kubernetes) that most processes skip.
    if kind == "local":
        from .local import LocalRayLauncher

        return LocalRayLauncher()
    if kind == "ray":
        from .ray_cluster import RayClusterLauncher

        return RayClusterLauncher(config)
    if kind == "kuberay":
        from .kuberay import KubeRayLauncher

        return KubeRayLauncher(config)
    raise LaunchError(f"unknown compute target kind {kind!r}")
