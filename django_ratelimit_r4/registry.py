"""Settings-driven registry of named instances (filled in by the registry work)."""
