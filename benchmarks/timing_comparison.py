#!/usr/bin/env python3
"""Is the course's timing right? The same work timed three ways, side by side, on a CUDA GPU.

For matmuls (fp32, TF32, bf16 at 4096² and 8192²), host↔device copies (pinned and pageable, 256 MiB)
and a device-to-device copy, it measures

- ``course_utils.benchmark`` (what the notebooks use),
- ``torch.utils.benchmark.Timer.blocked_autorange`` (PyTorch's own benchmark tool),
- raw CUDA events around a loop of calls (the reference),

prints one table (rates, and course/raw, which should lie within 0.95–1.05; `measure` says how the
rounds are paired) and writes it, with the device name, the PyTorch and CUDA versions and the date, to a
JSON file that appendix 90 shows as its "reference figures".

    python benchmarks/timing_comparison.py                       # writes course_utils/data/reference_figures.json
    python benchmarks/timing_comparison.py --output /tmp/t.json --sizes 4096 --strict
    python benchmarks/timing_comparison.py --output /tmp/t.json --only bf16 pageable --rounds 21

Exits with status 2 and a message on a machine without a CUDA GPU; with ``--strict``, exits 1 when a
course/raw ratio is outside 1 ± tolerance.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import platform
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
try:
    import course_utils  # noqa: F401
except ImportError:  # run from a checkout without `pip install -e .`
    sys.path.insert(0, str(ROOT))

from course_utils.hardware.reference_figures import format_reference_table  # noqa: E402
from course_utils.timing import benchmark  # noqa: E402

DEFAULT_OUTPUT = ROOT / "course_utils" / "data" / "reference_figures.json"
MIB = 2**20
DEFAULT_ROUNDS = 11
"""Rounds per case: each round times the case once with each of the three methods."""


@dataclass
class Case:
    """One thing to time: ``setup()`` allocates and returns the callable; ``work`` units per call."""

    name: str
    unit: str  # "TFLOP/s" or "GB/s"
    work: float  # FLOPs or bytes per call
    setup: Callable[[], Callable[[], Any]]
    precision: str | None = None  # torch.backends.cuda.matmul.fp32_precision during the case

    def rate(self, seconds: float) -> float:
        scale = 1e12 if self.unit.startswith("T") else 1e9
        return self.work / seconds / scale


@contextlib.contextmanager
def fp32_precision(value: str | None) -> Iterator[None]:
    """Set ``torch.backends.cuda.matmul.fp32_precision`` (``'tf32'`` or ``'ieee'``) and restore it.

    The current API only: the legacy ``allow_tf32`` flag is never read or written (mixing the two
    raises a RuntimeError).
    """
    if value is None:
        yield
        return
    matmul = torch.backends.cuda.matmul
    old = matmul.fp32_precision
    matmul.fp32_precision = value
    try:
        yield
    finally:
        matmul.fp32_precision = old


def _randn(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    gen = torch.Generator().manual_seed(0)
    return torch.randn(shape, generator=gen, dtype=torch.float32).to(device=device, dtype=dtype)


def _matmul_case(n: int, label: str, dtype: torch.dtype, precision: str | None,
                 device: torch.device) -> Case:
    def setup() -> Callable[[], Any]:
        a, b = _randn((n, n), dtype, device), _randn((n, n), dtype, device)
        return lambda: a @ b

    return Case(f"matmul {label} {n}²", "TFLOP/s", 2.0 * n**3, setup, precision)


def _copy_case(name: str, nbytes: int, make: Callable[[], tuple[torch.Tensor, torch.Tensor, bool]],
               work: float | None = None) -> Case:
    def setup() -> Callable[[], Any]:
        dst, src, non_blocking = make()
        return lambda: dst.copy_(src, non_blocking=non_blocking)

    return Case(name, "GB/s", float(work if work is not None else nbytes), setup)


def make_cases(device: str | torch.device, sizes: Sequence[int] = (4096, 8192),
               copy_bytes: int = 256 * MIB) -> list[Case]:
    """The cases, for ``device``. Host↔device copies only on CUDA (pinned memory needs it); the
    device-to-device copy counts bytes read plus bytes written."""
    dev = torch.device(device)
    cases: list[Case] = []
    for n in sizes:
        cases += [_matmul_case(n, "fp32", torch.float32, "ieee", dev),
                  _matmul_case(n, "TF32", torch.float32, "tf32", dev),
                  _matmul_case(n, "bf16", torch.bfloat16, None, dev)]
    count = copy_bytes // 4
    mib = f"{copy_bytes / MIB:g} MiB"
    if dev.type == "cuda":
        def h2d(pinned: bool) -> Callable[[], tuple[torch.Tensor, torch.Tensor, bool]]:
            def make() -> tuple[torch.Tensor, torch.Tensor, bool]:
                src = torch.ones(count, pin_memory=pinned)
                return torch.empty(count, device=dev), src, pinned
            return make

        def d2h(pinned: bool) -> Callable[[], tuple[torch.Tensor, torch.Tensor, bool]]:
            def make() -> tuple[torch.Tensor, torch.Tensor, bool]:
                dst = torch.empty(count, pin_memory=pinned)
                return dst, torch.ones(count, device=dev), pinned
            return make

        for pinned in (True, False):
            kind = "pinned" if pinned else "pageable"
            cases.append(_copy_case(f"host→device {kind} {mib}", copy_bytes, h2d(pinned)))
            cases.append(_copy_case(f"device→host {kind} {mib}", copy_bytes, d2h(pinned)))

    def d2d() -> tuple[torch.Tensor, torch.Tensor, bool]:
        return torch.empty(count, device=dev), torch.ones(count, device=dev), False

    cases.append(_copy_case(f"device→device {mib} (read+write)", copy_bytes, d2d, work=2.0 * copy_bytes))
    return cases


def _sync(dev: torch.device) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def time_raw(fn: Callable[[], Any], device: str | torch.device, warmup: int = 3, repeat: int = 10,
             min_sample_time: float = 0.02) -> float:
    """Median seconds per call with raw CUDA events around loops of calls (``perf_counter`` off CUDA)."""
    dev = torch.device(device)
    for _ in range(warmup):
        fn()
    _sync(dev)

    def sample(inner: int) -> float:
        if dev.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(inner):
                fn()
            end.record()
            end.synchronize()
            return start.elapsed_time(end) / 1e3 / inner
        t0 = time.perf_counter()
        for _ in range(inner):
            fn()
        return (time.perf_counter() - t0) / inner

    one = sample(1)
    inner = max(1, math.ceil(min_sample_time / max(one, 1e-9)))
    return statistics.median(sample(inner) for _ in range(repeat))


def time_torch_benchmark(fn: Callable[[], Any], min_run_time: float = 0.3) -> float:
    """Median seconds per call from ``torch.utils.benchmark`` (it synchronises the accelerator)."""
    from torch.utils.benchmark import Timer

    return Timer(stmt="fn()", globals={"fn": fn}).blocked_autorange(min_run_time=min_run_time).median


class ClockMonitor:
    """The GPU's SM clock and power draw while a case runs, sampled by ``nvidia-smi`` every 100 ms.

    Why it is in the table: under a heavy matmul an H200 reaches its power limit and lowers its clock,
    so the same kernel runs faster one second and slower the next. The clock range beside each row
    shows how much the GPU itself varied while the three timers took their turns. Without
    ``nvidia-smi`` (or for a non-CUDA device) the monitor records nothing and the row has no clock figures.
    """

    QUERY = "uuid,clocks.sm,power.draw"

    def __init__(self, device: torch.device, interval_ms: int = 100) -> None:
        smi = shutil.which("nvidia-smi")
        self._cmd = None if smi is None or device.type != "cuda" else [
            smi, f"--query-gpu={self.QUERY}", "--format=csv,noheader,nounits", f"-lms={interval_ms}"]
        self._uuid = _gpu_uuid(device) if self._cmd else None
        self._proc: subprocess.Popen[str] | None = None
        self.samples: list[tuple[float, float]] = []

    def __enter__(self) -> ClockMonitor:
        if self._cmd is not None:
            with contextlib.suppress(OSError):
                self._proc = subprocess.Popen(self._cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                              text=True)
        return self

    def __exit__(self, *exc: object) -> None:
        if self._proc is None:
            return
        self._proc.terminate()
        try:
            out, _ = self._proc.communicate(timeout=5)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            out, _ = self._proc.communicate()
        self.samples = parse_smi_samples(out, self._uuid)

    def summary(self) -> dict[str, Any]:
        """``{"sm_clock_mhz": [min, max], "power_w_max": w}``, or ``{}`` when nothing was sampled."""
        if not self.samples:
            return {}
        clocks = [c for c, _ in self.samples]
        return {"sm_clock_mhz": [min(clocks), max(clocks)], "power_w_max": max(p for _, p in self.samples)}


def _gpu_uuid(device: torch.device) -> str | None:
    """The GPU's UUID without nvidia-smi's ``GPU-`` prefix, or None when this PyTorch does not say."""
    uuid = getattr(torch.cuda.get_device_properties(device), "uuid", None)
    return str(uuid).removeprefix("GPU-").lower() if uuid is not None else None


def parse_smi_samples(text: str, uuid: str | None = None) -> list[tuple[float, float]]:
    """(SM clock in MHz, power in W) from ``nvidia-smi --query-gpu=uuid,clocks.sm,power.draw`` CSV lines.

    Only the GPU with ``uuid`` is kept; without a uuid (or when no line has it), all lines are kept if
    they come from a single GPU, and none otherwise (they could not be told apart). Lines that are not
    a uuid and two numbers (``[N/A]``, a half-written last line) are skipped.
    """
    rows = []
    for line in text.splitlines():
        parts = [part.strip() for part in line.split(",")]
        if len(parts) != 3:
            continue
        try:
            rows.append((parts[0].removeprefix("GPU-").lower(), float(parts[1]), float(parts[2])))
        except ValueError:
            continue
    if uuid is not None and not any(r[0] == uuid for r in rows):
        uuid = None
    if uuid is None and len({r[0] for r in rows}) > 1:
        return []
    return [(clock, power) for gpu, clock, power in rows if uuid is None or gpu == uuid]


def measure(case: Case, device: str | torch.device, quick: bool = False, rounds: int | None = None
            ) -> dict[str, Any]:
    """Time ``case`` three ways; a row of the table (seconds and rates, and course/raw).

    The three methods take turns over several rounds, the order rotating each round. A method's
    figure is the median over its rounds; ``ratio`` is the median over rounds of course/raw *within
    the same round*. Pairing matters on a real GPU: its clock follows its power draw and temperature,
    and pageable copies follow the host's memory state, so consecutive seconds can differ by several
    percent. Comparing two timers that ran a second apart measures that drift; comparing them
    within a round cancels most of it. The per-round seconds are kept in the row (``rounds``).
    """
    dev = torch.device(device)
    if dev.type == "cuda" and dev.index is None:
        dev = torch.device("cuda", torch.cuda.current_device())
    repeat, min_time = (3, 0.002) if quick else (5, 0.02)
    rounds = rounds if rounds is not None else (1 if quick else DEFAULT_ROUNDS)
    if rounds < 1:
        raise ValueError(f"measure(): rounds must be >= 1, got {rounds}")
    with fp32_precision(case.precision):
        fn = case.setup()
        methods: dict[str, Callable[[], float]] = {
            "raw": lambda: time_raw(fn, dev, repeat=repeat, min_sample_time=min_time),
            "course": lambda: benchmark(fn, device=dev, repeat=repeat, min_sample_time=min_time).median,
            "torch_benchmark": lambda: time_torch_benchmark(fn, min_run_time=0.01 if quick else 0.1),
        }
        names = list(methods)
        samples: dict[str, list[float]] = {name: [] for name in names}
        with ClockMonitor(dev) as monitor:
            for r in range(rounds):
                for name in names[r % len(names):] + names[:r % len(names)]:
                    samples[name].append(methods[name]())
        methods.clear()  # drop the closures over the tensors before empty_cache
    if dev.type == "cuda":
        torch.cuda.empty_cache()
    seconds = {name: statistics.median(values) for name, values in samples.items()}
    paired = [raw / course for course, raw in zip(samples["course"], samples["raw"], strict=True)]
    row: dict[str, Any] = {"case": case.name, "unit": case.unit, "work": case.work}
    for key, value in seconds.items():
        row[f"{key}_s"] = value
        row[key] = case.rate(value)
    row["ratio"] = statistics.median(paired)  # course rate / raw rate, round by round
    row["ratio_range"] = [min(paired), max(paired)]
    row["rounds"] = samples
    row.update(monitor.summary())
    return row


def environment(device: str | torch.device) -> dict[str, Any]:
    """Device name, versions and date (UTC) for the JSON file's ``meta``."""
    dev = torch.device(device)
    name = torch.cuda.get_device_name(dev) if dev.type == "cuda" else platform.processor() or "cpu"
    return {
        "device": name,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "python": platform.python_version(),
        "date": datetime.now(timezone.utc).date().isoformat(),
        "script": "benchmarks/timing_comparison.py",
    }


def write_json(path: str | Path, rows: list[dict[str, Any]], meta: dict[str, Any]) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"meta": meta, "rows": rows}, indent=1, ensure_ascii=False) + "\n",
                    encoding="utf-8")
    return path


def outliers(rows: Sequence[dict[str, Any]], tolerance: float = 0.05) -> list[str]:
    """Names of the cases whose course/raw ratio is outside ``1 ± tolerance``."""
    return [r["case"] for r in rows if not (1 - tolerance <= r["ratio"] <= 1 + tolerance)]


def run(device: str | torch.device, sizes: Sequence[int], copy_bytes: int, quick: bool = False,
        progress: Callable[[str], None] | None = None, rounds: int | None = None,
        only: Sequence[str] = ()) -> list[dict[str, Any]]:
    """Measure every case on ``device`` (those whose name contains one of ``only``, if given);
    ``progress`` is called with each case's name first."""
    dev = torch.device(device)
    if dev.type == "cuda":  # let the clocks ramp up before the first measured case
        a = _randn((4096, 4096), torch.float32, dev)
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < (0.1 if quick else 1.0):
            a @ a
        _sync(dev)
        del a
    rows = []
    for case in make_cases(dev, sizes, copy_bytes):
        if only and not any(part in case.name for part in only):
            continue
        if progress is not None:
            progress(case.name)
        rows.append(measure(case, dev, quick=quick, rounds=rounds))
    return rows


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--output", type=Path, default=DEFAULT_OUTPUT,
                        help="JSON file to write (default: course_utils/data/reference_figures.json)")
    parser.add_argument("--sizes", type=int, nargs="+", default=[4096, 8192], help="matmul sizes n (n × n)")
    parser.add_argument("--copy-mib", type=float, default=256, help="size of each copy in MiB (default 256)")
    parser.add_argument("--device", default="cuda", help="CUDA device (default: cuda, the current one)")
    parser.add_argument("--rounds", type=int, default=DEFAULT_ROUNDS,
                        help=f"rounds per case, each timing it once per method (default {DEFAULT_ROUNDS})")
    parser.add_argument("--only", nargs="+", default=[], metavar="TEXT",
                        help="time only the cases whose name contains one of these (e.g. bf16 pageable)")
    parser.add_argument("--tolerance", type=float, default=0.05, help="allowed |course/raw - 1| (0.05)")
    parser.add_argument("--strict", action="store_true", help="exit 1 when a ratio is out of tolerance")
    args = parser.parse_args(argv)

    if not torch.cuda.is_available() or torch.device(args.device).type != "cuda":
        why = ("this PyTorch has no CUDA support" if torch.version.cuda is None
               else "no CUDA GPU is visible (check the driver and CUDA_VISIBLE_DEVICES)")
        if torch.device(args.device).type != "cuda":
            why = f"--device must be a CUDA device, got {args.device!r}"
        print(f"timing_comparison.py needs a CUDA GPU: {why}. Run it on a GPU host; the reference figures "
              f"in {args.output} are left as they are.", file=sys.stderr)
        return 2

    device = torch.device(args.device)
    if args.rounds < 1:
        parser.error(f"--rounds must be >= 1, got {args.rounds}")
    rows = run(device, args.sizes, int(args.copy_mib * MIB), rounds=args.rounds, only=args.only,
               progress=lambda name: print(f"  timing {name} ...", file=sys.stderr, flush=True))
    if not rows:
        parser.error(f"--only {' '.join(args.only)} matches no case")
    meta = {**environment(device), "rounds": args.rounds}
    print(format_reference_table(rows, meta))
    bad = outliers(rows, args.tolerance)
    if bad:
        print(f"\ncourse/raw outside 1 ± {args.tolerance}: {', '.join(bad)}", file=sys.stderr)
    path = write_json(args.output, rows, meta)
    print(f"\nwritten: {path}")
    return 1 if (bad and args.strict) else 0


if __name__ == "__main__":
    sys.exit(main())
