"""Notebooks 01, 02, 04 and 07 (and the helpers that print): numbers for people, durations, byte counts and
table figures, one function each.

Every notebook prints through these (notebook 01 first), so a duration or a size reads the same in every
lesson, and the sanitize file of the tests (``tests/nbval_sanitize.cfg``) knows the duration format.
"""

from __future__ import annotations

import math

__all__ = ["format_bytes", "format_number", "format_seconds"]


def format_seconds(seconds: float) -> str:
    """Human-readable duration: ``'812 ns'``, ``'3.4 µs'``, ``'21.6 ms'``, ``'1.25 s'``."""
    if not math.isfinite(seconds):
        return str(seconds)
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("µs", 1e-6)):
        if abs(seconds) >= scale:
            value = seconds / scale
            return f"{value:.3g} {unit}" if value < 100 else f"{value:.0f} {unit}"
    return f"{seconds * 1e9:.3g} ns"


def format_bytes(nbytes: float) -> str:
    """Binary units, three significant digits: ``4096`` → ``'4 KiB'``, ``1536`` → ``'1.5 KiB'``, ``1 << 30`` → ``'1 GiB'``."""
    value = float(nbytes)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(value) < 1024:
            return f"{value:.3g} {unit}"
        value /= 1024
    return f"{value:.3g} TiB" if abs(value) < 1024 else f"{value / 1024:,.0f} PiB"


def format_number(value: object) -> str:
    """A table figure: ``'4,127'`` from 100 up, three significant digits below (``'54.3'``), ``'–'`` for none.

    ``None``, NaN and anything that is not a number print as ``'–'`` (a missing measurement).
    """
    if isinstance(value, bool) or not isinstance(value, int | float) or value != value:
        return "–"
    return f"{value:,.0f}" if abs(value) >= 100 else f"{value:.3g}"
