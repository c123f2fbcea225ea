"""Exercise checkers. Each returns a `Verdict`: whether the answer is right, what is wrong, and a hint.

One module per notebook (``course_utils.exercises.setup`` for notebook 00, and so on); the notebooks
call the checkers, and the tests run the hidden solutions through them.
"""

from __future__ import annotations

import html
from dataclasses import dataclass

__all__ = ["Verdict", "fail", "ok"]


@dataclass(frozen=True)
class Verdict:
    """The outcome of a check. Truthy when correct; displays as a short readable message."""

    correct: bool
    message: str
    hint: str = ""

    def __bool__(self) -> bool:
        return self.correct

    def __str__(self) -> str:
        if self.correct:
            return f"✔ Correct. {self.message}"
        text = f"✘ Not yet. {self.message}"
        return f"{text}\n  Hint: {self.hint}" if self.hint else text

    __repr__ = __str__

    def _repr_html_(self) -> str:
        colour = "#1e8449" if self.correct else "#c0392b"
        body = html.escape(str(self)).replace("\n", "<br>")
        return f'<div style="border-left:4px solid {colour};padding:4px 8px">{body}</div>'


def ok(message: str) -> Verdict:
    """A passing verdict."""
    return Verdict(True, message)


def fail(message: str, hint: str = "") -> Verdict:
    """A failing verdict: say what is wrong, and how to get closer."""
    return Verdict(False, message, hint)
