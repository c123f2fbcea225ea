"""Appendix notebook 90 (are the course's timers right?): reference figures, what the course's timing
helper measured on the GPU host, next to other timers.

``benchmarks/timing_comparison.py`` (run on a CUDA host) times the same matmuls and copies three ways
(`course_utils.benchmark`, ``torch.utils.benchmark`` and raw CUDA events) and writes the table to
``course_utils/data/reference_figures.json``. `show_reference_figures` prints that table in a notebook,
or says plainly that the file has not been made yet.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ..formatting import format_number

__all__ = ["COLUMNS", "EXTRA_COLUMNS", "default_path", "format_reference_table", "load_reference_figures",
           "show_reference_figures"]

COLUMNS = (("course", "course_utils"), ("torch_benchmark", "torch.utils.benchmark"),
           ("raw", "raw CUDA events"))
"""(row key, column title) of the three timings, in the order they are printed."""

EXTRA_COLUMNS = (("ratio_range", "range over rounds", ".2f"), ("sm_clock_mhz", "SM clock, MHz", ".0f"),
                 ("power_w_max", "peak power, W", ".0f"))
"""(row key, column title, number format) of the optional columns, printed when a row has the key."""


def default_path() -> Path:
    """``course_utils/data/reference_figures.json`` inside the installed package."""
    return Path(__file__).parents[1] / "data" / "reference_figures.json"


def load_reference_figures(path: str | Path | None = None) -> dict[str, Any] | None:
    """The reference table as a dict (``meta`` and ``rows``), or None when the file does not exist.

    Raises ValueError naming the file when it exists but is not a reference table.
    """
    path = Path(path) if path is not None else default_path()
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        if not isinstance(data.get("meta"), dict) or not isinstance(data.get("rows"), list):
            raise TypeError("expected an object with 'meta' (object) and 'rows' (list)")
    except (OSError, ValueError, TypeError, AttributeError) as exc:
        raise ValueError(f"{path} is not a reference-figures file ({type(exc).__name__}: {exc}); "
                         "re-create it with `python benchmarks/timing_comparison.py` on a CUDA host") from None
    return data


def _extra(value: Any, fmt: str) -> str:
    """An optional column's cell: a ``[low, high]`` range as ``'low–high'``, a number, or ``'–'``."""
    if (isinstance(value, list | tuple) and len(value) == 2
            and all(isinstance(v, int | float) for v in value)):
        return f"{value[0]:{fmt}}–{value[1]:{fmt}}"
    if isinstance(value, int | float) and value == value:
        return f"{value:{fmt}}"
    return "–"


def format_reference_table(rows: Sequence[Mapping[str, Any]], meta: Mapping[str, Any] | None = None) -> str:
    """A plain-text table: one line per case, the three timings as rates, and course/raw.

    Rows made with several rounds also show the range of course/raw over the rounds, and rows with
    ``nvidia-smi`` samples the GPU's SM clock range and peak power while the case ran
    (``ratio_range``, ``sm_clock_mhz``, ``power_w_max``).
    """
    header = ["case", "unit", *(title for _, title in COLUMNS), "course/raw"]
    extra = [(key, title, fmt) for key, title, fmt in EXTRA_COLUMNS if any(key in r for r in rows)]
    header += [title for _, title, _ in extra]
    body = [[str(r.get("case", "?")), str(r.get("unit", "")), *(format_number(r.get(key)) for key, _ in COLUMNS),
             f"{r['ratio']:.3f}" if isinstance(r.get("ratio"), int | float) else "–",
             *(_extra(r.get(key), fmt) for key, _, fmt in extra)] for r in rows]
    widths = [max(len(line[i]) for line in [header, *body]) for i in range(len(header))]

    def fmt(line: list[str]) -> str:
        cells = [line[0].ljust(widths[0]), line[1].ljust(widths[1])]
        cells += [cell.rjust(w) for cell, w in zip(line[2:], widths[2:], strict=True)]
        return "  ".join(cells).rstrip()

    lines = []
    if meta:
        rounds = f" · {meta['rounds']} rounds per case" if isinstance(meta.get("rounds"), int) else ""
        lines.append(f"{meta.get('device', '?')} · PyTorch {meta.get('torch', '?')} · CUDA {meta.get('cuda', '?')}"
                     f" · {meta.get('date', '?')}{rounds}")
    lines += [fmt(header), "  ".join("-" * w for w in widths)]
    lines += [fmt(line) for line in body]
    return "\n".join(lines)


def show_reference_figures(path: str | Path | None = None) -> None:
    """Print the reference table, or a note saying how to make it when the file does not exist yet."""
    try:
        data = load_reference_figures(path)
    except ValueError as exc:
        print(f"Reference figures: {exc}")
        return
    if data is None:
        print("Reference figures: not measured yet. A maintainer makes them on a CUDA host with\n"
              "  python benchmarks/timing_comparison.py\n"
              "which writes course_utils/data/reference_figures.json.")
        return
    print("Reference figures (rates: higher is better; course/raw near 1.00 means the course's timing "
          "agrees with raw CUDA events):")
    print(format_reference_table(data["rows"], data["meta"]))
