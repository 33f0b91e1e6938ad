"""The ports of a local cluster's nodes: which ``ray start`` flags take them, and how they are
chosen (free ones on the host without a sandbox; fixed ones inside a sandbox's own network)."""

from __future__ import annotations

import random
import socket

LOOPBACK = "127.0.0.1"

# `ray start` flag for each port a node listens on. Ray's fixed defaults (6379, 8265, 10001,
# 52365, worker ports 10002-19999) collide as soon as two clusters share a host; every port is
# therefore chosen by us, except the workers' (see start_node).
PORT_FLAGS = {
    "gcs": "--port",
    "dashboard": "--dashboard-port",
    "client_server": "--ray-client-server-port",
    "dashboard_agent_listen": "--dashboard-agent-listen-port",
    "dashboard_agent_grpc": "--dashboard-agent-grpc-port",
    "node_manager": "--node-manager-port",
    "object_manager": "--object-manager-port",
    "metrics_export": "--metrics-export-port",
    "runtime_env_agent": "--runtime-env-agent-port",
}
HEAD_ONLY_PORTS = ("gcs", "dashboard", "client_server")
HEAD_PORTS = tuple(PORT_FLAGS)
WORKER_PORTS = tuple(p for p in PORT_FLAGS if p not in HEAD_ONLY_PORTS)


def pick_free_ports(count: int) -> list[int]:
    """``count`` distinct ports that nobody listens on right now.

    Candidates come from below the kernel's ephemeral range, where port-0 binds and outgoing
    connections (including other Ray clusters' worker processes) never land, so a port is much
    less likely to be taken between this check and Ray's bind. All sockets stay open until every
    port is chosen, so the ports are distinct.
    """
    low, high = 20000, _ephemeral_port_range()[0] - 1
    sockets: list[socket.socket] = []
    ports: list[int] = []
    tries = 0
    try:
        while len(ports) < count:
            tries += 1
            candidate = random.randint(low, high) if high - low > 1000 and tries < 50 * count else 0
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            try:
                sock.bind(("", candidate))
            except OSError:
                sock.close()
                continue
            sockets.append(sock)
            ports.append(sock.getsockname()[1])
    finally:
        for sock in sockets:
            sock.close()
    return ports


def _ephemeral_port_range() -> tuple[int, int]:
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            low, high = f.read().split()
        return int(low), int(high)
    except (OSError, ValueError):
        return 32768, 60999


def sandbox_ports(count: int) -> list[dict[str, int]]:
    """Each node's ports inside a sandbox: its network is the cluster's own, so nothing else
    binds there and fixed numbers never collide (Ray's defaults for the head's public ones)."""
    head = {"gcs": 6379, "dashboard": 8265, "client_server": 10001}
    sets = []
    for number in range(count):
        names = HEAD_PORTS if number == 0 else WORKER_PORTS
        ports = {name: head[name] for name in names if name in head}
        free = (p for p in range(20000 + number * 20, 20020 + number * 20))
        ports.update({name: next(free) for name in names if name not in ports})
        sets.append(ports)
    return sets
