"""Notebooks 01, 02, 04 and 07 (and the helpers that print): numbers for people, durations, byte counts and
table figures, one function each; and the text every helper's messages share.

Every notebook prints through these (notebook 01 first), so a duration or a size reads the same in every
lesson, and the sanitize file of the tests (``tests/nbval_sanitize.cfg``) knows the duration format.

The shared text, one home each: `short_list` (a few names of many), `short_repr` (a value in a message),
`strip_ansi` (terminal colours out of a tool's output), `LOG_PREFIX` (the glog prefix of C++ log lines,
``I1205 10:01:02.123456 4242 file.cpp:42] ``) and `error_message` (an exception as one stable line).
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence

__all__ = ["LOG_PREFIX", "error_message", "format_bytes", "format_number", "format_seconds", "short_list",
           "short_repr", "strip_ansi"]

LOG_PREFIX = re.compile(r"^[A-Z]\d{4} \d\d:\d\d:\d\d\.\d+ +\d+ \S+\] ")
"""The glog-style prefix of a log line (c10d and torchrun; torch.compile's TORCH_LOGS, V for verbose): level,
date, time, thread id, ``file:line]``."""
_ANSI = re.compile(r"\x1b\[[0-9;]*m")


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


def short_list(items: Sequence[str], limit: int = 8) -> str:
    """Up to ``limit`` items joined by commas, then how many are left out: ``'a, b, ... (3 more)'``."""
    shown = ", ".join(items[:limit])
    return shown + (f", ... ({len(items) - limit} more)" if len(items) > limit else "")


def short_repr(value: object, limit: int = 80) -> str:
    """``repr(value)``, cut to ``limit`` characters with ``'...'`` at the end when longer."""
    text = repr(value)
    return text if len(text) <= limit else text[:limit - 3] + "..."


def strip_ansi(text: str) -> str:
    """``text`` without terminal colour codes (``ESC[31m`` and the like)."""
    return _ANSI.sub("", text)


def error_message(exc: BaseException, first_line: bool = False) -> str:
    """``Type: message`` with what belongs to one build or machine taken out: a C++ source location
    (``[/path/to/gloo/...cc:78] ``, which names the build's folders and changes with each release), a
    peer's address and port (``[127.0.0.1]:4282``, shown as ``[127.0.0.1]:PORT``) and the long
    ``TensorOptions(...)`` of a collective's fingerprint (shortened to ``TensorOptions(…)``). With
    ``first_line``, only the message's first line."""
    text = re.sub(r"\[[^\]\s]*\.(?:cc|cpp|h|hpp):\d+\] ", "", str(exc))
    text = re.sub(r"(\[[0-9A-Fa-f.:]+\]):\d+", r"\1:PORT", text)
    text = re.sub(r"TensorOptions\((?:[^()]|\([^()]*\))*\)", "TensorOptions(…)", text).strip()
    if first_line and text:
        text = text.splitlines()[0]
    return f"{type(exc).__name__}: {text}"
