from django.urls import path

from .views import AuditEventViewSet

urlpatterns = [
    path("orgs/<slug:org>/audit-events/", AuditEventViewSet.as_view({"get": "list"})),
    path("orgs/<slug:org>/audit-events/verify/", AuditEventViewSet.as_view({"get": "verify"})),
    path("orgs/<slug:org>/audit-events/export/", AuditEventViewSet.as_view({"get": "export"})),
]
