"""Optional URLconf of the state endpoint (staff or bearer token only; everyone else gets 404).

In the project's ``urls.py``::

    path("ops/r4/", include("django_ratelimit_r4.urls")),

then ``GET /ops/r4/`` is ``manage.py r4 status --json`` of the worker that answered, and
``POST /ops/r4/<name>/reset``, ``/drain`` and ``/transition`` steer it (JSON or form body:
``key``, ``to``). ``manage.py r4 ... --url https://host/ops/r4/`` uses exactly these. Access rules:
:mod:`django_ratelimit_r4.views`.
"""

from __future__ import annotations

from django.urls import path

from . import views

app_name = "ratelimit_r4"

urlpatterns = [
    path("", views.state_view, name="state"),
    path("<str:name>/reset", views.reset_view, name="reset"),
    path("<str:name>/drain", views.drain_view, name="drain"),
    path("<str:name>/transition", views.transition_view, name="transition"),
]
