"""Reads of quotas and reservations."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from typing import Any

from django.conf import settings
from django.db.models import Count, Sum

from config.gpu_flavors import UNTYPED

from .flavors import FlavorBook, Pool, flavor_budgets
from .ledger import EPSILON, Ledger, PastUsage, Usage
from .models import (
    RESOURCES,
    FairShareUsage,
    OrgQuota,
    QueuePolicy,
    QuotaGroup,
    Reservation,
    WorkspaceQuota,
)
from .tree import QuotaTree

# The policies whose order (or whose why-waiting factors) weigh a workspace's past usage.
PAST_USAGE_POLICIES = (QueuePolicy.FAIR_SHARE, QueuePolicy.INTELLIGENT)

TOTALS = {**{name: Sum(name) for name in RESOURCES}, "jobs": Count("id")}


def _usage(totals: dict) -> Usage:
    """A :class:`Usage` from a row of :data:`TOTALS` (a sum over no rows is None: 0)."""
    return Usage(**{name: totals[name] or 0 for name in RESOURCES}, running=totals["jobs"])


def _joined(instance, quota_model, field: str):
    """The quota row a ``select_related("quota")`` read with ``instance`` (None: it has none),
    or ``...`` when it was not: then the caller reads it (nothing else caches it)."""
    relation = quota_model._meta.get_field(field).remote_field
    if not relation.is_cached(instance):
        return ...
    return relation.get_cached_value(instance)


def org_quota(organization) -> OrgQuota:
    """The organisation's quota (unsaved and unlimited when none was set)."""
    joined = _joined(organization, OrgQuota, "organization")
    found = OrgQuota.objects.filter(organization=organization).first() if joined is ... else joined
    return found or OrgQuota(organization=organization)


def workspace_quota(workspace) -> WorkspaceQuota:
    """The workspace's quota (unsaved and unlimited when none was set)."""
    joined = _joined(workspace, WorkspaceQuota, "workspace")
    found = WorkspaceQuota.objects.filter(workspace=workspace).first() if joined is ... else joined
    return found or WorkspaceQuota(workspace=workspace)


def groups_above(quota: WorkspaceQuota) -> list[QuotaGroup]:
    """The quota groups above a workspace, nearest first (none, and no query, for a workspace
    directly under its organisation)."""
    if quota.group_id is None:
        return []
    groups = {
        g.pk: g for g in QuotaGroup.objects.filter(organization_id=quota.workspace.organization_id)
    }
    chain, node = [], quota.group_id
    while node in groups and groups[node] not in chain:
        chain.append(groups[node])
        node = groups[node].parent_id
    return chain


def active_reservations():
    return Reservation.objects.filter(released_at__isnull=True)


def reserved(workspace) -> dict[str, float]:
    """What the workspace's launching and running jobs hold."""
    held = active_reservations().filter(workspace=workspace).aggregate(**TOTALS)
    return {name: held[name] or 0.0 for name in RESOURCES}


def reserved_by_flavor(workspace) -> dict[str, float]:
    """The GPUs the workspace's launching and running jobs hold, by GPU flavor."""
    held = (
        active_reservations()
        .filter(workspace=workspace, gpu__gt=0)
        .order_by()
        .values_list("gpu_flavor")
        .annotate(gpus=Sum("gpu"))
    )
    return dict(held)


def ledger_for(
    organization_id: int,
    *,
    on_host: set[int],
    host: str,
    host_capacity: Callable[[], dict[str, float | None]],
    gpu_hours_used: Callable[[WorkspaceQuota], float],
    gpu_pools: Callable[[], dict[int, Pool]] | None = None,
    flavor_hours_used: Callable[[WorkspaceQuota], dict[str, float]] | None = None,
) -> Ledger:
    """What the organisation holds, against its limits and those of the shared host ``host``
    (``on_host``: its workspaces that launch there). ``gpu_hours_used`` gives what a workspace
    with a GPU budget has used this period, ``flavor_hours_used`` the same by flavor for a
    workspace with a budget of some flavor; ``gpu_pools``, the GPU flavors each workspace's
    target offers (without it, flavors are not counted)."""
    ws: dict[int, Usage] = defaultdict(Usage)
    org = Usage()
    rows = (
        active_reservations()
        .filter(organization_id=organization_id)
        .values("workspace_id")
        .annotate(**TOTALS)
    )
    for row in rows:
        usage = _usage(row)
        ws[row["workspace_id"]] = usage
        for name in (*RESOURCES, "running"):
            setattr(org, name, getattr(org, name) + getattr(usage, name))
    ws_quotas = {
        q.workspace_id: q
        for q in WorkspaceQuota.objects.filter(
            workspace__organization_id=organization_id
        ).select_related("workspace")
    }
    host_usage = Usage()
    if on_host:
        host_usage = _usage(active_reservations().filter(host=host).aggregate(**TOTALS))
    org_q = OrgQuota.objects.filter(organization_id=organization_id).first()
    groups = quota_groups(organization_id)
    flavors = None
    if gpu_pools is not None:
        flavors = flavor_book(organization_id, org_q, ws_quotas, gpu_pools(), host, groups)
    if flavors is not None and flavor_hours_used is not None:
        flavors.hours_used = {
            ws_id: flavor_hours_used(q) for ws_id, q in ws_quotas.items() if _flavor_budget(q)
        }
    return Ledger(
        host=host_usage,
        host_capacity=host_capacity() if on_host else {},
        on_host=on_host,
        org_quota=org_q,
        ws_quotas=ws_quotas,
        org=org,
        ws=ws,
        gpu_hours_used={
            ws_id: gpu_hours_used(q)
            for ws_id, q in ws_quotas.items()
            if q.gpu_hours_per_month is not None
        },
        past=past_usage(organization_id) if org_q and org_q.policy in PAST_USAGE_POLICIES else {},
        half_life_seconds=half_life_seconds(),
        flavors=flavors,
        groups=groups,
    )


def _flavor_budget(quota: WorkspaceQuota) -> bool:
    """Whether the workspace has a GPU-hour budget of some flavor."""
    return bool(flavor_budgets(quota.gpu_flavors))


def quota_groups(organization_id: int) -> dict[int, QuotaGroup]:
    """The organisation's quota groups by id (one query)."""
    return {group.pk: group for group in QuotaGroup.objects.filter(organization_id=organization_id)}


def flavor_book(
    organization_id: int,
    org_q: OrgQuota | None,
    ws_quotas: dict[int, WorkspaceQuota],
    pools: dict[int, Pool],
    host: str,
    groups: dict[int, QuotaGroup] | None = None,
) -> FlavorBook | None:
    """What each GPU flavor allows and holds for the organisation (None when no pool and no
    quota of it names a flavor: then flavors change nothing, and cost no query): its
    reservations' GPUs by workspace and flavor, and on the shared host, every organisation's
    by flavor (two queries, the second only when a workspace launches there)."""
    typed = any(set(pool.flavors) - {UNTYPED} for pool in pools.values())
    quoted = (
        bool(org_q and org_q.gpu_flavors)
        or any(q.gpu_flavors for q in ws_quotas.values())
        or any(g.gpu_flavors for g in (groups or {}).values())
    )
    if not typed and not quoted:
        return None
    return _flavor_book(organization_id, org_q, ws_quotas, pools, host)


def _flavor_book(
    organization_id: int,
    org_q: OrgQuota | None,
    ws_quotas: dict[int, WorkspaceQuota],
    pools: dict[int, Pool],
    host: str,
) -> FlavorBook:
    book = FlavorBook(
        org_capacity=dict(org_q.gpu_flavors) if org_q else {},
        ws_quotas={ws: dict(q.gpu_flavors) for ws, q in ws_quotas.items() if q.gpu_flavors},
        pools=pools,
    )
    held = (
        active_reservations()
        .filter(organization_id=organization_id, gpu__gt=0)
        .order_by()
        .values_list("workspace_id", "gpu_flavor")
        .annotate(gpus=Sum("gpu"))
    )
    host_key = next((p.key for p in pools.values() if p.key == f"host:{host}"), None)
    for ws_id, flavor, gpus in held:
        book.org_held[flavor] += gpus
        book.ws_held[ws_id][flavor] += gpus
        pool = book.pool(ws_id)
        if pool.key != host_key:  # a target's pool is this organisation's alone
            book.pool_held[pool.key][flavor] += gpus
    if host_key is not None:
        on_host = active_reservations().filter(host=host, gpu__gt=0)
        for flavor, gpus in on_host.order_by().values_list("gpu_flavor").annotate(gpus=Sum("gpu")):
            book.pool_held[host_key][flavor] += gpus
    return book


def half_life_seconds() -> float:
    return settings.MANTA_FAIR_SHARE_HALF_LIFE_HOURS * 3600


def past_usage(organization_id: int) -> dict[int, PastUsage]:
    """Each workspace's decayed past usage, as last written (one query)."""
    return {
        row.workspace_id: PastUsage({name: getattr(row, name) for name in RESOURCES}, row.as_of)
        for row in FairShareUsage.objects.filter(organization_id=organization_id)
    }


def quota_tree(organization) -> dict[str, Any]:
    """The organisation's quota tree as it stands, from the root: each node's quota (guaranteed,
    limit, lending limit, weight, max running), what its subtree holds and how much of that it
    borrows (holds beyond its guarantee), in all and per GPU flavor. Five queries, however
    deep."""
    org_q = org_quota(organization)
    groups = quota_groups(organization.pk)
    workspaces = {
        ws.pk: ws for ws in organization.workspaces.filter(archived_at=None).select_related("quota")
    }
    ws_quotas = {pk: workspace_quota(ws) for pk, ws in workspaces.items()}
    rows = active_reservations().filter(organization=organization).values("workspace_id")
    ws_usage: dict[int, Usage] = defaultdict(Usage)
    for row in rows.annotate(**TOTALS):
        ws_usage[row["workspace_id"]] = _usage(row)
    tree = QuotaTree(groups, {pk: q for pk, q in ws_quotas.items()}, ws_usage)
    org_usage = Usage()
    for usage in ws_usage.values():
        _merge(org_usage, usage)
    flavors = _tree_flavors(organization, org_q, groups, ws_quotas, tree)

    def node(kind, name, quota, usage: Usage, children, key) -> dict[str, Any]:
        held = {r: getattr(usage, r) for r in RESOURCES}
        guaranteed = quota.guaranteed() if kind != "organization" else quota.capacity()
        return {
            "level": kind,
            "name": name,
            "guaranteed": guaranteed,
            "limit": quota.limit() if kind != "organization" else quota.capacity(),
            "lending_limit": (
                quota.lending_limit() if kind != "organization" else dict.fromkeys(RESOURCES)
            ),
            "fair_share_weight": getattr(quota, "fair_share_weight", 1.0),
            "max_running_jobs": quota.max_running_jobs,
            "usage": held,
            "running": usage.running,
            "borrowed": {
                r: max(0.0, held[r] - (guaranteed[r] or 0.0)) if kind != "organization" else 0.0
                for r in RESOURCES
            },
            "gpu_flavors": flavors(kind, quota, key),
            "children": children,
        }

    under: dict[int | None, list[dict[str, Any]]] = defaultdict(list)
    for pk, ws in sorted(workspaces.items(), key=lambda item: item[1].slug):
        path = tree.path(pk)
        under[path[0] if path else None].append(
            node("workspace", ws.slug, ws_quotas[pk], ws_usage.get(pk) or Usage(), [], pk)
        )

    def subtree(group_id: int) -> dict[str, Any]:
        group = groups[group_id]
        children = [subtree(c) for c in sorted(groups) if _parent(groups, c) == group_id]
        return node(
            "group", group.name, group, tree.usage[group_id], children + under[group_id], group_id
        )

    top = [subtree(g) for g in sorted(groups, key=lambda g: groups[g].name)
           if _parent(groups, g) is None]  # fmt: skip
    return node("organization", organization.slug, org_q, org_usage, top + under[None], None)


def _tree_flavors(
    organization,
    org_q: OrgQuota,
    groups: dict[int, QuotaGroup],
    ws_quotas: dict[int, WorkspaceQuota],
    tree: QuotaTree,
) -> Callable[[str, Any, int | None], dict[str, Any]]:
    """What :func:`quota_tree` shows of each node per typed GPU flavor: its quota of it
    (the organisation's: its capacity; a workspace's lending limit as what it lends, 0 when it
    gives none), what its subtree holds of it and borrows. Every flavor the tree has a quota of
    or holds is shown at every node (one query: the reservations by workspace and flavor)."""
    held = (
        active_reservations()
        .filter(organization=organization, gpu__gt=0)
        .exclude(gpu_flavor=UNTYPED)
        .order_by()
        .values_list("workspace_id", "gpu_flavor")
        .annotate(gpus=Sum("gpu"))
    )
    by_node: dict[tuple[str, int | None], dict[str, float]] = defaultdict(
        lambda: defaultdict(float)
    )
    for ws_id, flavor, gpus in held:
        by_node["workspace", ws_id][flavor] += gpus
        by_node["organization", None][flavor] += gpus
        for group_id in tree.path(ws_id):
            by_node["group", group_id][flavor] += gpus
    names = sorted(
        {*org_q.gpu_flavors, *by_node["organization", None]}
        | {f for g in groups.values() for f in g.gpu_flavors or {}}
        | {f for q in ws_quotas.values() for f in q.gpu_flavors or {}}
    )

    def flavors(kind: str, quota: Any, key: int | None) -> dict[str, Any]:
        shown = {}
        for name in names:
            usage = by_node[kind, key][name]
            if kind == "organization":
                capacity = org_q.gpu_flavors.get(name)
                guaranteed, limit, lending = capacity, capacity, None
            else:
                own = (quota.gpu_flavors or {}).get(name) or {}
                guaranteed, limit = own.get("guaranteed", 0.0), own.get("limit")
                lending = own.get("lending_limit")
                if kind == "workspace" and lending is None:
                    lending = 0.0  # a workspace lends none of its flavor guarantee unless told
            shown[name] = {
                "guaranteed": guaranteed,
                "limit": limit,
                "lending_limit": lending,
                "usage": usage,
                "borrowed": 0.0 if kind == "organization" else max(0.0, usage - guaranteed),
            }
        return shown

    return flavors


def _parent(groups: dict[int, QuotaGroup], group_id: int) -> int | None:
    parent = groups[group_id].parent_id
    return parent if parent in groups else None


def _merge(target: Usage, usage: Usage) -> None:
    for name in (*RESOURCES, "running"):
        setattr(target, name, getattr(target, name) + getattr(usage, name))


def drift_over_limits() -> dict[str, int]:
    """How many organisations, quota groups and workspaces hold more than their capacity, limit
    or max-running cap allows, of a resource or of a GPU flavor (0 everywhere when admission
    kept its invariants). A group holds what its workspaces hold, at any depth."""
    drift = {"over_capacity": 0, "over_limit": 0, "over_running": 0}
    orgs = {q.organization_id: q for q in OrgQuota.objects.all()}
    workspaces = {q.workspace_id: q for q in WorkspaceQuota.objects.all()}
    groups = {g.pk: g for g in QuotaGroup.objects.all()}
    scopes = (
        ("organization_id", orgs, OrgQuota.capacity, "over_capacity"),
        ("workspace_id", workspaces, WorkspaceQuota.limit, "over_limit"),
    )
    in_groups: dict[int, Usage] = defaultdict(Usage)
    for scope, quotas, ceilings_of, over in scopes:
        for row in active_reservations().values(scope).annotate(**TOTALS):
            quota = quotas.get(row[scope])
            if quota is None:
                continue
            for name, ceiling in ceilings_of(quota).items():
                drift[over] += int(ceiling is not None and row[name] > ceiling + EPSILON)
            cap = quota.max_running_jobs
            drift["over_running"] += int(cap is not None and row["jobs"] > cap)
            if scope == "workspace_id" and groups:
                node, seen = quota.group_id, set()
                while node in groups and node not in seen:
                    seen.add(node)
                    _merge(in_groups[node], _usage(row))
                    node = groups[node].parent_id
    for pk, usage in in_groups.items():
        group = groups[pk]
        for name, ceiling in group.limit().items():
            drift["over_limit"] += int(
                ceiling is not None and getattr(usage, name) > ceiling + EPSILON
            )
        cap = group.max_running_jobs
        drift["over_running"] += int(cap is not None and usage.running > cap)
    _flavor_drift(drift, orgs, workspaces, groups)
    return drift


def _flavor_drift(
    drift: dict[str, int],
    orgs: dict[int, OrgQuota],
    workspaces: dict[int, WorkspaceQuota],
    groups: dict[int, QuotaGroup],
) -> None:
    """Add the GPU flavors' drift: organisations over a flavor's capacity, workspaces and
    groups over a flavor's limit (one query)."""
    held: dict[tuple[str, int, str], float] = defaultdict(float)
    rows = (
        active_reservations()
        .filter(gpu__gt=0)
        .exclude(gpu_flavor=UNTYPED)
        .order_by()
        .values_list("organization_id", "workspace_id", "gpu_flavor")
        .annotate(gpus=Sum("gpu"))
    )
    for org_id, ws_id, flavor, gpus in rows:
        held["org", org_id, flavor] += gpus
        held["ws", ws_id, flavor] += gpus
        quota = workspaces.get(ws_id)
        node, seen = (quota.group_id if quota else None), set()
        while node in groups and node not in seen:
            seen.add(node)
            held["group", node, flavor] += gpus
            node = groups[node].parent_id
    for (level, pk, flavor), gpus in held.items():
        if level == "org":
            ceiling = (orgs[pk].gpu_flavors or {}).get(flavor) if pk in orgs else None
        else:
            quota = workspaces.get(pk) if level == "ws" else groups.get(pk)
            ceiling = ((quota.gpu_flavors or {}).get(flavor) or {}).get("limit") if quota else None
        over = "over_capacity" if level == "org" else "over_limit"
        drift[over] += int(ceiling is not None and gpus > ceiling + EPSILON)
