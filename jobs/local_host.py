"""This host as the ``local`` compute target: how its clusters are isolated, which GPUs it has,
and how much admission may place on it.

The host is shared by every organisation whose workspaces launch on ``local``, so its capacity
is a limit above any organisation's: admission never reserves more of it than it has, whatever
an org's own capacity says.
"""

from __future__ import annotations

import functools
import os
from typing import Any

from django.conf import settings
from django.db import connection

from config.gpu_flavors import UNTYPED
from workspaces.models import ComputeTarget, ComputeTargetKind, Workspace

from .launchers.local.isolation import (
    GIB,
    MODE_SANDBOX,
    SandboxSettings,
    cluster_footprint,
    detect_gpus,
    egress_available,
    host_support,
)

HOST = "local"  # what a reservation on this host records in Reservation.host


@functools.cache
def gpu_inventory() -> tuple[str, ...]:
    """The device indices of this host's GPUs: ``MANTA_LOCAL_GPUS``, or what nvidia-smi lists."""
    if settings.MANTA_LOCAL_GPUS == "auto":
        return detect_gpus()
    return tuple(settings.MANTA_LOCAL_GPUS)


def gpu_flavor_inventory() -> dict[str, tuple[str, ...]]:
    """This host's GPUs by flavor, in inventory order (``UNTYPED`` for devices without a
    type): what ``MANTA_LOCAL_GPUS`` names, e.g. "h100:0,1;a100:2,3" (detected GPUs are
    untyped)."""
    types = settings.MANTA_LOCAL_GPU_FLAVORS
    inventory: dict[str, tuple[str, ...]] = {}
    for device in gpu_inventory():
        flavor = types.get(device, UNTYPED)
        inventory[flavor] = (*inventory.get(flavor, ()), device)
    return inventory


def sandbox_settings() -> SandboxSettings:
    """The operator's isolation settings (a tenant's target config never reaches them)."""
    return SandboxSettings(
        mode=settings.MANTA_LOCAL_ISOLATION,
        uid_range=settings.MANTA_LOCAL_UID_RANGE,
        egress=settings.MANTA_LOCAL_EGRESS,
        # The service's own files (code, settings, the embedded database and broker) stay
        # out of sight; the interpreter and its packages are shown again read-only.
        hide=(str(settings.BASE_DIR), str(settings.VAR_DIR), *settings.MANTA_LOCAL_HIDE_PATHS),
        gpus=gpu_inventory(),
        gpu_flavors=tuple(
            (device, flavor)
            for flavor, devices in gpu_flavor_inventory().items()
            if flavor
            for device in devices
        ),
        pids_per_node=settings.MANTA_LOCAL_PIDS_PER_NODE,
        node_memory_overhead_bytes=int(settings.MANTA_LOCAL_NODE_OVERHEAD_GB * GIB),
        default_node_memory_bytes=int(settings.MANTA_LOCAL_DEFAULT_NODE_MEMORY_GB * GIB),
        default_node_disk_bytes=int(settings.MANTA_DEFAULT_NODE_DISK_GB * GIB),
        min_node_cpu=settings.MANTA_LOCAL_MIN_NODE_CPU,
        lease_dir=settings.MANTA_LOCAL_LEASE_DIR,
    )


def capacity() -> dict[str, float | None]:
    """What admission may reserve on this host over all organisations (None: no cap; GPUs are
    logical, and uncapped, when the host has no inventory). What MANTA_LOCAL_CAPACITY names,
    else the host's own, less the reserve kept for the service."""
    configured = settings.MANTA_LOCAL_CAPACITY
    memory_gb = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / GIB
    inventory = gpu_inventory()
    found: dict[str, float | None] = {
        "cpu": max(0.0, (os.cpu_count() or 1) - settings.MANTA_LOCAL_RESERVE_CPU),
        "memory_gb": max(0.0, round(memory_gb - settings.MANTA_LOCAL_RESERVE_MEMORY_GB, 1)),
        "gpu": float(len(inventory)) if inventory else None,
        "disk_gb": None if "disk_gb" in configured else free_disk_gb(),
    }
    for name in found:
        if name in configured:
            found[name] = configured[name]
    return found


def free_disk_gb() -> float:
    """The free space (GB) of the filesystem the clusters' disks are made on (where
    MANTA_LOCAL_RAY_DIR is, or would be), less MANTA_LOCAL_RESERVE_DISK_GB. What a running
    cluster wrote to its (sparse) disk is gone from the free space and still in its
    reservation: the bound errs towards refusing, never towards filling the host."""
    path = os.path.abspath(settings.MANTA_LOCAL_RAY_DIR)
    while not os.path.exists(path):
        path = os.path.dirname(path)
    stats = os.statvfs(path)
    free_gb = stats.f_bavail * stats.f_frsize / GIB
    return max(0.0, round(free_gb - settings.MANTA_LOCAL_RESERVE_DISK_GB, 1))


def targets_host(workspace: Workspace) -> bool:
    return workspace.pk in workspaces_on_host(workspace.organization_id)


# The alias under which a submission reads the workspace's compute target with the workspace
# (jobs.selectors.submission_workspaces): a FilteredRelation, as a workspace names its target.
# Django sets no attribute when the join finds no row, so a second one says it was read.
TARGET_JOIN = "joined_compute_target"
TARGET_READ = "compute_target_joined"


def compute_target_of(workspace: Workspace) -> ComputeTarget | None:
    """The compute target the workspace names (None: no such row, as for the built-in
    ``local``): the one read with the workspace when it was, else read now."""
    if getattr(workspace, TARGET_READ, False):
        return getattr(workspace, TARGET_JOIN, None)
    return ComputeTarget.objects.filter(
        organization_id=workspace.organization_id, name=workspace.compute_target
    ).first()


def local_target_config(workspace: Workspace) -> dict[str, Any] | None:
    """The config of the workspace's compute target when it is this host (``{}`` for the
    built-in one), None when its jobs launch elsewhere: the same rule as
    :func:`workspaces_on_host`, for one workspace."""
    target = compute_target_of(workspace)
    if target is None:
        return {} if workspace.compute_target == ComputeTargetKind.LOCAL else None
    return dict(target.config) if target.kind == ComputeTargetKind.LOCAL else None


def sandbox_footprint(spec: dict[str, Any], config: dict[str, Any]) -> dict[str, float] | None:
    """What the sandboxes of a job of ``spec`` on this host (target ``config``) allow it in
    all: cpu, memory_gb and disk_gb, the sum of its nodes' (see isolation.cluster_footprint).
    None when this host does not sandbox its clusters (then it enforces nothing)."""
    sandbox = sandbox_settings()
    if sandbox.mode != MODE_SANDBOX:
        return None
    store = config.get("object_store_memory_bytes")
    return cluster_footprint(sandbox, spec, int(store) if store else None)


def workspaces_on_host(organization_id: int) -> set[int]:
    """The organisation's workspaces whose jobs launch on this host (one query: every
    admission pass asks)."""
    workspaces, targets = Workspace._meta.db_table, ComputeTarget._meta.db_table
    local = ComputeTargetKind.LOCAL
    with connection.cursor() as cursor:  # a plain statement: building it was most of its cost
        cursor.execute(
            f"SELECT w.id FROM {workspaces} w WHERE w.organization_id = %s AND ("
            # on one of the organisation's local targets
            f"w.compute_target IN (SELECT t.name FROM {targets} t "
            "WHERE t.organization_id = %s AND t.kind = %s) "
            # or on the built-in target, unless the organisation named one of its own after it
            f"OR (w.compute_target = %s AND NOT EXISTS (SELECT 1 FROM {targets} t "
            "WHERE t.organization_id = %s AND t.name = %s)))",
            [organization_id, organization_id, local, local, organization_id, local],
        )
        return {row[0] for row in cursor.fetchall()}


def isolation_report() -> dict[str, Any]:
    """The isolation in force on this host and what it enforces (worker start-up, the README)."""
    sandbox = sandbox_settings()
    if sandbox.mode == "off":
        return {
            "mode": "off",
            "enforced": "nothing: nodes run as the worker's user and see the whole host "
            "(single-user mode)",
        }
    problems = host_support(sandbox)
    return {
        "mode": "sandbox",
        "ready": not problems,
        "problems": problems,
        "uid_range": list(sandbox.uid_range),
        "egress": egress_available(sandbox),
        "gpus": list(sandbox.gpus),
        "capacity": capacity(),
    }
