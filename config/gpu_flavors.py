"""GPU flavors (types of GPU: ``h100``, ``a100``, ``l4``): the rule for their names and the
host inventory that realises them on the ``local`` target.

It lives at the bottom because everything reads it: the settings (``MANTA_LOCAL_GPUS``), the
compute target configs (workspaces), the quotas and the job spec. A device without a type is
the flavor-less ``gpu`` of the releases before flavors; its flavor is ``UNTYPED`` ("").
"""

from __future__ import annotations

import re

UNTYPED = ""  # the flavor of a GPU whose type nobody declared
# Lowercase, DNS-label-like (a flavor becomes a label value and part of metric labels); "gpu"
# and "any" would read as the untyped pool or as "whichever", so they are not flavors.
FLAVOR_NAME = re.compile(r"^[a-z][a-z0-9-]{0,30}$")
RESERVED_NAMES = frozenset({"gpu", "any"})
FLAVOR_RULE = (
    "a GPU flavor is 1-31 lowercase letters, digits and '-', starting with a letter "
    "(e.g. h100), and not 'gpu' or 'any'"
)
MAX_DEVICES = 1024


def flavor_problem(name: object) -> str:
    """Why ``name`` is no flavor name ('' when it is one)."""
    if not isinstance(name, str) or not FLAVOR_NAME.match(name) or name in RESERVED_NAMES:
        return f"{name!r}: {FLAVOR_RULE}"
    return ""


def parse_inventory(text: str) -> dict[str, tuple[str, ...]] | None:
    """The typed inventory ``MANTA_LOCAL_GPUS`` names: ``None`` for "auto"; otherwise each
    flavor's device indices, in the order written (``UNTYPED`` for devices without a type).

    Forms: "auto"; "" (no GPUs); a count ("4": devices 0-3, untyped); indices ("0,1,2,3");
    typed groups separated by ';' ("h100:0,1,2,3;a100:4,5"), which may mix in an untyped
    group ("h100:0,1;2,3"). Raises ValueError naming the rule broken."""
    text = text.strip()
    if text == "auto":
        return None
    if text.isdigit():
        if int(text) > MAX_DEVICES:
            raise ValueError(f"a count of at most {MAX_DEVICES}, or device indices")
        return {UNTYPED: tuple(str(i) for i in range(int(text)))} if int(text) else {}
    inventory: dict[str, tuple[str, ...]] = {}
    seen: set[str] = set()
    for group in (g.strip() for g in text.split(";")):
        if not group:
            continue
        flavor, colon, devices = group.rpartition(":")
        flavor = flavor.strip()
        if colon and flavor_problem(flavor):
            raise ValueError(f"in {group!r}: {flavor_problem(flavor)}")
        if flavor in inventory:
            raise ValueError(f"flavor {flavor or 'untyped'!r} is named twice")
        # A device repeated within a group is the same device (as before flavors existed).
        indices = list(dict.fromkeys(part.strip() for part in devices.split(",") if part.strip()))
        if not indices or not all(index.isdigit() for index in indices):
            raise ValueError(
                f"in {group!r}: device indices must be numbers such as 0,1,2,3 "
                "(typed: h100:0,1,2,3;a100:4,5)"
            )
        twice = sorted(set(indices) & seen, key=int)
        if twice:
            raise ValueError(f"device {twice[0]} is in two groups: a device has one flavor")
        seen.update(indices)
        inventory[flavor] = tuple(indices)
    if len(seen) > MAX_DEVICES:
        raise ValueError(f"at most {MAX_DEVICES} devices")
    return inventory
