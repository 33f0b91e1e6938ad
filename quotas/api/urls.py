from django.urls import path

from .views import OrgQuotaViewSet, WorkspaceQuotaViewSet

WS = "orgs/<slug:org>/workspaces/<slug:ws>/"

SINGLETON = {"get": "retrieve", "put": "update", "patch": "partial_update"}

urlpatterns = [
    path("orgs/<slug:org>/quota/", OrgQuotaViewSet.as_view(SINGLETON)),
    path(WS + "quota/", WorkspaceQuotaViewSet.as_view(SINGLETON)),
]
