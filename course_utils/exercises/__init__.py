"""Exercise checkers. Each returns a `Verdict`: whether the answer is right, what is wrong, and hints.

One module per notebook (``course_utils.exercises.setup`` for notebook 00, and so on); the notebooks
call the checkers, and the tests run the hidden solutions (and a catalogue of wrong answers) through them.

Hints come in two steps. A failing verdict names what is wrong and gives a ``hint`` that names the concept
(where does the tensor live? what does a replay read?). A ``closer`` hint, nearer to the code, is shown only
when the student asks for it (``%hint`` in a notebook, after ``%load_ext course_utils``; or
``verdict.closer_hint()``) or fails the same exercise again in the same kernel. Checkers get this by the
`exercise` decorator, which counts failures per exercise.
"""

from __future__ import annotations

import contextlib
import functools
import html
import signal
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from typing import Any, TypeVar

from ..language import localize

__all__ = ["TooSlow", "Verdict", "exercise", "fail", "hint_magic", "last_failure", "ok", "time_limit"]

ASK = "Stuck? %hint gives a closer hint; so does your next try, if it fails too."


@dataclass(frozen=True)
class Verdict:
    """The outcome of a check. Truthy when correct; displays as a short readable message.

    ``hint`` names the concept; ``closer`` is nearer to the code and is displayed only when ``show_closer``
    is set (`closer_hint`, ``%hint``, or a repeated failure of the same exercise)."""

    correct: bool
    message: str
    hint: str = ""
    closer: str = ""
    show_closer: bool = False

    def __bool__(self) -> bool:
        return self.correct

    def __str__(self) -> str:
        if self.correct:
            return localize(f"✔ Correct. {self.message}")
        lines = [f"✘ Not yet. {self.message}"]
        if self.hint:
            lines.append(f"  Hint: {self.hint}")
        if self.closer and self.show_closer:
            lines.append(f"  Closer hint: {self.closer}")
        elif self.closer:
            lines.append(f"  {ASK}")
        return localize("\n".join(lines))  # the frame in the notebook's language (course_utils.language)

    __repr__ = __str__

    def closer_hint(self) -> Verdict:
        """The same verdict with its closer hint shown (when it has one)."""
        return replace(self, show_closer=True)

    def _repr_html_(self) -> str:
        colour = "#1e8449" if self.correct else "#c0392b"
        body = html.escape(str(self)).replace("\n", "<br>")
        return f'<div style="border-left:4px solid {colour};padding:4px 8px">{body}</div>'


def ok(message: str) -> Verdict:
    """A passing verdict."""
    return Verdict(True, message)


def fail(message: str, hint: str = "", closer: str = "") -> Verdict:
    """A failing verdict: say what is wrong (``message``), name the concept that gets closer (``hint``), and,
    for a student who asks or fails again, what to change nearer to the code (``closer``)."""
    return Verdict(False, message, hint, closer)


_failures: dict[str, int] = {}
_last: list[Verdict] = []

F = TypeVar("F", bound=Callable[..., Verdict])


def exercise(checker: F) -> F:
    """Decorate a checker: its failing verdicts show their closer hint from the second failure on (per
    checker, per process: per notebook kernel), and the latest failure is kept for ``%hint``."""
    key = f"{checker.__module__}.{checker.__qualname__}"

    @functools.wraps(checker)
    def checked(*args: Any, **kwargs: Any) -> Verdict:
        verdict = checker(*args, **kwargs)
        if isinstance(verdict, Verdict) and not verdict.correct:
            _failures[key] = _failures.get(key, 0) + 1
            if _failures[key] > 1:
                verdict = verdict.closer_hint()
            _last[:] = [verdict]
        return verdict

    return checked  # type: ignore[return-value]


def last_failure() -> Verdict | None:
    """The latest failing verdict of any checker in this process, with its closer hint shown; None if none."""
    return _last[0].closer_hint() if _last else None


def hint_magic(line: str = "") -> Verdict | str:
    """``%hint``: the latest failed check in this kernel, with its closer hint."""
    verdict = last_failure()
    if verdict is None:
        return "No check has failed in this kernel yet: %hint shows a closer hint after one does."
    return verdict


class TooSlow(BaseException):
    """Raised into a student's function that runs past its `time_limit` (a ``BaseException``, so that the
    function's own ``except Exception`` does not swallow it)."""


@contextlib.contextmanager
def time_limit(seconds: float) -> Iterator[None]:
    """Raise `TooSlow` in the code inside after ``seconds`` (SIGALRM), so that a checker can say that an answer
    never returns; no limit off the main thread or where there is no SIGALRM (Windows)."""
    if not hasattr(signal, "setitimer") or threading.current_thread() is not threading.main_thread():
        yield
        return

    def too_slow(signum: int, frame: object) -> None:
        raise TooSlow

    previous = signal.signal(signal.SIGALRM, too_slow)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
