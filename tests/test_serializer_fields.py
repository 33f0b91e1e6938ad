"""Fields copied from one unbound set per class (config/serializers.py: ``clone``) are the
fields DRF's own deep copy builds: same classes, same attributes, bound the same way, at every
level of nesting, and never shared between two serializers."""

from __future__ import annotations

import contextlib
import copy
import re

import pytest
from rest_framework import serializers

import config.urls  # noqa: F401  (every API module, so every serializer class, is imported)
from config.serializers import DeclaredFieldsOnceMixin, FieldsBuiltOnceMixin, clone
from jobs import spec as job_spec


def subclasses(cls: type) -> list[type]:
    found = []
    for sub in cls.__subclasses__():
        found += [sub, *subclasses(sub)]
    return found


COPIED = sorted(
    {
        cls
        for cls in subclasses(DeclaredFieldsOnceMixin) + subclasses(FieldsBuiltOnceMixin)
        if issubclass(cls, serializers.BaseSerializer) and not cls.__name__.startswith("_")
    },
    key=lambda cls: f"{cls.__module__}.{cls.__qualname__}",
)
ADDRESS = re.compile(r" at 0x[0-9a-f]+")


@contextlib.contextmanager
def drf_copies():
    """While it lasts, every serializer builds its fields as DRF does without the mixins."""
    saved = DeclaredFieldsOnceMixin.get_fields, FieldsBuiltOnceMixin.get_fields
    DeclaredFieldsOnceMixin.get_fields = lambda self: copy.deepcopy(self._declared_fields)
    FieldsBuiltOnceMixin.get_fields = lambda self: super(FieldsBuiltOnceMixin, self).get_fields()
    try:
        yield
    finally:
        DeclaredFieldsOnceMixin.get_fields, FieldsBuiltOnceMixin.get_fields = saved


def built(serializer):
    """``serializer`` with the fields of every nested serializer built (they are lazy)."""
    if isinstance(serializer, serializers.ListSerializer):
        built(serializer.child)
    elif isinstance(serializer, serializers.Serializer):
        for field in serializer.fields.values():
            built(field)
    return serializer


def same(a, b, path: str) -> None:
    """``a`` (cloned) is ``b`` (DRF's) attribute by attribute, and no field object is shared."""
    assert type(a) is type(b), path
    if isinstance(a, serializers.Field):
        assert a is not b, f"{path}: one field object in two serializers"
        keys = set(vars(a)) | set(vars(b))
        # url_field_name: ModelSerializer.get_fields() records it on the instance that builds
        # the fields, here the first one only; nothing reads it but get_fields() itself
        for key in sorted(keys - {"parent", "_creation_counter", "fields", "url_field_name"}):
            if key in ("_args", "_kwargs"):  # the arguments as given, never bound
                assert repr(vars(a)[key]) == repr(vars(b)[key]), f"{path}.{key}"
                continue
            if key == "_validators":  # worked out when first read, from the class
                assert ADDRESS.sub("", repr(a.validators)) == ADDRESS.sub("", repr(b.validators))
                continue
            same(vars(a).get(key), vars(b).get(key), f"{path}.{key}")
        assert (a.parent is None) == (b.parent is None), path
        if isinstance(a, serializers.Serializer) and not isinstance(a, serializers.ListSerializer):
            assert list(a.fields) == list(b.fields), path
            for name in a.fields:
                assert a.fields[name].parent is a, f"{path}.{name} is bound to another parent"
                same(a.fields[name], b.fields[name], f"{path}.{name}")
    elif isinstance(a, dict):
        assert list(a) == list(b), path
        for key in a:
            same(a[key], b[key], f"{path}[{key!r}]")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            same(x, y, f"{path}[{i}]")
    else:
        assert a == b or ADDRESS.sub("", repr(a)) == ADDRESS.sub("", repr(b)), path


@pytest.mark.parametrize("cls", COPIED, ids=lambda cls: cls.__qualname__)
def test_copied_fields_are_the_fields_drf_builds_and_are_never_shared(cls):
    assert len(COPIED) > 20  # every API input and the job and attempt outputs
    first, second = built(cls()), built(cls())  # the second from the set the first made
    with drf_copies():
        drf = built(cls())
    for copied in (first, second):
        same(copied, drf, cls.__qualname__)
    same(first, second, cls.__qualname__)


def test_a_change_to_one_serializers_field_stays_in_it():
    first = job_spec.JobSpec()
    first.fields["priority"].required = True
    first.fields["worker_groups"].child.fields["replicas"].max_value = 1
    second = job_spec.JobSpec()
    assert second.fields["priority"].required is False
    assert second.fields["worker_groups"].child.fields["replicas"].max_value != 1


IMAGE = "rayproject/ray:2.40.0"
SPECS = [
    {"image": IMAGE, "entrypoint": "python run.py", "head": {"cpu": 1, "memory_gb": 2}},
    {
        "image": IMAGE,
        "entrypoint": "python run.py",
        "head": {"cpu": 1, "memory_gb": 2},
        "worker_groups": [
            {"name": "gpu", "replicas": 2, "cpu": 4, "memory_gb": 8, "gpu": 1},
            {"name": "cpu", "replicas": 1, "cpu": 2, "memory_gb": 4},
        ],
        "runtime_env": {"env_vars": {"A": "1"}, "pip": ["numpy==2.0.0"]},
        "priority": 7,
        "gpu_flavor": ["h100", "a100"],
    },
    {"entrypoint": "", "head": {"cpu": -1}, "worker_groups": [{"replicas": "x"}, {}]},
    {"entrypoint": "x", "worker_groups": [{"name": "a", "bogus": 1}], "runtime_env": []},
    {"entrypoint": "x", "gpu_flavor": ["h100", "h100"], "unknown": True},
    [],
]


@pytest.mark.parametrize("body", SPECS, ids=range(len(SPECS)))
def test_validation_through_copied_fields_answers_as_drf_does(body):
    ours = job_spec.JobSpec(data=body)
    ours.is_valid()
    with drf_copies():
        drfs = job_spec.JobSpec(data=body)
        drfs.is_valid()
    assert ours.errors == drfs.errors
    assert bool(ours.errors) == (body not in SPECS[:2])
    if not ours.errors:
        assert ours.validated_data == drfs.validated_data


def test_a_list_child_is_cloned_unbound_and_bound_to_its_copy():
    prototype = serializers.ListField(child=serializers.IntegerField(min_value=0))
    copied = clone(prototype)
    assert copied.child is not prototype.child
    assert copied.child.parent is copied and prototype.child.parent is prototype
    assert copied.child.source == "" and copied.child.field_name == ""
    assert copied.run_validation([1, "2"]) == [1, 2]
    with pytest.raises(serializers.ValidationError):
        copied.run_validation([-1])
