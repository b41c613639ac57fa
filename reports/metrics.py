"""Number checks shared by the report writers (run-directory files are read through trainer/rundir.py)."""

from __future__ import annotations

import math
from typing import Any


def finite(value: Any) -> bool:
    """True for a real, finite number."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
