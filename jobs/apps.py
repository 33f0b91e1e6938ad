from django.apps import AppConfig


class JobsConfig(AppConfig):
    name = "jobs"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from . import following, state, tasks
        from .models import TERMINAL_STATES, JobState

        # Nothing leaves before commit: these run after the transition's transaction commits.
        # A job that joins the queue, or one that ends and frees what it held, starts an
        # admission pass.
        for joined_or_freed in (JobState.QUEUED, *TERMINAL_STATES):
            state.on_state(joined_or_freed, lambda job_id: tasks.admit.delay())
        state.on_state(JobState.CANCELLED, following.job_cancelled)
