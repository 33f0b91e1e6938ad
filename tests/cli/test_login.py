"""manta login / context / logout, and the environment over the stored config."""

from __future__ import annotations

import json
import stat

import httpx
from manta import config

from tests.conftest import PASSWORD


def stored(manta) -> dict:
    return json.loads((manta.config_home / "manta" / "config.json").read_text())


def login(manta, email="dev@acme.test", password=PASSWORD):
    return manta("login", "--url", manta.url, "--email", email, input=f"{password}\n")


def test_login_stores_a_private_config_whose_token_works(manta):
    result = login(manta)
    assert result.exit_code == 0, result.output
    path = manta.config_home / "manta" / "config.json"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    saved = stored(manta)
    assert saved["url"] == manta.url and saved["token"].startswith("mnt_")
    # The only organisation and the only workspace the developer sees are chosen for them.
    assert (saved["org"], saved["workspace"], saved["email"]) == ("acme", "ml", "dev@acme.test")
    assert PASSWORD not in path.read_text()
    # The token is real: the API knows it, and the next command uses it.
    me = httpx.get(f"{manta.url}/api/v1/me/", headers={"Authorization": f"Bearer {saved['token']}"})
    assert me.status_code == 200 and me.json()["email"] == "dev@acme.test"
    listed = manta("--output", "json", "jobs", "ls")
    assert listed.exit_code == 0, listed.output
    assert json.loads(listed.stdout) == []


def test_a_second_login_keeps_the_file_private_and_replaces_the_token(manta):
    assert login(manta).exit_code == 0
    path = manta.config_home / "manta" / "config.json"
    path.chmod(0o644)
    first = stored(manta)["token"]
    assert login(manta).exit_code == 0
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stored(manta)["token"] != first


def test_a_wrong_password_stores_nothing_and_says_why(manta):
    result = login(manta, password="wrong password")
    assert result.exit_code == 1
    assert "invalid email or password" in result.stderr
    assert not (manta.config_home / "manta" / "config.json").exists()


def test_commands_without_a_login_say_how_to_log_in(manta):
    result = manta("jobs", "ls")
    assert result.exit_code == 2
    assert "manta login" in result.stderr


def test_context_switches_workspace_after_checking_it(manta, live_world):
    from tests.conftest import SYSTEM
    from workspaces import services

    services.workspace_create(actor=SYSTEM, organization=live_world.org, slug="vision", name="V")
    assert login(manta, "admin@acme.test").exit_code == 0
    # Two workspaces: none is chosen for the org admin, and commands say what to do.
    assert stored(manta)["workspace"] == ""
    assert "manta context" in manta("jobs", "ls").stderr

    missing = manta("context", "--workspace", "nope")
    assert missing.exit_code == 1 and "not_found" in missing.stderr
    assert stored(manta)["workspace"] == ""

    result = manta("-o", "json", "context", "--workspace", "vision")
    assert result.exit_code == 0, result.output
    body = json.loads(result.stdout)
    assert (body["org"], body["workspace"], body["email"]) == ("acme", "vision", "admin@acme.test")
    assert body["workspaces"] == ["ml", "vision"]
    assert stored(manta)["workspace"] == "vision"

    shown = manta("context")
    assert shown.exit_code == 0
    assert "vision" in shown.stdout and "admin@acme.test" in shown.stdout


def test_the_environment_overrides_the_stored_login(manta, live_world, counter):
    assert login(manta).exit_code == 0
    # CI: another user's token and workspace from the environment, nothing stored changes.
    env = {"MANTA_TOKEN": live_world.tokens["viewer"], "MANTA_WORKSPACE": "ml"}
    result = manta("context", "--output", "json", env=env)
    assert result.exit_code == 0, result.output
    body = json.loads(result.stdout)
    assert body["email"] == "viewer@acme.test"
    assert body["sources"] == {"url": "config", "token": "env", "org": "config", "workspace": "env"}
    # The viewer may not submit: the environment's token is the one used.
    refused = manta("submit", "--template", "counter", env=env)
    assert refused.exit_code == 1 and "permission_denied" in refused.stderr
    # MANTA_URL wins over the stored URL too: nothing listens there.
    gone = manta("jobs", "ls", env={"MANTA_URL": "http://127.0.0.1:9"})
    assert gone.exit_code == 1 and "127.0.0.1:9" in gone.stderr
    assert stored(manta)["token"] != live_world.tokens["viewer"]


def test_ci_needs_no_stored_config(manta, counter):
    result = manta.as_user("developer", "templates", "ls", "-o", "json")
    assert result.exit_code == 0, result.output
    assert [t["name"] for t in json.loads(result.stdout)] == ["counter"]
    assert not (manta.config_home / "manta" / "config.json").exists()


def test_logout_revokes_the_token(manta):
    assert login(manta).exit_code == 0
    token = stored(manta)["token"]
    result = manta("logout")
    assert result.exit_code == 0, result.output
    assert stored(manta)["token"] == ""
    me = httpx.get(f"{manta.url}/api/v1/me/", headers={"Authorization": f"Bearer {token}"})
    assert me.status_code == 401


def test_resolve_prefers_flags_then_environment_then_the_file():
    saved = config.StoredConfig(url="http://saved", token="t-saved", org="o", workspace="w")
    settings = config.resolve(
        saved, environ={"MANTA_ORG": "env-org", "MANTA_URL": ""}, flags={"workspace": "flag-ws"}
    )
    assert (settings.url, settings.token) == ("http://saved", "t-saved")
    assert (settings.org, settings.workspace) == ("env-org", "flag-ws")
    assert settings.sources == {
        "url": "config",
        "token": "config",
        "org": "env",
        "workspace": "flag",
    }
