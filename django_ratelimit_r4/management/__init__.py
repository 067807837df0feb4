"""Management commands of django-ratelimit-r4."""
