"""The Chinese edition stays in step with the English one: every markdown block has a current translation,
the glossary is followed, the generated notebooks are exactly what `make sync` writes, and their code is the
English code."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

# A test-only package: `make test` installs it; after only `pip install -r requirements.txt` these tests skip.
polib = pytest.importorskip("polib", reason="the Chinese edition's tests need polib (tests/requirements.txt)")

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))
import translations as tr  # noqa: E402  (tools/translations.py)

NOTEBOOKS = tr.english_notebooks()
IDS = [p.stem for p in NOTEBOOKS]


def load(path: Path) -> dict:
    return json.loads(path.read_text(encoding="utf-8"))


def catalogue(path: Path) -> polib.POFile:
    po_path = tr.CATALOGUES / f"{path.stem}.po"
    assert po_path.is_file(), f"{path.name} has no catalogue {po_path.relative_to(ROOT)}: run make sync"
    return polib.pofile(str(po_path))


@pytest.mark.parametrize("path", NOTEBOOKS, ids=IDS)
def test_every_block_has_a_current_translation(path):
    found = tr.problems(load(path), catalogue(path))
    if found and os.environ.get(tr.STALE_ENV) == "mark":  # an instructor who does not read Chinese: marked stale
        pytest.skip(f"{path.name}: {len(found)} block(s) shown in English, marked stale ({tr.STALE_ENV}=mark)")
    assert not found, f"{path.name}: {len(found)} block(s) without a current Chinese translation " \
        f"(i18n/zh_CN/{path.stem}.po):\n" + "\n".join(f"  cell {i}: {what}: {words!r}" for i, what, words in found)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=IDS)
def test_translation_follows_the_glossary(path):
    misses = tr.glossary_misses(catalogue(path), tr.glossary())
    assert not misses, f"{path.name}: glossary terms not rendered as i18n/zh_CN/GLOSSARY.md says:\n" + \
        "\n".join(f"  {english!r} → {rendering!r} in {words!r}" for words, english, rendering in misses)


@pytest.mark.parametrize("po_path", [tr.CATALOGUES / f"{p.stem}.po" for p in NOTEBOOKS] + [tr.COURSE_PO],
                         ids=IDS + ["course"])
def test_translation_avoids_the_renderings_the_glossary_rules_out(po_path):
    """One concept, one Chinese term: a block whose English uses a glossary term must not also name it in a way
    the glossary's last column rules out (不确定性 beside 非确定性, 重启 kernel for restarting the Jupyter kernel)."""
    avoided = tr.glossary_avoided(polib.pofile(str(po_path)), tr.glossary_rows())
    assert not avoided, f"{po_path.name}: renderings that i18n/zh_CN/GLOSSARY.md says to avoid:\n" + \
        "\n".join(f"  {english!r}: {rendering!r} in {words!r}" for words, english, rendering in avoided)


def test_glossary_no_avoided_rendering_contains_its_own_term():
    """An avoided rendering inside the rendering itself would flag every correct translation."""
    rows = tr.glossary_rows()
    assert ("nondeterminism", "非确定性", ("不确定性",)) in rows
    assert all(len(row) == 3 for row in rows) and tr.glossary() == [(e, r) for e, r, _ in rows]
    bad = [(english, rendering, a) for english, rendering, avoid in rows for a in avoid if a.lower() in rendering.lower()]
    assert not bad, f"avoided renderings that the rendering contains: {bad}"


def test_the_generated_parts_are_translated():
    po = polib.pofile(str(tr.COURSE_PO))
    missing = [e.msgid for e in po if not e.obsolete and (not e.msgstr or "fuzzy" in e.flags)]
    assert not missing, f"i18n/zh_CN/course.po: untranslated or stale: {missing}"


def test_chinese_notebooks_are_what_make_sync_writes():
    result = subprocess.run([sys.executable, str(ROOT / "tools" / "translations.py"), "--check"],
                            capture_output=True, text=True, cwd=ROOT)
    assert result.returncode == 0, f"run `make sync`:\n{result.stdout}{result.stderr}"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=IDS)
def test_code_is_the_same_in_both_editions(path):
    english, chinese = load(path), load(tr.ZH_NOTEBOOKS / path.name)
    assert len(english["cells"]) == len(chinese["cells"])
    for i, (en, zh) in enumerate(zip(english["cells"], chinese["cells"], strict=True)):
        assert en["cell_type"] == zh["cell_type"], f"cell {i}"
        if en["cell_type"] != "code":
            continue
        if "course-setup" in en["metadata"].get("tags", []):
            assert "".join(zh["source"]).startswith("".join(en["source"])), f"{path.name} setup cell"
            continue
        assert en["source"] == zh["source"], f"{path.name} cell {i}: the code differs"
        # the same outputs, but for the course's fixed phrases in Chinese (tests/test_language.py)
        localized = copy.deepcopy(en["outputs"])
        tr.zh_outputs(localized)
        assert localized == zh["outputs"], f"{path.name} cell {i}: the outputs differ"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=IDS)
def test_chinese_links_resolve(path):
    """A link to a notebook goes to the Chinese one beside it; other relative links go one folder up."""
    zh = load(tr.ZH_NOTEBOOKS / path.name)
    for i, cell in enumerate(zh["cells"]):
        if cell["cell_type"] != "markdown":
            continue
        for target in tr._RELATIVE_LINK.findall("".join(cell["source"])):
            file = target.split("#")[0]
            assert (tr.ZH_NOTEBOOKS / file).resolve().exists(), f"{path.name} cell {i}: broken link {target}"


# --- the tool itself -----------------------------------------------------------------------------------

def test_blocks_rebuild_the_cell_and_leave_code_out():
    text = "## 1. Title\n\nA paragraph\nover two lines.\n\n```python\nx = 1\n\ny = 2\n```\n- a list\n- of two\n\n---\n"
    parts = tr.split_blocks(text)
    assert tr._join(parts) == text
    blocks = [p for p in parts if isinstance(p, tr.Block)]
    assert [b.text for b in blocks if b.translatable] == ["## 1. Title", "A paragraph\nover two lines.",
                                                         "- a list\n- of two"]
    assert any(b.text.startswith("```") and not b.translatable for b in blocks)


def test_changed_english_makes_the_old_translation_fuzzy_and_the_test_names_the_cell():
    po = tr.new_catalogue("x.ipynb")
    po.append(polib.POEntry(msgid="Pinned memory makes copies faster.", msgstr="固定内存让拷贝更快。"))
    nb = {"cells": [{"cell_type": "markdown", "metadata": {}, "source": ["Pinned memory makes copies much faster."]}]}
    merged = tr.merge(po, tr.notebook_msgids(nb, "x.ipynb"))
    entry = merged.find("Pinned memory makes copies much faster.")
    assert entry.msgstr == "固定内存让拷贝更快。" and "fuzzy" in entry.flags
    assert entry.previous_msgid == "Pinned memory makes copies faster."
    assert tr.problems(nb, merged) == [(0, "stale (fuzzy: the English changed)",
                                        "Pinned memory makes copies much faster.")]
    assert tr.translations(merged) == {}  # a stale translation is not used: the English shows instead


def test_structure_and_glossary_checks_catch_a_careless_translation():
    english = "## 2. Pinned memory: `pin_memory=True` reaches 55 GB/s\n- a\n- b"
    assert tr.structure_problems(english, "## 2. 固定内存：`pin_memory=True` 达到 55 GB/s\n- 甲\n- 乙") == []
    problems = tr.structure_problems(english, "### 锁页内存：`pin_memory` 很快\n- 甲")
    assert len(problems) == 4  # inline code, numbers, heading level, list items
    po = tr.new_catalogue("x.ipynb")
    po.append(polib.POEntry(msgid=english, msgstr="## 2. 锁页内存：`pin_memory=True` 达到 55 GB/s\n- 甲\n- 乙"))
    assert tr.glossary_misses(po, tr.glossary()) == [(english[:60].replace("\n", " "), "pinned memory", "固定内存")]


def test_avoided_renderings_check_catches_a_careless_translation():
    rows = tr.glossary_rows()
    english = "- **Nondeterminism**: restart the kernel, then time the GPU kernel again."
    po = tr.new_catalogue("x.ipynb")
    po.append(polib.POEntry(msgid=english, msgstr="- **非确定性**：重启内核，然后再给 GPU kernel 计时。"))
    assert tr.glossary_misses(po, tr.glossary()) == [] and tr.glossary_avoided(po, rows) == []
    # 非确定性 is there, and so is 不确定性, which only the new check sees; 重启 kernel both checks see
    po[0].msgstr = "- **非确定性**（不确定性）：重启 kernel，然后再给 GPU kernel 计时。"
    words = english[:60]
    assert tr.glossary_misses(po, tr.glossary()) == [(words, "restart the kernel", "重启内核")]
    assert tr.glossary_avoided(po, rows) == [(words, "restart the kernel", "重启 kernel"),
                                             (words, "nondeterminism", "不确定性")]
    # a word with two meanings: the GPU kernel stays "kernel", and 收集 stays right for "collect", even in a
    # block that all-gathers (all-gather hides the gather inside it)
    po = tr.new_catalogue("x.ipynb")
    po.append(polib.POEntry(msgid="Each kernel is timed; the all-gather collects the shards.",
                            msgstr="每个 kernel 都计时；all-gather 收集各个分片。"))
    assert tr.glossary_misses(po, tr.glossary()) == [] and tr.glossary_avoided(po, rows) == []
    po[0].msgid = "Each kernel is timed; the unit is gathered from the shards."
    assert tr.glossary_avoided(po, rows) == [(po[0].msgid[:60], "gathered", "收集")]


def test_a_stale_translation_is_marked_in_the_chinese_notebook_and_on_its_page(tmp_path, monkeypatch):
    """With COURSE_ZH_STALE=mark an English change passes the tests; the Chinese notebook shows the changed block
    in English and says in its metadata how many blocks are stale, and the site's page says so at the top."""
    english = {"nbformat": 4, "nbformat_minor": 5, "metadata": {}, "cells": [
        {"cell_type": "markdown", "id": "a", "metadata": {}, "source": ["# Title\n", "\n", "Pinned memory makes copies much faster."]}]}
    po = tr.new_catalogue("x.ipynb")
    po.append(polib.POEntry(msgid="# Title", msgstr="# 标题"))
    po.append(polib.POEntry(msgid="Pinned memory makes copies faster.", msgstr="固定内存让拷贝更快。"))
    (tmp_path / "x.po").write_text(po.__unicode__(), encoding="utf-8")
    (tmp_path / "x.ipynb").write_text(json.dumps(english), encoding="utf-8")
    monkeypatch.setattr(tr, "CATALOGUES", tmp_path)
    monkeypatch.setattr(tr, "english_notebooks", lambda: [tmp_path / "x.ipynb"])
    monkeypatch.setattr(tr, "ZH_README", tmp_path / "none.md")
    zh = json.loads(tr.build()[tr.ZH_NOTEBOOKS / "x.ipynb"])
    assert "".join(zh["cells"][0]["source"]).startswith("# 标题") and "much faster" in "".join(zh["cells"][0]["source"])
    assert zh["metadata"][tr.STALE_KEY] == {"blocks": 1, "cells": [0]}
    sys.path.insert(0, str(ROOT / "site_src"))
    import course_site

    page = course_site.read_notebook(json.dumps(zh), "zh_CN")
    assert len(page.cells) == 1  # in the title's cell: cells stay in step with the English notebook's
    assert page.cells[0].source.startswith("# 标题\n\n**注意：** 英文原文在翻译之后有改动，本页有 1 段")
    assert "course_zh_stale" not in course_site.read_notebook(json.dumps(english), "zh_CN").metadata


def test_this_repositorys_ci_does_not_mark_stale_translations():
    """The switch is for forks, off by default: here a stale translation fails `make test`."""
    assert "\nZH_STALE ?=\n" in (ROOT / "Makefile").read_text(encoding="utf-8")
    for path in [ROOT / ".ci" / "run", *(ROOT / ".github" / "workflows").glob("*.yml")]:
        assert "ZH_STALE" not in path.read_text(encoding="utf-8"), path
