from django.urls import path

from .dashboard import WRITE_METHODS, JobDashboardViewSet
from .pools import WarmPoolViewSet
from .usage import WorkspaceUsageView
from .views import JobViewSet, TemplateViewSet

WS = "orgs/<slug:org>/workspaces/<slug:ws>/"
DASHBOARD = JobDashboardViewSet.as_view(
    {"get": "proxy", "head": "proxy", **dict.fromkeys(WRITE_METHODS, "refuse")}
)

ORG = "orgs/<slug:org>/"

urlpatterns = [
    path(ORG + "warm-pools/", WarmPoolViewSet.as_view({"get": "list", "post": "create"})),
    path(
        ORG + "warm-pools/<int:pk>/",
        WarmPoolViewSet.as_view({"get": "retrieve", "patch": "partial_update"}),
    ),
    path(WS + "usage/", WorkspaceUsageView.as_view({"get": "retrieve"})),
    path(WS + "templates/", TemplateViewSet.as_view({"get": "list", "post": "create"})),
    path(
        WS + "templates/<int:pk>/",
        TemplateViewSet.as_view(
            {"get": "retrieve", "patch": "partial_update", "delete": "destroy"}
        ),
    ),
    path(WS + "templates/<int:pk>/versions/", TemplateViewSet.as_view({"get": "versions"})),
    path(WS + "jobs/", JobViewSet.as_view({"get": "list", "post": "create"})),
    path(WS + "jobs/<int:pk>/", JobViewSet.as_view({"get": "retrieve"})),
    path(WS + "jobs/<int:pk>/approve/", JobViewSet.as_view({"post": "approve"})),
    path(WS + "jobs/<int:pk>/reject/", JobViewSet.as_view({"post": "reject"})),
    path(WS + "jobs/<int:pk>/cancel/", JobViewSet.as_view({"post": "cancel"})),
    path(WS + "jobs/<int:pk>/events/", JobViewSet.as_view({"get": "events"})),
    path(WS + "jobs/<int:pk>/logs/", JobViewSet.as_view({"get": "logs"})),
    path(WS + "jobs/<int:pk>/launch-plan/", JobViewSet.as_view({"get": "launch_plan"})),
    # The job's Ray Dashboard, read only: plain, or under a dashboard link (-/<link>/).
    path(WS + "jobs/<int:pk>/dashboard/", DASHBOARD, name="job-dashboard"),
    path(WS + "jobs/<int:pk>/dashboard/-/<str:link>/", DASHBOARD),
    path(WS + "jobs/<int:pk>/dashboard/-/<str:link>/<path:path>", DASHBOARD),
    path(WS + "jobs/<int:pk>/dashboard/<path:path>", DASHBOARD),
]
