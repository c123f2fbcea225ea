"""course_utils.language: the fixed phrases (a verdict's frame, a recording's banner) in the Chinese edition, the
banner as a web page words it, and the Chinese notebooks' stored outputs."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from course_utils import recording
from course_utils.exercises import Verdict
from course_utils.language import BANNER, current_language, for_a_web_page, localize, set_language

ROOT = Path(__file__).resolve().parents[1]
LABEL = "1× NVIDIA H200 · PyTorch 2.11.0+cu130 · CUDA 13.0 · 2026-12-02"
# What is left of the English frame when a phrase was not translated.
ENGLISH_FRAME = re.compile(r"Not yet\.|Correct\.|Hint:|Stuck\?|Recorded output|recorded on|renamed since|is now"
                           r"|this notebook|this cell|needs \d|leaves this|runs only when asked")


@pytest.fixture
def chinese() -> Iterator[None]:
    set_language("zh_CN")
    try:
        yield
    finally:
        set_language("en")


def test_unknown_language_is_refused_and_english_is_the_default() -> None:
    assert current_language() == "en"
    with pytest.raises(ValueError, match=r"set_language\('zh'\): the course speaks 'en' and 'zh_CN'"):
        set_language("zh")
    assert current_language() == "en"


def test_a_verdict_speaks_the_notebooks_language_around_the_checkers_own_words(chinese: None) -> None:
    wrong = Verdict(False, "x is on cpu.", hint="Where is x made?", closer="device=")
    assert str(wrong) == ("✘ 还不对。x is on cpu.\n  提示：Where is x made?\n"
                          "  卡住了？%hint 会给出更近一步的提示；下次再答错时也会给出。")
    assert str(wrong.closer_hint()).endswith("\n  更近一步的提示：device=")
    assert str(Verdict(True, "right.")) == "✔ 正确。right."
    assert "✘ 还不对。x is on cpu.<br>" in wrong._repr_html_()
    set_language("en")
    assert str(wrong).startswith("✘ Not yet. x is on cpu.\n  Hint: Where is x made?\n  Stuck? %hint")


@pytest.mark.parametrize("gpus,have,name,slow,env", [
    (1, 0, "a", "", {}),
    (2, 0, "a", "", {}),
    (2, 1, "a", "", {}),
    (1, 1, "a", "", {recording.ONLY_ENV: "b"}),
    (1, 1, "a", "compiles for about 7 minutes on an H200", {}),
    (1, 1, "a", "", {"needs": "19 14.93"}),
])
def test_every_reason_a_banner_gives_is_translated(gpus: int, have: int, name: str, slow: str,
                                                   env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    """The reasons come from recording's own code, so a reworded reason without its translation fails here."""
    for key in (recording.ONLY_ENV, recording.SLOW_ENV):
        monkeypatch.delenv(key, raising=False)
    env = dict(env)
    needs, usable = map(float, env.pop("needs", "0 0").split())  # GiB a --needs-gib cell needs, and has
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    why = recording._why_not_here(gpus, have, name, slow, needs, usable if needs else None)
    banner = f"Recorded output ({why}), recorded on {LABEL} (renamed since: a.b is now a.c; d is now e):"
    assert BANNER.fullmatch(banner)
    zh = localize(banner, "zh_CN")
    assert zh.startswith("录制的输出（") and zh.endswith("（录制后改名：a.b 现为 a.c；d 现为 e）：") and LABEL in zh
    assert not ENGLISH_FRAME.search(zh.replace(slow, "")), zh


def test_english_text_outside_the_frame_is_left_alone() -> None:
    text = ("RuntimeError: Hint: not ours\nrecorded on the profiler\n"
            "Recorded output of a profile\n  Hint: (indented the course's way, but in English mode)")
    assert localize(text, "zh_CN").splitlines()[:3] == text.splitlines()[:3]
    assert localize(text, "en") == text


def test_a_web_page_says_where_a_recording_was_made_in_both_editions() -> None:
    """On a page, "this notebook ran without a CUDA GPU" reads as the reader's own machine."""
    english = f"Recorded output (this notebook ran without a CUDA GPU), recorded on {LABEL}:"
    assert for_a_web_page(english, "en") == f"Output recorded on {LABEL}:"
    html = f'<div style="border-left:4px solid #2e86c1">{english}</div>'
    assert for_a_web_page(html, "en") == f'<div style="border-left:4px solid #2e86c1">Output recorded on {LABEL}:</div>'
    assert for_a_web_page(localize(english, "zh_CN"), "zh_CN") == f"此单元格的输出录制于 {LABEL}："


def _stored_texts(path: Path) -> Iterator[str]:
    for cell in json.loads(path.read_text(encoding="utf-8"))["cells"]:
        for out in cell.get("outputs", []):
            yield "".join(out.get("text", ""))
            for mime in ("text/plain", "text/html"):
                yield "".join(out.get("data", {}).get(mime, ""))


@pytest.mark.parametrize("path", sorted((ROOT / "notebooks" / "zh").glob("*.ipynb")), ids=lambda p: p.stem)
def test_the_chinese_notebooks_store_the_frame_in_chinese(path: Path) -> None:
    """tools/translations.py localizes the English run's outputs as the Chinese notebook would print them."""
    english = ROOT / "notebooks" / path.name
    frames = sum(bool(BANNER.search(t) or "✘ Not yet." in t or "✔ Correct." in t) for t in _stored_texts(english))
    left = [t[:80] for t in _stored_texts(path) if BANNER.search(t) or re.search(r"^(✘ Not yet|✔ Correct)\.", t, re.M)]
    assert not left, left
    translated = sum("录制的输出（" in t or "✘ 还不对。" in t or "✔ 正确。" in t for t in _stored_texts(path))
    assert translated == frames
