"""How every verdict writes a p-value: two significant figures, never "0" (a p that underflowed is "<1e-300") and
never a claim from a p that could not be computed (NaN: "n/a")."""

from __future__ import annotations

import math

SMALLEST_SHOWN = "1e-300"  # scipy returns 0.0 once the tail is under the smallest double (~1e-308)


def p_text(p: float) -> str:
    """The figure alone, for a table cell: '0.27', '1.7e-19', '<1e-300', 'n/a'."""
    if not math.isfinite(p) or p < 0:
        return "n/a"
    return f"{p:.2g}" if p > 0 else f"<{SMALLEST_SHOWN}"


def p_claim(p: float, name: str = "p") -> str:
    """The claim in prose: 'p=0.27', 'p<1e-300', 'p n/a' (name: 'TOST p', ...)."""
    text = p_text(p)
    return f"{name}{text}" if text.startswith("<") else f"{name} {text}" if text == "n/a" else f"{name}={text}"
