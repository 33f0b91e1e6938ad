from django.urls import path

from config.pagination import CursorPagination

from .views import OrgWebhookViewSet, WorkspaceWebhookViewSet

ORG = "orgs/<slug:org>/"
WS = ORG + "workspaces/<slug:ws>/"


def routes(prefix: str, viewset) -> list:
    hook = prefix + "webhooks/<int:pk>/"
    delivery = hook + "deliveries/<int:delivery_id>/"
    return [
        path(prefix + "webhooks/", viewset.as_view({"get": "list", "post": "create"})),
        path(
            hook,
            viewset.as_view({"get": "retrieve", "patch": "partial_update", "delete": "destroy"}),
        ),
        path(hook + "rotate-secret/", viewset.as_view({"post": "rotate_secret"})),
        path(hook + "ping/", viewset.as_view({"post": "ping"})),
        path(
            hook + "deliveries/",
            # a long list: cursor pages beside page numbers (config/pagination.py)
            viewset.as_view({"get": "deliveries"}, pagination_class=CursorPagination),
        ),
        path(delivery, viewset.as_view({"get": "delivery"})),
        path(delivery + "redeliver/", viewset.as_view({"post": "redeliver"})),
    ]


urlpatterns = routes(WS, WorkspaceWebhookViewSet) + routes(ORG, OrgWebhookViewSet)
