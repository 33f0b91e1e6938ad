from django.apps import AppConfig


class QuotasConfig(AppConfig):
    name = "quotas"
    default_auto_field = "django.db.models.BigAutoField"
