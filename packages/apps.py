from django.apps import AppConfig


class PackagesConfig(AppConfig):
    name = "packages"
    default_auto_field = "django.db.models.BigAutoField"
