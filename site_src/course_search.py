"""The site's search, a Sphinx extension that course_site.py sets up.

Sphinx's own search page ranks pages of equal score by file name and shows no excerpt when the site is opened
from disk (it fetches each result page for one, which a browser refuses under file://). So:
  - at the end of the build, ``_static/course-search-data.js`` holds, for each page, its sections (id,
    heading, prose, the first and last lines of each cell's outputs, the distinct words of its code) and the
    glossary's English-Chinese pairs (i18n/zh_CN/GLOSSARY.md); only search.html loads it, with ``course-search.js``
    (_static/ beside this file), which ranks and shows the results from it;
  - every page highlights a search's words only when opened from a result (its link carries
    ``?highlight=``), and scrolls to the first one in the result's section.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
DATA = "course-search-data.js"
# An output is searched by its first and last lines that have words (a traceback's last line is its message),
# so that a long table or log does not swell the data; code by its words (an excerpt comes from the prose or
# the outputs).
OUTPUT_HEAD, OUTPUT_TAIL, LINE_CHARS = 3, 2, 120
CJK = re.compile(r"[\u3400-\u9fff]")

# On every page, before Sphinx's scripts run: Sphinx keeps the last search's words in localStorage and would
# highlight them on whatever page opens next (a click in the sidebar after a search). Forget them; highlight
# only the words a result's link carries (?highlight=), once images have their size, and scroll to the first
# in the result's section (#id), else in a section past the introduction.
HIGHLIGHT_FROM_RESULT = """(() => {
  localStorage.removeItem("sphinx_highlight_terms");
  if (!new URLSearchParams(location.search).get("highlight")) return;
  window.addEventListener("load", () => {
    if (typeof SphinxHighlight === "undefined") return;
    SphinxHighlight.highlightSearchWords();  // reads ?highlight=, drops it from the address; marks after 10 ms
    setTimeout(() => {
      const id = decodeURIComponent(location.hash.slice(1));
      const section = id && document.getElementById(id);
      const hit = (section && section.querySelector("span.highlighted"))
        || document.querySelector("article section section span.highlighted")
        || document.querySelector("article span.highlighted");
      if (hit) hit.scrollIntoView({block: "center"});
    }, 50);
  });
})();"""


def text_of(node: Any) -> str:
    """The node's text as a reader sees it: block elements separated by a space; raw HTML, comments and
    images left out."""
    from docutils import nodes

    if isinstance(node, nodes.Text):
        return str(node)
    if isinstance(node, (nodes.raw, nodes.comment, nodes.image, nodes.system_message)):
        return ""
    return "".join(text_of(c) + ("" if isinstance(c, (nodes.Text, nodes.Inline)) else " ") for c in node.children)


def squash(parts: list[str]) -> str:
    return re.sub(r"\s+", " ", " ".join(parts)).strip()


def output_lines(text: str) -> str:
    lines = [line.strip()[:LINE_CHARS] for line in text.splitlines() if re.search(r"[^\W\d_]{3}", line)]
    if len(lines) > OUTPUT_HEAD + OUTPUT_TAIL:
        lines = lines[:OUTPUT_HEAD] + lines[-OUTPUT_TAIL:]
    return " ".join(lines)


def sections(doctree: Any) -> list[list[str]]:
    """[id, heading, prose, outputs, code words] of each section, in page order, without its subsections."""
    from docutils import nodes

    records = []
    for section in doctree.findall(nodes.section):
        prose: list[str] = []
        outputs: list[str] = []
        code: set[str] = set()
        for child in section.children:
            if isinstance(child, (nodes.section, nodes.title)):
                continue
            classes = child.get("classes", []) if isinstance(child, nodes.Element) else []
            if "cell" not in classes:
                prose.append(text_of(child))
                continue
            for part in child.children:  # a notebook cell: its source, then its outputs
                part_classes = part.get("classes", [])
                if "cell_input" in part_classes:
                    code.update(re.findall(r"\w+", text_of(part)))
                elif "cell_output" in part_classes:
                    outputs.extend(output_lines(text_of(output)) for output in part.children)
        records.append([section["ids"][0], text_of(section[0]).strip(), squash(prose), squash(outputs),
                        " ".join(sorted(code))])
    return records


def synonyms() -> list[list[str]]:
    """[English, Chinese] of each glossary row whose rendering is Chinese (not a term kept in English)."""
    from translations import glossary  # tools/translations.py: the glossary's one reader

    return [[en, zh] for en, zh in glossary() if CJK.search(zh)]


def write_data(app: Any, exception: Exception | None) -> None:
    """_static/course-search-data.js: every page's sections and the glossary's pairs (build-finished)."""
    if exception is not None or app.builder.format != "html":
        return
    env = app.env
    pages = [[name, text_of(env.titles[name]).strip(), sections(env.get_doctree(name))]
             for name in sorted(env.found_docs)]
    data = {"pages": pages, "synonyms": synonyms()}
    text = json.dumps(data, ensure_ascii=False, separators=(",", ":"))
    out = Path(app.outdir) / "_static" / DATA
    out.write_text(f"var COURSE_SEARCH_DATA = {text};\n", encoding="utf-8")


def on_html_page_context(app: Any, pagename: str, templatename: str, context: dict, doctree: Any) -> None:
    """search.html alone loads the data and the ranking; deferred, they run after Sphinx's searchtools.js
    (which the theme loads last in the head) and before it starts the search (DOMContentLoaded)."""
    if pagename == "search":
        app.add_js_file(DATA, defer="defer")
        app.add_js_file("course-search.js", defer="defer")


def on_builder_inited(app: Any) -> None:
    app.config.html_static_path.append(str(HERE / "_static"))


def setup(app: Any) -> dict[str, Any]:
    app.add_js_file(None, body=HIGHLIGHT_FROM_RESULT)
    app.connect("builder-inited", on_builder_inited)
    app.connect("html-page-context", on_html_page_context)
    app.connect("build-finished", write_data)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
