from rest_framework.test import APIClient


def test_healthz():
    assert APIClient().get("/healthz").json() == {"status": "ok"}


def test_readyz_checks_database_and_broker(db):
    response = APIClient().get("/readyz")
    assert response.status_code == 200, response.content
    assert response.json()["checks"] == {"database": "ok", "broker": "ok"}
