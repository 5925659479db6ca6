#!/usr/bin/env python
"""The test project's manage.py, run from anywhere."""

import os
import sys
from pathlib import Path

if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.djangosite.settings")
    from django.core.management import execute_from_command_line

    execute_from_command_line(sys.argv)
