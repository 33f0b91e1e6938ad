from django.urls import path

from .views import OrgQuotaViewSet, QuotaGroupViewSet, WorkspaceQuotaViewSet

WS = "orgs/<slug:org>/workspaces/<slug:ws>/"

SINGLETON = {"get": "retrieve", "put": "update", "patch": "partial_update"}

urlpatterns = [
    path("orgs/<slug:org>/quota/", OrgQuotaViewSet.as_view(SINGLETON)),
    path("orgs/<slug:org>/quota/tree/", OrgQuotaViewSet.as_view({"get": "tree"})),
    path(
        "orgs/<slug:org>/quota-groups/",
        QuotaGroupViewSet.as_view({"get": "list", "post": "create"}),
    ),
    path(
        "orgs/<slug:org>/quota-groups/<slug:name>/",
        QuotaGroupViewSet.as_view(
            {"get": "retrieve", "patch": "partial_update", "delete": "destroy"}
        ),
    ),
    path(WS + "quota/", WorkspaceQuotaViewSet.as_view(SINGLETON)),
]
