"""An archived workspace is read-only: every write into it, from the API, the admin panel or a
command, is a 409 ``workspace_archived``. Services call :func:`require_active`; the tenant base
view refuses writes before they reach one."""

from __future__ import annotations

from config.errors import Conflict

from .models import Workspace


class WorkspaceArchived(Conflict):
    type = "workspace_archived"


def require_active(workspace: Workspace) -> None:
    if workspace.archived_at is not None:
        raise WorkspaceArchived(
            f"the workspace {workspace.slug!r} is archived: it is read-only",
            errors={"workspace": ["archived"]},
        )
