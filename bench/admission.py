"""Admission throughput under ``fair_share`` on PostgreSQL, and whether its cost per job grows
with the queue.

100 workspaces, each guaranteed 10 CPUs of an organisation's 1,000; every job asks for 1 CPU, so a
pass admits up to 1,000 jobs. By default (``--shape tree``) the workspaces sit in a three-level
quota tree: the organisation → 2 divisions (each guaranteed 500, limit 600) → 5 teams each
(guaranteed 100, limit 120) → 10 workspaces each, so every admission checks the limits of a
team, a division and the organisation, and fair share orders by the path's keys; ``--shape
flat`` puts the 100 workspaces directly under the organisation, as before the tree.
``--shape tree-flavors`` is the tree with GPU flavors: the host has 500 h100 and 500 a100, every
job asks for 1 CPU and 1 GPU of its workspace's flavor (h100 for even workspaces, a100 for odd),
and the organisation, each division and each team have the same guarantees and limits per
flavor as in CPUs, halved (each workspace guaranteed 10 of its flavor), so every admission also
checks a team's, a division's and the organisation's flavor limits, with their ``Σ eff``.

Between timed passes the admitted jobs are finished (state and reservations updated in bulk,
untimed). Queued jobs are written in bulk by the set-up, not through the submission API: only
admission is measured — the pass that picks jobs, writes their
reservations, moves them to ``launching`` with a timeline event, an audit event and an outbox row
each, creates their attempts and sends their launch tasks to Redis.

    .venv/bin/python bench/admission.py [--admit 10000] [--shape tree|flat|tree-flavors]
        [--fair-preemption]
    .venv/bin/python bench/admission.py --versus [--rounds 12]

Prints jobs admitted per second with 10,000 and with 100,000 jobs queued, the cost per admitted
job in each case, and their ratio (goals: ≥ 1,000 admissions/s; ratio ≤ 1.1). ``--versus``
builds a flat and a tree organisation in one database and alternates their passes (1,000 jobs
each), so both see the same machine and database: it prints the tree's cost per job over the
flat one's.
"""

from __future__ import annotations

import argparse
import time

from common import BROKER, configure

WORKSPACES = 100
CAPACITY = 1000
DIVISIONS, TEAMS = 2, 5  # per division: 10 workspaces per team


FLAVORS = ("h100", "a100")


def per_flavor(guaranteed: float, limit: float, gpus: bool) -> dict:
    """A group's GPU quota in ``--shape tree-flavors``: half of its CPU quota per flavor."""
    if not gpus:
        return {}
    half = {"guaranteed": guaranteed / 2, "limit": limit / 2}
    return {
        "guaranteed_gpu": guaranteed,
        "limit_gpu": limit,
        "gpu_flavors": {name: dict(half) for name in FLAVORS},
    }


def tree(org, gpus: bool = False) -> list:
    """The quota groups of ``--shape tree``: each workspace's team, in workspace order."""
    from quotas.models import QuotaGroup

    teams = []
    for d in range(DIVISIONS):
        division = QuotaGroup.objects.create(
            organization=org,
            name=f"div{d}",
            guaranteed_cpu=500,
            limit_cpu=600,
            **per_flavor(500, 600, gpus),
        )
        for t in range(TEAMS):
            teams.append(
                QuotaGroup.objects.create(
                    organization=org,
                    name=f"div{d}-team{t}",
                    parent=division,
                    guaranteed_cpu=100,
                    limit_cpu=120,
                    **per_flavor(100, 120, gpus),
                )
            )
    per_team = WORKSPACES // len(teams)
    return [teams[index // per_team] for index in range(WORKSPACES)]


def build(queued: int, shape: str = "flat", fair_preemption: bool = False):
    from django.utils import timezone

    from audit.context import Actor
    from jobs import services as job_services
    from jobs.models import Job, JobState
    from quotas.models import OrgQuota, WorkspaceQuota
    from workspaces import services

    system = Actor.system("bench")
    slug = f"org{queued}"
    org, owner = services.org_create(actor=system, slug=slug, name="", owner_email=f"o@{slug}.t")
    gpus = shape == "tree-flavors"
    flavored = {"gpu": CAPACITY, "gpu_flavors": dict.fromkeys(FLAVORS, CAPACITY / 2)}
    OrgQuota.objects.create(
        organization=org,
        cpu=CAPACITY,
        policy="fair_share",
        preemption=fair_preemption,
        fair_share_preemption=fair_preemption,
        **(flavored if gpus else {}),
    )
    spec = {
        "image": "rayproject/ray:2.60.0",
        "entrypoint": "python -V",
        "head": {"cpu": 1, "memory_gb": 0, "gpu": 0},
    }
    versions = []
    groups = tree(org, gpus) if shape.startswith("tree") else [None] * WORKSPACES
    for index in range(WORKSPACES):
        ws = services.workspace_create(actor=system, organization=org, slug=f"w{index}")
        share = CAPACITY / WORKSPACES
        quota = {"guaranteed_gpu": share, "gpu_flavors": {FLAVORS[index % 2]: {"guaranteed": share,
                 "limit": None}}} if gpus else {}  # fmt: skip
        WorkspaceQuota.objects.create(
            workspace=ws, guaranteed_cpu=share, group=groups[index], **quota
        )
        template = job_services.template_create(actor=system, workspace=ws, name="t", spec=spec)
        versions.append((ws, template))
    if fair_preemption:
        hog(org, versions[0], owner)
    # With fair-share preemption, every job has waited past the limit, and the first workspace
    # holds twice its fair allocation (``hog``): each pass reads every workspace's next job and
    # what it has queued, works out the fair allocations, and finds no victim (the one job
    # above its fair allocation is within its minimum runtime).
    start = timezone.now() - timezone.timedelta(hours=1 if fair_preemption else 0)
    resolved = {
        **spec,
        "runtime_env": {},
        "worker_groups": [],
        "max_runtime_seconds": 3600,
        "max_retries": 0,
        "priority": 5,
        "ttl_seconds_after_finished": 300,
    }
    batch = []
    specs = [{**resolved, "gpu_flavor": [name]} for name in FLAVORS] if gpus else [resolved] * 2
    for n in range(queued):
        ws, version = versions[n % WORKSPACES]
        batch.append(
            Job(
                organization=org,
                workspace=ws,
                template_version=version,
                name="b",
                state=JobState.QUEUED,
                spec=specs[n % WORKSPACES % 2],
                requested_cpu=1,
                requested_memory_gb=0,
                requested_gpu=1 if gpus else 0,
                priority=5,
                submitted_by=owner,
                queued_at=start + timezone.timedelta(microseconds=n),
            )
        )
        if len(batch) == 5000:
            Job.objects.bulk_create(batch)
            batch = []
    Job.objects.bulk_create(batch)
    return org


def hog(org, version: tuple, owner) -> None:
    """A job of ``version``'s workspace holding twice the workspace's share of the CPUs, within
    its minimum runtime (it is never a victim): admitted before anything else is queued."""
    from django.utils import timezone

    from jobs import admission
    from jobs.models import Job, JobState

    ws, template_version = version
    spec = {**template_version.spec, "min_runtime_seconds": 3600, "priority": 5}
    job = Job.objects.create(
        organization=org,
        workspace=ws,
        template_version=template_version,
        name="hog",
        state=JobState.QUEUED,
        spec=spec,
        requested_cpu=2 * CAPACITY / WORKSPACES,
        requested_memory_gb=0,
        requested_gpu=0,
        priority=5,
        submitted_by=owner,
        queued_at=timezone.now(),
    )
    if admission.admit(org.pk) != [job.pk]:
        raise RuntimeError("the first workspace's job was not admitted")


def finish(job_ids: list[int]) -> None:
    """Free the capacity the last pass took (untimed)."""
    from django.utils import timezone

    from jobs.models import Job
    from quotas.models import Reservation

    Job.objects.filter(pk__in=job_ids).update(state="succeeded", finished_at=timezone.now())
    Reservation.objects.filter(job_id__in=job_ids, released_at__isnull=True).update(
        released_at=timezone.now()
    )


def measure(
    queued: int, to_admit: int, shape: str, fair_preemption: bool = False
) -> tuple[float, int]:
    from jobs import admission

    org = build(queued, shape, fair_preemption)
    elapsed, admitted = 0.0, 0
    while admitted < to_admit:
        started = time.perf_counter()
        ids = admission.admit(org.pk)
        elapsed += time.perf_counter() - started
        if not ids:
            raise RuntimeError("a pass admitted nothing")
        admitted += len(ids)
        finish(ids)
    return elapsed, admitted


def versus(rounds: int) -> None:
    """Alternate the passes of a flat and a tree organisation; their cost per job."""
    from jobs import admission

    orgs = {shape: build(rounds * 1000 + 2000 + i, shape) for i, shape in enumerate(SHAPES)}
    for org in orgs.values():
        finish(admission.admit(org.pk))  # warm up: caches, plans, connections
    spent, done = dict.fromkeys(SHAPES, 0.0), dict.fromkeys(SHAPES, 0)
    for round_ in range(rounds):
        for shape in SHAPES if round_ % 2 == 0 else SHAPES[::-1]:
            started = time.perf_counter()
            ids = admission.admit(orgs[shape].pk)
            spent[shape] += time.perf_counter() - started
            done[shape] += len(ids)
            finish(ids)
    cost = {shape: spent[shape] / done[shape] for shape in SHAPES}
    for shape in SHAPES:
        print(f"{shape}: {done[shape]:,} jobs, {cost[shape] * 1000:.3f} ms per job")
    print(f"cost per admitted job, tree vs flat: ratio {cost['tree'] / cost['flat']:.3f}")


SHAPES = ("flat", "tree")
# --shape tree-flavors: the host's 1,000 GPUs, 500 of each flavor.
INVENTORY = ";".join(
    f"{name}:{','.join(str(i) for i in range(n * 500, n * 500 + 500))}"
    for n, name in enumerate(FLAVORS)
)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--admit", type=int, default=10_000)
    parser.add_argument("--shape", choices=["tree", "flat", "tree-flavors"], default="tree")
    parser.add_argument("--versus", action="store_true", help="tree against flat, alternated")
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument(
        "--fair-preemption",
        action="store_true",
        help="the organisation preempts for fair shares, every job is overdue, and one "
        "workspace holds twice its fair allocation",
    )
    args = parser.parse_args()
    # The jobs never launch: the host's own capacity (a few CPUs) must not be what binds.
    configure(
        f"manta_bench_admission_{'versus' if args.versus else args.shape}",
        LOG_LEVEL="ERROR",
        MANTA_LOCAL_CAPACITY="cpu=1000000,memory_gb=1000000,gpu=1000000",
        **({"MANTA_LOCAL_GPUS": INVENTORY} if args.shape == "tree-flavors" else {}),
    )
    import redis

    if args.versus:
        versus(args.rounds)
        redis.Redis.from_url(BROKER).flushdb()
        return
    results = {}
    for queued in (10_000, 100_000):
        elapsed, admitted = measure(
            queued, min(args.admit, queued), args.shape, args.fair_preemption
        )
        results[queued] = elapsed / admitted
        print(
            f"{queued:>7,} queued: admitted {admitted:,} in {elapsed:.2f} s "
            f"({admitted / elapsed:,.0f} jobs/s, {elapsed / admitted * 1000:.3f} ms per job)"
        )
        redis.Redis.from_url(BROKER).flushdb()  # the launch tasks nobody consumes
    ratio = results[100_000] / results[10_000]
    print(f"cost per admitted job, 100,000 vs 10,000 queued: ratio {ratio:.2f} (goal ≤ 1.1)")


if __name__ == "__main__":
    main()
