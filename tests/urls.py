"""URLs of the HTTP-surface tests."""

from django.urls import path

from . import views

urlpatterns = [
    path("api/", views.api),
    path("api-async/", views.api_async),
    path("slow/", views.slow),
    path("per-ip/", views.per_ip),
    path("per-ip-async/", views.per_ip_async),
    path("multi/", views.multi),
    path("multi-keyed/", views.multi_keyed),
    path("heavy/<int:pk>/", views.heavy),
    path("deep/", views.deep),
    path("deep-async/", views.deep_async),
    path("boom/", views.boom),
    path("deep-breaker/", views.deep_breaker),
    path("deep-bulkhead/", views.deep_bulkhead),
    path("breaker/", views.breaker),
    path("breaker-fallback/", views.breaker_with_fallback),
    path("bulkhead/", views.bulkheaded),
    path("flaky/", views.flaky),
    path("stacked/", views.stacked),
    path("class/", views.ApiClassView.as_view()),
    path("class-async/", views.ApiAsyncClassView.as_view()),
    path("drf/", views.DrfApi.as_view()),
    path("drf-scoped/", views.DrfScoped.as_view()),
    path("drf-keyed/", views.DrfKeyed.as_view()),
    path("drf-two/", views.DrfTwoThrottles.as_view()),
    path("drf-unnamed/", views.DrfUnnamed.as_view()),
    path("drf-breaker/", views.DrfBreaker.as_view()),
]
