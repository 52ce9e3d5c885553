from django.apps import AppConfig


class ShopConfig(AppConfig):
    name = "tests.django_project.shop"
    label = "shop"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from . import jobs  # noqa: F401 - registers the job classes, as an app's ready() does
