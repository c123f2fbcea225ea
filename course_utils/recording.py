"""Every notebook (its setup cell loads the ``%%gpu`` magic): recorded GPU outputs. A cell that needs a
GPU runs for real where there is one, and elsewhere shows what it printed on a real GPU host, labelled
with the device, PyTorch and CUDA versions and the date.

In a notebook (after ``%load_ext course_utils``)::

    %%gpu 01-async-timing
    x = torch.randn(8192, 8192, device="cuda")
    ...

    %%gpu 04-dp-batch-split --gpus 2
    ...

- With at least that many CUDA GPUs visible, the cell's code runs as usual.
- Otherwise the cell shows the stored recording ``course_utils/recorded/<name>.json``: a banner naming
  the hardware and software it was recorded on, then the outputs (text, plots, error messages) in order.
  A missing or unreadable recording shows a note saying so; it never raises.
- A recorded stream (stdout or stderr) longer than `FOLD_LINES` lines, a compiler's log for instance, is shown
  folded: its first and last lines, and how many are left out (``load_recording(name)`` has them all). A cell
  that runs for real folds its long streams too, as they come: the first `FOLD_LINES` lines as they are
  written, then a line saying how many more there were, and the last three (``last_run(name)`` has them all).
  Only what goes through ``sys.stdout``/``sys.stderr`` is folded; a subprocess's or a C++ library's own
  writes to the terminal are not.
- With ``COURSE_RECORD=1`` in the environment (``make record`` on a GPU host), a cell that runs for
  real also writes its outputs to its recording file. ``COURSE_RECORDINGS_DIR`` moves that folder.
- With ``COURSE_GPU_CELLS=name,name,...`` set, only the ``%%gpu`` cells named there run on a GPU host; the
  others show their recordings (``make record GPU_CELLS=...`` re-records a few cells of a notebook).
- A module or name that moves after a cell was recorded (``course_utils.gpus`` became
  ``course_utils.subprocesses``, say) is noted in the recording with `note_rename`: the recording still
  matches the cell's code with the new names put back (`recorded_from`), and its banner says what was
  renamed since, until ``make record`` re-makes it.
- ``%%gpu NAME --slow "WHY"`` marks a cell that takes minutes even on a large GPU (``WHY`` says how long
  and why). On a GPU it shows its recording too, and runs only when asked: ``COURSE_SLOW_CELLS=1`` in the
  environment (``%env COURSE_SLOW_CELLS=1`` in the notebook, ``make gpu-check SLOW=1``), or its name in
  ``COURSE_GPU_CELLS``.
- ``%%gpu NAME --needs-gib N`` marks a cell whose point needs about N GiB of GPU memory (a Colab T4 has about
  15). On a GPU where this process can allocate less (what the driver reports free, plus what its own allocator
  holds unused), the cell shows its recording, with a banner saying how much it needs and how much is free;
  named in ``COURSE_GPU_CELLS``, it runs anyway.

Rule for notebook authors: a ``%%gpu`` cell is a leaf. Later cells must not use names it defines,
because on a CPU-only machine its code does not run.
"""

from __future__ import annotations

import ast
import hashlib
import html
import io
import json
import linecache
import math
import os
import platform
import re
import shlex
import sys
from collections import deque
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, NamedTuple

from .language import localize

__all__ = [
    "PACKAGE_FOLDER",
    "GpuLine",
    "Recording",
    "RecordingError",
    "cell_digest",
    "folded",
    "gpu_cell_magic",
    "hardware_meta",
    "last_run",
    "load_recording",
    "not_recorded_note",
    "note_rename",
    "parse_gpu_line",
    "recorded_from",
    "recording_label",
    "recordings_dir",
    "run_or_replay",
    "save_recording",
    "scrub_paths",
    "show_recording",
]

RECORD_ENV = "COURSE_RECORD"
DIR_ENV = "COURSE_RECORDINGS_DIR"
ONLY_ENV = "COURSE_GPU_CELLS"
SLOW_ENV = "COURSE_SLOW_CELLS"
FOLD_LINES = 40
"""A recorded stream longer than this is shown folded (`show_recording`)."""
_NAME = re.compile(r"^[a-z0-9][a-z0-9_.-]{0,80}$")
_FILENAME = "<gpu cell>"
_WIDGET_MIME = "application/vnd.jupyter.widget-view+json"


class RecordingError(RuntimeError):
    """A recording file is missing, unreadable or not in the expected format."""


@dataclass
class Recording:
    """One cell's recorded outputs. ``outputs`` are nbformat-like dicts in the order they appeared."""

    name: str
    meta: dict[str, Any]
    outputs: list[dict[str, Any]] = field(default_factory=list)


def recordings_dir() -> Path:
    """Folder of the recording files: ``$COURSE_RECORDINGS_DIR`` or the package's ``recorded/``."""
    env = os.environ.get(DIR_ENV, "").strip()
    return Path(env) if env else Path(__file__).with_name("recorded")


def _check_name(name: str) -> str:
    if not isinstance(name, str) or not _NAME.match(name):
        raise ValueError(f"recording name {name!r}: use lower-case letters, digits, '-', '_' or '.', "
                         "starting with a letter or digit, e.g. '01-async-timing'")
    return name


def _path(name: str) -> Path:
    return recordings_dir() / f"{_check_name(name)}.json"


def cell_digest(source: str) -> str:
    """Short hash of a cell's code (trailing blanks ignored), stored to spot stale recordings."""
    norm = "\n".join(line.rstrip() for line in source.strip().splitlines())
    return hashlib.sha256(norm.encode()).hexdigest()[:16]


def recorded_from(meta: dict[str, Any], source: str) -> bool:
    """Whether a recording's ``meta`` was made from ``source``: the digests match, or they match once every
    rename noted since (`note_rename`) is undone in ``source``."""
    if meta.get("cell_digest") == cell_digest(source):
        return True
    renames = meta.get("renamed_since", [])
    if not renames:
        return False
    for old, new in reversed([(r["old"], r["new"]) for r in renames]):
        source = source.replace(new, old)
    return meta.get("cell_digest") == cell_digest(source)


def note_rename(name: str, renames: Sequence[tuple[str, str]], source: str, date: str | None = None) -> Path:
    """Note in recording ``name`` that each ``(old, new)`` of ``renames`` is now called ``new`` (a moved module,
    a renamed function): a maintainer's step when code moves and no GPU is at hand to re-record. ``source``
    is the cell's code now; it must differ from what was recorded by these renames (and earlier noted ones)
    only, else `RecordingError`. The banner then says what was renamed since; ``make record`` drops the note."""
    if not renames:
        raise ValueError("note_rename: give at least one (old, new) pair")
    rec = load_recording(name)
    meta = dict(rec.meta)
    on = date or datetime.now(timezone.utc).date().isoformat()
    meta["renamed_since"] = [*meta.get("renamed_since", []), *({"old": o, "new": n, "on": on} for o, n in renames)]
    if not recorded_from(meta, source):
        raise RecordingError(f"{name}: the cell's code differs from what was recorded by more than the renames "
                             f"{list(renames)}; re-record it with `make record` on a GPU host")
    return save_recording(name, rec.outputs, meta)


def load_recording(name: str) -> Recording:
    """Read ``<recordings_dir>/<name>.json``. Raises `RecordingError` saying what is wrong."""
    path = _path(name)
    if not path.is_file():
        raise RecordingError(f"no recording named {name!r} (expected the file {path.name} in "
                             "course_utils/recorded/; a maintainer makes it with `make record` on a GPU host)")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        meta, outputs = data["meta"], data["outputs"]
        if not isinstance(meta, dict) or not isinstance(outputs, list):
            raise TypeError("'meta' must be an object and 'outputs' a list")
        for out in outputs:
            if out.get("output_type") not in ("stream", "display_data", "error"):
                raise TypeError(f"unknown output type {out.get('output_type')!r}")
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise RecordingError(f"the recording {path.name} is unreadable ({type(exc).__name__}: {exc}); "
                             "re-create it with `make record` on a GPU host") from None
    return Recording(name=name, meta=meta, outputs=outputs)


_LIVE: dict[str, Recording] = {}
"""The streams of each ``%%gpu`` cell that ran for real in this process, and ended without an error, by name."""


def last_run(name: str) -> Recording:
    """The outputs of the ``%%gpu`` cell ``name``: of its last run in this process if it ran here for real and
    ended without an error (its streams, unfolded; ``meta["live"]`` is True), else its recording
    (`load_recording`, which may raise `RecordingError`)."""
    return _LIVE[name] if name in _LIVE else load_recording(name)


def _live_meta() -> dict[str, Any]:
    """A live run's label: the GPU and PyTorch (no driver query: it runs after every live cell)."""
    import torch

    return {"device": torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu",
            "torch": torch.__version__, "live": True}


def hardware_meta(gpus: int = 1) -> dict[str, Any]:
    """What a recording is labelled with: GPU name and count, PyTorch, CUDA, driver, Python, date (UTC)."""
    import torch

    from .environment import driver_version

    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    return {
        "device": torch.cuda.get_device_name(0) if count else "cpu",
        "gpu_count": count,
        "gpus_required": gpus,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "driver": driver_version() if count else None,
        "python": platform.python_version(),
        "date": datetime.now(timezone.utc).date().isoformat(),
    }


PACKAGE_FOLDER = re.compile(r"(/[^\s\"':\x1b]+)?/(site|dist)-packages/")
"""An installed package's folder on the machine that ran the code (tools/refresh_notebooks.py uses it too)."""


def _path_folders(folders: list[str] | None) -> re.Pattern[str] | None:
    """A pattern of the folders on the Python path (``sys.path``: ``PYTHONPATH``'s folders, a ``pip install
    --target`` folder, the repository), longest first, each with the slash after it."""
    names = sorted({f.rstrip("/") for f in (sys.path if folders is None else folders)
                    if f and os.path.isabs(f) and f.rstrip("/")}, key=len, reverse=True)
    return re.compile("|".join(re.escape(n) + "/" for n in names)) if names else None


def scrub_paths(outputs: list[dict[str, Any]], folders: list[str] | None = None) -> list[dict[str, Any]]:
    """``outputs`` with the GPU host's package folders left out of stream text and tracebacks: a warning that
    names ``/opt/venv/lib/python3.12/site-packages/torch/x.py`` is stored as naming ``torch/x.py``, and one from
    a folder on the Python path (``folders``, default ``sys.path``: ``/tmp/site/torchao/x.py`` where packages
    were installed with ``pip install --target /tmp/site``) as ``torchao/x.py``, so students never read the
    folders of the machine that recorded."""
    on_path = _path_folders(folders)

    def scrub(text: str) -> str:
        text = PACKAGE_FOLDER.sub("", text)
        return on_path.sub("", text) if on_path else text

    clean = json.loads(json.dumps(outputs))
    for out in clean:
        if isinstance(out.get("text"), str):
            out["text"] = scrub(out["text"])
        if isinstance(out.get("traceback"), list):
            out["traceback"] = [scrub(line) for line in out["traceback"]]
    return clean


def save_recording(name: str, outputs: list[dict[str, Any]], meta: dict[str, Any]) -> Path:
    """Write a recording atomically (temporary file, then rename), package folders left out (`scrub_paths`).
    Returns its path."""
    outputs = scrub_paths(outputs)
    path = _path(name)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps({"meta": meta, "outputs": outputs}, indent=1, ensure_ascii=False) + "\n",
                   encoding="utf-8")
    os.replace(tmp, path)
    return path


def recording_label(meta: dict[str, Any]) -> str:
    """``'2× NVIDIA H200 · PyTorch 2.11.0+cu130 · CUDA 13.0 · driver 580.159.04 · 2026-12-02'`` from a
    recording's meta (recordings made before the driver was noted leave it out)."""
    count = meta.get("gpu_count", 1)
    parts = [f"{count}× {meta.get('device', 'unknown GPU')}", f"PyTorch {meta.get('torch', '?')}"]
    if meta.get("cuda"):
        parts.append(f"CUDA {meta['cuda']}")
    if meta.get("driver"):
        parts.append(f"driver {meta['driver']}")
    parts.append(str(meta.get("date", "unknown date")))
    return " · ".join(parts)


def _have_gpus() -> int:
    from .devices import cuda_device_count

    return cuda_device_count()


def _only_these() -> set[str] | None:
    """The names in ``$COURSE_GPU_CELLS`` (the only ``%%gpu`` cells that run), or None when it is unset."""
    names = os.environ.get(ONLY_ENV, "").strip()
    return {n.strip() for n in names.split(",") if n.strip()} if names else None


def _recording_run() -> bool:
    """Whether this is a recording run (``COURSE_RECORD=1``, `make record`)."""
    return os.environ.get(RECORD_ENV, "").strip().lower() in ("1", "true", "yes")


def _slow_cells_wanted() -> bool:
    return os.environ.get(SLOW_ENV, "").strip().lower() in ("1", "true", "yes")


def _skips_slow(name: str, slow: str) -> bool:
    """Whether a ``--slow`` cell stays a recording here: nobody asked for slow cells, or for this one by name."""
    only = _only_these()
    return bool(slow) and not _slow_cells_wanted() and not (only is not None and name in only)


def _usable_gib(gpus: int = 1) -> float:
    """GiB this process can still allocate on each of CUDA GPUs 0 … ``gpus`` − 1, the least of them: what the
    driver reports free, plus what this process's caching allocator holds unused (reserved, not allocated).
    An upper bound: cached blocks that are partly in use cannot be handed out (a plan's margin covers that)."""
    import torch

    usable = []
    for i in range(gpus):
        free, _ = torch.cuda.mem_get_info(i)
        usable.append(free + torch.cuda.memory_reserved(i) - torch.cuda.memory_allocated(i))
    return min(usable) / 2**30


def _too_little_memory(name: str, needs_gib: float, gpus: int = 1) -> float | None:
    """The GiB usable here (rounded down to 0.1) when a ``--needs-gib`` cell has fewer than it needs, else None.
    A recording run, or the cell named in ``COURSE_GPU_CELLS``, always runs it: a maintainer asked for it, and a
    GPU too small for it must fail loudly rather than keep an old recording."""
    only = _only_these()
    if needs_gib <= 0 or _recording_run() or (only is not None and name in only):
        return None
    usable = math.floor(_usable_gib(gpus) * 10) / 10
    return usable if usable < needs_gib else None


def _why_not_here(gpus: int, have: int, name: str = "", slow: str = "", needs_gib: float = 0.0,
                  usable_gib: float | None = None) -> str:
    only = _only_these()
    if only is not None and name not in only and have >= gpus:
        return f"{ONLY_ENV} leaves this cell out"
    if have >= gpus and _skips_slow(name, slow):
        return (f"this cell {slow.rstrip('.')}, so it runs only when asked: run `%env {SLOW_ENV}=1` "
                "in this notebook, then this cell again")
    if have >= gpus and usable_gib is not None and usable_gib < needs_gib:
        return f"this cell needs about {needs_gib:g} GiB of GPU memory free; this GPU has {usable_gib:.1f} GiB free"
    if gpus == 1:
        return "this notebook ran without a CUDA GPU"
    return f"this cell needs {gpus} CUDA GPUs; this notebook ran with {have or 'none'}"


def _banner(text: str, colour: str) -> None:
    from IPython.display import publish_display_data

    text = localize(text)  # in the notebook's language (course_utils.language)
    publish_display_data({
        "text/plain": text,
        "text/html": (f'<div style="border-left:4px solid {colour};padding:4px 8px;margin:2px 0;'
                      f'font-size:90%">{html.escape(text)}</div>'),
    })


def _hardware(gpus: int) -> str:
    if gpus == 1:
        return "a machine with an NVIDIA GPU (on Colab: a GPU runtime)"
    return f"a machine with {gpus} NVIDIA GPUs (a lab or cloud server; Colab gives one)"


def not_recorded_note(name: str, gpus: int, have: int, shows: str = "", why: str = "") -> str:
    """What a student reads where a ``%%gpu`` cell has no usable recording: why it did not run (``why``, else
    the GPU count), what it would show, and where it runs. (How maintainers make recordings is in the README.)"""
    would = f"it shows {shows.rstrip('.')}" if shows else "it runs the code above"
    return (f"Not run: {why or _why_not_here(gpus, have)}. On {_hardware(gpus)} {would}. "
            f"No output of this cell ({name}) from such a machine comes with the course yet.")


def folded(text: str, name: str, stream: str = "stdout") -> str:
    """``text`` as `show_recording` shows it: whole up to `FOLD_LINES` lines, else its first 5 and last 3 lines
    around a line saying how many are left out and where they are."""
    lines = text.splitlines(keepends=True)
    if len(lines) <= FOLD_LINES:
        return text
    return "".join(lines[:5]) + _fold_line(len(lines) - 8, f"the recorded {stream}",
                                           f"load_recording({name!r})") + "".join(lines[-3:])


def _fold_line(left_out: int, stream: str, reader: str) -> str:
    """The line that stands for the ``left_out`` lines of ``stream`` a fold leaves out, and where they all are."""
    return f"[... {left_out} more lines of {stream}; course_utils.recording.{reader}.outputs has them all ...]\n"


def show_recording(name: str, gpus: int = 1, shows: str = "", slow: str = "", needs_gib: float = 0.0,
                   usable_gib: float | None = None) -> None:
    """Display a recording with its label, or a note when it is missing or unreadable. Never raises."""
    why = _why_not_here(gpus, _have_gpus(), name, slow, needs_gib, usable_gib)
    try:
        rec = load_recording(name)
    except (RecordingError, ValueError):
        _banner(not_recorded_note(name, gpus, _have_gpus(), shows, why), "#c0392b")
        return
    renamed = "; ".join(f"{r['old']} is now {r['new']}" for r in rec.meta.get("renamed_since", []))
    since = f" (renamed since: {renamed})" if renamed else ""
    _banner(f"Recorded output ({why}), recorded on {recording_label(rec.meta)}{since}:", "#2e86c1")
    _replay(rec.outputs, name)


def _replay(outputs: list[dict[str, Any]], name: str = "", fold: bool = True) -> None:
    """Show outputs as the cell that made them did: streams (folded, when ``fold``), displays, errors.
    Both paths use it: a recording shown on a machine without the GPUs, and what a recording run captured."""
    from IPython.display import publish_display_data

    for out in outputs:
        kind = out.get("output_type")
        if kind == "stream":
            stream = sys.stderr if out.get("name") == "stderr" else sys.stdout
            text = out.get("text", "")
            stream.write(folded(text, name, str(out.get("name", "stdout"))) if fold else text)
            stream.flush()
        elif kind == "display_data":
            publish_display_data(out.get("data", {}), out.get("metadata", {}))
        elif kind == "error" and fold:
            sys.stderr.write(f"{out.get('ename', 'Error')}: {out.get('evalue', '')}\n"
                             "(this error was raised on the GPU host, as the lesson intends)\n")
            sys.stderr.flush()


class _Sink(io.TextIOBase):
    """A text stream that appends what is written to a shared, ordered list of outputs."""

    def __init__(self, name: str, outputs: list[dict[str, Any]]) -> None:
        self.name_ = name
        self.outputs = outputs
        self.after: Any = None  # once the cell has ended: where a late write goes (a log handler made in the cell)

    def writable(self) -> bool:
        return True

    def write(self, text: str) -> int:
        if self.after is not None:
            self.after.write(text)
            return len(text)
        if text:
            last = self.outputs[-1] if self.outputs else None
            if last and last["output_type"] == "stream" and last["name"] == self.name_:
                last["text"] += text
            else:
                self.outputs.append({"output_type": "stream", "name": self.name_, "text": text})
        return len(text)


class _FoldingStream(_Sink):
    """A live cell's stream: it keeps everything in ``outputs`` (as `_Sink`), and shows it on ``target`` as it
    comes until `FOLD_LINES` lines have gone out; the rest is held back (`end` shows how much, and its last lines)."""

    SHOWN_AT_END = 3  # lines of what was held back, shown when the cell ends

    def __init__(self, name: str, target: Any, outputs: list[dict[str, Any]]) -> None:
        super().__init__(name, outputs)
        self.target = target
        self.lines_out = self.lines_held = 0
        self.tail: deque[str] = deque(maxlen=self.SHOWN_AT_END + 2)  # the last lines held back, the open one too

    def write(self, text: str) -> int:
        size = super().write(text)
        if self.after is not None:  # the cell has ended: the text went straight through
            return size
        while text and self.lines_out < FOLD_LINES:
            line, newline, text = text.partition("\n")
            self.target.write(line + newline)
            self.lines_out += bool(newline)
        for part in text.splitlines(keepends=True):  # lines end at "\n" only: "\r" rewrites one line
            if self.tail and not self.tail[-1].endswith("\n"):
                self.tail[-1] += part
            else:
                self.tail.append(part)
            self.lines_held += part.endswith("\n")
        return size

    def flush(self) -> None:
        self.target.flush()

    def end(self, cell: str) -> None:
        """Show what was held back: all of it when it is a few lines, else how many lines, and the last ones;
        from now on, writes go straight to ``target``."""
        self.after = self.target
        pieces = list(self.tail)
        held = self.lines_held + (bool(pieces) and not pieces[-1].endswith("\n"))
        if held > self.SHOWN_AT_END + 1:  # the fold line stands for two lines or more
            self.target.write(_fold_line(held - self.SHOWN_AT_END, self.name_, f"last_run({cell!r})"))
            pieces = pieces[-self.SHOWN_AT_END:]
        self.target.write("".join(pieces))
        self.target.flush()


@contextmanager
def _folding(name: str, outputs: list[dict[str, Any]]) -> Iterator[None]:
    """Fold stdout and stderr while the block runs (`_FoldingStream`), keeping them whole in ``outputs``."""
    saved = sys.stdout, sys.stderr
    streams = _FoldingStream("stdout", saved[0], outputs), _FoldingStream("stderr", saved[1], outputs)
    sys.stdout, sys.stderr = streams
    try:
        yield
    finally:
        sys.stdout, sys.stderr = saved
        for stream in streams:
            stream.end(name)


@contextmanager
def _capture(outputs: list[dict[str, Any]]) -> Iterator[None]:
    """Capture stdout, stderr and rich displays, in order, into ``outputs``."""
    from IPython import get_ipython
    from IPython.core.displaypub import DisplayPublisher

    class _Publisher(DisplayPublisher):
        def publish(self, data: dict, metadata: dict | None = None, **kwargs: Any) -> None:  # type: ignore[override]
            if _WIDGET_MIME not in data:  # a live widget cannot be replayed from a file
                outputs.append({"output_type": "display_data", "data": dict(data),
                                "metadata": dict(metadata or {})})

        def clear_output(self, wait: bool = False) -> None:
            pass

    shell = get_ipython()
    saved = sys.stdout, sys.stderr, getattr(shell, "display_pub", None)
    sinks = _Sink("stdout", outputs), _Sink("stderr", outputs)
    sys.stdout, sys.stderr = sinks
    if shell is not None:
        shell.display_pub = _Publisher()
    try:
        yield
    finally:
        sinks[0].after, sinks[1].after = saved[0], saved[1]
        sys.stdout, sys.stderr = saved[0], saved[1]
        if shell is not None:
            shell.display_pub = saved[2]


def _execute(source: str, namespace: dict[str, Any]) -> None:
    """Run cell code like IPython would: magics transformed, the last expression displayed."""
    from IPython import get_ipython
    from IPython.display import display

    shell = get_ipython()
    code = shell.transform_cell(source) if shell is not None else source
    # Register the code so tracebacks and warnings can show its lines.
    linecache.cache[_FILENAME] = (len(code), None, code.splitlines(keepends=True), _FILENAME)
    tree = ast.parse(code, filename=_FILENAME)
    last = tree.body.pop() if tree.body and isinstance(tree.body[-1], ast.Expr) else None
    assert last is None or isinstance(last, ast.Expr)
    exec(compile(tree, _FILENAME, "exec"), namespace)
    if last is not None:
        value = eval(compile(ast.Expression(last.value), _FILENAME, "eval"), namespace)
        plt = sys.modules.get("matplotlib.pyplot")
        open_figure = plt is not None and getattr(value, "number", None) in plt.get_fignums()
        if value is not None and not open_figure:  # open figures are shown by _show_new_figures
            display(value)


def _show_new_figures(before: set[int]) -> None:
    """Display and close the matplotlib figures the cell opened, so they are part of its outputs."""
    plt = sys.modules.get("matplotlib.pyplot")
    if plt is None:
        return
    from IPython.display import display

    for num in plt.get_fignums():
        if num not in before:
            fig = plt.figure(num)
            display(fig)
            plt.close(fig)


def run_or_replay(name: str, source: str, namespace: dict[str, Any], gpus: int = 1, shows: str = "",
                  slow: str = "", needs_gib: float = 0.0) -> None:
    """Run ``source`` in ``namespace`` when ``gpus`` CUDA GPUs are visible, else show its recording (or,
    without one, a note saying what the cell ``shows``). A ``slow`` cell (its text says why) runs only when
    asked for (``COURSE_SLOW_CELLS=1``, or its name in ``COURSE_GPU_CELLS``) and otherwise shows its recording.
    A cell that ``needs_gib`` GiB of GPU memory shows its recording where fewer are usable (unless named there).

    With ``COURSE_RECORD=1`` set, a real run also saves the outputs as the recording ``name``.
    Errors raised by the code are re-raised after its outputs are shown (and recorded).
    """
    _check_name(name)
    if gpus < 1:
        raise ValueError(f"%%gpu {name}: --gpus must be at least 1, got {gpus}")
    only = _only_these()
    if _have_gpus() < gpus or (only is not None and name not in only) or _skips_slow(name, slow):
        show_recording(name, gpus, shows, slow)
        return
    usable = _too_little_memory(name, needs_gib, gpus)
    if usable is not None:
        show_recording(name, gpus, shows, slow, needs_gib, usable)
        return
    plt = sys.modules.get("matplotlib.pyplot")
    before = set(plt.get_fignums()) if plt is not None else set()
    _LIVE.pop(name, None)  # from now on, this run (if it ends well) or the recording
    if not _recording_run():
        streams: list[dict[str, Any]] = []
        with _folding(name, streams):
            _execute(source, namespace)
        _show_new_figures(before)
        _LIVE[name] = Recording(name, _live_meta(), streams)
        return
    outputs: list[dict[str, Any]] = []
    error: BaseException | None = None
    with _capture(outputs):
        try:
            _execute(source, namespace)
        except Exception as exc:  # recorded, then re-raised below
            error = exc
        _show_new_figures(before)
    if error is not None:
        outputs.append({"output_type": "error", "ename": type(error).__name__,
                        "evalue": str(error)})
    meta = hardware_meta(gpus)
    meta["cell_digest"] = cell_digest(source)
    save_recording(name, outputs, meta)
    # Show what was captured (whole: this is the real run), then re-raise so a deliberate error demo still
    # fails visibly, with its own traceback.
    _replay(outputs, name, fold=False)
    if error is not None:
        raise error


class GpuLine(NamedTuple):
    """A parsed ``%%gpu`` line."""

    name: str
    gpus: int = 1
    shows: str = ""
    slow: str = ""
    needs_gib: float = 0.0


def parse_gpu_line(line: str) -> GpuLine:
    """``NAME [--gpus N] [--shows "WHAT"] [--slow "WHY"] [--needs-gib N]`` (the ``%%gpu`` line) → `GpuLine`;
    ValueError if bad."""
    args = shlex.split(line)
    gpus, needs_gib, texts = 1, 0.0, {"--shows": "", "--slow": ""}
    try:
        for flag in ("--gpus", "--shows", "--slow", "--needs-gib"):
            if flag in args:
                i = args.index(flag)
                if flag == "--gpus":
                    gpus = int(args[i + 1])
                elif flag == "--needs-gib":
                    needs_gib = float(args[i + 1])
                    if not 0 < needs_gib < float("inf"):
                        raise ValueError
                else:
                    texts[flag] = args[i + 1]
                del args[i:i + 2]
        (name,) = args
    except (ValueError, IndexError):
        raise ValueError(f"bad %%gpu line: {line!r}") from None
    return GpuLine(name, gpus, texts["--shows"], texts["--slow"], needs_gib)


def gpu_cell_magic(line: str, cell: str) -> None:
    """``%%gpu NAME [--gpus N] [--shows "WHAT"] [--slow "WHY"] [--needs-gib N]``: run the cell on a GPU host, show
    its recording elsewhere (``--shows`` says, where there is no recording, what the cell would show; ``--slow``
    makes a cell that takes minutes run only when asked; ``--needs-gib`` makes a cell that needs more GPU memory
    than a small GPU has show its recording there; see the module's text)."""
    from IPython import get_ipython

    try:
        name, gpus, shows, slow, needs_gib = parse_gpu_line(line)
    except ValueError:
        raise ValueError('usage: %%gpu NAME [--gpus N] [--shows "WHAT"] [--slow "WHY"] [--needs-gib N], '
                         f"got '%%gpu {line}'") from None
    shell = get_ipython()
    namespace = shell.user_ns if shell is not None else {}
    try:
        run_or_replay(name, cell, namespace, gpus, shows, slow, needs_gib)
    except Exception:
        # Show a plain traceback of the cell's own code (not of this magic) and fail the cell.
        if shell is not None:
            etype, value, tb = sys.exc_info()
            while tb is not None and tb.tb_frame.f_code.co_filename != _FILENAME:
                tb = tb.tb_next
            if tb is not None and value is not None:
                raise value.with_traceback(tb) from None
        raise

