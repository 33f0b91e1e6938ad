import re
import uuid

from .context import RequestContext, reset_request, set_request

_VALID_REQUEST_ID = re.compile(r"^[A-Za-z0-9._-]{8,64}$")


class RequestContextMiddleware:
    """Gives every request an id (the client's ``X-Request-ID`` when it is well-formed), records
    it with the client address for audit rows, and returns it as ``X-Request-ID``."""

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        incoming = request.headers.get("X-Request-ID", "")
        request_id = incoming if _VALID_REQUEST_ID.match(incoming) else uuid.uuid4().hex
        request.request_id = request_id
        token = set_request(
            RequestContext(
                request_id=request_id,
                ip=request.META.get("REMOTE_ADDR") or None,
                user_agent=request.headers.get("User-Agent", "")[:512],
            )
        )
        try:
            response = self.get_response(request)
        finally:
            reset_request(token)
        response["X-Request-ID"] = request_id
        return response
