"""Demo URLs. Probe paths sit outside every limiter: a saturated limiter must not fail a probe."""

from cards import views
from django.contrib import admin
from django.urls import include, path

urlpatterns = [
    path("", views.dashboard, name="dashboard"),
    path("dashboard/state.json", views.dashboard_state, name="dashboard-state"),
    path("authorize", views.authorize, name="authorize"),
    path("authorize-async", views.authorize_async, name="authorize-async"),
    path("partner", views.partner, name="partner"),
    # Off the main path: blocks the event loop on purpose so the stall detector has something to log.
    path("block", views.block, name="block"),
    path("healthz/live", views.live, name="live"),
    path("healthz/ready", views.ready, name="ready"),
    path("healthz/resilience", views.resilience_health, name="resilience-health"),
    path("r4/", include("django_ratelimit_r4.urls")),
    path("", include("django_prometheus.urls")),
    path("admin/", admin.site.urls),
]
