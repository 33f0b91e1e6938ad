"""Manta settings. Everything is read from the environment; each default is the embedded mode
(SQLite and a filesystem Celery broker under ``var/``) so ``make demo`` needs no server.

Documented in the README ("Configuration").
"""

import ipaddress
import os
import re
import warnings
from pathlib import Path

import environ
from django.core.exceptions import ImproperlyConfigured

from config.gpu_flavors import parse_inventory as parse_gpu_inventory

BASE_DIR = Path(__file__).resolve().parent.parent
VAR_DIR = Path(environ.Env().str("MANTA_VAR_DIR", default=str(BASE_DIR / "var")))

env = environ.Env()


# Settings read as numbers are checked at start, so a typo or a value out of range stops every
# process naming the setting, instead of turning a bound off.
def _refuse(name: str, rule: str):
    raise ImproperlyConfigured(f"{name}: {rule}")


def _number(name: str, default: float, *, low: float, high: float, kind=float):
    # Parsed as written: environ's float() drops every character that is not a digit, a
    # point, a comma or a minus first, which reads "1e400" as 1400 and "12h" as 12.
    raw = os.environ.get(name)
    try:
        value = default if raw is None else kind(raw.strip())
        if value != value:  # nan
            raise ValueError
    except ValueError:
        _refuse(name, f"must be a {'whole ' if kind is int else ''}number")
    if not low <= value <= high:
        _refuse(name, f"must be between {low:,.10g} and {high:,.10g}, not {value:,.10g}")
    return value


DEBUG = env.bool("DEBUG", default=False)
# How long an invitation into an organisation can be accepted.
MANTA_INVITATION_DAYS = _number("MANTA_INVITATION_DAYS", 7, low=1, high=3660, kind=int)
# Browser sign-in for every user (/api-auth/login/): a session opens a job's Ray Dashboard.
LOGIN_URL = "rest_framework:login"
LOGIN_REDIRECT_URL = "/api/docs/"
# Session and CSRF cookies (the admin panel) only over HTTPS, unless DEBUG.
SESSION_COOKIE_SECURE = CSRF_COOKIE_SECURE = env.bool("MANTA_SECURE_COOKIES", default=not DEBUG)
SECRET_KEY = env.str("SECRET_KEY", default="insecure-embedded-default-change-me")
MANTA_ENCRYPTION_KEY = env.str("MANTA_ENCRYPTION_KEY", default="")
# Signs the audit chains' checkpoints (audit/signing.py); empty derives one from SECRET_KEY. Set
# it on its own to keep the checkpoints verifiable across a SECRET_KEY rotation.
MANTA_AUDIT_CHECKPOINT_KEY = env.str("MANTA_AUDIT_CHECKPOINT_KEY", default="")
ALLOWED_HOSTS = env.list("ALLOWED_HOSTS", default=["127.0.0.1", "localhost", "testserver"])
CSRF_TRUSTED_ORIGINS = env.list("CSRF_TRUSTED_ORIGINS", default=[])

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rest_framework",
    "django_filters",
    "drf_spectacular",
    "drf_spectacular_sidecar",  # Swagger UI and ReDoc as static files (no CDN)
    "guardian",
    "workspaces",
    "audit",
    "outbox",
    "jobs",
    "quotas",
    "notifications",
    "packages",
]

MIDDLEWARE = [
    "config.metrics_http.RequestMetricsMiddleware",  # manta_http_* for /metrics: times all below
    "audit.middleware.RequestContextMiddleware",
    "django.middleware.security.SecurityMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",  # /static/, DEBUG or not (STATIC_* below)
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

ROOT_URLCONF = "config.urls"
WSGI_APPLICATION = "config.wsgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "config" / "templates"],  # api_docs/redoc.html
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

DATABASES = {"default": env.db("DATABASE_URL", default=f"sqlite:///{VAR_DIR / 'manta.sqlite3'}")}
if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
    # SQLite has no row locks: IMMEDIATE transactions take the write lock up front, so the web
    # process and the worker queue behind each other (busy timeout) instead of failing with
    # "database is locked" half-way through a transaction.
    DATABASES["default"]["OPTIONS"] = {
        "transaction_mode": "IMMEDIATE",
        "timeout": 30,
        "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
    }
DATABASES["default"]["ATOMIC_REQUESTS"] = False
# Persistent connections: a request (or a worker's task) reuses its process's connection for
# this many seconds instead of opening one each time (a few ms and a backend fork on PostgreSQL);
# 0 closes it after every request. CONN_MAX_AGE is the older name of the same setting.
DATABASES["default"].setdefault(
    "CONN_MAX_AGE",
    _number(
        "MANTA_DB_CONN_MAX_AGE",
        _number("CONN_MAX_AGE", 60, low=0, high=366 * 86400, kind=int),
        low=0,
        high=366 * 86400,
        kind=int,
    ),
)
# A persistent connection that the database dropped (a restart, a terminated backend) is found
# dead at the next request's first query and replaced, instead of failing it.
DATABASES["default"]["CONN_HEALTH_CHECKS"] = True
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

AUTH_USER_MODEL = "workspaces.User"
AUTHENTICATION_BACKENDS = [
    "django.contrib.auth.backends.ModelBackend",
    "guardian.backends.ObjectPermissionBackend",
]
AUTH_PASSWORD_VALIDATORS = [
    {
        "NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator",
        "OPTIONS": {"user_attributes": ("email", "full_name")},
    },
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
]
PASSWORD_HASHERS = env.list(
    "PASSWORD_HASHERS",
    default=[
        "django.contrib.auth.hashers.PBKDF2PasswordHasher",
        "django.contrib.auth.hashers.PBKDF2SHA1PasswordHasher",
    ],
)
ANONYMOUS_USER_NAME = None  # guardian: no anonymous user row

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

# Static files (the admin's, DRF's browsable API's, Swagger UI's and ReDoc's) are served by the
# API process itself, through WhiteNoise, DEBUG or not: no web server in front is needed for
# them. By default WhiteNoise finds them where the installed apps keep them (Django's finders,
# scanned once at start), so `make serve`, the tests' gunicorn and any checkout serve them with
# no collectstatic step to forget. The image runs collectstatic at build, compressed (gzip,
# beside each file), and sets MANTA_STATIC_COLLECTED=true: there that copy in STATIC_ROOT is
# served, its .gz files to clients that accept gzip. (With finders on, WhiteNoise would serve the
# apps' uncompressed files over STATIC_ROOT's.) Not a manifest storage: that would make
# collectstatic mandatory.
STATIC_URL = "static/"
STATIC_ROOT = env.str("STATIC_ROOT", default=str(VAR_DIR / "static"))
MANTA_STATIC_COLLECTED = env.bool("MANTA_STATIC_COLLECTED", default=False)
WHITENOISE_USE_FINDERS = not MANTA_STATIC_COLLECTED
if WHITENOISE_USE_FINDERS:
    # Nothing is read from STATIC_ROOT then (it is only where collectstatic writes): that it does
    # not exist is no news for every process to print.
    warnings.filterwarnings("ignore", message="No directory at: ", category=UserWarning)

# Code packages (packages/): stored once per content. The filesystem under var/ by default; any
# Django storage backend in production, e.g. S3-compatible object storage with django-storages:
# MANTA_PACKAGE_STORAGE=storages.backends.s3.S3Storage and its OPTIONS as JSON.
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {"BACKEND": "whitenoise.storage.CompressedStaticFilesStorage"},
    "packages": {
        "BACKEND": env.str(
            "MANTA_PACKAGE_STORAGE", default="django.core.files.storage.FileSystemStorage"
        ),
        "OPTIONS": env.json(
            "MANTA_PACKAGE_STORAGE_OPTIONS", default={"location": str(VAR_DIR / "packages")}
        ),
    },
}


# PostgreSQL: a query's values travel apart from its SQL (server-side binding), and a statement
# a connection has run MANTA_DB_PREPARE_THRESHOLD times is kept prepared by the server, parsed
# and planned once instead of on every run (the same few statements make every request). "off":
# never kept (a pooler in transaction mode that cannot follow them, PgBouncer before 1.21).
if DATABASES["default"]["ENGINE"] == "django.db.backends.postgresql":
    _prepare = env.str("MANTA_DB_PREPARE_THRESHOLD", default="5").strip().lower()
    DATABASES["default"].setdefault("OPTIONS", {}).update(
        {
            "server_side_binding": True,
            "prepare_threshold": None
            if _prepare == "off"
            else _number("MANTA_DB_PREPARE_THRESHOLD", 5, low=0, high=1_000_000, kind=int),
        }
    )

MANTA_PACKAGE_MAX_BYTES = _number(
    "MANTA_PACKAGE_MAX_BYTES", 100 * 1024**2, low=1, high=1024**4, kind=int
)
MANTA_PACKAGE_MAX_UNPACKED_BYTES = _number(
    "MANTA_PACKAGE_MAX_UNPACKED_BYTES", 1024**3, low=1, high=16 * 1024**4, kind=int
)
MANTA_PACKAGE_RETENTION_DAYS = _number(
    "MANTA_PACKAGE_RETENTION_DAYS", 30, low=1, high=36_600, kind=int
)


# What one workspace's packages may add up to (GiB) and how many it may hold: without a bound a
# tenant could fill the shared package storage at upload speed.
MANTA_PACKAGE_STORAGE_GB = _number("MANTA_PACKAGE_STORAGE_GB", 5.0, low=0.001, high=1_000_000)
MANTA_PACKAGE_STORAGE_COUNT = _number(
    "MANTA_PACKAGE_STORAGE_COUNT", 500, low=1, high=10_000_000, kind=int
)
# Clusters that download code themselves (kuberay) get a URL valid this long: presigned by object
# storage, or served by the API at MANTA_PUBLIC_URL (the address clusters reach it at).
MANTA_PACKAGE_URL_SECONDS = _number(
    "MANTA_PACKAGE_URL_SECONDS", 3600, low=1, high=7 * 86400, kind=int
)
MANTA_PUBLIC_URL = env.str("MANTA_PUBLIC_URL", default="")

# JSON request bodies nested deeper than this are refused with a 400 (config/parsers.py).
MANTA_JSON_MAX_DEPTH = _number("MANTA_JSON_MAX_DEPTH", 64, low=2, high=1000, kind=int)
REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "workspaces.authentication.BearerTokenAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"],
    "DEFAULT_PARSER_CLASSES": ["config.parsers.StrictJSONParser"],
    "DEFAULT_PAGINATION_CLASS": "config.pagination.StablePageNumberPagination",
    "PAGE_SIZE": 50,
    "DEFAULT_FILTER_BACKENDS": ["django_filters.rest_framework.DjangoFilterBackend"],
    "DEFAULT_SCHEMA_CLASS": "config.schema.AutoSchema",  # documents the error responses
    "EXCEPTION_HANDLER": "config.errors.exception_handler",
    "UNAUTHENTICATED_USER": None,
    "URL_FORMAT_OVERRIDE": None,  # ?format= belongs to the audit export, not to content negotiation
}

SPECTACULAR_SETTINGS = {
    "TITLE": "Manta API",
    "DESCRIPTION": "Governed, multi-tenant Ray jobs: organisations, workspaces, roles, tokens, "
    "job templates, jobs, quotas, webhooks and an append-only audit log.",
    "VERSION": "1.0.0",
    "SERVE_INCLUDE_SCHEMA": False,
    "COMPONENT_SPLIT_REQUEST": True,
    "SCHEMA_PATH_PREFIX": r"/api/v1",
    "ENUM_NAME_OVERRIDES": {},
    # Swagger UI (/api/docs/) and ReDoc (/api/redoc/) load their scripts, styles and icon from
    # this service's static files (drf-spectacular-sidecar): they work with no internet access.
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
    # Nor does Swagger UI send the schema to an online validator.
    "SWAGGER_UI_SETTINGS": {"deepLinking": True, "validatorUrl": None},
}

# Celery: Redis in production and tests; kombu's filesystem transport (no server) by default.
CELERY_BROKER_URL = env.str("CELERY_BROKER_URL", default="filesystem://")
CELERY_RESULT_BACKEND = env.str("CELERY_RESULT_BACKEND", default=None)
CELERY_TASK_ALWAYS_EAGER = env.bool("CELERY_TASK_ALWAYS_EAGER", default=False)
# Tasks are acknowledged when they finish, so a task whose worker died is delivered again; the
# broker holds an unacknowledged task for longer than any countdown we use.
CELERY_TASK_ACKS_LATE = True
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_BROKER_TRANSPORT_OPTIONS = {"visibility_timeout": 3600}
if CELERY_BROKER_URL.startswith("filesystem://"):
    # The embedded broker: kombu's filesystem transport, its folders under var/. Set here (not
    # in a Celery signal, which re-entered the configuration it was called from) so the API,
    # the worker and `manage.py shell` all find them.
    _broker = VAR_DIR / "broker"
    for _folder in ("queue", "processed", "control"):
        (_broker / _folder).mkdir(parents=True, exist_ok=True)
    CELERY_BROKER_TRANSPORT_OPTIONS.update(
        data_folder_in=str(_broker / "queue"),
        data_folder_out=str(_broker / "queue"),
        processed_folder=str(_broker / "processed"),
        control_folder=str(_broker / "control"),
        store_processed=False,
    )
elif CELERY_BROKER_URL.startswith(("redis://", "rediss://")):
    # A broker that hangs instead of refusing (frozen, failed over, dropped by a firewall)
    # would hold a publish forever: an API request would never answer. With these, each try
    # gives up after 2 s and the publish after its retries, so a submission still answers
    # within gunicorn's 30 s (8-15 s measured with Redis frozen, tests/e2e/test_faults.py).
    CELERY_BROKER_TRANSPORT_OPTIONS.update(
        socket_timeout=2, socket_connect_timeout=2, socket_keepalive=True
    )
# Outages: the worker and beat wait for the broker at start and reconnect after losing it, for
# as long as it takes (tests/e2e/test_faults.py); the Redis shim in config/celery.py keeps the
# worker alive through the reconnect.
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
CELERY_BROKER_CONNECTION_RETRY = True
CELERY_BROKER_CONNECTION_MAX_RETRIES = None
CELERY_BROKER_CHANNEL_ERROR_RETRY = True
CELERY_TASK_IGNORE_RESULT = True
# Two queues: the default one (``celery``) carries the job lifecycle (admission, launch, follow,
# cancel, sweeps), ``webhooks`` carries what talks to the tenants' receivers and mail servers
# (the outbox dispatcher, deliveries, emails: every ``manta.notifications.*`` task). Tasks are
# routed by name when they are sent, so no app imports another to pick a queue. A worker started
# without ``-Q`` consumes both (the demo, a single-process deployment); ``make worker`` and
# docker-compose run one worker per queue, so a backlog of slow deliveries, which can keep every
# process of a worker busy for minutes, never holds a launch (docs/architecture.md, "Dispatch").
JOBS_QUEUE = "celery"
WEBHOOKS_QUEUE = "webhooks"
CELERY_TASK_DEFAULT_QUEUE = JOBS_QUEUE
CELERY_TASK_QUEUES = {JOBS_QUEUE: {}, WEBHOOKS_QUEUE: {}}
CELERY_TASK_ROUTES = {"manta.notifications.*": {"queue": WEBHOOKS_QUEUE}}
# Celery's Django fix-up closes every database connection before and after every task, which
# makes CONN_MAX_AGE moot in a worker (a new connection per task). Past this many tasks it
# closes them; until then config/celery.py closes them as Django does after a request: when
# older than CONN_MAX_AGE, or broken.
CELERY_DB_REUSE_MAX = 1_000_000
CELERY_BEAT_SCHEDULE = {
    "sweep": {
        "task": "manta.jobs.sweep",
        "schedule": _number("MANTA_SWEEP_INTERVAL_SECONDS", 15.0, low=0.1, high=86400),
    },
    "webhooks-sweep": {
        "task": "manta.notifications.sweep",
        "schedule": _number("WEBHOOK_SWEEP_INTERVAL_SECONDS", 5.0, low=0.1, high=86400),
    },
    "packages-expire": {"task": "manta.packages.expire", "schedule": 3600.0},
    # Verify each audit chain since its last checkpoint and sign its head (audit/tasks.py).
    "audit-checkpoint": {
        "task": "manta.audit.checkpoint",
        "schedule": _number(
            "MANTA_AUDIT_CHECKPOINT_INTERVAL_SECONDS", 3600.0, low=1, high=366 * 86400
        ),
    },
}


# Throttles (config/throttles.py): "count/period", the period s, m, h or d, optionally a multiple
# of it ("500/30m"); empty turns that throttle off. Every attempt counts, failed logins too.
def _throttle_rate(name: str, default: str) -> str | None:
    value = env.str(name, default=default).strip()
    if value and not re.fullmatch(
        r"[1-9]\d*/([1-9]\d*)?(s|sec|second|m|min|minute|h|hour|d|day)", value.lower()
    ):
        raise ImproperlyConfigured(f"{name}: a rate such as 10/min or 500/30m, or empty for none")
    return value or None


REST_FRAMEWORK["DEFAULT_THROTTLE_RATES"] = {
    "login_ip": _throttle_rate("MANTA_THROTTLE_LOGIN_IP", "20/min"),
    "login_account": _throttle_rate("MANTA_THROTTLE_LOGIN_ACCOUNT", "5/min"),
    "tokens": _throttle_rate("MANTA_THROTTLE_TOKENS", "30/h"),
    "submit_user": _throttle_rate("MANTA_THROTTLE_SUBMIT_USER", "500/30m"),  # Anyscale's limit
    "submit_workspace": _throttle_rate("MANTA_THROTTLE_SUBMIT_WORKSPACE", "2000/30m"),
    # Each upload is up to MANTA_PACKAGE_MAX_BYTES hashed, checked and stored.
    "package_upload": _throttle_rate("MANTA_THROTTLE_PACKAGE_UPLOAD", "60/h"),
}
# A client is its REMOTE_ADDR. Behind N reverse proxies that each append to X-Forwarded-For, set
# N; with 0 the header, which any client can write, is ignored (DRF's default, None, trusts it).
REST_FRAMEWORK["NUM_PROXIES"] = _number("MANTA_NUM_PROXIES", 0, low=0, high=100, kind=int)

# /metrics (jobs/metrics.py) answers a scraper that sends MANTA_METRICS_TOKEN as a bearer token,
# or one whose address (read as the throttles read it, MANTA_NUM_PROXIES) lies in these networks:
# by default this host's loopback, so a Prometheus beside the API scrapes with nothing set; empty,
# the token only. Nobody else learns how busy the platform is.
MANTA_METRICS_TOKEN = env.str("MANTA_METRICS_TOKEN", default="")
if MANTA_METRICS_TOKEN and not re.fullmatch(r"[!-~]{16,}", MANTA_METRICS_TOKEN):
    _refuse(
        "MANTA_METRICS_TOKEN",
        "at least 16 printable ASCII characters, no spaces (e.g. `openssl rand -hex 32`)",
    )
try:
    MANTA_METRICS_ALLOWED_NETWORKS = [
        str(ipaddress.ip_network(network.strip(), strict=False))
        for network in env.list("MANTA_METRICS_ALLOWED_NETWORKS", default=["127.0.0.0/8", "::1"])
    ]
except ValueError as _exc:
    _refuse("MANTA_METRICS_ALLOWED_NETWORKS", f"must list CIDR networks ({_exc})")

# A Celery worker's own metrics exporter (config/worker_metrics.py): its pool's counters, on this
# address and port, under the same rule as /metrics; 0 (the default) serves none. Each worker on
# a host needs a port of its own.
MANTA_WORKER_METRICS_PORT = _number("MANTA_WORKER_METRICS_PORT", 0, low=0, high=65535, kind=int)
MANTA_WORKER_METRICS_ADDRESS = env.str("MANTA_WORKER_METRICS_ADDRESS", default="127.0.0.1")

# The throttles count in the default cache, which every API process must share: Redis in
# production (by default the broker's, so compose and production need nothing more; any
# django-environ cache URL works), files under var/cache/ in the embedded mode. Not local memory
# there: the embedded API runs two gunicorn processes (scripts/demo.py), each would count alone.
# Not the database cache: its table needs `createcachetable`, and each count would take SQLite's
# one write lock.
_broker_redis = CELERY_BROKER_URL if CELERY_BROKER_URL.startswith(("redis://", "rediss://")) else ""
MANTA_CACHE_URL = env.str("MANTA_CACHE_URL", default=_broker_redis)
if MANTA_CACHE_URL.startswith(("redis://", "rediss://")):
    _cache = environ.Env.cache_url_config(
        MANTA_CACHE_URL, backend="django.core.cache.backends.redis.RedisCache"
    )
    # A Redis that hangs holds a request 2 s per call, not forever (the throttles then let it by).
    _cache["OPTIONS"] = {
        "socket_timeout": 2,
        "socket_connect_timeout": 2,
        **_cache.get("OPTIONS", {}),
    }
elif MANTA_CACHE_URL:
    _cache = environ.Env.cache_url_config(MANTA_CACHE_URL)
else:
    # Full, the file cache deletes a third of its entries: room for far more clients than that.
    _cache = {
        "BACKEND": "django.core.cache.backends.filebased.FileBasedCache",
        "LOCATION": str(VAR_DIR / "cache"),
        "OPTIONS": {"MAX_ENTRIES": 10_000},
    }
CACHES = {"default": {"KEY_PREFIX": "manta", **_cache}}

# Scheduling policies (docs/scheduling.md). ``intelligent``: a priority 1-6 job that has waited
# this long is no longer overtaken. ``fair_share``: a workspace's past usage counts half as much
# after each half-life.
MANTA_INTELLIGENT_AGING_MINUTES = _number(
    "MANTA_INTELLIGENT_AGING_MINUTES", 60.0, low=0, high=525_600
)
# A request that queues a job runs the admission pass itself after its commit (one hop to the
# launch) while its organisation has at most this many queued jobs; 0: always the admit task.
MANTA_INLINE_ADMISSION_MAX_QUEUED = _number(
    "MANTA_INLINE_ADMISSION_MAX_QUEUED", 16, low=0, high=10_000, kind=int
)
MANTA_FAIR_SHARE_HALF_LIFE_HOURS = _number(
    "MANTA_FAIR_SHARE_HALF_LIFE_HOURS", 24.0, low=0.01, high=87_600
)
# ``fair_share``: an overdue head beyond its guarantee gets a reservation in time only when the
# running jobs' deadlines make room for it within this window (jobs/backfill.py; Slurm's
# bf_window, whose default is a day too). 0: never.
MANTA_BACKFILL_WINDOW_HOURS = _number("MANTA_BACKFILL_WINDOW_HOURS", 24.0, low=0, high=87_600)

# Running jobs (jobs/attempts.py).
MANTA_LOCAL_RAY_DIR = env.str("MANTA_LOCAL_RAY_DIR", default="/tmp/manta-ray")
# How long a queued job's predicted start (jobs/prediction.py) is reused for its detail.
MANTA_PREDICTION_CACHE_SECONDS = _number("MANTA_PREDICTION_CACHE_SECONDS", 10.0, low=0, high=86400)
MANTA_FOLLOW_INTERVAL_SECONDS = _number("MANTA_FOLLOW_INTERVAL_SECONDS", 1.0, low=0.05, high=3600)
MANTA_HEARTBEAT_STALE_SECONDS = _number("MANTA_HEARTBEAT_STALE_SECONDS", 30.0, low=1, high=86400)
MANTA_LEASE_SECONDS = _number("MANTA_LEASE_SECONDS", 30.0, low=1, high=86400)
MANTA_CLUSTER_LOST_SECONDS = _number("MANTA_CLUSTER_LOST_SECONDS", 60.0, low=1, high=7 * 86400)
# A dead worker node is started again this many times per attempt; one more loss fails the
# attempt (node_failures).
MANTA_NODE_RESTARTS = _number("MANTA_NODE_RESTARTS", 3, low=0, high=1000, kind=int)
# How often a running attempt's driver log is copied to the database (so it never disappears
# from logs/ when its cluster stops answering).
MANTA_LOG_SAVE_SECONDS = _number("MANTA_LOG_SAVE_SECONDS", 10.0, low=0.1, high=86400)
# How much of a driver log's end that copy keeps, and the most logs/ reads of a log at once: a
# longer log's copy starts with a line saying how many bytes were dropped (jobs/log_archive.py).
MANTA_LOG_ARCHIVE_BYTES = _number(
    "MANTA_LOG_ARCHIVE_BYTES", 2 * 1024**2, low=4096, high=256 * 1024**2, kind=int
)


# The `local` target's isolation (jobs/launchers/local/sandbox.py) and capacity
# (jobs/local_host.py): operator settings, checked here so a bad value stops every process at
# start, naming itself.
# "sandbox": every cluster in its own uid, namespaces and cgroups (needs root, util-linux);
# "off": single-user mode, nodes run as the worker's user and see the whole host.
MANTA_LOCAL_ISOLATION = env.str("MANTA_LOCAL_ISOLATION", default="sandbox")
if MANTA_LOCAL_ISOLATION not in ("sandbox", "off"):
    _refuse("MANTA_LOCAL_ISOLATION", "must be 'sandbox' or 'off'")
_uid_range = env.str("MANTA_LOCAL_UID_RANGE", default="3000000-3099999")
try:
    _low, _high = (int(part) for part in _uid_range.split("-"))
except ValueError:
    _refuse("MANTA_LOCAL_UID_RANGE", f"must be LOW-HIGH, e.g. 3000000-3099999, not {_uid_range!r}")
if not 1000 <= _low <= _high < 2**31 - 1:
    _refuse("MANTA_LOCAL_UID_RANGE", "must lie within 1000..2147483646, low <= high")
MANTA_LOCAL_UID_RANGE = (_low, _high)
MANTA_LOCAL_EGRESS = env.bool("MANTA_LOCAL_EGRESS", default=True)  # pip etc. via slirp4netns
# What an org admin may allow-list for its local target's egress (egress_allow); loopback,
# link-local and metadata addresses never. Narrow it where the host's own services listen on
# private addresses.
MANTA_LOCAL_EGRESS_ALLOWABLE = env.list(
    "MANTA_LOCAL_EGRESS_ALLOWABLE",
    default=["10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "100.64.0.0/10", "fc00::/7"],
)
try:
    MANTA_LOCAL_EGRESS_ALLOWABLE = [
        str(ipaddress.ip_network(n, strict=False)) for n in MANTA_LOCAL_EGRESS_ALLOWABLE
    ]
except ValueError as _exc:
    _refuse("MANTA_LOCAL_EGRESS_ALLOWABLE", f"must list CIDR networks ({_exc})")
# The uids and GPUs leased to live clusters: one pool per host, whatever a target's work_dir.
MANTA_LOCAL_LEASE_DIR = env.str("MANTA_LOCAL_LEASE_DIR", default="/var/lib/manta/sandbox-leases")
if not MANTA_LOCAL_LEASE_DIR.startswith("/"):
    _refuse("MANTA_LOCAL_LEASE_DIR", "must be an absolute path")
# GPU inventory: "auto" (nvidia-smi), "" (none: GPUs are logical only), "4" or "0,1,2,3", or
# typed by flavor, "h100:0,1,2,3;a100:4,5" (config/gpu_flavors.py). Held as "auto" or the
# device indices, and each typed device's flavor in MANTA_LOCAL_GPU_FLAVORS.
try:
    _inventory = parse_gpu_inventory(env.str("MANTA_LOCAL_GPUS", default="auto"))
except ValueError as _exc:
    _refuse(
        "MANTA_LOCAL_GPUS",
        f"must be 'auto', a count, device indices such as 0,1,2,3 or typed groups such as "
        f"h100:0,1,2,3;a100:4,5 ({_exc})",
    )
if _inventory is None:
    MANTA_LOCAL_GPUS: str | tuple[str, ...] = "auto"
    MANTA_LOCAL_GPU_FLAVORS: dict[str, str] = {}
else:
    MANTA_LOCAL_GPUS = tuple(device for devices in _inventory.values() for device in devices)
    MANTA_LOCAL_GPU_FLAVORS = {
        device: flavor for flavor, devices in _inventory.items() if flavor for device in devices
    }
MANTA_LOCAL_PIDS_PER_NODE = _number(
    "MANTA_LOCAL_PIDS_PER_NODE", 1024, low=64, high=1_000_000, kind=int
)
MANTA_LOCAL_NODE_OVERHEAD_GB = _number("MANTA_LOCAL_NODE_OVERHEAD_GB", 1.0, low=0.25, high=1024)
MANTA_LOCAL_DEFAULT_NODE_MEMORY_GB = _number(
    "MANTA_LOCAL_DEFAULT_NODE_MEMORY_GB", 2.0, low=0.25, high=4096
)
# The CPU quota a sandboxed node gets at least, whatever its spec says (a head with 0 CPUs still
# runs Ray's own processes); admission reserves the same.
MANTA_LOCAL_MIN_NODE_CPU = _number("MANTA_LOCAL_MIN_NODE_CPU", 1.0, low=0.1, high=64)
# The writable storage (GB) of a node whose spec names none, on every target; within the spec's
# bounds for disk_gb (jobs/spec.py MIN_DISK_GB..MAX_DISK_GB).
MANTA_DEFAULT_NODE_DISK_GB = _number("MANTA_DEFAULT_NODE_DISK_GB", 10.0, low=0.1, high=16384)
MANTA_LOCAL_HIDE_PATHS = env.list("MANTA_LOCAL_HIDE_PATHS", default=[])
if any(not path.startswith("/") or path.rstrip("/") == "" for path in MANTA_LOCAL_HIDE_PATHS):
    _refuse("MANTA_LOCAL_HIDE_PATHS", "must be absolute paths other than /")
# What admission may place on this host over all organisations: e.g.
# "cpu=8,memory_gb=32,gpu=4,disk_gb=500"; a resource not named is this host's, less the reserve
# kept for the service itself (disk: the free space where MANTA_LOCAL_RAY_DIR lies).
MANTA_LOCAL_CAPACITY = {}
for _name, _value in env.dict("MANTA_LOCAL_CAPACITY", default={}).items():
    if _name not in ("cpu", "memory_gb", "gpu", "disk_gb"):
        _refuse(
            "MANTA_LOCAL_CAPACITY", f"unknown resource {_name!r}; use cpu, memory_gb, gpu, disk_gb"
        )
    try:
        MANTA_LOCAL_CAPACITY[_name] = float(_value)
    except ValueError:
        _refuse("MANTA_LOCAL_CAPACITY", f"{_name} must be a number, not {_value!r}")
    if not 0 <= MANTA_LOCAL_CAPACITY[_name] < 1e9:
        _refuse("MANTA_LOCAL_CAPACITY", f"{_name} must be a non-negative number")
MANTA_LOCAL_RESERVE_CPU = _number("MANTA_LOCAL_RESERVE_CPU", 0.0, low=0, high=4096)
MANTA_LOCAL_RESERVE_MEMORY_GB = _number("MANTA_LOCAL_RESERVE_MEMORY_GB", 2.0, low=0, high=1_000_000)
MANTA_LOCAL_RESERVE_DISK_GB = _number("MANTA_LOCAL_RESERVE_DISK_GB", 5.0, low=0, high=1_000_000)

# Compute targets are tenant input too (workspaces/api/serializers.py). A `ray` target's address
# must be public unless it lies in one of these networks (the compose file lists its own);
# `in_cluster` (the platform's own Kubernetes service account) only where this says so.
MANTA_COMPUTE_TARGET_ALLOWED_NETWORKS = env.list(
    "MANTA_COMPUTE_TARGET_ALLOWED_NETWORKS", default=[]
)
MANTA_KUBERAY_IN_CLUSTER = env.bool("MANTA_KUBERAY_IN_CLUSTER", default=False)

# Webhooks (notifications/). Deliveries may only reach public addresses unless a network is
# listed here (e.g. "127.0.0.0/8" for a receiver on this host); plain http:// only if allowed.
WEBHOOK_ALLOWED_NETWORKS = env.list("WEBHOOK_ALLOWED_NETWORKS", default=[])
WEBHOOK_ALLOW_HTTP = env.bool("WEBHOOK_ALLOW_HTTP", default=False)
WEBHOOK_TIMEOUT_SECONDS = _number("WEBHOOK_TIMEOUT_SECONDS", 15.0, low=0.1, high=600)
# Delay before each attempt (the first is immediate); after the last, a delivery is exhausted.
WEBHOOK_RETRY_SCHEDULE = [
    float(s)
    for s in env.list(
        "WEBHOOK_RETRY_SCHEDULE", default=[0, 5, 300, 1800, 7200, 18000, 36000, 36000]
    )
]
WEBHOOK_RETRY_JITTER = _number("WEBHOOK_RETRY_JITTER", 0.2, low=0, high=1)  # ± this fraction
WEBHOOK_RETRY_AFTER_MAX_SECONDS = _number(
    "WEBHOOK_RETRY_AFTER_MAX_SECONDS", 86400.0, low=1, high=366 * 86400
)
# An endpoint whose every attempt failed for this long is disabled and its org admins emailed.
WEBHOOK_DISABLE_AFTER_SECONDS = _number(
    "WEBHOOK_DISABLE_AFTER_SECONDS", 5 * 86400.0, low=60, high=366 * 86400
)
# How long a worker holds the deliveries it claimed; a dead worker's deliveries are retried after.
WEBHOOK_LEASE_SECONDS = _number("WEBHOOK_LEASE_SECONDS", 60.0, low=1, high=86400)
WEBHOOK_ROTATION_GRACE_SECONDS = _number(
    "WEBHOOK_ROTATION_GRACE_SECONDS", 86400, low=0, high=366 * 86400, kind=int
)

# Email notifications (approval requests, failed jobs, disabled webhooks): console by default.
EMAIL_BACKEND = env.str("EMAIL_BACKEND", default="django.core.mail.backends.console.EmailBackend")
EMAIL_HOST = env.str("EMAIL_HOST", default="localhost")
EMAIL_PORT = _number("EMAIL_PORT", 25, low=1, high=65535, kind=int)
EMAIL_HOST_USER = env.str("EMAIL_HOST_USER", default="")
EMAIL_HOST_PASSWORD = env.str("EMAIL_HOST_PASSWORD", default="")
EMAIL_USE_TLS = env.bool("EMAIL_USE_TLS", default=False)
DEFAULT_FROM_EMAIL = env.str("DEFAULT_FROM_EMAIL", default="manta@localhost")

# The audit log's hash chain: which algorithm, and the session setting that lets a database
# superuser purge it (tests flush their database between cases).
AUDIT_PURGE_SETTING = "manta.audit_maintenance"

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "root": {"handlers": ["console"], "level": env.str("LOG_LEVEL", default="INFO")},
    "loggers": {"django.db.backends": {"level": "WARNING"}},
}

# Code sources (git repositories jobs run code from): the same SSRF policy as webhooks over
# its own allowed networks; unencrypted git:// and http:// only when allowed.
MANTA_CODE_SOURCE_ALLOWED_NETWORKS = env.list("MANTA_CODE_SOURCE_ALLOWED_NETWORKS", default=[])
MANTA_CODE_SOURCE_ALLOW_PLAIN = env.bool("MANTA_CODE_SOURCE_ALLOW_PLAIN", default=False)
MANTA_CODE_FETCH_SECONDS = _number("MANTA_CODE_FETCH_SECONDS", 300, low=1, high=86400, kind=int)
