from django.contrib import admin
from django.urls import include, path
from drf_spectacular.views import SpectacularAPIView, SpectacularRedocView, SpectacularSwaggerView

from .health import healthz, readyz

api_v1 = [
    path("", include("workspaces.api.urls")),
    path("", include("jobs.api.urls")),
    path("", include("quotas.api.urls")),
    path("", include("notifications.api.urls")),
    path("", include("packages.api.urls")),
]

urlpatterns = [
    path("api/v1/", include(api_v1)),
    path("api/schema/", SpectacularAPIView.as_view(), name="schema"),
    path("api/docs/", SpectacularSwaggerView.as_view(url_name="schema"), name="docs"),
    path(
        "api/redoc/",
        SpectacularRedocView.as_view(url_name="schema", template_name="api_docs/redoc.html"),
        name="redoc",
    ),
    path("healthz", healthz),
    path("readyz", readyz),
    path("", include("jobs.metrics")),  # /metrics
    path("admin/", admin.site.urls),
]
