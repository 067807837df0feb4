"""``manage.py r4``: status and steering of the configured resilience instances."""
