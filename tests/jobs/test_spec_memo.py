"""A spec validated before is not validated again (``jobs.spec.validate_spec``): the answer is
the serialisers' for the same spec, organisation policy and settings, a fresh copy each time,
and whatever changes what validation reads makes it validate again."""

import pytest
from rest_framework import serializers

from jobs import spec as job_spec
from jobs.spec import validate_spec
from tests.jobs.conftest import counter_spec


@pytest.fixture
def counted(monkeypatch):
    """How many times the serialisers ran."""
    runs = []
    real = job_spec.JobSpec

    def counting(*args, **kwargs):
        runs.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(job_spec, "JobSpec", counting)
    job_spec._validated.cache_clear()
    yield runs
    job_spec._validated.cache_clear()


def test_the_same_spec_is_validated_once_and_answered_alike(world, counted):
    first = validate_spec(counter_spec(), organization=world.org)
    again = validate_spec(counter_spec(), organization=world.org)
    assert len(counted) == 1
    assert again == first
    job_spec._validated.cache_clear()
    assert validate_spec(counter_spec(), organization=world.org) == first  # the serialisers'


def test_each_answer_is_a_copy_of_its_own(world, counted):
    first = validate_spec(counter_spec(), organization=world.org)
    first["head"]["cpu"] = 99
    first["runtime_env"]["env_vars"]["COUNT_TO"] = "changed"
    again = validate_spec(counter_spec(), organization=world.org)
    assert again["head"]["cpu"] == 0 and again["runtime_env"]["env_vars"]["COUNT_TO"] == "10"


def test_a_change_of_policy_or_setting_validates_again(world, counted, settings):
    validate_spec(counter_spec(), organization=world.org)
    world.org.allowed_image_prefixes = ["registry.corp/"]
    with pytest.raises(serializers.ValidationError, match="image policy"):
        validate_spec(counter_spec(), organization=world.org)
    world.org.allowed_image_prefixes = ["rayproject/"]
    world.org.max_nodes_per_job = 2  # the head and up to 2 workers: 3 nodes
    with pytest.raises(serializers.ValidationError, match="max_nodes_per_job"):
        validate_spec(counter_spec(), organization=world.org)
    world.org.max_nodes_per_job = None
    settings.MANTA_DEFAULT_NODE_DISK_GB = 3
    assert validate_spec(counter_spec(), organization=world.org)["head"]["disk_gb"] == 3
    assert len(counted) == 4


def test_a_bad_spec_is_refused_every_time(world, counted):
    bad = counter_spec(head={"cpu": -1})
    for _ in range(2):
        with pytest.raises(serializers.ValidationError):
            validate_spec(bad, organization=world.org)
    assert len(counted) == 2


def test_input_that_is_not_json_is_still_validated_and_refused(world, counted):
    with pytest.raises(serializers.ValidationError):
        validate_spec({**counter_spec(), "max_runtime_seconds": float("nan")}, organization=None)
    assert validate_spec({**counter_spec(), "priority": 5}, organization=None)["priority"] == 5


def test_a_long_spec_is_validated_every_time_and_not_kept(world, counted):
    # A tenant's large specs (here a long entrypoint) must not fill the processes' memory.
    env_vars = {f"V{n}": "x" * 1000 for n in range(job_spec.MEMO_MAX_CHARS // 1000)}
    long = counter_spec(runtime_env={"env_vars": env_vars})
    first = validate_spec(long, organization=world.org)
    assert validate_spec(long, organization=world.org) == first
    assert len(counted) == 2
    assert job_spec._validated.cache_info().currsize == 0
