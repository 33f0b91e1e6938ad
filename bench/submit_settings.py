"""Manta's settings with the benchmark's baseline endpoint added (bench/bare.py)."""

from config.settings import *  # noqa: F403

ROOT_URLCONF = "bench.bare"
