from django.contrib import admin
from django.urls import include, path

from .shop import views

urlpatterns = [
    path("admin/", admin.site.urls),
    path("orders/", views.place_order),
    # Two segments, neither of them the dashboard's own "jobs": its links must carry the whole prefix.
    path("ops/board/", include("syncjobs.contrib.django.urls")),
]
