"""``/metrics`` in the Prometheus text format: job counts by state and the admission invariants'
drift (all zero when quotas hold). Aggregates only, no tenant names.

Here, at the top of the apps, because it reads jobs and quotas; the root URLconf
(``config/urls.py``) includes it by name, so ``config`` imports no app.
"""

from django.db.models import Count
from django.http import HttpResponse
from django.urls import path
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Gauge, generate_latest

from .accounting import reconcile
from .models import Job, JobState


def metrics(request):
    registry = CollectorRegistry()
    jobs = Gauge("manta_jobs", "Jobs by state", ["state"], registry=registry)
    counts = dict(Job.objects.order_by().values_list("state").annotate(n=Count("id")))
    for state in JobState.values:
        jobs.labels(state=state).set(counts.get(state, 0))
    drift = Gauge(
        "manta_quota_drift",
        "Admission invariants that do not hold (0 = healthy)",
        ["kind"],
        registry=registry,
    )
    for kind, value in reconcile().items():
        drift.labels(kind=kind).set(value)
    return HttpResponse(generate_latest(registry), content_type=CONTENT_TYPE_LATEST)


urlpatterns = [path("metrics", metrics)]
