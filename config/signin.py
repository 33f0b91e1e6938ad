"""The browser sign-in forms (the admin's and ``/api-auth/login/``, which opens a job's Ray
Dashboard) under the same login throttles as the token endpoint: the same scopes and so the same
counts, so an account gets its five tries a minute across every way in, not five per form.

A refused POST answers 429 with ``Retry-After`` and never reaches the form (a right password is
refused too until the window passes, as on the token endpoint); GETs are not counted."""

from __future__ import annotations

import functools
import math

from django.contrib import admin
from django.contrib.auth.views import LoginView
from django.http import HttpRequest, HttpResponse

from .throttles import LoginAccountThrottle, LoginIPThrottle


class FormLoginAccountThrottle(LoginAccountThrottle):
    """Per account, read from the form's ``username`` field (the user's email)."""

    def account(self, request) -> object:
        return request.POST.get("username")


def throttled(view):
    """``view`` with its POSTs counted by the login throttles."""

    @functools.wraps(view)
    def wrapped(request: HttpRequest, *args, **kwargs) -> HttpResponse:
        if request.method == "POST":
            for throttle in (LoginIPThrottle(), FormLoginAccountThrottle()):
                if not throttle.allow_request(request, None):
                    wait = math.ceil(throttle.wait())
                    response = HttpResponse(
                        f"Too many sign-in attempts: try again in {wait} seconds.\n",
                        status=429,
                        content_type="text/plain; charset=utf-8",
                    )
                    response["Retry-After"] = str(wait)
                    return response
        return view(request, *args, **kwargs)

    return wrapped


admin_login = throttled(admin.site.login)
browser_login = throttled(LoginView.as_view(template_name="rest_framework/login.html"))
