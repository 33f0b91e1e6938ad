from rest_framework.pagination import PageNumberPagination


class StablePageNumberPagination(PageNumberPagination):
    """Page numbers over a queryset that views always order by a unique key, so pages are stable."""

    page_size_query_param = "page_size"
    max_page_size = 200
