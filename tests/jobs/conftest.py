import copy

from audit.context import Actor
from jobs import services
from jobs.api.examples import COUNTER_SPEC
from tests.conftest import SYSTEM


def counter_spec(**changes):
    spec = copy.deepcopy(COUNTER_SPEC)
    spec.update(changes)
    return spec


def submit(world, template, who="developer", **kwargs):
    job = services.job_submit(
        actor=Actor.for_user(world.users[who]), workspace=world.ws, template=template, **kwargs
    )
    return job


__all__ = ["SYSTEM", "counter_spec", "submit"]
