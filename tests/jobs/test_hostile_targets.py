"""Compute target configs are tenant input: every config that could turn the worker against the
service is refused at save with a 400 naming the field and the rule, and nothing is stored."""

import pytest
import yaml

from tests.conftest import SYSTEM
from tests.jobs.conftest import counter_spec
from tests.jobs.test_compute_targets import KUBECONFIG, TARGETS
from tests.notifications.test_ssrf import INTERNAL_ADDRESSES, resolver  # noqa: F401
from workspaces.models import ComputeTarget


def refused(world, config, kind="ray"):
    body = {"name": "t", "kind": kind, "config": config}
    response = world.client("org_admin").post(TARGETS, body, format="json")
    assert response.status_code == 400, response.content
    assert not ComputeTarget.objects.exists()
    return response.json()["errors"]


@pytest.mark.parametrize(("address", "rule"), INTERNAL_ADDRESSES)
def test_ray_address_internal_addresses_are_refused(world, settings, address, rule):
    settings.MANTA_COMPUTE_TARGET_ALLOWED_NETWORKS = []
    host = f"[{address}]" if ":" in address else address
    errors = refused(world, {"address": f"http://{host}:8265"})
    assert rule in errors["config.address"][0], errors
    assert "MANTA_COMPUTE_TARGET_ALLOWED_NETWORKS" in errors["config.address"][0]


@pytest.mark.parametrize(
    "address",
    [
        "http://localhost:5432",
        "http://0x7f000001:8265",  # 127.0.0.1 in hex
        "http://2130706433:8265",  # and as one decimal number
        "http://127.1:8265",
        "http://[::ffff:7f00:1]:8265",
        "http://0177.0.0.1:8265",  # octal
    ],
)
def test_ray_address_encodings_of_loopback_are_refused(world, settings, address):
    settings.MANTA_COMPUTE_TARGET_ALLOWED_NETWORKS = []
    assert "loopback" in refused(world, {"address": address})["config.address"][0]


def test_ray_address_names_are_resolved_and_every_answer_checked(world, settings, resolver):  # noqa: F811
    settings.MANTA_COMPUTE_TARGET_ALLOWED_NETWORKS = []
    resolver["ray.acme.test"] = ["93.184.216.34", "10.0.0.1"]
    message = refused(world, {"address": "http://ray.acme.test:8265"})["config.address"][0]
    assert "resolves to 10.0.0.1" in message and "private" in message
    resolver["metadata.google.internal"] = ["169.254.169.254"]
    message = refused(world, {"address": "http://metadata.google.internal"})["config.address"][0]
    assert "metadata" in message
    assert (
        "does not resolve"
        in refused(world, {"address": "http://no-such.invalid:8265"})["config.address"][0]
    )


def test_allowed_networks_open_exactly_what_they_list(world, settings):
    settings.MANTA_COMPUTE_TARGET_ALLOWED_NETWORKS = ["10.0.0.0/8"]
    body = {"name": "t", "kind": "ray", "config": {"address": "http://10.1.2.3:8265"}}
    assert world.client("org_admin").post(TARGETS, body, format="json").status_code == 201
    errors = refused_named(world, "http://169.254.169.254:80")
    assert "metadata" in errors


def refused_named(world, address):
    body = {"name": "u", "kind": "ray", "config": {"address": address}}
    response = world.client("org_admin").post(TARGETS, body, format="json")
    assert response.status_code == 400
    return response.json()["errors"]["config.address"][0]


def kubeconfig_with(user=None, cluster=None):
    config = yaml.safe_load(KUBECONFIG)
    if user is not None:
        config["users"][0]["user"] = user
    if cluster is not None:
        config["clusters"][0]["cluster"].update(cluster)
    return yaml.safe_dump(config)


EXEC = {"apiVersion": "client.authentication.k8s.io/v1", "command": "sh",
        "args": ["-c", "env > /tmp/stolen"]}  # fmt: skip


@pytest.mark.parametrize(
    ("kubeconfig", "rule"),
    [
        (kubeconfig_with(user={"exec": EXEC}), "users[0].user.exec: exec plugins"),
        (
            kubeconfig_with(user={"auth-provider": {"name": "gcp"}}),
            "users[0].user.auth-provider: auth providers",
        ),
        (kubeconfig_with(user={"tokenFile": "/etc/shadow"}), "users[0].user.tokenFile: file"),
        (
            kubeconfig_with(user={"client-certificate": "/etc/ssl/a.pem", "client-key": "/k"}),
            "users[0].user.client-certificate: file",
        ),
        (
            kubeconfig_with(cluster={"certificate-authority": "/etc/ca.pem"}),
            "clusters[0].cluster.certificate-authority: file",
        ),
        ("/etc/passwd", "paths on the worker's host are refused"),
        ("~/.kube/config", "paths on the worker's host are refused"),
        ("apiVersion: v1\nkind: [", "not valid YAML"),
        ("- a\n- b\n", "a YAML mapping"),
    ],
    ids=[
        "exec",
        "auth-provider",
        "tokenFile",
        "client-certificate",
        "ca-file",
        "path",
        "home-path",
        "bad-yaml",
        "not-a-mapping",
    ],
)
def test_kubeconfigs_that_run_code_or_read_files_are_refused(world, kubeconfig, rule):
    errors = refused(world, {"kubeconfig": kubeconfig}, kind="kuberay")
    assert any(rule in message for message in errors["config.kubeconfig"]), errors


def test_in_cluster_only_where_the_deployment_allows_it(world, settings):
    settings.MANTA_KUBERAY_IN_CLUSTER = False
    errors = refused(world, {"in_cluster": True}, kind="kuberay")
    assert "MANTA_KUBERAY_IN_CLUSTER=true" in errors["config.in_cluster"][0]
    settings.MANTA_KUBERAY_IN_CLUSTER = True
    body = {"name": "t", "kind": "kuberay", "config": {"in_cluster": True}}
    assert world.client("org_admin").post(TARGETS, body, format="json").status_code == 201


def test_an_inline_kubeconfig_is_fine(world):
    body = {"name": "t", "kind": "kuberay", "config": {"kubeconfig": KUBECONFIG}}
    assert world.client("org_admin").post(TARGETS, body, format="json").status_code == 201


@pytest.mark.parametrize(
    "config",
    [
        {"sandbox": {"mode": "off"}},
        {"work_dir": "/"},
        {"start_timeout_seconds": 10**12},
        {"object_store_memory_bytes": -1},
        {"allowed_networks": ["0.0.0.0/0"]},
    ],
    ids=["sandbox", "work_dir", "huge-timeout", "negative-store", "allowed-networks"],
)
def test_local_target_configs_cannot_reach_operator_settings(world, config):
    errors = refused(world, config, kind="local")
    assert [key for key in errors if key.startswith("config.")], errors


def test_operator_settings_win_over_a_stored_config(world, settings):
    """Even a row that bypassed the API (an old one, a database edit) cannot switch isolation
    off or widen what a ray target may reach: the worker applies the operator's settings."""
    from jobs import services as job_services
    from jobs.launch_requests import resolve_target
    from tests.jobs.conftest import submit

    settings.MANTA_COMPUTE_TARGET_ALLOWED_NETWORKS = []
    ComputeTarget.objects.create(
        organization=world.org, name="mine", kind="local",
        config={"sandbox": {"mode": "off", "uid_range": [0, 0]}},
    )  # fmt: skip
    ComputeTarget.objects.create(
        organization=world.org, name="ray", kind="ray",
        config={"address": "http://127.0.0.1:8265", "allowed_networks": ["0.0.0.0/0"]},
    )  # fmt: skip
    template = job_services.template_create(
        actor=SYSTEM, workspace=world.ws, name="t", spec=counter_spec()
    ).template
    job = submit(world, template)
    for name, check in (
        ("mine", lambda c: c["sandbox"]["mode"] == "sandbox" and c["sandbox"]["uid_range"][0] > 0),
        ("ray", lambda c: c["allowed_networks"] == []),
    ):
        world.ws.compute_target = name
        world.ws.save(update_fields=["compute_target"])
        job.workspace.refresh_from_db()
        assert check(resolve_target(job).config), name


def test_max_nodes_per_job_refuses_hostile_numbers(world):
    for value in (0, -3, 10**12, "lots", None):
        response = world.client("owner").patch(
            "/api/v1/orgs/acme/", {"max_nodes_per_job": value}, format="json"
        )
        assert response.status_code == 400, (value, response.content)
        assert "max_nodes_per_job" in response.json()["errors"]
