from rest_framework.pagination import PageNumberPagination

from config import strict


class StablePageNumberPagination(PageNumberPagination):
    """Page numbers over a queryset that views always order by a unique key, so pages are stable.

    Every list goes through here, so this is where a list refuses query parameters it does not
    take (a misspelt filter would otherwise return everything): see :mod:`config.strict`."""

    page_size_query_param = "page_size"
    max_page_size = 200

    def paginate_queryset(self, queryset, request, view=None):
        if view is not None:
            strict.refuse_unknown_query_params(
                request, view, always=(self.page_query_param, self.page_size_query_param)
            )
        return super().paginate_queryset(queryset, request, view)
