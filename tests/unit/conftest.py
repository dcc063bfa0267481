"""The unit tests' folder on `sys.path`, for the shared builders (tests/unit/builders.py)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
