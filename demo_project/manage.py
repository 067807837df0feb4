#!/usr/bin/env python
"""Demo project: a card-authorization service protected by django-ratelimit-r4."""

import os
import sys
from pathlib import Path

if __name__ == "__main__":
    # Run from a checkout without installing: make the package importable.
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "demo.settings")
    from django.core.management import execute_from_command_line

    execute_from_command_line(sys.argv)
