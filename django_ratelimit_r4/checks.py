"""System checks for ``RATELIMIT_R4`` (filled in by the registry work)."""
