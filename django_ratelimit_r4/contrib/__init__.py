"""Optional integrations (Prometheus, ...). Each submodule imports its third-party package itself."""
