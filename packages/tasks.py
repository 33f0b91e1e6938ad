from celery import shared_task

from . import services


@shared_task(name="manta.packages.expire")
def expire() -> int:
    return services.packages_expire()
