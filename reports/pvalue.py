"""How every verdict writes a p-value: two significant figures, and never "0" (a p that underflowed is "<1e-300")."""

from __future__ import annotations

SMALLEST_SHOWN = "1e-300"  # scipy returns 0.0 once the tail is under the smallest double (~1e-308)


def p_text(p: float) -> str:
    """The figure alone, for a table cell: '0.27', '1.7e-19', '<1e-300'."""
    return f"{p:.2g}" if p > 0 else f"<{SMALLEST_SHOWN}"


def p_claim(p: float, name: str = "p") -> str:
    """The claim in prose: 'p=0.27', 'p<1e-300' (name: 'TOST p', ...)."""
    text = p_text(p)
    return f"{name}{text}" if text.startswith("<") else f"{name}={text}"
