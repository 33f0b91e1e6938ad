from django.apps import AppConfig


class QuotasConfig(AppConfig):
    name = "quotas"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from jobs import state
        from jobs.models import ACTIVE_STATES

        from . import scheduler

        def release_on_leaving(job, from_state: str) -> None:
            # Exactly once: in the transaction that moves the job out of launching/running.
            if from_state in ACTIVE_STATES and job.state not in ACTIVE_STATES:
                scheduler.release(job)

        state.in_transaction(release_on_leaving)
