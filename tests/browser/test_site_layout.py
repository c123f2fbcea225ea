"""The site's layout as a student meets it (site/, `make site`), in both editions, opened from disk and offline.

  - a phone (400 px wide): no page scrolls sideways (wide tables and code scroll, or wrap, in their own box);
  - a laptop (1366 px): no line of code, output or code block is cut off, a wrapped line shows its
    continuation cue; a long traceback is folded with its exception in view; code cells have a copy button
    (sphinx-copybutton) that copies the cell's code, outputs have none;
  - a lesson's first load stays within a byte budget, with the theme's icons drawn (without Font Awesome's
    script and fonts), and the two editions share one copy of the theme's static files;
  - the landing page is a student's (where to start, Colab and Binder, what each lesson teaches), and every
    plot has alt text that says what it shows;
  - the Chinese edition's sections carry the English headings' anchors, and links with them build.

Run: .venv/bin/python -m pytest -q -p no:cacheprovider tests/browser/test_site_layout.py
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from urllib.parse import unquote, urlparse

import pytest

pytest.importorskip("playwright.sync_api", reason="make browser-test installs playwright")

from browser_support import OUTPUT, ROOT, SITE, open_site  # noqa: E402

EDITIONS = [("en", ROOT / "notebooks", "")] + (
    [("zh", ROOT / "notebooks" / "zh", "zh/")] if (SITE / "zh").is_dir() else [])
LESSONS = {lang: sorted(folder.glob("*.ipynb")) for lang, folder, _ in EDITIONS}
PHONE = {"width": 400, "height": 800}
LAPTOP = {"width": 1366, "height": 768}


def pages(prefix: str, lang: str) -> list[str]:
    return [f"{prefix}{name}" for name in ["index.html", "search.html", "genindex.html"]
            + [f"{p.stem}.html" for p in LESSONS[lang]]]


def code_sources(path) -> set[str]:
    nb = json.loads(path.read_text(encoding="utf-8"))
    return {"".join(c["source"]).strip() for c in nb["cells"] if c["cell_type"] == "code"}


@pytest.mark.parametrize("lang,folder,prefix", EDITIONS, ids=[e[0] for e in EDITIONS])
def test_no_page_scrolls_sideways_on_a_phone(site_page, lang, folder, prefix):
    site_page.set_viewport_size(PHONE)
    too_wide = []
    for rel in pages(prefix, lang):
        open_site(site_page, rel)
        width = site_page.evaluate("document.documentElement.scrollWidth")
        if width > PHONE["width"]:
            too_wide.append(f"{rel}: {width} px")
    site_page.screenshot(path=str(OUTPUT / f"site-{lang}-phone.png"))
    assert not too_wide, f"pages wider than a {PHONE['width']} px phone: {too_wide}"


# Every shown <pre> of a page: lines wider than its box (its scroll width beyond its width).
CUT_OFF = """() => [...document.querySelectorAll('article pre')].filter(pre => pre.getClientRects().length)
  .filter(pre => pre.scrollWidth > pre.clientWidth + 1).map(pre => pre.textContent.slice(0, 60))"""
# Lines that wrap onto more rows, and whether their continuation cue (the arrow of ::before) has a height.
WRAPPED = """() => [...document.querySelectorAll('article pre .course-line')].filter(l => l.getClientRects().length > 0
  && l.getBoundingClientRect().height > 1.5 * parseFloat(getComputedStyle(l).lineHeight))
  .map(l => parseFloat(getComputedStyle(l, '::before').height))"""


@pytest.mark.parametrize("lang,folder,prefix", EDITIONS, ids=[e[0] for e in EDITIONS])
def test_code_is_not_cut_off_on_a_laptop(site_page, lang, folder, prefix):
    site_page.set_viewport_size(LAPTOP)
    cut, wrapped = [], []
    for path in LESSONS[lang]:
        open_site(site_page, f"{prefix}{path.stem}.html")
        cut += [f"{path.stem}: {text!r}" for text in site_page.evaluate(CUT_OFF)]
        wrapped += site_page.evaluate(WRAPPED)
    assert not cut, f"code cut off at {LAPTOP['width']} px: {cut[:10]}"
    assert wrapped, "no long line wraps: the check above proves nothing"
    assert all(h > 0 for h in wrapped), "a wrapped line without its continuation cue"


@pytest.mark.parametrize("lang,folder,prefix", EDITIONS, ids=[e[0] for e in EDITIONS])
def test_long_tracebacks_are_folded_with_the_error_in_view(site_page, lang, folder, prefix):
    folded = 0
    for path in LESSONS[lang]:
        errors = [o for c in json.loads(path.read_text(encoding="utf-8"))["cells"]
                  for o in c.get("outputs", []) if o.get("output_type") == "error"]
        if not errors:
            continue
        open_site(site_page, f"{prefix}{path.stem}.html")
        shown = site_page.locator("article .output.traceback pre")
        assert shown.count() == len(errors), f"{path.stem}: {shown.count()} tracebacks, {len(errors)} stored"
        for i, error in enumerate(errors):
            pre = shown.nth(i)
            text = pre.inner_text()
            message = re.sub(r"\x1b\[[0-9;]*m", "", f"{error['ename']}: {error['evalue']}").splitlines()[0].strip()
            assert message in text, f"{path.stem}: the exception {message!r} is not in view:\n{text[-300:]}"
            toggle = pre.locator("xpath=preceding-sibling::button[contains(@class, 'course-traceback-toggle')]")
            if len(pre.text_content().splitlines()) > 10:
                assert toggle.count() == 1, f"{path.stem}: a traceback of {len(text.splitlines())} lines unfolded"
                assert text.lstrip().startswith(error["ename"]), f"{path.stem}: folded, it shows {text[:200]!r}"
                toggle.click()
                assert "Cell In" in pre.inner_text() or "File " in pre.inner_text(), "the frames do not open"
                folded += 1
    assert folded, "no traceback was folded"


def test_copy_buttons_copy_the_code_only(site_page):
    path = ROOT / "notebooks" / "02_moving_data.ipynb"
    open_site(site_page, "02_moving_data.html")
    assert site_page.locator("article .cell_output .copybtn").count() == 0, "a copy button on an output"
    inputs = site_page.locator("article .cell_input:visible")
    assert site_page.locator("article .cell_input:visible .copybtn").count() == inputs.count() > 5
    # ClipboardJS copies through a temporary textarea: the copy event's target holds the text.
    site_page.evaluate("() => document.addEventListener('copy', e => { window.__copied = e.target.value; })")
    sources = code_sources(path)
    for i in range(6):
        cell = inputs.nth(i)
        cell.hover()
        cell.locator(".copybtn").click()
        copied = site_page.evaluate("() => window.__copied")
        assert copied in sources, f"the copy button of cell {i} copied {copied!r}, not the cell's code"


# A lesson's first load (02: plots, tracebacks, solutions): what the browser fetches, HTML to images, search
# index included. It was 2.74 MB (en) and 2.82 MB (zh), 1.56 MB of it Font Awesome's script, 225 kB its fonts.
FIRST_LOAD_BUDGET = 1_200_000
ICONS = """() => [...document.querySelectorAll('[class*="fa-"]')].filter(e => e.getClientRects().length)
  .map(e => ({cls: e.className, mask: getComputedStyle(e, '::before').maskImage,
              width: parseFloat(getComputedStyle(e, '::before').width)}))"""


@pytest.mark.parametrize("lang,folder,prefix", EDITIONS, ids=[e[0] for e in EDITIONS])
def test_first_load_of_a_lesson_fits_the_byte_budget(site_page, lang, folder, prefix):
    requested, failed = [], []
    site_page.on("request", lambda r: requested.append(r.url))
    site_page.on("requestfailed", lambda r: failed.append(r.url))
    open_site(site_page, f"{prefix}02_moving_data.html")
    site_page.wait_for_timeout(500)
    files = {Path(unquote(urlparse(url).path)) for url in requested if url.startswith("file:")}
    sizes = {f.relative_to(SITE).as_posix(): f.stat().st_size for f in files if f.is_file()}
    assert not failed, f"requests that failed: {failed[:5]}"
    assert not [f for f in sizes if "fontawesome" in f or f.endswith((".woff", ".woff2"))], sizes
    total = sum(sizes.values())
    assert total <= FIRST_LOAD_BUDGET, (f"{prefix}02_moving_data.html's first load is {total:,} bytes, over the "
                                        f"budget of {FIRST_LOAD_BUDGET:,}: {sorted(sizes.items(), key=lambda x: -x[1])[:6]}")
    icons = site_page.evaluate(ICONS)
    assert len(icons) > 5 and all(i["mask"].startswith("url(") and i["width"] > 0 for i in icons), \
        f"icons not drawn: {[i for i in icons if not (i['mask'].startswith('url(') and i['width'] > 0)]}"
    site_page.locator(".bd-header-article").screenshot(path=str(OUTPUT / f"site-{lang}-icons.png"))


def test_editions_share_their_static_files():
    """site/zh/_static keeps only what differs from site/_static (the language's options and translations)."""
    if not (SITE / "zh").is_dir():
        pytest.skip("no Chinese edition (notebooks/zh/) in site/")
    own = sorted(p.relative_to(SITE / "zh" / "_static").as_posix() for p in (SITE / "zh" / "_static").rglob("*")
                 if p.is_file())
    same = [rel for rel in own if (SITE / "_static" / rel).is_file()
            and (SITE / "_static" / rel).read_bytes() == (SITE / "zh" / "_static" / rel).read_bytes()]
    assert own and not same, f"site/zh/_static: {own} (identical to site/_static: {same})"
    assert "documentation_options.js" in own


@pytest.mark.parametrize("lang,folder,prefix", EDITIONS, ids=[e[0] for e in EDITIONS])
def test_landing_page_is_a_students(site_page, lang, folder, prefix):
    """Where to start with Colab and Binder buttons, each lesson with what it teaches and where to run it; no
    maintainers' columns (helpers, checkers), and nothing cut off on a laptop or a phone."""
    sys.path.insert(0, str(ROOT / "tools"))
    from project import repository_url

    repo = repository_url().removeprefix("https://github.com/")
    nb_dir = folder.relative_to(ROOT).as_posix()
    open_site(site_page, f"{prefix}index.html")
    article = site_page.locator("article")
    assert "course_utils/exercises" not in article.inner_text() and "checkers" not in article.inner_text()
    buttons = article.locator(".course-launch a").evaluate_all("els => els.map(e => e.href)")
    assert buttons == [f"https://colab.research.google.com/github/{repo}/blob/main/{nb_dir}/00_setup.ipynb",
                       f"https://mybinder.org/v2/gh/{repo}/main?labpath={nb_dir.replace('/', '%2F')}%2F00_setup.ipynb"]
    assert article.locator("a[href='00_setup.html']").count() >= 2, "no link to the first lesson"
    rows = article.locator("table tbody tr")
    assert rows.count() == len(LESSONS[lang]) and article.locator("table thead th").count() == 3
    for i, path in enumerate(LESSONS[lang]):
        links = rows.nth(i).locator("a").evaluate_all("els => els.map(e => e.getAttribute('href'))")
        assert links[0] == f"{path.stem}.html" and any(f"{nb_dir}/{path.name}" in h for h in links[1:]) \
            and any(f"{nb_dir.replace('/', '%2F')}%2F{path.name}" in h for h in links[1:]), links
    for viewport in (LAPTOP, PHONE):
        site_page.set_viewport_size(viewport)
        assert site_page.evaluate("document.documentElement.scrollWidth") <= viewport["width"]
        cut = site_page.evaluate("() => [...document.querySelectorAll('article table')].filter("
                                 "t => t.scrollWidth > t.clientWidth + 1).length")
        assert viewport is PHONE or not cut, "the lessons table is cut off on a laptop"
    site_page.set_viewport_size(LAPTOP)
    site_page.screenshot(path=str(OUTPUT / f"site-{lang}-landing.png"), full_page=True)


GENERIC_ALT = re.compile(r"^(image|plot|figure|png|output|图)?$|\.png$|_images/", re.I)


@pytest.mark.parametrize("lang,folder,prefix", EDITIONS, ids=[e[0] for e in EDITIONS])
def test_every_plot_says_what_it_shows(site_page, lang, folder, prefix):
    """Every plot (a PNG output of a cell) has alt text of its own: what the code that drew it names (a
    recording's description, titles, labels, the plotting function) and its section."""
    bad, plots = [], 0
    for path in LESSONS[lang]:
        open_site(site_page, f"{prefix}{path.stem}.html")
        for alt in site_page.locator("article .cell_output img").evaluate_all("els => els.map(e => e.alt)"):
            plots += 1
            words = re.sub(r"[（(].*", "", alt)
            if GENERIC_ALT.search(alt.strip()) or len(words.split()) < 2 and len(words) < 8:
                bad.append(f"{path.stem}: {alt!r}")
    assert plots and not bad, f"plots without a specific alt text: {bad}"


SECTION_IDS = """() => [...document.querySelectorAll('article section')].filter(s => s.querySelector(':scope > h1, :scope > h2,'
  + ' :scope > h3, :scope > h4')).map(s => ({id: s.id, slug: (s.querySelector(':scope > span[id]') || s).id}))"""


def test_chinese_sections_have_the_english_anchors(site_page):
    """zh/NN.html's sections are anchored as the English headings they translate (GitHub's slug, as on the
    English page), not #id1, #id2 that shift when a heading is added."""
    if not (SITE / "zh").is_dir():
        pytest.skip("no Chinese edition (notebooks/zh/) in site/")
    problems = []
    for path in LESSONS["en"]:
        open_site(site_page, f"{path.stem}.html")
        english = [s["slug"] for s in site_page.evaluate(SECTION_IDS)]
        open_site(site_page, f"zh/{path.stem}.html")
        chinese = [s["id"] for s in site_page.evaluate(SECTION_IDS)]
        if chinese != english:
            problems.append(f"{path.stem}: {[(z, e) for z, e in zip(chinese, english, strict=False) if z != e][:3]}")
        toc = site_page.eval_on_selector_all(".bd-toc-nav a[href^='#']", "els => els.map(e => e.getAttribute('href'))")
        problems += [f"zh/{path.stem}: a contents link {h}" for h in toc if re.fullmatch(r"#id\d+", h)]
    assert not problems, "\n".join(problems)


def test_chinese_links_with_english_anchors_build(tmp_path):
    """A Chinese page that links another's section by its English anchor (the translations keep link targets)
    builds under -W, in the page and across pages; an unknown anchor still fails."""
    from sphinx.cmd.build import build_main

    sys.path.insert(0, str(ROOT / "site_src"))
    from course_site import heading_slugs

    zh = ROOT / "notebooks" / "zh" / "02_moving_data.ipynb"
    anchor = [s for cell in heading_slugs(ROOT / "notebooks" / zh.name) for s in cell if s[0].isdigit()][1]  # "1-..."
    for name, target, status in [("good", anchor, 0), ("bad", "no-such-heading", 1)]:
        src = tmp_path / name
        src.mkdir()
        (src / zh.name).write_bytes(zh.read_bytes())
        (src / "index.md").write_text(f"# 链接\n\n[固定内存]({zh.name}#{target})\n\n```{{toctree}}\n{zh.stem}\n```\n",
                                      encoding="utf-8")
        args = ["-W", "-q", "-c", str(ROOT / "site_src"), "-D", "language=zh_CN", str(src), str(src / "_out")]
        assert build_main(args) == status, f"#{target}: the build's status is not {status}"
