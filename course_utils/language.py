"""Every notebook: the language of the course's fixed phrases — the frame of a checker's verdict ("✘ Not yet.",
"Hint:", "Closer hint:") and the banner above a recorded GPU output. (The rarer note shown where a recording is
missing stays in English, as the checkers' own messages do.)

The English notebooks speak English. The Chinese edition (notebooks/zh/) is generated from them, and its setup
cell calls ``set_language("zh_CN")``; from then on these phrases come out in Chinese in that kernel. What a
checker says about *your* answer (its message and hints) stays in English: it is written per exercise.

The same table translates the stored outputs of the Chinese notebooks (tools/translations.py calls
`localize` on every output the English run left), so a reader of the Chinese edition, on the website or in
JupyterLab, sees the phrases in one language whether the cell ran or not.

    >>> set_language("zh_CN")
    >>> localize("✘ Not yet. x is on cpu.\\n  Hint: Where is x made?")
    '✘ 还不对。x is on cpu.\\n  提示：Where is x made?'
    >>> set_language("en")
"""

from __future__ import annotations

import re

__all__ = ["BANNER", "BANNER_ZH_CN", "LANGUAGES", "current_language", "for_a_web_page", "localize", "set_language"]

LANGUAGES = ("en", "zh_CN")
_current = "en"

# English pattern -> Chinese replacement (`re.sub` syntax). Each pattern is anchored on a phrase only the course
# prints, so that applying the table to any output (a stored traceback, a log) changes nothing else.
_VERDICT_ZH_CN: list[tuple[re.Pattern[str], str]] = [(re.compile(p, re.M), r) for p, r in [
    (r"^✔ Correct\. ", "✔ 正确。"),
    (r"^✘ Not yet\. ", "✘ 还不对。"),
    (r"^  Hint: ", "  提示："),
    (r"^  Closer hint: ", "  更近一步的提示："),
    (r"^  Stuck\? %hint gives a closer hint; so does your next try, if it fails too\.$",
     "  卡住了？%hint 会给出更近一步的提示；下次再答错时也会给出。"),
]]
# Why a ``%%gpu`` cell shows its recording (recording._why_not_here), inside the banner's parentheses.
_WHY_ZH_CN: list[tuple[re.Pattern[str], str]] = [(re.compile(p), r) for p, r in [
    (r"^this notebook ran without a CUDA GPU$", "本笔记本运行时没有 CUDA GPU"),
    (r"^this cell needs (\d+) CUDA GPUs; this notebook ran with none$", r"此单元格需要 \1 块 CUDA GPU；本笔记本运行时没有 GPU"),
    (r"^this cell needs (\d+) CUDA GPUs; this notebook ran with (\d+)$", r"此单元格需要 \1 块 CUDA GPU；本笔记本运行时只有 \2 块"),
    (r"^(\w+) leaves this cell out$", r"\1 未包含此单元格"),
    (r"^this cell needs about ([\d.]+) GiB of GPU memory free; this GPU has ([\d.]+) GiB free$",
     r"此单元格需要约 \1 GiB 空闲显存；这块 GPU 只有 \2 GiB 空闲"),
    (r"^this cell (.+), so it runs only when asked: run `%env (\w+)=1` in this notebook, then this cell again$",
     r"此单元格较慢（\1），因此只在需要时运行：在本笔记本中运行 `%env \2=1`，再运行此单元格"),
]]
# The banner above a recording (recording.show_recording), in its text and in its HTML (one <div>).
BANNER = re.compile(r"Recorded output \((?P<why>.+?)\), recorded on (?P<label>.+?)"
                    r"(?: \(renamed since: (?P<renamed>.+?)\))?:(?=$|</div>)", re.M)


def _banner_zh_cn(m: re.Match[str]) -> str:
    why = m["why"]
    for pattern, replacement in _WHY_ZH_CN:
        why = pattern.sub(replacement, why)
    renamed = "；".join(part.replace(" is now ", " 现为 ") for part in m["renamed"].split("; ")) if m["renamed"] else ""
    return f"录制的输出（{why}），录制于 {m['label']}" + (f"（录制后改名：{renamed}）" if renamed else "") + "："


# The same banner in the Chinese edition's stored outputs (what `_banner_zh_cn` makes).
BANNER_ZH_CN = re.compile(r"录制的输出（(?P<why>.+?)），录制于 (?P<label>.+?)(?:（录制后改名：(?P<renamed>.+?)）)?：(?=$|</div>)",
                          re.M)


def for_a_web_page(text: str, language: str) -> str:
    """A stored output as a web page shows it: the banner above a recording says where the output was recorded,
    not why "this notebook ran without a CUDA GPU" — on a page, a reader takes "this notebook" for their own
    machine. (The website shows the outputs of a CPU run, with the GPU cells' recordings.)"""
    if language == "en":
        return BANNER.sub(lambda m: f"Output recorded on {m['label']}"
                                    + (f" (renamed since: {m['renamed']})" if m["renamed"] else "") + ":", text)
    return BANNER_ZH_CN.sub(lambda m: f"此单元格的输出录制于 {m['label']}"
                                      + (f"（录制后改名：{m['renamed']}）" if m["renamed"] else "") + "：", text)


def set_language(language: str) -> None:
    """The language of the fixed phrases from now on in this process: ``"en"`` or ``"zh_CN"``."""
    global _current
    if language not in LANGUAGES:
        raise ValueError(f"set_language({language!r}): the course speaks {' and '.join(map(repr, LANGUAGES))}")
    _current = language


def current_language() -> str:
    return _current


def localize(text: str, language: str | None = None) -> str:
    """``text`` (English, as the course prints it) with its fixed phrases in ``language`` (default: the
    current one); everything else, what a checker says about the answer included, is left as it is."""
    if (language or _current) == "en":
        return text
    for pattern, replacement in _VERDICT_ZH_CN:
        text = pattern.sub(replacement, text)
    return BANNER.sub(_banner_zh_cn, text)
