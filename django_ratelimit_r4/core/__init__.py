"""The primitives, free of Django: usable and testable on their own.

Nothing under ``django_ratelimit_r4.core`` may import Django (a test enforces it).
"""
