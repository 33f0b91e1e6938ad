from django.urls import path

from . import audit, invitations, views

ORG = "orgs/<slug:org>/"
WS = ORG + "workspaces/<slug:ws>/"

urlpatterns = [
    path("auth/tokens/", views.TokenViewSet.as_view({"get": "list", "post": "create"})),
    path("auth/tokens/<int:pk>/", views.TokenViewSet.as_view({"delete": "destroy"})),
    path("me/", views.MeView.as_view()),
    path("orgs/", views.OrgListView.as_view({"get": "list"})),
    path(ORG, views.OrgViewSet.as_view({"get": "retrieve", "patch": "partial_update"})),
    path(
        ORG + "compute-targets/",
        views.ComputeTargetViewSet.as_view({"get": "list", "post": "create"}),
    ),
    path(
        ORG + "compute-targets/<int:pk>/",
        views.ComputeTargetViewSet.as_view(
            {"get": "retrieve", "patch": "partial_update", "delete": "destroy"}
        ),
    ),
    path(ORG + "users/", views.OrgUserViewSet.as_view({"get": "list"})),
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
        views.WorkspaceListViewSet.as_view({"get": "list", "post": "create"}),
    ),
    path(
        WS,
        views.WorkspaceDetailViewSet.as_view(
            {"get": "retrieve", "patch": "partial_update", "delete": "destroy"}
        ),
    ),
    path(WS + "members/", views.MemberViewSet.as_view({"get": "list", "post": "create"})),
    path(
        WS + "members/<int:pk>/",
        views.MemberViewSet.as_view({"patch": "partial_update", "delete": "destroy"}),
    ),
]
