from django.apps import AppConfig


class JobsConfig(AppConfig):
    name = "jobs"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from . import execution, state, tasks
        from .models import JobState

        # Nothing leaves before commit: these run after the transition's transaction commits.
        state.on_state(JobState.QUEUED, lambda job_id: tasks.admit.delay())
        state.on_state(JobState.CANCELLED, execution.job_cancelled)
