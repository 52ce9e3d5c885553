"""The jobs dashboard's URLs: ``path("jobs/", include("syncjobs.contrib.django.urls"))`` in the project's URLconf.

Every path below the mount goes to the one view (the dashboard routes them
itself); ``reverse("syncjobs:dashboard")`` is its front page.
"""

from __future__ import annotations

from django.urls import path

from .dashboard import dashboard_view

app_name = "syncjobs"

urlpatterns = [
    path("", dashboard_view, name="dashboard"),
    path("<path:rest>", dashboard_view, name="dashboard-page"),
]
