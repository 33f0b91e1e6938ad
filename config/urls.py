from django.contrib import admin
from django.urls import include, path
from drf_spectacular.views import SpectacularAPIView, SpectacularRedocView, SpectacularSwaggerView

from .health import healthz, readyz
from .signin import admin_login, browser_login

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
    path("admin/login/", admin_login),  # the admin's own view, under the login throttles
    path("admin/", admin.site.urls),
    # Sign-in for every user, not only admins: a browser session opens a job's Ray Dashboard
    # (jobs/api/dashboard.py sends a browser that is not signed in here, and back).
    path("api-auth/login/", browser_login),  # rest_framework.urls' view, throttled
    path("api-auth/", include("rest_framework.urls")),
]
