"""Workloads for the scheduling simulator (``bench/simulate.py``): a seeded synthetic one and the
OpenB GPU cluster trace. Pure Python: nothing here touches Django or the database.

A :class:`Trace` is the organisation a replay builds (its capacity, its workspaces' guarantees)
and the tasks it submits: when each arrives, in which workspace, from which template, what it
asks for, how long it runs, and its ``max_runtime_seconds`` (the cap Manta would stop it at; a
prediction with no history assumes a job runs that long).

Templates matter because ``jobs/prediction.py`` predicts a job's run time from the recent runs
of its template: a synthetic template has a typical duration of its own; an OpenB "template" is
a workspace's tasks of one shape (the same CPU, memory, GPU and QoS), the closest the trace comes
to "the same job submitted again".
"""

from __future__ import annotations

import csv
import dataclasses
import hashlib
import math
import random
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OPENB_DIR = ROOT.parent / "shared" / "traces" / "openb"  # ../shared/traces/openb from the repo
OPENB_PODS = "openb_pod_list_default.csv"
OPENB_NODES = "openb_node_list_all_node.csv"
QOS_PRIORITY = {"Guaranteed": 9, "LS": 7, "Burstable": 5, "BE": 3}
RESOURCES = ("cpu", "memory_gb", "gpu")


@dataclasses.dataclass(frozen=True)
class Task:
    name: str
    arrival: float  # seconds from the start of the trace
    workspace: int  # index into Trace.guarantees
    template: str  # tasks of one template share a run-time history
    priority: int
    cpu: float
    memory_gb: float
    gpu: float
    runtime: float  # seconds it runs once started (a restarted task runs it all again)
    max_runtime: int  # seconds: its spec's max_runtime_seconds (runtime never exceeds it)

    @property
    def requested(self) -> dict[str, float]:
        return {"cpu": self.cpu, "memory_gb": self.memory_gb, "gpu": self.gpu}


@dataclasses.dataclass
class Trace:
    name: str
    tasks: list[Task]  # in arrival order
    capacity: dict[str, float]  # the organisation's cpu, memory_gb, gpu
    guarantees: list[dict[str, float]]  # per workspace
    description: str = ""

    @property
    def workspaces(self) -> int:
        return len(self.guarantees)


# --- synthetic ----------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class SyntheticParams:
    """Every knob of the synthetic workload (each is a flag of ``bench/simulate.py``)."""

    jobs: int = 2000
    workspaces: int = 20
    seed: int = 1
    gpus: float = 64  # the organisation's GPU capacity
    cpu_per_gpu: float = 8  # a job's CPUs per GPU, and the capacity's
    memory_per_gpu: float = 32  # GB, likewise
    gpu_sizes: tuple[int, ...] = (1, 2, 4, 8)
    size_zipf: float = 1.2  # weight of the k-th size ∝ 1 / k^size_zipf (1: 49 %, 8: 9 %)
    templates_per_workspace: int = 3  # each with its own size and typical duration
    duration_median: float = 1800  # seconds: the median template's typical duration
    template_sigma: float = 1.0  # log-normal spread of templates' typical durations
    run_sigma: float = 0.5  # log-normal spread of one template's runs around its typical one
    cap_sigmas: float = 3.0  # max_runtime = typical × e^(cap_sigmas × run_sigma)
    load: float = 1.2  # offered GPU-time ÷ GPU capacity × span: above 1, work queues
    burst_factor: float = 6.0  # arrival rate in a burst ÷ the calm rate
    burst_every: float = 4 * 3600  # mean seconds of calm between bursts (exponential)
    burst_length: float = 1200  # mean seconds a burst lasts (exponential)
    workspace_zipf: float = 0.8  # guarantee of the i-th workspace ∝ 1 / i^workspace_zipf
    demand_sigma: float = 0.5  # log-normal spread of a workspace's demand around its guarantee
    guaranteed: float = 1.0  # Σ guarantees ÷ capacity
    priorities: tuple[tuple[int, float], ...] = ((3, 0.1), (5, 0.8), (7, 0.1))


def synthetic(params: SyntheticParams) -> Trace:
    """A seeded workload: heavy-tailed sizes and durations, bursty arrivals, unequal workspaces.

    Workspace i is guaranteed a share ∝ 1/i^workspace_zipf of the capacity; its share of the
    submitted jobs is that times a log-normal factor (demand_sigma), so some workspaces ask for
    more than their guarantee and some for less. Each workspace has a few templates, each with a
    GPU size (1/2/4/8, Zipf weights) and a typical duration (log-normal around duration_median);
    a run lasts its template's typical duration times a log-normal factor (run_sigma), capped at
    its max_runtime. Arrivals are a Poisson process whose rate is burst_factor times higher
    during bursts (a two-state Markov-modulated Poisson process), scaled so the offered load is
    ``load`` times the GPU capacity over the trace.
    """
    p = params
    rng = random.Random(p.seed)
    weights = [1 / (i + 1) ** p.workspace_zipf for i in range(p.workspaces)]
    total = sum(weights)
    capacity = {
        "cpu": p.gpus * p.cpu_per_gpu,
        "memory_gb": p.gpus * p.memory_per_gpu,
        "gpu": p.gpus,
    }
    guarantees = [
        {name: capacity[name] * p.guaranteed * w / total for name in RESOURCES} for w in weights
    ]
    demand = [w * rng.lognormvariate(0, p.demand_sigma) for w in weights]
    size_weights = [1 / (k + 1) ** p.size_zipf for k in range(len(p.gpu_sizes))]
    templates = [
        [
            (
                f"w{ws}-t{t}",
                rng.choices(p.gpu_sizes, size_weights)[0],
                p.duration_median * rng.lognormvariate(0, p.template_sigma),
            )
            for t in range(p.templates_per_workspace)
        ]
        for ws in range(p.workspaces)
    ]
    levels, chances = zip(*p.priorities, strict=True)
    drawn = []
    for _ in range(p.jobs):
        ws = rng.choices(range(p.workspaces), demand)[0]
        name, size, typical = rng.choice(templates[ws])
        cap = math.ceil(typical * math.exp(p.cap_sigmas * p.run_sigma))
        runtime = min(cap, max(1.0, typical * rng.lognormvariate(0, p.run_sigma)))
        drawn.append((ws, name, size, runtime, cap, rng.choices(levels, chances)[0]))
    # The calm rate that makes the offered load: mean rate × mean GPU-seconds = load × GPUs.
    gpu_seconds = sum(size * runtime for _, _, size, runtime, _, _ in drawn) / p.jobs
    mean_rate = p.load * p.gpus / gpu_seconds
    burst_share = p.burst_length / (p.burst_length + p.burst_every)
    calm_rate = mean_rate / (1 - burst_share + p.burst_factor * burst_share)
    tasks, clock, bursting = [], 0.0, False
    switch = rng.expovariate(1 / p.burst_every)
    for n, (ws, name, size, runtime, cap, priority) in enumerate(drawn):
        while True:
            rate = calm_rate * (p.burst_factor if bursting else 1)
            gap = rng.expovariate(rate)
            if clock + gap < switch:
                clock += gap
                break
            clock, bursting = switch, not bursting  # memoryless: draw again in the new state
            switch = clock + rng.expovariate(1 / (p.burst_length if bursting else p.burst_every))
        tasks.append(
            Task(
                name=f"job-{n:05d}",
                arrival=clock,
                workspace=ws,
                template=name,
                priority=priority,
                cpu=size * p.cpu_per_gpu,
                memory_gb=size * p.memory_per_gpu,
                gpu=float(size),
                runtime=runtime,
                max_runtime=cap,
            )
        )
    return Trace(
        "synthetic",
        tasks,
        capacity,
        guarantees,
        f"synthetic seed {p.seed}: {p.jobs} jobs, {p.workspaces} workspaces, {p.gpus:g} GPUs, "
        f"load {p.load:g}",
    )


# --- OpenB ----------------------------------------------------------------------------------


def openb_gpu(num_gpu: int, gpu_milli: int) -> float:
    """GPUs a task holds: ``num_gpu`` whole ones, or a fraction of one for a GPU-sharing task
    (``num_gpu`` 1 and ``gpu_milli`` under 1000)."""
    if num_gpu == 1 and 0 < gpu_milli < 1000:
        return gpu_milli / 1000
    return float(num_gpu)


def workspace_of(name: str, workspaces: int) -> int:
    """A stable assignment of a task to a workspace: its name's SHA-256, modulo."""
    return int.from_bytes(hashlib.sha256(name.encode()).digest()[:8], "big") % workspaces


def openb(
    directory: Path = OPENB_DIR,
    *,
    workspaces: int = 20,
    jobs: int | None = None,
    capacity_scale: float = 0.01,
    guaranteed: float = 1.0,
) -> Trace:
    """The OpenB pod list as a workload.

    A task arrives at ``creation_time`` and runs ``deletion_time - scheduled_time`` seconds
    (tasks without either are skipped: they never ran); it holds ``num_gpu`` GPUs, or
    ``gpu_milli/1000`` of one when it shares a GPU, ``cpu_milli/1000`` CPUs and
    ``memory_mib/1024`` GB; its QoS is its priority (Guaranteed 9, LS 7, Burstable 5, BE 3). It
    belongs to workspace ``sha256(name) mod workspaces``, and to the template of that
    workspace's tasks of its shape. Every task's max_runtime is the trace's longest run
    (rounded up to a day): the trace says nothing of the limits its users set.

    The organisation's capacity is the cluster's (its nodes' CPUs, memory and GPUs) times
    ``capacity_scale``, so that work queues; each workspace is guaranteed a share of each
    resource proportional to its share of the trace's demand of it (resource × run time), the
    guarantees adding up to ``guaranteed`` × capacity. ``jobs`` keeps that many tasks, evenly
    spaced in arrival order, and scales the capacity down by the same fraction (90 % of the
    tasks arrive in the trace's last 30 days: a prefix would be its quiet first months).
    """
    with open(directory / OPENB_NODES, newline="") as nodes_file:
        nodes = list(csv.DictReader(nodes_file))
    cluster = {
        "cpu": sum(int(n["cpu_milli"]) for n in nodes) / 1000,
        "memory_gb": sum(int(n["memory_mib"]) for n in nodes) / 1024,
        "gpu": float(sum(int(n["gpu"]) for n in nodes)),
    }
    with open(directory / OPENB_PODS, newline="") as pods_file:
        pods = [
            pod
            for pod in csv.DictReader(pods_file)
            if pod["scheduled_time"] != "" and pod["deletion_time"] != ""
        ]
    pods.sort(key=lambda pod: (int(pod["creation_time"]), pod["name"]))
    if jobs is not None and jobs < len(pods):
        # An even sample over the whole trace, and the capacity scaled down with it: the same
        # load, where a prefix would keep only the trace's quiet first months.
        capacity_scale *= jobs / len(pods)
        pods = [pods[n * len(pods) // jobs] for n in range(jobs)]
    runtimes = [max(1, int(pod["deletion_time"]) - int(pod["scheduled_time"])) for pod in pods]
    longest = math.ceil(max(runtimes, default=1) / 86400) * 86400
    tasks = []
    for pod, runtime in zip(pods, runtimes, strict=True):
        ws = workspace_of(pod["name"], workspaces)
        shape = "-".join(pod[k] for k in ("cpu_milli", "memory_mib", "num_gpu", "gpu_milli", "qos"))
        tasks.append(
            Task(
                name=pod["name"],
                arrival=float(pod["creation_time"]),
                workspace=ws,
                template=f"w{ws}-{shape}",
                priority=QOS_PRIORITY[pod["qos"]],
                cpu=int(pod["cpu_milli"]) / 1000,
                memory_gb=int(pod["memory_mib"]) / 1024,
                gpu=openb_gpu(int(pod["num_gpu"]), int(pod["gpu_milli"])),
                runtime=float(runtime),
                max_runtime=longest,
            )
        )
    capacity = {name: amount * capacity_scale for name, amount in cluster.items()}
    return Trace(
        "openb",
        tasks,
        capacity,
        demand_guarantees(tasks, workspaces, capacity, guaranteed),
        f"OpenB: {len(tasks)} tasks, {workspaces} workspaces, capacity × {capacity_scale:g} "
        f"({capacity['gpu']:g} GPUs, {capacity['cpu']:g} CPUs, {capacity['memory_gb']:g} GB)",
    )


def demand_guarantees(
    tasks: list[Task], workspaces: int, capacity: dict[str, float], guaranteed: float
) -> list[dict[str, float]]:
    """Each workspace's guarantee of each resource: ``guaranteed`` × capacity × its share of
    the tasks' demand of it (amount × run time); an even split of a resource nobody asks for."""
    demand: dict[str, list[float]] = defaultdict(lambda: [0.0] * workspaces)
    for task in tasks:
        for name in RESOURCES:
            demand[name][task.workspace] += task.requested[name] * task.runtime
    guarantees: list[dict[str, float]] = [{} for _ in range(workspaces)]
    for name in RESOURCES:
        total = sum(demand[name])
        for ws in range(workspaces):
            share = demand[name][ws] / total if total else 1 / workspaces
            guarantees[ws][name] = capacity[name] * guaranteed * share
    return guarantees
