from drf_spectacular.extensions import OpenApiAuthenticationExtension
from rest_framework import authentication, exceptions

from .identity import token_authenticate


class BearerTokenAuthentication(authentication.BaseAuthentication):
    """``Authorization: Bearer mnt_…``. ``request.auth`` is the ApiToken."""

    keyword = "Bearer"

    def authenticate(self, request):
        header = authentication.get_authorization_header(request).decode("latin-1")
        if not header:
            return None
        scheme, _, secret = header.partition(" ")
        if scheme.lower() != self.keyword.lower():
            return None
        token = token_authenticate(secret.strip())
        if token is None:
            raise exceptions.AuthenticationFailed("invalid, expired or revoked token")
        return token.user, token

    def authenticate_header(self, request):
        return self.keyword


class BearerTokenScheme(OpenApiAuthenticationExtension):
    target_class = "workspaces.authentication.BearerTokenAuthentication"
    name = "bearerAuth"

    def get_security_definition(self, auto_schema):
        return {"type": "http", "scheme": "bearer", "description": "A Manta API token (mnt_…)"}
