#!/usr/bin/env python3
"""Build a static HTML version of the course from the notebooks' stored outputs.

    python tools/build_site.py [--out site]

Each notebook becomes ``site/NN_name.html`` (nbconvert's lab template, plots embedded as data URIs,
nothing executed), and ``site/index.html`` is the notebook map from README.md. The site works offline:
no script, style sheet, font or image is fetched from the network (MathJax, require.js and the widget
manager are left out; a widget shows a note instead, beside the static output every widget cell also
has), links between notebooks point at the .html pages, and badge images become text links. Solution
cells are collapsed in a ``<details>`` element that opens on a click. Links to
other files of the repository point at the repository on the web (pyproject's ``Repository``).
The build fails when a page links to a local file that the site does not have.

Run it in an environment with nbconvert (``make site`` installs tests/requirements-browser.txt).
"""

from __future__ import annotations

import argparse
import copy
import html
import re
import shutil
import sys
from pathlib import Path
from urllib.parse import unquote, urlsplit

import nbformat
from jinja2 import DictLoader
from nbconvert import HTMLExporter
from nbconvert.filters.markdown_mistune import markdown2html_mistune
from project import ROOT, repository_url

WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
# [![alt](image)](target): a badge; the site keeps the link as text, so no remote image is needed.
IMAGE_LINK = re.compile(r"\[!\[([^\]]*)\]\([^)]*\)\]\(([^)\s]+)\)")
HREF = re.compile(r'(href|src)="([^"]*)"')

SITE_CSS = """
.course-nav { font-family: system-ui, sans-serif; font-size: 14px; display: flex; gap: 1.5em;
  align-items: center; padding: 8px 16px; border-bottom: 1px solid #ddd; background: #f7f7f7;
  position: sticky; top: 0; z-index: 10; }
.course-nav a { text-decoration: none; color: #1a5fb4; }
.course-nav .spacer { flex: 1; }
.course-solution { font-family: system-ui, sans-serif; margin: 8px 0 8px 8px; }
.course-solution summary { cursor: pointer; color: #1a5fb4; }
.course-solution pre { background: #f7f7f7; padding: 6px 8px; overflow-x: auto; font-size: 13px; }
.course-widget-note { font-family: system-ui, sans-serif; font-size: 13px; color: #555;
  border: 1px dashed #aaa; border-radius: 4px; padding: 4px 8px; margin: 4px 0; }
"""

# The lab template without anything fetched from the network, with a navigation bar on top.
PAGE_TEMPLATE = """{%- extends 'lab/index.html.j2' -%}
{%- block html_head_js_requirejs -%}{%- endblock html_head_js_requirejs -%}
{%- block jupyter_widgets -%}{%- endblock jupyter_widgets -%}
{%- block html_head_js_mathjax -%}{%- endblock html_head_js_mathjax -%}
{%- block html_head_js_mermaidjs -%}{%- endblock html_head_js_mermaidjs -%}
{%- block extra_css -%}<style type="text/css">{{ resources.site_css }}</style>{%- endblock extra_css -%}
{%- block body_header -%}
{{ super() }}
<!-- course-nav -->
{%- endblock body_header -%}
"""

INDEX_TEMPLATE = """<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{title}</title>
<style>
body {{ font-family: system-ui, sans-serif; max-width: 60em; margin: 2em auto; padding: 0 1em;
  line-height: 1.5; color: #222; }}
table {{ border-collapse: collapse; }}
th, td {{ border: 1px solid #ccc; padding: 6px 10px; text-align: left; vertical-align: top; }}
th {{ background: #f3f3f3; }}
code {{ background: #f3f3f3; padding: 0 3px; border-radius: 3px; }}
a {{ color: #1a5fb4; }}
footer {{ margin-top: 3em; font-size: 13px; color: #666; }}
</style>
</head>
<body>
<main>
{body}
</main>
<footer>Built from the notebooks' stored outputs (a CPU run; GPU cells show outputs recorded on a GPU host).
Source: <a href="{repo}">{repo}</a>.</footer>
</body>
</html>
"""


def badges_as_links(markdown: str) -> str:
    """[![Binder](badge.svg)](url) [![Open In Colab](...)](url2) -> [Binder](url) · [Open In Colab](url2)."""
    text = IMAGE_LINK.sub(r"[\1](\2)", markdown)
    return re.sub(r"(?<=\))[ \t]+(?=\[)", " · ", text) if text != markdown else text


def readme_sections() -> tuple[str, str, str]:
    """(title, introduction, notebook map) from README.md, as markdown."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    title = re.search(r"^# (.+)$", text, re.M).group(1).strip()
    intro_match = re.search(r"^# .+?\n(.*?)\n## ", text, re.S | re.M)
    intro = re.sub(r"<!--.*?-->", "", intro_match.group(1)).strip() if intro_match else ""
    intro = badges_as_links(intro)
    section = re.search(r"^## The notebooks\s*\n(.*?)(?=^## |\Z)", text, re.S | re.M)
    if not section:
        raise SystemExit("README.md has no '## The notebooks' section: the site's index is built from it")
    return title, intro, section.group(1).strip()


def link_target(url: str, here: str, pages: set[str], repo: str) -> str:
    """Where a link from ``here`` (a path relative to the repository root) points in the site."""
    parts = urlsplit(url)
    if parts.scheme or parts.netloc or url.startswith(("#", "mailto:", "data:")) or not parts.path:
        return url
    base = Path(here).parent
    target = Path(*[p for p in (base / unquote(parts.path)).parts])
    resolved = Path(*_normalise(target.parts))
    fragment = f"#{parts.fragment}" if parts.fragment else ""
    if resolved.suffix == ".ipynb" and resolved.parent == Path("notebooks") and resolved.stem in pages:
        return f"{resolved.stem}.html{fragment}"
    if resolved == Path("README.md"):
        return f"index.html{fragment}"
    if str(resolved).startswith(".."):
        return url
    kind = "tree" if (ROOT / resolved).is_dir() else "blob"
    return f"{repo}/{kind}/main/{resolved.as_posix()}{fragment}"


def _normalise(parts: tuple[str, ...]) -> list[str]:
    out: list[str] = []
    for p in parts:
        if p == "..":
            if out and out[-1] != "..":
                out.pop()
            else:
                out.append(p)
        elif p != ".":
            out.append(p)
    return out


def rewrite_links(html_text: str, here: str, pages: set[str], repo: str) -> str:
    def sub(m: re.Match) -> str:
        attr, url = m.group(1), html.unescape(m.group(2))
        if attr == "src":
            return m.group(0)
        return f'{attr}="{html.escape(link_target(url, here, pages, repo), quote=True)}"'

    return HREF.sub(sub, html_text)


def _output_text(out: nbformat.NotebookNode) -> str:
    if out.get("output_type") == "stream":
        return "".join(out.get("text", ""))
    if out.get("output_type") == "error":
        return f"{out.get('ename', '')}: {out.get('evalue', '')}"
    return "".join(out.get("data", {}).get("text/plain", ""))


def _pre(text: str, cls: str) -> str:
    # One line of HTML: newlines as character references, so no blank line can end the block early.
    return f'<pre class="{cls}">' + html.escape(text.rstrip("\n")).replace("\n", "&#10;") + "</pre>"


def solution_block(cell: nbformat.NotebookNode) -> nbformat.NotebookNode:
    """A solution cell as the site shows it: collapsed in a <details> element, its code and text outputs inside."""
    code = re.sub(r"^#@title[^\n]*\n", "", cell.source)
    parts = [_pre(code, "course-solution-code")]
    parts += [_pre(text, "course-solution-output") for text in map(_output_text, cell.get("outputs", [])) if text]
    body = ('<details class="course-solution"><summary>Solution (click to open)</summary>'
            + "".join(parts) + "</details>")
    return nbformat.v4.new_markdown_cell(body)


def static_copy(nb: nbformat.NotebookNode) -> nbformat.NotebookNode:
    """The notebook as the site shows it: badges as text links, widgets as a note, solutions collapsed."""
    nb = copy.deepcopy(nb)
    nb.metadata.pop("widgets", None)
    nb.cells = [solution_block(c) if c.cell_type == "code" and "solution" in c.metadata.get("tags", []) else c
                for c in nb.cells]
    for cell in nb.cells:
        if cell.cell_type == "markdown":
            cell.source = badges_as_links(cell.source)
        if cell.cell_type != "code":
            continue
        outputs = []
        for out in cell.get("outputs", []):
            data = out.get("data", {})
            if WIDGET_VIEW in data:
                plain = "".join(data.get("text/plain", ""))
                if re.match(r"^[A-Z]\w*\(", plain):  # a control panel (HBox(...)), not a progress bar
                    note = ('<div class="course-widget-note">Interactive controls (ipywidgets): live when '
                            "the notebook runs in JupyterLab, Binder or Colab. The output below is "
                            "their first result.</div>")
                    outputs.append(nbformat.v4.new_output("display_data", data={"text/html": note}))
                continue
            outputs.append(out)
        cell.outputs = outputs
    return nb


def nav_bar(pages: list[tuple[str, str]], i: int) -> str:
    links = ['<a href="index.html">Course index</a>']
    if i > 0:
        links.append(f'<a href="{pages[i - 1][0]}.html" rel="prev">← {html.escape(pages[i - 1][1])}</a>')
    links.append('<span class="spacer"></span>')
    if i + 1 < len(pages):
        links.append(f'<a href="{pages[i + 1][0]}.html" rel="next">{html.escape(pages[i + 1][1])} →</a>')
    return f'<nav class="course-nav">{"".join(links)}</nav>'


def notebook_title(nb: nbformat.NotebookNode, fallback: str) -> str:
    for cell in nb.cells:
        if cell.cell_type == "markdown":
            m = re.search(r"^#\s+(.+)$", cell.source, re.M)
            if m:
                return re.sub(r"[*_`]", "", m.group(1)).strip()
    return fallback


def check_local_links(out: Path) -> list[str]:
    problems = []
    for page in sorted(out.glob("*.html")):
        for m in HREF.finditer(page.read_text(encoding="utf-8")):
            url = html.unescape(m.group(2))
            parts = urlsplit(url)
            if parts.scheme or parts.netloc or url.startswith(("#", "data:", "mailto:")) or not parts.path:
                continue
            if not (out / unquote(parts.path)).exists():
                problems.append(f"{page.name}: {m.group(1)}={url!r} does not exist in the site")
    return problems


def build(out: Path, notebooks: list[Path]) -> list[Path]:
    repo = repository_url()
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    loaded = [(p, nbformat.read(p, as_version=4)) for p in notebooks]
    pages = [(p.stem, notebook_title(nb, p.stem)) for p, nb in loaded]
    stems = {stem for stem, _ in pages}
    exporter = HTMLExporter(template_name="lab", template_file="course_site.html.j2",
                            extra_loaders=[DictLoader({"course_site.html.j2": PAGE_TEMPLATE})],
                            embed_images=True)
    written = []
    for i, (path, nb) in enumerate(loaded):
        resources = {"metadata": {"name": pages[i][1], "path": str(path.parent)},
                     "site_css": SITE_CSS}
        body, _ = exporter.from_notebook_node(static_copy(nb), resources=resources)
        body = rewrite_links(body, f"notebooks/{path.name}", stems, repo)
        body = body.replace("<!-- course-nav -->", nav_bar(pages, i), 1)
        target = out / f"{path.stem}.html"
        target.write_text(body, encoding="utf-8")
        written.append(target)

    title, intro, notebook_map = readme_sections()
    body_md = f"# {title}\n\n{intro}\n\n## The notebooks\n\n{notebook_map}\n"
    index_html = markdown2html_mistune(body_md)
    index_html = rewrite_links(index_html, "README.md", stems, repo)
    (out / "index.html").write_text(INDEX_TEMPLATE.format(title=html.escape(title), body=index_html,
                                                          repo=html.escape(repo)), encoding="utf-8")
    written.insert(0, out / "index.html")
    problems = check_local_links(out)
    if problems:
        raise SystemExit("broken links in the site:\n" + "\n".join(problems))
    return written


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "site", help="output folder (replaced)")
    parser.add_argument("notebooks", nargs="*", type=Path, help="default: notebooks/*.ipynb")
    args = parser.parse_args(argv)
    notebooks = args.notebooks or sorted((ROOT / "notebooks").glob("*.ipynb"))
    for page in build(args.out, notebooks):
        print(f"{page.relative_to(args.out.parent) if page.is_relative_to(args.out.parent) else page}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
