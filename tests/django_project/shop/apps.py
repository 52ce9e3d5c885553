from django.apps import AppConfig


class ShopConfig(AppConfig):
    name = "tests.django_project.shop"
    label = "shop"
    default_auto_field = "django.db.models.BigAutoField"
    # No ready() importing .jobs: syncjobs finds shop/jobs.py when Django starts.
