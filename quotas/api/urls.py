from django.urls import path

from .views import OrgQuotaViewSet, WorkspaceQuotaViewSet

WS = "orgs/<slug:org>/workspaces/<slug:ws>/"

urlpatterns = [
    path(
        "orgs/<slug:org>/quota/",
        OrgQuotaViewSet.as_view({"get": "retrieve", "patch": "partial_update"}),
    ),
    path(
        WS + "quota/", WorkspaceQuotaViewSet.as_view({"get": "retrieve", "patch": "partial_update"})
    ),
    path(WS + "usage/", WorkspaceQuotaViewSet.as_view({"get": "usage"})),
]
