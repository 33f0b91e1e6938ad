from django.urls import path

from .views import PackageViewSet

WS = "orgs/<slug:org>/workspaces/<slug:ws>/"

urlpatterns = [
    path(WS + "packages/", PackageViewSet.as_view({"get": "list", "post": "create"})),
    path(WS + "packages/<str:sha256>/", PackageViewSet.as_view({"get": "retrieve"})),
]
