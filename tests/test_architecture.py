"""Dependencies point one way (DESIGN.md, STYLE.md 13): an app imports from itself and from the
apps below it, never from one above, and no two apps need each other.

The graph is read from the source with ``ast``: every module of every app (migrations and tests
aside), imports inside functions included — a lazy import is a dependency all the same.
"""

from __future__ import annotations

import ast
import dataclasses
from collections import defaultdict
from pathlib import Path

import pytest
from django.conf import settings

ROOT = Path(__file__).resolve().parent.parent

# Which app may import which: config at the bottom (errors, db helpers, the Celery app), jobs at
# the top. The outbox sits below every app that writes domain events; notifications reads it.
ALLOWED: dict[str, set[str]] = {
    "config": set(),
    "audit": {"config"},
    "outbox": {"config"},
    "workspaces": {"config", "audit", "outbox"},
    "notifications": {"config", "audit", "outbox", "workspaces"},
    "packages": {"config", "audit", "outbox", "workspaces"},
    "quotas": {"config", "audit", "outbox", "workspaces"},
    "jobs": {"config", "audit", "outbox", "workspaces", "notifications", "packages", "quotas"},
}
APPS = tuple(ALLOWED)


@dataclasses.dataclass(frozen=True)
class Import:
    importer: str  # module, e.g. "notifications.dispatch"
    imported: str  # the module it names, resolved to the most specific one known
    where: str  # path:line


def _module_files() -> dict[str, Path]:
    found = {}
    for app in APPS:
        for path in sorted((ROOT / app).rglob("*.py")):
            parts = path.relative_to(ROOT).with_suffix("").parts
            if "migrations" in parts or "tests" in parts:
                continue
            if parts[-1] == "__init__":
                parts = parts[:-1]
            found[".".join(parts)] = path
    return found


MODULES = _module_files()


def _resolve(name: str) -> str:
    """The most specific module of ours that ``name`` is or is inside of (else ``name``)."""
    candidate = name
    while candidate and candidate not in MODULES:
        candidate = candidate.rpartition(".")[0]
    return candidate or name


def imports_in(module: str, source: str, *, is_package: bool, where: str) -> list[Import]:
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: from the module's package, up level - 1
                package = module.split(".") if is_package else module.split(".")[:-1]
                base = ".".join(package[: len(package) - node.level + 1])
                base = f"{base}.{node.module}" if node.module else base
            else:
                base = node.module or ""
            # ``from pkg import sub`` names the module pkg.sub when there is one.
            names = [f"{base}.{alias.name}" for alias in node.names]
            names = [name if _resolve(name) == name else base for name in names]
        else:
            continue
        resolved = dict.fromkeys(_resolve(name) for name in names)  # once each, in order
        found += [Import(module, name, f"{where}:{node.lineno}") for name in resolved]
    return found


def all_imports() -> list[Import]:
    found = []
    for module, path in MODULES.items():
        where = str(path.relative_to(ROOT))
        source = path.read_text()
        found += imports_in(module, source, is_package=path.name == "__init__.py", where=where)
    return found


def app_graph() -> dict[tuple[str, str], list[Import]]:
    """(importing app, imported app) → the imports that make that edge."""
    edges: dict[tuple[str, str], list[Import]] = defaultdict(list)
    for imp in all_imports():
        importer, imported = imp.importer.split(".")[0], imp.imported.split(".")[0]
        if imported in ALLOWED and imported != importer:
            edges[(importer, imported)].append(imp)
    return dict(edges)


def cycles(edges) -> list[list[str]]:
    """The strongly connected components of more than one node (Tarjan)."""
    successors: dict[str, set[str]] = defaultdict(set)
    for a, b in edges:
        successors[a].add(b)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in sorted(successors[node]):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(set(successors) | {b for _, b in edges}):
        if node not in index:
            visit(node)
    return found


def describe(edges: dict[tuple[str, str], list[Import]]) -> str:
    lines = ["app graph (importer → imported apps; * = not allowed):"]
    for app in APPS:
        targets = sorted(b for a, b in edges if a == app)
        marks = [f"{b}{'*' if b not in ALLOWED[app] else ''}" for b in targets]
        lines.append(f"  {app:<14}→ {', '.join(marks) or '-'}")
    for (a, b), imps in sorted(edges.items()):
        if b not in ALLOWED[a]:
            shown = ", ".join(f"{i.where} ({i.imported})" for i in imps[:6])
            more = f" and {len(imps) - 6} more" if len(imps) > 6 else ""
            lines.append(f"  {a} → {b}: {shown}{more}")
    return "\n".join(lines)


def test_every_app_is_in_the_table():
    ours = {app for app in settings.INSTALLED_APPS if (ROOT / app / "__init__.py").exists()}
    assert ours | {"config"} == set(APPS)


def test_no_app_imports_one_it_must_not():
    edges = app_graph()
    forbidden = {edge for edge in edges if edge[1] not in ALLOWED[edge[0]]}
    assert not forbidden, describe(edges)


def test_no_circle_between_apps():
    assert not cycles({(a, b) for a, bs in ALLOWED.items() for b in bs}), "ALLOWED has a circle"
    edges = app_graph()
    assert not cycles(set(edges)), describe(edges)


@pytest.mark.parametrize("app", ["notifications", "jobs"])
def test_no_circle_of_files_inside_an_app(app):
    """jobs/ sends its Celery tasks by name through jobs/dispatch.py: the tasks module imports
    the lifecycle, never the other way round."""
    edges: dict[tuple[str, str], list[str]] = defaultdict(list)
    for imp in all_imports():
        a, b = imp.importer, imp.imported
        if a.split(".")[0] == b.split(".")[0] == app and a != b:
            edges[(a, b)].append(imp.where)
    found = cycles(edges)
    detail = "\n".join(f"  {a} → {b}: {', '.join(w)}" for (a, b), w in sorted(edges.items()))
    assert not found, f"circles: {found}\n{app}'s module graph:\n{detail}"


def test_the_job_lifecycle_is_not_wired_from_app_ready():
    """What a job's state change starts is said where the change is made (jobs/dispatch.py),
    not registered at start-up, where a process that skipped it would silently do nothing."""
    tree = ast.parse((ROOT / "jobs" / "apps.py").read_text())
    assert not [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == "ready"]


def test_imports_inside_functions_and_relative_imports_are_seen():
    source = (
        "from . import models\n"
        "from .dispatch import events_dispatch\n"
        "def later():\n"
        "    from jobs.models import Job\n"
        "    import quotas.services\n"
    )
    found = imports_in(
        "notifications.emails", source, is_package=False, where="notifications/emails.py"
    )
    assert [i.imported for i in found] == [
        "notifications.models",
        "notifications.dispatch",
        "jobs.models",
        "quotas.services",
    ]


# The attempt lifecycle reaches launchers only through the contract (jobs/launchers/base.py):
# it never asks which kind it holds, nor imports one.
LIFECYCLE = (
    "jobs.attempts",
    "jobs.launching",
    "jobs.following",
    "jobs.sweep",
    "jobs.logs",
    "jobs.launch_requests",
)
CONCRETE_LAUNCHERS = (
    "jobs.launchers.local",
    "jobs.launchers.kuberay",
    "jobs.launchers.ray_cluster",
)


def test_the_attempt_lifecycle_never_asks_which_launcher_it_holds():
    found = []
    for module in LIFECYCLE:
        path = MODULES[module]
        tree = ast.parse(path.read_text())
        found += [
            f"{path.relative_to(ROOT)}:{node.lineno} hasattr()"
            for node in ast.walk(tree)
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "hasattr"
        ]
        found += [
            f"{imp.where} imports {imp.imported}"
            for imp in imports_in(
                module, path.read_text(), is_package=False, where=str(path.relative_to(ROOT))
            )
            if imp.imported.startswith(CONCRETE_LAUNCHERS)
        ]
    assert not found, "\n".join(found)
