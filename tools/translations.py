#!/usr/bin/env python3
"""The Chinese edition: gettext catalogues in, generated notebooks out.

The English notebooks are the source. Each one has a catalogue, ``i18n/zh_CN/NN_name.po``, whose entries
are the translatable blocks of its markdown cells (a paragraph, a list, a table, a heading: text between
blank lines; fenced code stays English and is not in the catalogue). ``i18n/zh_CN/course.po`` holds the
strings of the generated parts: lesson titles and what each teaches (README's map, the "Next:" cells).

    python tools/translations.py           # update the catalogues, then write notebooks/zh/ and README.zh-CN.md
    python tools/translations.py --check   # exit 1 if any of them is out of date (the tests run this)
    python tools/translations.py --status  # what is untranslated or stale, per notebook and cell

Updating a catalogue works as gettext's msgmerge does: a new English block gets an empty entry; a block
whose English changed gets the old translation marked ``fuzzy`` (with the old English as ``#| msgid``), so
a translator sees what changed; a block that is gone becomes obsolete (``#~``). The tests fail on any
empty or fuzzy entry. A generated notebook is its English notebook with each markdown block replaced by
its translation (the English stays where there is none yet), the badges pointing at the Chinese notebook,
and a setup cell that also moves into the English notebooks' folder, so that data/ and scratch folders are
shared. Code cells and their outputs are the English ones: strict nbval of the English edition covers both.

Needs polib (in tests/requirements.txt): ``make sync`` runs this in .venv.
"""

from __future__ import annotations

import argparse
import copy
import difflib
import html
import json
import re
import sys
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import polib
from project import CURRICULUM, ROOT, repository_url
from sync_notebooks import (
    BRANCH,
    colab_url,
    dump,
    lessons_and_appendices,
    readme_notebook_map,
    replace_block,
    report_stale,
    setup_source,
)

from course_utils.language import localize

LANG = "zh_CN"
CATALOGUES = ROOT / "i18n" / LANG
ZH_NOTEBOOKS = ROOT / "notebooks" / "zh"
ZH_README = ROOT / "README.zh-CN.md"
COURSE_PO = CATALOGUES / "course.po"
GENERATED_TAGS = ("course-badges", "course-next")
STALE_KEY = "course_zh_stale"
"""Notebook metadata of a Chinese notebook with blocks still in English: {"blocks": n, "cells": [indices]}."""
STALE_ENV = "COURSE_ZH_STALE"
"""``COURSE_ZH_STALE=mark`` (``make test ZH_STALE=mark``): stale translations are marked, not a test failure."""
"""Markdown cells written by tools/sync_notebooks.py: their Chinese is generated too, not translated."""

_FENCE = re.compile(r"^\s*(```|~~~)")
_INLINE_CODE = re.compile(r"`[^`]*`")
_LINK_TARGET = re.compile(r"\]\([^)]*\)")
_WORD = re.compile(r"[A-Za-z]{2,}")
# A markdown link or image target: ](target) with no spaces.
_RELATIVE_LINK = re.compile(r"\]\((?!https?:|mailto:|#|/)([^)\s]+)\)")


# --- markdown → blocks ---------------------------------------------------------------------------------

@dataclass(frozen=True)
class Block:
    text: str
    translatable: bool


def split_blocks(markdown: str) -> list[Block | str]:
    """A markdown cell as blocks and the separators between them, so that ``_join`` rebuilds it exactly.

    A block is a run of non-blank lines; a fenced code block is a block of its own (blank lines inside it
    included) and is never translatable, nor is a block without words (a rule, an image alone)."""
    lines = markdown.split("\n")
    ranges: list[tuple[int, int, bool]] = []  # [first, last] line of each block, and whether it is code
    i = 0
    while i < len(lines):
        m = _FENCE.match(lines[i])
        if m:
            j = i + 1
            while j < len(lines) and not lines[j].strip().startswith(m.group(1)):
                j += 1
            ranges.append((i, min(j, len(lines) - 1), True))
            i = j + 1
        elif lines[i].strip():
            j = i
            while j + 1 < len(lines) and lines[j + 1].strip() and not _FENCE.match(lines[j + 1]):
                j += 1
            ranges.append((i, j, False))
            i = j + 1
        else:
            i += 1
    offsets = [0]
    for line in lines:
        offsets.append(offsets[-1] + len(line) + 1)  # where each line starts; one past the end last
    parts: list[Block | str] = []
    pos = 0
    for first, last, code in ranges:
        begin, end = offsets[first], offsets[last + 1] - 1
        if begin > pos:
            parts.append(markdown[pos:begin])
        text = markdown[begin:end]
        prose = _LINK_TARGET.sub("]", _INLINE_CODE.sub("", text))
        parts.append(Block(text, not code and bool(_WORD.search(prose))))
        pos = end
    if pos < len(markdown):
        parts.append(markdown[pos:])
    return parts


def _join(parts: list[Block | str]) -> str:
    return "".join(p if isinstance(p, str) else p.text for p in parts)


def _source(cell: dict) -> str:
    return "".join(cell["source"])


def _lines(text: str) -> list[str]:
    parts = text.split("\n")
    return [p + "\n" for p in parts[:-1]] + [parts[-1]]


def _tags(cell: dict) -> list[str]:
    return cell.get("metadata", {}).get("tags", [])


def translatable_cells(nb: dict) -> list[tuple[int, list[Block]]]:
    """(cell index, its translatable blocks) of every markdown cell that a translator translates."""
    out = []
    for i, cell in enumerate(nb["cells"]):
        if cell["cell_type"] != "markdown" or any(t in _tags(cell) for t in GENERATED_TAGS):
            continue
        blocks = [p for p in split_blocks(_source(cell)) if isinstance(p, Block) and p.translatable]
        if blocks:
            out.append((i, blocks))
    return out


# --- catalogues ----------------------------------------------------------------------------------------

def new_catalogue(name: str) -> polib.POFile:
    po = polib.POFile(wrapwidth=0)
    po.metadata = {
        "Project-Id-Version": "GPU Usage in PyTorch",
        "Language": LANG,
        "MIME-Version": "1.0",
        "Content-Type": "text/plain; charset=UTF-8",
        "Content-Transfer-Encoding": "8bit",
    }
    po.header = f"Simplified Chinese translation of {name}. English source: notebooks/{name}."
    return po


def load_catalogue(path: Path, name: str) -> polib.POFile:
    if path.is_file():
        po = polib.pofile(str(path), wrapwidth=0)
        po.wrapwidth = 0
        return po
    return new_catalogue(name)


def merge(po: polib.POFile, wanted: list[tuple[str, list[tuple[str, str]]]]) -> polib.POFile:
    """The catalogue with exactly the msgids in ``wanted`` (each with its occurrences), in that order,
    keeping translations, carrying a changed block's old translation as fuzzy, and the rest obsolete."""
    live = {e.msgid: e for e in po if not e.obsolete}
    old = {e.msgid: e for e in po if e.obsolete}
    old.update(live)
    out = polib.POFile(wrapwidth=0)
    out.metadata, out.header = po.metadata, po.header
    used: set[str] = set()
    for msgid, occurrences in wanted:
        if msgid in used:
            continue
        used.add(msgid)
        if msgid in old:
            entry = old[msgid]
            entry.obsolete = False
        else:
            entry = polib.POEntry(msgid=msgid, msgstr="")
            candidates = [e for e in old.values() if e.msgstr and e.msgid not in {m for m, _ in wanted}]
            best = max(candidates, key=lambda e: difflib.SequenceMatcher(None, e.msgid, msgid).ratio(),
                       default=None)
            if best is not None and difflib.SequenceMatcher(None, best.msgid, msgid).ratio() >= 0.6:
                entry.msgstr = best.msgstr
                entry.flags = ["fuzzy"]
                entry.previous_msgid = best.msgid
                old.pop(best.msgid)
        entry.occurrences = occurrences
        out.append(entry)
    for msgid, entry in old.items():
        if msgid not in used and entry.msgstr:
            entry.obsolete = True
            entry.occurrences = []
            out.append(entry)
    return out


def notebook_msgids(nb: dict, name: str) -> list[tuple[str, list[tuple[str, str]]]]:
    wanted: dict[str, list[tuple[str, str]]] = {}
    for i, blocks in translatable_cells(nb):
        for block in blocks:
            wanted.setdefault(block.text, []).append((f"notebooks/{name}", f"cell{i}"))
    return list(wanted.items())


def course_msgids() -> list[tuple[str, list[tuple[str, str]]]]:
    """The generated parts' strings: each lesson's and appendix's title and what a lesson teaches."""
    wanted: dict[str, list[tuple[str, str]]] = {}
    for stem, title, teaches in lessons_and_appendices():
        for text in (title.split(" · ", 1)[1], teaches):
            if text:
                wanted.setdefault(text, []).append(("tools/project.py", stem))
    return list(wanted.items())


def translations(po: polib.POFile) -> dict[str, str]:
    """msgid → msgstr of every entry that is translated and not fuzzy."""
    return {e.msgid: e.msgstr for e in po if not e.obsolete and e.msgstr and "fuzzy" not in e.flags}


def problems(nb: dict, po: polib.POFile) -> list[tuple[int, str, str]]:
    """(cell index, what is wrong, the block's first words) for each block without a current translation."""
    entries = {e.msgid: e for e in po if not e.obsolete}
    out = []
    for i, blocks in translatable_cells(nb):
        for block in blocks:
            entry = entries.get(block.text)
            what = ("missing from the catalogue" if entry is None else
                    "stale (fuzzy: the English changed)" if "fuzzy" in entry.flags else
                    "untranslated" if not entry.msgstr else
                    "; ".join(structure_problems(entry.msgid, entry.msgstr)))
            if what:
                out.append((i, what, block.text[:70].replace("\n", " ")))
    return out


_CODE_SPAN = re.compile(r"``.+?``|`[^`]+`", re.S)  # inline code, which may wrap onto the next line
_TARGET = re.compile(r"\]\(([^)\s]*)\)")
_NUMBER = re.compile(r"(?<![\w.])\d+(?:\.\d+)?")
_LIST_ITEM = re.compile(r"^\s*(?:[-*+]|\d+\.)\s", re.M)


def structure_problems(msgid: str, msgstr: str) -> list[str]:
    """What a translation changed that it must keep: inline code, link targets, numbers, the heading level,
    the number of list items and table rows."""
    out = []
    for what, pattern in (("inline code", _CODE_SPAN), ("link targets", _TARGET)):
        a, b = Counter(pattern.findall(msgid)), Counter(pattern.findall(msgstr))
        if a != b:
            out.append(f"{what} differ: missing {sorted((a - b).elements())}, added {sorted((b - a).elements())}")
    prose_en, prose_zh = (_TARGET.sub("]", _CODE_SPAN.sub("", t)) for t in (msgid, msgstr))
    missing = set(_NUMBER.findall(prose_en)) - set(_NUMBER.findall(prose_zh))
    if missing:
        out.append(f"numbers missing: {sorted(missing)}")
    level = (re.match(r"#+ ", msgid) or re.match("", "")).group(0), (re.match(r"#+ ", msgstr) or re.match("", "")).group(0)
    if level[0] != level[1]:
        out.append(f"heading level differs: {level[0]!r} vs {level[1]!r}")
    for what, count in (("list items", lambda t: len(_LIST_ITEM.findall(t))),
                        ("table rows", lambda t: sum(line.lstrip().startswith("|") for line in t.splitlines()))):
        if count(msgid) != count(msgstr):
            out.append(f"{what}: {count(msgid)} in English, {count(msgstr)} in Chinese")
    return out


# --- the glossary ----------------------------------------------------------------------------------------

GLOSSARY = CATALOGUES / "GLOSSARY.md"
AVOID_SEPARATOR = "、"
"""Between the renderings of the glossary's fourth column (避免的译法)."""


def glossary_rows() -> list[tuple[str, str, tuple[str, ...]]]:
    """(English term, its Chinese rendering, the renderings to avoid) of every row of the glossary's table.
    The fourth column, optional, lists the renderings to avoid, separated by 、."""
    rows = []
    for line in GLOSSARY.read_text(encoding="utf-8").splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("|") and len(cells) >= 2 and cells[0] not in ("English", "") and set(cells[0]) != {"-"}:
            avoid = cells[3].split(AVOID_SEPARATOR) if len(cells) >= 4 else []
            rows.append((cells[0], cells[1], tuple(a.strip() for a in avoid if a.strip())))
    return rows


def glossary() -> list[tuple[str, str]]:
    """(English term, its Chinese rendering) of every row of the glossary's table."""
    return [(english, rendering) for english, rendering, _ in glossary_rows()]


def _term(english: str) -> re.Pattern[str]:
    """A glossary term in English prose: any case (unless it has capitals inside), plural, -ise or -ize."""
    words = [re.escape(w) for w in re.split(r"[\s-]+", english)]
    body = r"[\s-]+".join(words)
    if english == english.lower():
        return re.compile(rf"\b{body.replace('z', '[sz]')}(?:s|es)?\b", re.I)
    return re.compile(rf"\b{body}s?\b")


def _terms_used(po: polib.POFile, terms: list[tuple]) -> Iterator[tuple[polib.POEntry, tuple]]:
    """(entry, the term's row) for each translated block whose English uses a term of ``terms`` (rows whose
    first item is the English term) outside code and link targets. Longer terms are matched first and hide
    the shorter ones inside them (activation checkpointing, not activation; all-gather, not gather)."""
    ordered = sorted(terms, key=lambda t: -len(t[0]))
    for entry in po:
        if entry.obsolete or not entry.msgstr or "fuzzy" in entry.flags:
            continue
        prose = _LINK_TARGET.sub("]", _INLINE_CODE.sub(" ", entry.msgid))
        for row in ordered:
            pattern = _term(row[0])
            if pattern.search(prose):
                prose = pattern.sub(" ", prose)
                yield entry, row


def glossary_misses(po: polib.POFile, terms: list[tuple[str, str]]) -> list[tuple[str, str, str]]:
    """(the block's first words, English term, rendering) for each translated block whose English uses a
    glossary term (outside code and link targets) and whose Chinese lacks its rendering. Longer terms are
    matched first and hide the shorter ones inside them (activation checkpointing, not activation)."""
    return [(entry.msgid[:60].replace("\n", " "), english, rendering)
            for entry, (english, rendering, *_) in _terms_used(po, terms)
            if rendering.lower() not in entry.msgstr.lower()]


def glossary_avoided(po: polib.POFile, rows: list[tuple[str, str, tuple[str, ...]]]) -> list[tuple[str, str, str]]:
    """(the block's first words, English term, avoided rendering) for each translated block whose English uses
    a glossary term (outside code and link targets, longer terms hiding shorter ones, as ``glossary_misses``)
    and whose Chinese contains one of the renderings the glossary says to avoid for it (``glossary_rows``):
    a concept named two ways, 不确定性 beside 非确定性."""
    return [(entry.msgid[:60].replace("\n", " "), english, avoided)
            for entry, (english, _, avoid) in _terms_used(po, rows)
            for avoided in avoid if avoided.lower() in entry.msgstr.lower()]


# --- the Chinese notebooks and README ------------------------------------------------------------------

def zh_badges(url: str, name: str, english: bool = True) -> str:
    """A Chinese notebook's badges (or, ``english=False``, README.zh-CN.md's, for notebooks/zh/00_setup.ipynb),
    and the link to the English notebook, also on Colab (where a relative link does not resolve)."""
    slug = url.removeprefix("https://github.com/")
    colab = colab_url(url, f"notebooks/zh/{name}")
    binder = f"https://mybinder.org/v2/gh/{slug}/{BRANCH}?labpath=notebooks%2Fzh%2F{name}"
    badges = (f"[![在 Colab 中打开](https://colab.research.google.com/assets/colab-badge.svg)]({colab}) "
              f"[![Binder](https://mybinder.org/badge_logo.svg)]({binder})")
    if not english:
        return badges
    return f"{badges} [English](../{name})（[在 Colab 中打开]({colab_url(url, f'notebooks/{name}')})）"


def zh_setup(url: str) -> str:
    """The English setup cell, the course's fixed phrases in Chinese (course_utils.language), then a move into
    the English notebooks' folder (data/ and scratch folders)."""
    return (setup_source(url) + "\n"
            "import os\n\n"
            "from course_utils.language import set_language\n\n"
            'set_language("zh_CN")  # 课程的固定用语（检查结果的框架、录制输出的标注）显示为中文\n\n'
            'if os.path.isdir("../data") and os.path.basename(os.getcwd()) == "zh":\n'
            '    os.chdir("..")  # the Chinese notebooks use the English ones\' data/ folder')


def zh_next(name: str, course: dict[str, str], url: str) -> str:
    """The Chinese "Next:" cell, from the same curriculum as the English one."""
    pages = lessons_and_appendices()
    stems = [stem for stem, _, _ in pages]
    stem = name.removesuffix(".ipynb")
    i = stems.index(stem) if stem in stems else len(stems)
    lessons = len(CURRICULUM)

    def title(k: int) -> str:
        s, t, _ = pages[k]
        number, text = t.split(" · ", 1)
        return f"{number} · {course.get(text, text)}"

    if i + 1 < lessons:
        teaches = pages[i + 1][2]
        colab = colab_url(url, f"notebooks/zh/{stems[i + 1]}.ipynb")
        return (f"**下一课：** [{title(i + 1)}]({stems[i + 1]}.ipynb)（[在 Colab 中打开]({colab})）："
                f"{course.get(teaches, teaches)}。")
    if i + 1 == lessons and len(pages) > lessons:
        appendices = "，".join(f"[{title(k)}]({stems[k]}.ipynb)（[在 Colab 中打开]"
                              f"({colab_url(url, f'notebooks/zh/{stems[k]}.ipynb')})）" for k in range(lessons, len(pages)))
        return f"**下一步：** 这是最后一课。附录：{appendices}。课程目录见 README.zh-CN.md。"
    return (f"**下一步：** 回到 README.zh-CN.md 中的课程目录，或从 [{title(0)}]({stems[0]}.ipynb)"
            f"（[在 Colab 中打开]({colab_url(url, f'notebooks/zh/{stems[0]}.ipynb')})）开始学习。")


def _relink(text: str) -> str:
    """Relative links in a Chinese notebook: notebooks are beside it; other files are one folder further."""
    def fix(m: re.Match[str]) -> str:
        target = m.group(1)
        if target.split("#")[0].endswith(".ipynb"):
            return m.group(0)
        if target.split("#")[0] == "../README.md":
            return "](../../README.zh-CN.md)"
        return f"](../{target})"
    return _RELATIVE_LINK.sub(fix, text)


def zh_notebook(nb: dict, name: str, done: dict[str, str], course: dict[str, str], url: str) -> dict:
    zh = copy.deepcopy(nb)
    for cell in zh["cells"]:
        tags = _tags(cell)
        if cell["cell_type"] == "markdown":
            if "course-badges" in tags:
                text = zh_badges(url, name)
            elif "course-next" in tags:
                text = zh_next(name, course, url)
            else:
                parts = split_blocks(_source(cell))
                text = _join([Block(_relink(done[p.text]), True) if isinstance(p, Block) and p.text in done
                              else p for p in parts])
            cell["source"] = _lines(text)
        elif "course-setup" in tags:
            cell["source"] = _lines(zh_setup(url))
        if cell["cell_type"] == "code":
            zh_outputs(cell.get("outputs", []))
    return zh


def _localized(text: str) -> str:
    return localize(text, LANG)


def zh_outputs(outputs: list[dict]) -> None:
    """The English run's stored outputs with the course's fixed phrases (verdicts, recording banners) in
    Chinese, as the Chinese notebook prints them when it runs (its setup cell sets the language)."""
    for out in outputs:
        if "text" in out and (zh := _localized("".join(out["text"]))) != "".join(out["text"]):
            out["text"] = zh.splitlines(keepends=True)
        data = out.get("data", {})
        plain = "".join(data.get("text/plain", ""))
        zh = _localized(plain)
        if zh == plain:
            continue
        data["text/plain"] = zh.splitlines(keepends=True)
        if "text/html" in data:  # the same text, escaped (a verdict's line breaks as <br>)
            page = "".join(data["text/html"])
            for before, after in [(html.escape(plain), html.escape(zh)),
                                  (html.escape(plain).replace("\n", "<br>"), html.escape(zh).replace("\n", "<br>"))]:
                page = page.replace(before, after)
            data["text/html"] = page.splitlines(keepends=True)


def zh_readme_map(course: dict[str, str]) -> str:
    """README.zh-CN.md's notebook table: README's, in Chinese, linking the Chinese notebooks."""
    return readme_notebook_map("| 笔记本 | 内容 | 用到的辅助模块（`course_utils/`） | 练习检查器（`course_utils/exercises/`） |",
                               "notebooks/zh/", course, "供好奇的读者和维护者参考")


# --- main ----------------------------------------------------------------------------------------------

def english_notebooks() -> list[Path]:
    return sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))


def build() -> dict[Path, str]:
    """Every file this tool writes, path → its content as it should be now."""
    out: dict[Path, str] = {}
    course_po = merge(load_catalogue(COURSE_PO, "the course's generated parts"), course_msgids())
    course_po.header = "Simplified Chinese of the generated parts: lesson titles and what each teaches."
    out[COURSE_PO] = course_po.__unicode__()
    course = translations(course_po)
    url = repository_url()
    for path in english_notebooks():
        nb = json.loads(path.read_text(encoding="utf-8"))
        po_path = CATALOGUES / f"{path.stem}.po"
        po = merge(load_catalogue(po_path, path.name), notebook_msgids(nb, path.name))
        out[po_path] = po.__unicode__()
        zh = zh_notebook(nb, path.name, translations(po), course, url)
        if stale := problems(nb, po):
            # Blocks whose English changed since they were translated show in English; the notebook says how
            # many (the site puts a note on its page). Tests fail on it unless COURSE_ZH_STALE=mark.
            zh["metadata"][STALE_KEY] = {"blocks": len(stale), "cells": sorted({i for i, _, _ in stale})}
        out[ZH_NOTEBOOKS / path.name] = dump(zh)
    if ZH_README.is_file():
        readme = replace_block(ZH_README.read_text(encoding="utf-8"), "notebooks", zh_readme_map(course),
                               ZH_README.name)
        out[ZH_README] = replace_block(readme, "badges", zh_badges(url, "00_setup.ipynb", english=False),
                                       ZH_README.name)
    return out


def status(only: list[str]) -> int:
    bad = 0
    for path in english_notebooks():
        if only and not any(path.name.startswith(prefix) for prefix in only):
            continue
        nb = json.loads(path.read_text(encoding="utf-8"))
        found = problems(nb, load_catalogue(CATALOGUES / f"{path.stem}.po", path.name))
        blocks = sum(len(b) for _, b in translatable_cells(nb))
        print(f"{path.name}: {blocks - len(found)}/{blocks} blocks translated")
        for i, what, words in found:
            print(f"  cell {i}: {what}: {words!r}")
        misses = glossary_misses(load_catalogue(CATALOGUES / f"{path.stem}.po", path.name), glossary())
        for words, english, rendering in misses:
            print(f"  glossary: {english!r} should be {rendering!r} in {words!r}")
        bad += len(found) + len(misses)
    return 1 if bad else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if a generated file is out of date")
    parser.add_argument("--status", action="store_true", help="list untranslated and stale blocks")
    parser.add_argument("only", nargs="*", help="with --status: only notebooks whose names start so (01 07_)")
    args = parser.parse_args()
    if args.status:
        return status(args.only)
    stale = []
    files = build()
    for path, text in files.items():
        if not path.is_file() or path.read_text(encoding="utf-8") != text:
            stale.append(path)
            if not args.check:
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(text, encoding="utf-8")
    extra = [p for p in ZH_NOTEBOOKS.glob("*.ipynb") if p not in files] if ZH_NOTEBOOKS.is_dir() else []
    for path in extra:
        stale.append(path)
        if not args.check:
            path.unlink()
    return report_stale(stale, args.check)


if __name__ == "__main__":
    sys.exit(main())
