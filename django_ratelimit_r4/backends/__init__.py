"""Where limiter state lives. ``memory`` (per process) today; a Redis backend slots in behind the same interface."""
