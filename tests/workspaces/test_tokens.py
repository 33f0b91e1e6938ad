import datetime as dt

from django.utils import timezone
from rest_framework.test import APIClient

from audit.models import AuditEvent
from tests.conftest import PASSWORD
from workspaces.identity import token_hash
from workspaces.models import ApiToken


def issue(email="dev@acme.test", password=PASSWORD, **extra):
    return APIClient().post(
        "/api/v1/auth/tokens/", {"email": email, "password": password, **extra}, format="json"
    )


def bearer(secret):
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {secret}")
    return client


def test_issue_token_shows_secret_once_and_stores_only_a_hash(world):
    response = issue(name="ci", expires_in_days=30)
    assert response.status_code == 201, response.content
    body = response.json()
    assert body["token"].startswith("mnt_")
    stored = ApiToken.objects.get(pk=body["id"])
    assert stored.key_hash == token_hash(body["token"])
    assert body["token"] not in {stored.key_hash, stored.prefix}
    assert stored.expires_at > timezone.now() + dt.timedelta(days=29)
    assert AuditEvent.objects.filter(action="token.create", target_id=str(stored.pk)).exists()
    # listed without the secret
    listed = bearer(body["token"]).get("/api/v1/auth/tokens/").json()["results"]
    assert body["id"] in [t["id"] for t in listed]
    assert all("token" not in t for t in listed)


def test_wrong_password_is_401_and_issues_nothing(world):
    count = ApiToken.objects.count()
    response = issue(password="wrong")
    assert response.status_code == 401
    assert response.json()["type"] == "authentication_failed"
    assert ApiToken.objects.count() == count


def test_bad_input_names_the_field(world):
    response = issue(email="not-an-email", expires_in_days=0)
    assert response.status_code == 400
    body = response.json()
    assert body["type"] == "validation_error"
    assert set(body["errors"]) == {"email", "expires_in_days"}


def test_revoked_token_is_401(world):
    secret = issue().json()["token"]
    client = bearer(secret)
    token_id = ApiToken.objects.get(key_hash=token_hash(secret)).pk
    assert client.get("/api/v1/me/").status_code == 200
    assert client.delete(f"/api/v1/auth/tokens/{token_id}/").status_code == 204
    response = client.get("/api/v1/me/")
    assert response.status_code == 401
    assert response.json()["type"] == "authentication_failed"
    assert AuditEvent.objects.filter(action="token.revoke", target_id=str(token_id)).exists()


def test_expired_token_is_401(world):
    secret = issue(expires_in_days=1).json()["token"]
    ApiToken.objects.filter(key_hash=token_hash(secret)).update(
        expires_at=timezone.now() - dt.timedelta(seconds=1)
    )
    assert bearer(secret).get("/api/v1/me/").status_code == 401


def test_cannot_revoke_someone_elses_token(world):
    other = ApiToken.objects.filter(user=world.users["owner"]).first()
    response = world.client("developer").delete(f"/api/v1/auth/tokens/{other.pk}/")
    assert response.status_code == 404
    other.refresh_from_db()
    assert other.revoked_at is None


def test_last_used_is_recorded(world):
    secret = issue().json()["token"]
    token = ApiToken.objects.get(key_hash=token_hash(secret))
    assert token.last_used_at is None
    bearer(secret).get("/api/v1/me/")
    token.refresh_from_db()
    assert token.last_used_at is not None


def test_garbage_and_missing_credentials(world):
    assert bearer("mnt_nope").get("/api/v1/me/").status_code == 401
    response = APIClient().get("/api/v1/me/")
    assert response.status_code == 401
    assert response["WWW-Authenticate"] == "Bearer"
    assert response.json()["type"] == "not_authenticated"
