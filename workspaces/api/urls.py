from django.urls import path

from . import account, audit, compute_targets, invitations, organizations, workspaces

ORG = "orgs/<slug:org>/"
WS = ORG + "workspaces/<slug:ws>/"

urlpatterns = [
    path("auth/tokens/", account.TokenViewSet.as_view({"get": "list", "post": "create"})),
    path("auth/tokens/<int:pk>/", account.TokenViewSet.as_view({"delete": "destroy"})),
    path("me/", account.MeView.as_view()),
    path("orgs/", organizations.OrgListView.as_view({"get": "list"})),
    path(ORG, organizations.OrgViewSet.as_view({"get": "retrieve", "patch": "partial_update"})),
    path(
        ORG + "compute-targets/",
        compute_targets.ComputeTargetViewSet.as_view({"get": "list", "post": "create"}),
    ),
    path(
        ORG + "compute-targets/<int:pk>/",
        compute_targets.ComputeTargetViewSet.as_view(
            {"get": "retrieve", "patch": "partial_update", "delete": "destroy"}
        ),
    ),
    path(ORG + "users/", organizations.OrgUserViewSet.as_view({"get": "list"})),
    path(ORG + "audit-events/", audit.AuditEventViewSet.as_view({"get": "list"})),
    path(ORG + "audit-events/verify/", audit.AuditEventViewSet.as_view({"get": "verify"})),
    path(ORG + "audit-events/export/", audit.AuditEventViewSet.as_view({"get": "export"})),
    path(
        ORG + "invitations/",
        invitations.InvitationViewSet.as_view({"get": "list", "post": "create"}),
    ),
    path(
        ORG + "invitations/<int:pk>/",
        invitations.InvitationViewSet.as_view({"delete": "destroy"}),
    ),
    path("invitations/accept/", invitations.InvitationAcceptView.as_view()),
    path(
        ORG + "workspaces/",
        workspaces.WorkspaceListViewSet.as_view({"get": "list", "post": "create"}),
    ),
    path(
        WS,
        workspaces.WorkspaceDetailViewSet.as_view(
            {"get": "retrieve", "patch": "partial_update", "delete": "destroy"}
        ),
    ),
    path(WS + "members/", workspaces.MemberViewSet.as_view({"get": "list", "post": "create"})),
    path(
        WS + "members/<int:pk>/",
        workspaces.MemberViewSet.as_view({"patch": "partial_update", "delete": "destroy"}),
    ),
]
