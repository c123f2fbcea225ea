"""The two steps of a checker's hints (course_utils.exercises): the concept first, the closer hint when the
student asks (%hint, Verdict.closer_hint) or fails the same exercise again in the same kernel."""

from __future__ import annotations

from IPython.core.interactiveshell import InteractiveShell
from IPython.utils.capture import capture_output

from course_utils import exercises
from course_utils.exercises import Verdict, exercise, fail, ok


@exercise
def check_double(fn) -> Verdict:  # a checker as the notebooks' are written
    if fn(2) == 4:
        return ok("fn doubles.")
    return fail(f"fn(2) returned {fn(2)}.", "what does doubling mean?", "return 2 * x")


@exercise
def check_other(x) -> Verdict:
    return ok("fine") if x else fail("x is false.", "make it true.")


def test_the_closer_hint_waits_for_a_second_failure_of_the_same_exercise() -> None:
    first = check_double(lambda x: x)
    assert not first and first.hint == "what does doubling mean?" and first.closer == "return 2 * x"
    assert str(first).splitlines() == ["✘ Not yet. fn(2) returned 2.", "  Hint: what does doubling mean?",
                                       f"  {exercises.ASK}"]
    assert "return 2 * x" not in str(first) and "return 2 * x" not in first._repr_html_()
    assert not check_other(False)  # another exercise's failure counts for that exercise only
    second = check_double(lambda x: x + 1)
    assert str(second).splitlines()[-1] == "  Closer hint: return 2 * x"
    assert check_double(lambda x: x * 2)  # a right answer is a plain ✔
    assert str(check_double(lambda x: 2 * x)) == "✔ Correct. fn doubles."


def test_asking_for_the_closer_hint() -> None:
    verdict = check_double(lambda x: x)
    assert "Closer hint: return 2 * x" in str(verdict.closer_hint())
    assert exercises.last_failure() == verdict.closer_hint()
    assert str(fail("m", "h")).splitlines() == ["✘ Not yet. m", "  Hint: h"]  # no closer hint: nothing offered


def test_the_hint_magic() -> None:
    shell = InteractiveShell.instance()  # the one shell of this process, as the other tests use it
    shell.run_line_magic("load_ext", "course_utils")
    with capture_output() as cap:
        shell.run_cell("%hint")
    assert "No check has failed in this kernel yet" in cap.stdout
    check_double(lambda x: x)
    with capture_output() as cap:
        shell.run_cell("%hint")
    assert "Closer hint: return 2 * x" in cap.stdout
