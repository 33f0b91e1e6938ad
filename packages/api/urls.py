from django.urls import path

from .sources import CodeSourceViewSet
from .views import PackageDownloadView, PackageViewSet

WS = "orgs/<slug:org>/workspaces/<slug:ws>/"

urlpatterns = [
    path("package-downloads/<str:token>.zip", PackageDownloadView.as_view()),
    path(WS + "packages/", PackageViewSet.as_view({"get": "list", "post": "create"})),
    path(WS + "packages/<str:sha256>/", PackageViewSet.as_view({"get": "retrieve"})),
    path(WS + "code-sources/", CodeSourceViewSet.as_view({"get": "list", "post": "create"})),
    path(
        WS + "code-sources/<slug:name>/",
        CodeSourceViewSet.as_view(
            {"get": "retrieve", "patch": "partial_update", "delete": "destroy"}
        ),
    ),
]
