"""Made-up profiler traces for the tests of course_utils.performance.traces (tests/test_traces.py) and of
notebook 07's profile-reading checker (tests/test_answers_07.py). Not a test module: pytest does not collect it."""

from __future__ import annotations

import json
from pathlib import Path


def write_trace(tmp_path: Path, events: list[dict]) -> Path:
    """A Chrome trace file holding ``events``, as the profiler writes one."""
    path = tmp_path / "trace.json"
    path.write_text(json.dumps({"traceEvents": events}))
    return path


def op(name: str, ts: float, dur: float, cat: str = "cpu_op", tid: int = 1) -> dict:
    """One complete event ("X") of the trace: an op, a kernel or a step, by its category."""
    return {"ph": "X", "cat": cat, "name": name, "pid": 1, "tid": tid, "ts": ts, "dur": dur}
