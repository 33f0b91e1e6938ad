"""What a sandboxed node is allowed, on plain values: the footprint admission reserves is the
arithmetic the cgroups and the disk are made from, node by node and in total."""

from __future__ import annotations

import dataclasses

import pytest

from jobs.launchers.base import LaunchRequest
from jobs.launchers.local import LocalRayLauncher
from jobs.launchers.local.isolation import (
    GIB,
    MIB,
    SandboxSettings,
    cluster_footprint,
    node_footprint,
    sandbox_limits,
)
from jobs.launchers.local.startup import sandbox_nodes

SETTINGS = SandboxSettings(
    default_node_memory_bytes=2 * GIB,
    node_memory_overhead_bytes=GIB,
    default_node_disk_bytes=10 * GIB,
    min_node_cpu=1.0,
)


def test_a_head_with_no_cpus_and_no_memory_holds_what_its_sandbox_gives_it():
    footprint = node_footprint(SETTINGS, {"cpu": 0, "memory_gb": 0, "gpu": 0})
    # 1 CPU at least; the default 2 GiB + its 30 % object store + 1 GiB of Ray's own; 10 GiB disk
    assert footprint == {
        "cpu": 1.0,
        "memory_gb": (2 * GIB + int(2 * GIB * 0.3) + GIB) / GIB,
        "disk_gb": 10.0,
    }
    assert footprint["memory_gb"] == pytest.approx(3.6)


def test_a_node_that_names_everything_holds_that_and_its_object_store_and_overhead():
    node = {"cpu": 4, "memory_gb": 8, "gpu": 1, "disk_gb": 25}
    assert node_footprint(SETTINGS, node) == {
        "cpu": 4.0,
        "memory_gb": (8 * GIB + int(8 * GIB * 0.3) + GIB) / GIB,
        "disk_gb": 25.0,
    }
    # the target's object store replaces the 30 %
    configured = node_footprint(SETTINGS, node, object_store_bytes=512 * MIB)
    assert configured["memory_gb"] == 8 + 0.5 + 1


def test_the_minimum_cpu_and_the_defaults_are_the_operators():
    settings = dataclasses.replace(
        SETTINGS, min_node_cpu=0.5, default_node_memory_bytes=GIB, default_node_disk_bytes=GIB
    )
    assert node_footprint(settings, {"cpu": 0}) == {
        "cpu": 0.5,
        "memory_gb": (GIB + int(GIB * 0.3) + GIB) / GIB,
        "disk_gb": 1.0,
    }
    # a small node's object store is 100 MiB at least
    tiny = node_footprint(settings, {"cpu": 2, "memory_gb": 0.25})
    assert tiny["memory_gb"] == (GIB // 4 + 100 * MIB + GIB) / GIB


def test_a_cluster_holds_its_head_and_every_replica():
    spec = {
        "head": {"cpu": 0, "memory_gb": 2},
        "worker_groups": [
            {"name": "a", "replicas": 3, "cpu": 2, "memory_gb": 4, "disk_gb": 20},
            {"name": "b", "replicas": 0, "cpu": 8, "memory_gb": 64},
        ],
    }
    head = node_footprint(SETTINGS, spec["head"])
    worker = node_footprint(SETTINGS, spec["worker_groups"][0])
    assert cluster_footprint(SETTINGS, spec) == {
        "cpu": head["cpu"] + 3 * worker["cpu"],
        "memory_gb": head["memory_gb"] + 3 * worker["memory_gb"],
        "disk_gb": 10 + 3 * 20.0,
    }


@pytest.mark.parametrize("object_store", [None, 300 * MIB])
def test_sandbox_limits_total_exactly_the_footprints(object_store):
    """What the cgroups get (sandbox_limits over the launcher's own nodes) is, to the byte, what
    admission reserves (cluster_footprint over the spec)."""
    spec = {
        "image": "rayproject/ray:2.60.0",
        "entrypoint": "true",
        "head": {"cpu": 0, "memory_gb": 1.5, "gpu": 0},
        "worker_groups": [
            {"name": "w", "replicas": 2, "cpu": 3, "memory_gb": 0, "disk_gb": 2.5},
            {"name": "v", "replicas": 1, "cpu": 1, "memory_gb": 7},
        ],
    }
    config = {"sandbox": {**SETTINGS.to_config()}}
    if object_store:
        config["object_store_memory_bytes"] = object_store
    request = LaunchRequest(
        submission_id="s", cluster_name="c", spec=spec, labels={}, target_config=config
    )
    nodes = LocalRayLauncher().plan(request)["nodes"]
    named, stores = sandbox_nodes(SETTINGS, nodes, object_store)
    limits = sandbox_limits(SETTINGS, named, stores)
    reserved = cluster_footprint(SETTINGS, spec, object_store)

    assert sum(limits["cpu"].values()) == reserved["cpu"] == 1 + 2 * 3 + 1
    assert limits["memory_bytes"] == reserved["memory_gb"] * GIB
    assert limits["disk_bytes"] == reserved["disk_gb"] * GIB == (10 + 2 * 2.5 + 10) * GIB
    assert limits["inodes"] == (10 + 2 * 2.5 + 10) * 65536
    assert limits["pids"] == 4 * SETTINGS.pids_per_node
    assert limits["shm_bytes"] == sum(stores.values()) + 64 * MIB
    # node by node, in the plan's own names
    assert limits["cpu"] == {"h": 1.0, "w0": 3.0, "w1": 3.0, "w2": 1.0}
    for name, node in zip(("h", "w0", "w2"), (spec["head"], *spec["worker_groups"]), strict=True):
        share = limits["nodes"][name]
        assert node_footprint(SETTINGS, node, object_store) == {
            "cpu": share["cpu"],
            "memory_gb": share["memory_bytes"] / GIB,
            "disk_gb": share["disk_bytes"] / GIB,
        }
    assert set(limits) == {
        "cpu",
        "memory_bytes",
        "pids",
        "shm_bytes",
        "disk_bytes",
        "inodes",
        "nodes",
    }


def test_the_plan_shows_each_nodes_footprint_and_their_total():
    spec = {
        "image": "rayproject/ray:2.60.0",
        "entrypoint": "true",
        "head": {"cpu": 0, "memory_gb": 2, "disk_gb": 5},
        "worker_groups": [{"name": "w", "replicas": 1, "cpu": 2, "memory_gb": 1}],
    }
    request = LaunchRequest(
        submission_id="s",
        cluster_name="c",
        spec=spec,
        labels={},
        target_config={"sandbox": SETTINGS.to_config()},
    )
    footprint = LocalRayLauncher().plan(request)["isolation"]["footprint"]
    assert footprint["nodes"] == {
        "h": node_footprint(SETTINGS, spec["head"]),
        "w0": node_footprint(SETTINGS, spec["worker_groups"][0]),
    }
    assert footprint["total"] == cluster_footprint(SETTINGS, spec)
    assert footprint["total"]["disk_gb"] == 15.0
