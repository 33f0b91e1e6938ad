"""Operator settings (the local target's, package storage's, /metrics', every number) are
checked when the settings load: a bad value stops the process at start with an error naming the
variable, instead of failing a launch (or every submission, or every scrape) later. Each case
loads config.settings in a clean process, as `make serve` does."""

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def load(**env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", "import config.settings as s; print(s.MANTA_LOCAL_GPUS)"],
        cwd=ROOT,
        env={"PATH": "/usr/bin:/bin", "MANTA_VAR_DIR": "/tmp/manta-settings-check", **env},
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.mark.parametrize(
    ("name", "value", "rule"),
    [
        ("MANTA_LOCAL_ISOLATION", "sometimes", "'sandbox' or 'off'"),
        ("MANTA_LOCAL_UID_RANGE", "0-0", "within 1000"),  # root
        ("MANTA_LOCAL_UID_RANGE", "5000-4000", "low <= high"),
        ("MANTA_LOCAL_UID_RANGE", "abc", "LOW-HIGH"),
        ("MANTA_LOCAL_UID_RANGE", "1000-99999999999", "within 1000"),
        ("MANTA_LOCAL_GPUS", "../../etc/passwd", "device indices"),
        ("MANTA_LOCAL_GPUS", "99999999", "device indices"),
        ("MANTA_LOCAL_GPUS", "h100:0,1;a100:1,2", "device 1 is in two groups"),
        ("MANTA_LOCAL_GPUS", "H100:0,1", "lowercase letters"),
        ("MANTA_LOCAL_GPUS", "gpu:0,1", "not 'gpu' or 'any'"),
        ("MANTA_LOCAL_GPUS", "h100:0;h100:1", "named twice"),
        ("MANTA_LOCAL_GPUS", "h100:", "device indices must be numbers"),
        ("MANTA_LOCAL_PIDS_PER_NODE", "-1", "between 64"),
        ("MANTA_LOCAL_PIDS_PER_NODE", "lots", "whole number"),
        ("MANTA_LOCAL_NODE_OVERHEAD_GB", "1e400", "between"),
        ("MANTA_LOCAL_DEFAULT_NODE_MEMORY_GB", "0", "between 0.25"),
        ("MANTA_LOCAL_HIDE_PATHS", "relative/dir", "absolute paths"),
        ("MANTA_LOCAL_HIDE_PATHS", "/", "other than /"),
        ("MANTA_LOCAL_CAPACITY", "cpu=abc", "cpu must be a number"),
        ("MANTA_LOCAL_CAPACITY", "cpus=8", "unknown resource 'cpus'"),
        ("MANTA_LOCAL_CAPACITY", "gpu=-4", "non-negative"),
        ("MANTA_LOCAL_RESERVE_CPU", "-1", "between 0"),
        ("MANTA_LOCAL_RESERVE_DISK_GB", "-5", "between 0"),
        ("MANTA_LOCAL_CAPACITY", "disk_gb=-1", "non-negative"),
        ("MANTA_LOCAL_MIN_NODE_CPU", "0", "between 0.1"),
        ("MANTA_DEFAULT_NODE_DISK_GB", "-1", "between 0.1 and 16,384"),
        ("MANTA_DEFAULT_NODE_DISK_GB", "20000", "between 0.1 and 16,384"),
        ("MANTA_LOCAL_EGRESS_ALLOWABLE", "10.0.0.0/8,mirror.corp", "must list CIDR networks"),
        ("MANTA_LOCAL_LEASE_DIR", "relative/leases", "absolute path"),
        ("MANTA_PACKAGE_STORAGE_GB", "lots", "must be a number"),
        ("MANTA_PACKAGE_STORAGE_GB", "-5", "must be between 0.001 and 1,000,000"),
        ("MANTA_PACKAGE_STORAGE_GB", "nan", "must be a number"),
        ("MANTA_PACKAGE_STORAGE_COUNT", "-1", "must be between 1 and"),
        ("MANTA_BACKFILL_WINDOW_HOURS", "-1", "must be between 0 and 87,600"),
        ("MANTA_BACKFILL_WINDOW_HOURS", "a day", "must be a number"),
        ("MANTA_BACKFILL_WINDOW_HOURS", "1e400", "must be between 0 and 87,600, not inf"),
        ("MANTA_BACKFILL_WINDOW_HOURS", "12h", "must be a number"),  # not 12
        ("MANTA_LOCAL_PIDS_PER_NODE", "1e3", "whole number"),  # not 13
        ("MANTA_PACKAGE_STORAGE_COUNT", "2.5", "must be a whole number"),
        ("MANTA_LEASE_SECONDS", "0", "must be between 1 and 86,400, not 0"),
        ("MANTA_FOLLOW_INTERVAL_SECONDS", "1s", "must be a number"),
        ("MANTA_SWEEP_INTERVAL_SECONDS", "-15", "must be between 0.1 and 86,400"),
        ("WEBHOOK_RETRY_JITTER", "2", "must be between 0 and 1, not 2"),
        ("WEBHOOK_TIMEOUT_SECONDS", "inf", "must be between 0.1 and 600, not inf"),
        ("EMAIL_PORT", "70000", "must be between 1 and 65,535"),
        ("MANTA_DB_CONN_MAX_AGE", "-1", "must be between 0 and"),
        ("CONN_MAX_AGE", "forever", "must be a whole number"),
        ("MANTA_JSON_MAX_DEPTH", "1e9", "must be a whole number"),
        ("MANTA_PACKAGE_MAX_BYTES", "0", "must be between 1 and"),
        ("MANTA_NODE_RESTARTS", "-3", "must be between 0 and 1,000"),
        ("MANTA_INVITATION_DAYS", "0", "must be between 1 and 3,660"),
        ("MANTA_LOG_ARCHIVE_BYTES", "1024", "must be between 4,096 and 268,435,456, not 1,024"),
        ("MANTA_METRICS_ALLOWED_NETWORKS", "127.0.0.0/8,prometheus.corp", "must list CIDR"),
        ("MANTA_METRICS_ALLOWED_NETWORKS", "10.0.0.0/33", "must list CIDR networks"),
        ("MANTA_METRICS_TOKEN", "short", "at least 16 printable ASCII characters"),
        ("MANTA_METRICS_TOKEN", "a token with spaces in it", "no spaces"),
    ],
)
def test_a_bad_local_setting_stops_the_process_naming_it(name, value, rule):
    done = load(**{name: value})
    assert done.returncode != 0
    assert "ImproperlyConfigured" in done.stderr and f"{name}:" in done.stderr, done.stderr[-800:]
    assert rule in done.stderr, done.stderr[-800:]


def test_good_local_settings_load():
    done = load(MANTA_LOCAL_GPUS="0,2,2", MANTA_LOCAL_CAPACITY="cpu=8,gpu=2,disk_gb=500")
    assert done.returncode == 0, done.stderr[-800:]
    assert done.stdout.strip() == "('0', '2')"


def test_a_typed_inventory_loads_with_each_devices_flavor():
    done = subprocess.run(
        [sys.executable, "-c", "import config.settings as s; "
         "print(s.MANTA_LOCAL_GPUS, s.MANTA_LOCAL_GPU_FLAVORS)"],
        cwd=ROOT, capture_output=True, text=True, timeout=60,
        env={"PATH": "/usr/bin:/bin", "MANTA_VAR_DIR": "/tmp/manta-settings-check",
             "MANTA_LOCAL_GPUS": " h100:0,1 ; a100:4,5;2"},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-800:]
    assert done.stdout.strip() == (
        "('0', '1', '4', '5', '2') {'0': 'h100', '1': 'h100', '4': 'a100', '5': 'a100'}"
    )


@pytest.mark.parametrize(
    ("env", "loaded"),
    [
        ({}, "['127.0.0.0/8', '::1/128'] 0"),
        ({"MANTA_METRICS_ALLOWED_NETWORKS": "", "MANTA_METRICS_TOKEN": "0123456789abcdef"},
         "[] 16"),
        ({"MANTA_METRICS_ALLOWED_NETWORKS": " 10.1.2.3/8, ::1,192.0.2.7"},
         "['10.0.0.0/8', '::1/128', '192.0.2.7/32'] 0"),
    ],
)  # fmt: skip
def test_metrics_settings_load_normalised(env, loaded):
    done = subprocess.run(
        [sys.executable, "-c", "import config.settings as s; "
         "print(s.MANTA_METRICS_ALLOWED_NETWORKS, len(s.MANTA_METRICS_TOKEN))"],
        cwd=ROOT, capture_output=True, text=True, timeout=60,
        env={"PATH": "/usr/bin:/bin", "MANTA_VAR_DIR": "/tmp/manta-settings-check", **env},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-800:]
    assert done.stdout.strip() == loaded
