"""ASGI entry point (uvicorn demo.asgi:application), with the event-loop stall detector on."""

import os

from django.core.asgi import get_asgi_application

from django_ratelimit_r4.stall import monitor_asgi

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "demo.settings")
# Logs the stack of any code that blocks the loop for more than 20 ms (Python's "pinning").
application = monitor_asgi(get_asgi_application(), threshold=0.020)
