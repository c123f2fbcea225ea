#!/usr/bin/env python3
"""The course's website: ``python site_src/course_site.py`` (``make site``) builds site/ and, when
notebooks/zh/ has notebooks, the Chinese edition in site/zh/; this module is also the Sphinx extension that
conf.py loads.

Each edition's sources are staged in build/site-src/LANG/: a copy of its notebooks (every ``*.ipynb`` of its
folder, sorted by file name, so a new lesson needs nothing here) and ``index.md``, the landing page: a student's
(where to start, with Colab and Binder links; each lesson and what it teaches), made from its README's
``<!-- notebooks: -->`` block (the helper and checker columns stay in the README), with a table of contents in
file-name order (lessons, then appendices). Sphinx runs with ``-W --keep-going -n``: any warning (a broken link between notebooks, an
unknown heading anchor, a missing image) fails the build; it names the staged copy
(build/site-src/en/02_moving_data.ipynb is notebooks/02_moving_data.ipynb). As the extension it
  - reads every notebook through `read_notebook`: the badge cell (tag ``course-badges``) is dropped (the
    theme's launch buttons replace it), a ``solution`` cell gets MyST-NB's ``hide-input`` toggle, widget
    views (they need a widget manager from a CDN) give way to the static output every widget cell has, a
    recording's banner is worded for a page (`course_utils.language.for_a_web_page`), a plot gets alt text
    from the code that drew it (`plot_alt`), and a Chinese notebook whose translation lags the English says so
    under its title;
  - gives each Chinese section the anchor of the English heading it translates (`EnglishAnchors`), so that
    links with English anchors work in both editions;
  - sends links to other repository files (``../README.md``, ``course_utils/x.py``) to the repository on
    GitHub (pyproject's ``Repository``), and links to the other edition's notebooks to its pages;
  - puts a language switch (English <-> 中文) on every page when both editions are built;
  - gives Chinese search (Sphinx uses jieba) the terms of i18n/zh_CN/GLOSSARY.md as words;
  - sets up the search page (course_search.py beside it: ranking, excerpts, highlights from a result);
  - after the build, draws the theme's few icons as CSS masks (`on_build_finished`) instead of loading its
    1.5 MB icon script, and lets the Chinese edition use the English edition's identical static files
    (`share_static`), with _static/course-layout.css and .js for phones, wrapped code and folded tracebacks.
"""

from __future__ import annotations

import logging
import os
import posixpath
import re
import shutil
import sys
from pathlib import Path
from typing import Any, NamedTuple
from urllib.parse import quote, unquote

try:  # docutils comes with Sphinx; without it, main() says what to install
    from docutils import nodes
    from docutils.transforms import Transform
except ImportError:
    Transform = object  # type: ignore[assignment,misc]

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tools"))

from project import APPENDIX, ROOT, repository_url  # noqa: E402

from course_utils.language import for_a_web_page  # noqa: E402

SITE = ROOT / "site"
STAGING = ROOT / "build" / "site-src"
SEARCH_WORDS = "search-words.txt"  # jieba's user dictionary, staged beside the Chinese sources
WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"


class Edition(NamedTuple):
    language: str  # Sphinx's `language`
    folder: str  # its notebooks, relative to the repository root
    readme: str  # its README (title, introduction and notebook map)
    out: str  # its folder in site/
    label: str  # its name in the language switch
    captions: tuple[str, str]  # the sidebar's two parts: lessons, appendices
    solution: tuple[str, str]  # the toggle of a solution cell: show, hide
    widget_note: str  # shown instead of live ipywidgets
    # The landing page: the "start here" heading and sentence ({first}: the first lesson, {teaches}: what it
    # teaches), the lessons table's heading and its three columns, the launch links, a plot's alt text
    # ({what} in section {section}).
    start: tuple[str, str]
    lessons: tuple[str, str, str, str]
    launch: tuple[str, str]
    plot_alt: str
    stale_note: str = ""  # under the title of a page whose translation lags the English ({n}: blocks in English)


EDITIONS = (
    Edition("en", "notebooks", "README.md", "", "English", ("Lessons", "Appendices"),
            ("Show the solution", "Hide the solution"),
            "Interactive controls (ipywidgets) go here when the notebook runs in JupyterLab, Binder or Colab; "
            "below is the output they first show.",
            ("Start here", "Start with {first}: {teaches}. Read it here, or run it in your browser:"),
            ("What you will learn", "lesson", "what you will learn", "run it"),
            ("Open in Colab", "Open in Binder"), "Plot: {what} (section “{section}”)"),
    Edition("zh_CN", "notebooks/zh", "README.zh-CN.md", "zh", "中文", ("课程", "附录"),
            ("显示参考答案", "隐藏参考答案"),
            "在 JupyterLab、Binder 或 Colab 中运行笔记本时，这里是可以操作的交互控件（ipywidgets）；"
            "下面是它们最初显示的输出。",
            ("从这里开始", "从 {first} 开始：{teaches}。可以在这里阅读，也可以在浏览器中运行："),
            ("你将学到什么", "课程", "你将学到", "运行"),
            ("在 Colab 中打开", "在 Binder 中打开"), "图：{what}（“{section}”一节）",
            "**注意：** 英文原文在翻译之后有改动，本页有 {n} 段尚未更新翻译，暂以英文显示。"),
)


def edition(language: str) -> Edition:
    return next((e for e in EDITIONS if e.language == language), EDITIONS[0])


def notebooks(e: Edition) -> list[Path]:
    return sorted((ROOT / e.folder).glob("*.ipynb"))


def built_editions() -> list[Edition]:
    """English always; another edition when its folder has notebooks."""
    return [e for e in EDITIONS if e is EDITIONS[0] or notebooks(e)]


# --- the sources of one edition ------------------------------------------------------------------------

def launch_links(e: Edition, notebook: str) -> tuple[str, str]:
    """Colab and Binder URLs of a notebook (its path in the repository), as the README's badges make them."""
    slug = repository_url().removeprefix("https://github.com/")
    return (f"https://colab.research.google.com/github/{slug}/blob/main/{notebook}",
            f"https://mybinder.org/v2/gh/{slug}/main?labpath={quote(notebook, safe='')}")


def student_map(e: Edition, block: str) -> str:
    """The README's notebook map as a student needs it: where to start (with Colab and Binder buttons) and
    each lesson with what it teaches and where to run it; the maintainers' columns (the helpers a notebook
    imports, its exercise checkers) stay in the README."""
    rows = re.findall(r"^\| \[([^\]]+)\]\(([^)\s]+\.ipynb)\) \| ([^|]*?) \|", block, re.M)
    if not rows:
        sys.exit(f"{e.readme}: no row '| [NN · title](notebooks/NN.ipynb) | what it teaches | ...' in its map")
    title, target, teaches = rows[0]
    colab, binder = launch_links(e, target)
    start = "\n".join([
        f"## {e.start[0]}", "", e.start[1].format(first=f"[{title}]({target})", teaches=teaches), "",
        '<p class="course-launch">',
        f'<a class="course-launch-button" href="{colab}">{e.launch[0]}</a>',
        f'<a class="course-launch-button" href="{binder}">{e.launch[1]}</a>', "</p>"])
    table = [f"## {e.lessons[0]}", "", f"| {' | '.join(e.lessons[1:])} |", "|---|---|---|"]
    for title, target, teaches in rows:
        colab, binder = launch_links(e, target)
        table.append(f"| [{title}]({target}) | {teaches} | [Colab]({colab}) · [Binder]({binder}) |")
    return start + "\n\n" + "\n".join(table) + "\n"


def landing_page(e: Edition, pages: list[Path]) -> str:
    """index.md: the README's title and introduction, where to start and the lessons (`student_map`), and
    the table of contents."""
    readme = ROOT / e.readme
    text = readme.read_text(encoding="utf-8") if readme.exists() else ""
    block = re.search(r"<!-- notebooks:.*?-->\n(.*?)<!-- /notebooks -->", text, re.S)
    title = re.search(r"^# (.+)$", text, re.M)
    if not block or not title:
        sys.exit(f"{e.readme} needs a '# title' and a <!-- notebooks: --> block: the site's landing page")
    intro = re.sub(r"<!-- (\w+):.*?<!-- /\1 -->", "", text[title.end():].split("\n## ", 1)[0], flags=re.S)
    # Paragraphs that point at the other README are the site's language switch now.
    paragraphs = [p for p in intro.split("\n\n") if p.strip() and "](README" not in p]
    lessons = [p.stem for p in pages if not APPENDIX.match(p.stem)]
    appendices = [p.stem for p in pages if APPENDIX.match(p.stem)]
    toc = "".join(f"\n```{{toctree}}\n:hidden:\n:caption: {caption}\n\n" + "\n".join(stems) + "\n```\n"
                  for caption, stems in zip(e.captions, (lessons, appendices), strict=True) if stems)
    return "\n\n".join([title.group(0), *paragraphs, student_map(e, block.group(1))]) + "\n" + toc


def stage(e: Edition) -> Path:
    """build/site-src/LANG: the edition's notebooks (copies), index.md and, for Chinese, search words."""
    src = STAGING / e.language
    shutil.rmtree(src, ignore_errors=True)
    src.mkdir(parents=True)
    pages = notebooks(e)
    for path in pages:
        shutil.copy2(path, src / path.name)
    (src / "index.md").write_text(landing_page(e, pages), encoding="utf-8")
    if e.language.startswith("zh"):
        # The glossary's Chinese renderings: jieba then keeps 固定内存 whole, so searching it finds it.
        from translations import glossary  # tools/translations.py: the glossary's one reader

        terms = {zh for _, zh in glossary() if re.fullmatch(r"[\u4e00-\u9fff]+", zh)}
        (src / SEARCH_WORDS).write_text("".join(f"{t} 100000\n" for t in sorted(terms)), encoding="utf-8")
    return src


# --- the extension ---------------------------------------------------------------------------------------

def _plain(markdown: str) -> str:
    """A heading's text without markdown: links keep their text, code its content."""
    return re.sub(r"[*_`]", "", re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", markdown)).strip()


def _literal(match: str) -> str:
    """A string literal of the code as a reader would say it: an f-string's {n} stays n, {expr:.2f} n too."""
    return re.sub(r"\{([^{}:!]+)[^{}]*\}", lambda m: m.group(1).strip(), match)


def plot_alt(e: Edition, source: str, section: str) -> str:
    """What a plot shows, from the code that drew it: a recording's --shows description, else the titles and
    axis labels the cell gives (title=, set_title, suptitle, the timeline's caption), else the function that
    draws it; with the section it illustrates."""
    shows = re.search(r'^%%gpu \S+.*?--shows "([^"]+)"', source, re.M)
    titles = [_literal(t) for t in re.findall(
        r'(?:\btitle=|set_title\(|suptitle\(|plt\.title\(|plot_timeline\(\w+, )f?"([^"]+)"', source)]
    labels = [_literal(t) for t in re.findall(r'(?:\b[xy]label=|set_[xy]label\()f?"([^"]+)"', source)]
    drawer = re.findall(r"\b((?:plot|draw)_\w+|\w+_chart)\b", source)
    if shows:
        what = shows.group(1)
    elif titles:
        what = "; ".join(dict.fromkeys(titles)) + (f" ({', '.join(dict.fromkeys(labels))})" if labels else "")
    elif drawer:
        what = drawer[0].replace("_", " ") + (f" ({', '.join(dict.fromkeys(labels))})" if labels else "")
    else:
        sys.exit(f"a plot whose code names no title, label or plotting function:\n{source[:300]}")
    return e.plot_alt.format(what=what, section=section)


def read_notebook(text: str, language: str = "en") -> Any:
    """MyST-NB's reader for .ipynb (nb_custom_formats): the notebook as the site shows it."""
    import nbformat

    e = edition(language)
    nb = nbformat.reads(text, as_version=4)
    nb.metadata.pop("widgets", None)
    if stale := nb.metadata.get("course_zh_stale"):  # tools/translations.py: blocks still in English
        # under the title, in the title's cell: cells stay in step with the English notebook's (anchors)
        title = next(c for c in nb.cells if c.cell_type == "markdown" and "course-badges" not in
                     c.metadata.get("tags", []))
        title.source = re.sub(r"\A(#[^\n]*\n)", lambda m: m.group(1) + "\n" + e.stale_note.format(n=stale["blocks"])
                              + "\n", title.source, count=1)
    section = ""
    for cell in nb.cells:
        tags = cell.metadata.setdefault("tags", [])
        if "course-badges" in tags:
            tags.append("remove-cell")
        if cell.cell_type != "code":
            section = next((_plain(h) for h in reversed(re.findall(r"^#{1,6} (.+)$", cell.source, re.M))), section)
            continue
        if any("image/png" in out.get("data", {}) for out in cell.get("outputs", [])):
            cell.metadata.setdefault("mystnb", {})["image"] = {"alt": plot_alt(e, cell.source, section)}
        if "solution" in tags:
            tags.append("hide-input")
            cell.metadata.setdefault("mystnb", {}).update(code_prompt_show=e.solution[0], code_prompt_hide=e.solution[1])
            cell.source = re.sub(r"\A#@title[^\n]*\n", "", cell.source)  # Colab's form title
        outputs = []
        for out in cell.get("outputs", []):
            data = out.get("data", {})
            for mime in ("text/plain", "text/html"):  # a recording's banner, worded for a web page
                if mime in data:
                    data[mime] = for_a_web_page("".join(data[mime]), e.language)
            if WIDGET_VIEW not in data:
                outputs.append(out)
            elif re.match(r"[A-Z]\w*\(", "".join(data.get("text/plain", ""))):  # a panel: HBox(...)
                note = f'<p class="course-widget-note"><em>{e.widget_note}</em></p>'
                outputs.append(nbformat.v4.new_output("display_data", data={"text/html": note}))
            # else a progress bar (tqdm): left out
        cell.outputs = outputs
    return nb


def heading_slugs(path: Path) -> list[list[str]]:
    """The anchor MyST gives each heading (GitHub's slug, made unique in the page), cell by cell."""
    import nbformat
    from markdown_it.renderer import RendererHTML
    from myst_parser.config.main import MdParserConfig
    from myst_parser.parsers.mdit import create_md_parser
    from myst_parser.slugs import github_slugify, unique_slug

    md, seen, cells = create_md_parser(MdParserConfig(), RendererHTML), set(), []
    for cell in nbformat.read(path, as_version=4).cells:
        slugs = []
        if cell.cell_type == "markdown" and "course-badges" not in cell.metadata.get("tags", []):
            tokens = md.parse(cell.source)
            for token, inline in zip(tokens, tokens[1:], strict=False):
                if token.type == "heading_open":
                    title = "".join(c.content for c in inline.children or [] if c.type in ("text", "code_inline"))
                    slugs.append(unique_slug(github_slugify(title), seen))
                    seen.add(slugs[-1])
        cells.append(slugs)
    return cells


class EnglishAnchors(Transform):
    """The Chinese edition's sections get the anchors of the English headings they translate (#1-to-on-tensors-
    a-new-tensor-when-something-changes, not #id1: a Chinese heading has no ASCII slug, so docutils numbers it,
    and the numbers shift when a heading is added). notebooks/zh/NN.ipynb is NN.ipynb translated cell by cell
    (tools/translations.py), so the k-th heading of a cell is the k-th heading of the English cell. The English
    anchor becomes the section's first id (its permalink and table-of-contents entry) and a MyST anchor, so a
    link with an English heading's anchor (the translations keep link targets) works between Chinese pages; the
    Chinese heading's own slug stays as a second anchor."""

    default_priority = 690  # after docutils and Sphinx give ids, before MyST adds its slugs and resolves #links

    def apply(self, **kwargs: Any) -> None:
        from sphinx.util import logging as sphinx_logging  # a warning fails the -W build

        logger = sphinx_logging.getLogger(__name__)
        env = getattr(self.document.settings, "env", None)
        if env is None or not env.config.language.startswith("zh"):
            return
        e = edition(env.config.language)
        zh, en = ROOT / e.folder / f"{env.docname}.ipynb", ROOT / EDITIONS[0].folder / f"{env.docname}.ipynb"
        if not (zh.exists() and en.exists()):
            return
        english = {}
        for i, (zh_cell, en_cell) in enumerate(zip(heading_slugs(zh), heading_slugs(en), strict=True)):
            if len(zh_cell) != len(en_cell):
                logger.warning(f"{zh.relative_to(ROOT)}: cell {i} has {len(zh_cell)} headings, {en.name} "
                               f"{len(en_cell)}: regenerate it (python tools/translations.py)")
            english.update(zip(zh_cell, en_cell, strict=False))  # warned above when they differ
        slugs = getattr(self.document, "myst_slugs", {})
        for section in self.document.findall(nodes.section):
            anchor = english.get(section.get("slug"))
            if anchor is None or anchor in section["ids"]:
                continue
            if anchor in self.document.ids:
                logger.warning(f"{zh.relative_to(ROOT)}: the English anchor #{anchor} is taken twice")
                continue
            old = section["ids"][0]
            section["ids"].insert(0, anchor)
            self.document.ids[anchor] = section
            for slug, (line, target, title) in list(slugs.items()):
                if target == old:
                    slugs[slug] = slugs[anchor] = (line, anchor, title)


def on_config_inited(app: Any, config: Any) -> None:
    """What differs between editions: title, notebook folder, reader language, search words."""
    e = edition(config.language)
    config.project = config.html_title = re.search(r"^# (.+)$", (ROOT / e.readme).read_text(encoding="utf-8"),
                                                   re.M).group(1)
    config.html_theme_options["path_to_docs"] = e.folder
    config.nb_custom_formats = {".ipynb": ["course_site.read_notebook", {"language": e.language}, False]}
    words = Path(app.srcdir) / SEARCH_WORDS
    if words.exists():
        config.html_search_options = {"dict": str(words)}


def link_target(e: Edition, docname: str, target: str, repo: str) -> str | None:
    """Where a link that is not a page of this edition goes: another edition's page, a repository file on
    GitHub, or None (then MyST reports it and the strict build fails)."""
    here = ROOT / (e.readme if docname == "index" else f"{e.folder}/{docname}.ipynb")
    path, _, fragment = target.partition("#")
    file = Path(os.path.normpath(here.parent / unquote(path)))
    anchor = f"#{fragment}" if fragment else ""
    for other in built_editions():
        if file.suffix == ".ipynb" and file.parent == ROOT / other.folder and file.exists():
            return posixpath.relpath(posixpath.join(other.out, f"{file.stem}.html"), e.out or ".") + anchor
    if file.exists() and file.is_relative_to(ROOT):
        kind = "tree" if file.is_dir() else "blob"
        return f"{repo}/{kind}/main/{file.relative_to(ROOT).as_posix()}{anchor}"
    return None


def on_doctree_read(app: Any, doctree: Any) -> None:
    """Links MyST could not place (files outside the edition's sources): see link_target."""
    from docutils import nodes
    from sphinx import addnodes

    e = edition(app.config.language)
    docname = app.env.docname
    for node in list(doctree.findall(addnodes.pending_xref)):
        if node.get("reftype") != "myst" or node.get("refdomain"):
            continue
        target = node["reftarget"]
        if docname == "index" and target.startswith(f"{e.folder}/") and target.split("#")[0].endswith(".ipynb"):
            # README's map: notebooks/NN.ipynb is a page of this edition; MyST checks it and its anchor.
            page, _, fragment = target[len(e.folder) + 1:].partition("#")
            if (ROOT / e.folder / page).exists():
                node["refdomain"], node["reftarget"] = "doc", page[:-len(".ipynb")]
                node["reftargetid"] = fragment or None
                continue
        url = link_target(e, docname, target, app.config.html_theme_options["repository_url"])
        if url is not None:
            node.replace_self(nodes.reference("", "", *node.children, refuri=url, internal=False))


def on_html_page_context(app: Any, pagename: str, templatename: str, context: dict, doctree: Any) -> None:
    """The language switch: the same page in the other edition (its index when it lacks that notebook)."""
    e = edition(app.config.language)
    context["language_switch"] = None
    for other in built_editions():
        if other is e:
            continue
        same = pagename in ("index", "search", "genindex") or (ROOT / other.folder / f"{pagename}.ipynb").exists()
        url = posixpath.relpath(posixpath.join(other.out, f"{pagename if same else 'index'}.html"), e.out or ".")
        context["language_switch"] = {"label": other.label, "url": url, "lang": other.language.replace("_", "-")}


# --- what a first load fetches ---------------------------------------------------------------------------

ICONS_CSS = "course-icons.css"
# Font Awesome's script, which no page loads now. Its fonts stay: the theme's CSS draws a few icons of pages
# seldom seen with them (admonitions, "Hide search matches"), and a browser fetches them only there.
FONT_AWESOME = ("scripts/fontawesome.js", "scripts/fontawesome.js.LICENSE.txt")


def icon_packs(script: str) -> dict[str, dict[str, tuple[int, int, str]]]:
    """The icons of the theme's Font Awesome script by pack (fas, fab, far): name (and alias) -> (width,
    height, SVG path). Each pack is an object literal ``var b={name:[w,h,[aliases],"unicode","path"],...}``
    that the script then hands to ``p("fas",b)`` (pydata-sphinx-theme 0.20's bundle of Font Awesome 7)."""
    packs: dict[str, dict[str, tuple[int, int, str]]] = {}
    for block in re.finditer(r'var b=\{(.*?)\};!function\(c\)\{.{0,300}?\(function\(\)\{p\("(fa\w)",b\)', script, re.S):
        icons = packs.setdefault(block.group(2), {})
        for m in re.finditer(r'"?([\w-]+)"?:\[(\d+),(\d+),\[([^\]]*)\],"\w+","(M[^"]+)"\]', block.group(1)):
            for name in [m.group(1), *re.findall(r'"([\w-]+)"', m.group(4))]:
                icons[name] = (int(m.group(2)), int(m.group(3)), m.group(5))
    return packs


def on_build_finished(app: Any, exception: Exception | None) -> None:
    """The theme's icons without Font Awesome's script (1.5 MB) and fonts (225 kB) for some twenty icons: the
    icons the pages and the theme's scripts name, drawn from the script's own SVG paths as CSS masks
    (course-icons.css); the script is removed from the output."""
    if exception is not None or app.builder.format != "html":
        return
    static = Path(app.outdir) / "_static"
    script = static / FONT_AWESOME[0]
    if not script.exists():
        return
    packs = icon_packs(script.read_text(encoding="utf-8"))
    used = set()
    for path in [*Path(app.outdir).glob("*.html"), *static.glob("scripts/*.js")]:
        if path != script:
            used |= set(re.findall(r"\bfa-([a-z0-9-]+)", path.read_text(encoding="utf-8")))
    rules = []
    for name in sorted(used):
        icon = next((packs[p][name] for p in ("fas", "fab", "far") if name in packs.get(p, {})), None)
        if icon is None:  # a style or size class: fa-solid, fa-lg, fa-fw
            continue
        width, height, path = icon
        svg = f"<svg xmlns='http://www.w3.org/2000/svg' viewBox='0 0 {width} {height}'><path d='{path}'/></svg>"
        mask = f'url("data:image/svg+xml,{svg.replace("<", "%3C").replace(">", "%3E")}") center / contain no-repeat'
        rules.append(f".fa-{name}::before {{ width: {width / height:.4g}em; -webkit-mask: {mask}; mask: {mask}; }}")
    if not rules:
        sys.exit("no Font Awesome icon found in the theme's script: course_site.on_build_finished needs a look")
    (static / ICONS_CSS).write_text(
        "/* The icons the site uses, from the theme's Font Awesome 7 Free (CC BY 4.0; course_site.py writes this\n"
        "   file): each drawn as a mask in the text's colour, in the page's font (the icon font's metrics alone\n"
        "   would make the browser download it). */\n"
        '[class*="fa-"], [class*="fa-"]::before { font-family: inherit !important; }\n'
        '[class*="fa-"]::before { content: "" !important; display: inline-block; height: 1em;'
        " vertical-align: -0.125em; background-color: currentColor; }\n" + "\n".join(rules) + "\n",
        encoding="utf-8")
    for rel in FONT_AWESOME:
        (static / rel).unlink(missing_ok=True)


def share_static(site: Path, other: Path) -> None:
    """Files of other/_static that are byte for byte those of site/_static: removed, and the other edition's
    pages load site/_static's (what differs stays: documentation_options.js, translations.js)."""
    shared = []
    for path in sorted((other / "_static").rglob("*")):
        twin = site / "_static" / path.relative_to(other / "_static")
        if path.is_file() and twin.is_file() and path.read_bytes() == twin.read_bytes():
            shared.append(path.relative_to(other).as_posix())
            path.unlink()
    up = posixpath.relpath(site, other)
    pattern = re.compile(r'((?:href|src)=")(' + "|".join(map(re.escape, shared)) + r')([?"])')
    for page in other.glob("*.html"):
        text = page.read_text(encoding="utf-8")
        page.write_text(pattern.sub(lambda m: f"{m.group(1)}{up}/{m.group(2)}{m.group(3)}", text), encoding="utf-8")
    for folder in sorted((other / "_static").rglob("*"), reverse=True):
        if folder.is_dir() and not any(folder.iterdir()):
            folder.rmdir()


def setup(app: Any) -> dict[str, Any]:
    try:  # Sphinx's Chinese search splits words with jieba: no "Building prefix dict..." in the build log
        import jieba

        jieba.setLogLevel(logging.WARNING)
    except ImportError:
        pass
    app.setup_extension("course_search")  # the search page's ranking and excerpts, highlights from a result
    app.add_transform(EnglishAnchors)
    app.connect("config-inited", on_config_inited, priority=400)  # before MyST-NB reads its configuration
    app.connect("doctree-read", on_doctree_read)
    app.connect("html-page-context", on_html_page_context)
    app.add_css_file(ICONS_CSS)  # written by on_build_finished
    app.connect("build-finished", on_build_finished)
    return {"parallel_read_safe": True, "parallel_write_safe": True}


# --- the build -------------------------------------------------------------------------------------------

def main() -> int:
    try:
        import myst_nb  # noqa: F401
        import sphinx_book_theme  # noqa: F401
        from sphinx.cmd.build import build_main
    except ImportError as exc:
        sys.exit(f"the site needs Sphinx, MyST-NB and sphinx-book-theme ({exc}); `make site` installs them, "
                 "or: pip install -c tests/constraints.txt -r tests/requirements-browser.txt")
    shutil.rmtree(SITE, ignore_errors=True)
    for e in built_editions():
        # MyST-NB writes beside the output folder (jupyter_execute/), so Sphinx writes in build/ first.
        html = STAGING / f"{e.language}-out" / "html"
        shutil.rmtree(html.parent, ignore_errors=True)
        args = ["-W", "--keep-going", "-n", "-q", "-c", str(HERE), "-d", str(html.parent / "doctrees"),
                "-D", f"language={e.language}", str(stage(e)), str(html)]
        if status := build_main(args):
            return status
        for source_map in html.rglob("*.map"):  # the theme's source maps: for its developers, 3 MB
            source_map.unlink()
        shutil.move(html, SITE / e.out)
        if e.out:  # the other edition's copies of the theme's files: one set, in site/_static
            share_static(SITE, SITE / e.out)
        print(f"{e.label}: {len(notebooks(e))} notebooks -> {(SITE / e.out).relative_to(ROOT)}/index.html")
    return 0


if __name__ == "__main__":
    sys.exit(main())
