#!/usr/bin/env python3
"""Rebuild what is generated: every notebook's badge and setup cells, README's badges, notebook map and
command table, and CONTRIBUTING.md's curriculum and command table.

The sources (see tools/project.py): the repository URL in pyproject.toml, the curriculum in
tools/project.py, the ``course_utils`` imports in each notebook's code cells, and the ``##`` comments of
the Makefile. Each notebook's first cell (tagged ``course-badges``) gets Open-in-Colab and Binder badges
for that notebook, and its first code cell (tagged ``course-setup``) installs course_utils from the
repository when it is missing (Colab opens single notebooks) and loads the ``%%gpu`` magic. Its last cell
(tagged ``course-next``) links the next lesson. Every cell tagged ``solution`` is hidden until asked for:
source hidden in JupyterLab, a form under ``#@title`` in Colab.

    python tools/sync_notebooks.py            # rewrite what is out of date
    python tools/sync_notebooks.py --check    # exit 1 if anything is out of date (used by the tests)

Only the text of those cells and the marked blocks (``<!-- name: ... -->`` to ``<!-- /name -->``) of
README.md and CONTRIBUTING.md change; stored outputs are kept.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

from project import CURRICULUM, ROOT, make_targets, notebook_modules, repository_url

BRANCH = "main"


def badge_source(url: str, name: str) -> str:
    slug = url.removeprefix("https://github.com/")
    colab = f"https://colab.research.google.com/github/{slug}/blob/{BRANCH}/notebooks/{name}"
    binder = f"https://mybinder.org/v2/gh/{slug}/{BRANCH}?labpath=notebooks%2F{name}"
    return (f"[![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)]({colab}) "
            f"[![Binder](https://mybinder.org/badge_logo.svg)]({binder})")


def setup_source(url: str) -> str:
    return (
        "# Setup: installs the course's helpers when they are missing (e.g. on Colab), then loads them.\n"
        "import importlib.util\n"
        "\n"
        'if importlib.util.find_spec("course_utils") is None:\n'
        f'    %pip install -q "course_utils @ git+{url}"\n'
        "%load_ext course_utils"
    )


def _lines(text: str) -> list[str]:
    parts = text.split("\n")
    return [p + "\n" for p in parts[:-1]] + [parts[-1]]


def _tagged(cell: dict, tag: str) -> bool:
    return tag in cell.get("metadata", {}).get("tags", [])


SOLUTION_TITLE = "#@title Solution (double-click to show the code)"
"""First line of every solution cell: Colab shows it as a form with the code hidden (``cellView: form``)."""


def solution_source(source: str) -> str:
    """A solution cell's code under the Colab form title (an old title or a bare ``# Solution`` replaced)."""
    lines = source.split("\n")
    while lines and (lines[0].startswith("#@title") or lines[0].strip() == "# Solution"):
        lines.pop(0)
    return "\n".join([SOLUTION_TITLE, *lines])


def hide_solution(cell: dict) -> None:
    """Solutions stay hidden until asked for: in JupyterLab (source hidden) and Colab (a form)."""
    meta = cell.setdefault("metadata", {})
    meta.setdefault("jupyter", {})["source_hidden"] = True
    meta["cellView"] = "form"
    cell["source"] = _lines(solution_source("".join(cell["source"])))


def lessons_and_appendices() -> list[tuple[str, str, str]]:
    """(stem, numbered title, what it teaches) of every lesson, then of every appendix in notebooks/."""
    pages = [(lesson.stem, f"{lesson.stem[:2]} · {lesson.title}", lesson.teaches) for lesson in CURRICULUM]
    for path in sorted((ROOT / "notebooks").glob("9*_appendix_*.ipynb")):
        pages.append((path.stem, f"{path.stem[:2]} · {notebook_heading(path)}", ""))
    return pages


def notebook_heading(path: Path) -> str:
    """The title of a notebook's ``# NN · Title`` heading, without the number."""
    for cell in json.loads(path.read_text(encoding="utf-8"))["cells"]:
        m = re.match(r"#\s+\d\d\s+·\s+(.+)", "".join(cell["source"])) if cell["cell_type"] == "markdown" else None
        if m:
            return m.group(1).strip()
    return path.stem


def colab_url(url: str, path: str) -> str:
    """The Colab address of ``path`` (e.g. ``notebooks/02_moving_data.ipynb``) in the repository at ``url``."""
    return f"https://colab.research.google.com/github/{url.removeprefix('https://github.com/')}/blob/{BRANCH}/{path}"


def next_source(name: str, url: str) -> str:
    """The closing "Next:" line of a notebook: the following lesson (also as a Colab link: on Colab, where one
    notebook is opened from GitHub, a relative link has no folder to resolve in), or the way back to the map."""
    pages = lessons_and_appendices()
    stems = [stem for stem, _, _ in pages]
    stem = name.removesuffix(".ipynb")
    i = stems.index(stem) if stem in stems else len(stems)
    lessons = len(CURRICULUM)
    if i + 1 < lessons:
        _, title, teaches = pages[i + 1]
        colab = colab_url(url, f"notebooks/{stems[i + 1]}.ipynb")
        return f"**Next:** [{title}]({stems[i + 1]}.ipynb) ([on Colab]({colab})): {teaches}."
    if i + 1 == lessons and len(pages) > lessons:
        appendices = ", ".join(f"[{title}]({s}.ipynb) ([on Colab]({colab_url(url, f'notebooks/{s}.ipynb')}))"
                               for s, title, _ in pages[lessons:])
        return f"**Next:** that was the last lesson. Appendices: {appendices}. The course map is in README.md."
    return ("**Next:** back to the course map in README.md, or to the lessons from [00 · Setup](00_setup.ipynb) "
            f"([on Colab]({colab_url(url, 'notebooks/00_setup.ipynb')})).")


def sync(nb: dict, name: str, url: str) -> dict:
    cells = nb["cells"]
    for cell in cells:
        if cell["cell_type"] == "code" and _tagged(cell, "solution"):
            hide_solution(cell)
    nxt = {"cell_type": "markdown", "id": "course-next", "metadata": {"tags": ["course-next"]},
           "source": _lines(next_source(name, url))}
    if cells and _tagged(cells[-1], "course-next"):
        cells[-1]["source"] = nxt["source"]
    else:
        cells[:] = [c for c in cells if not _tagged(c, "course-next")] + [nxt]
    badges = {"cell_type": "markdown", "id": "course-badges", "metadata": {"tags": ["course-badges"]},
              "source": _lines(badge_source(url, name))}
    if cells and _tagged(cells[0], "course-badges"):
        cells[0]["source"] = badges["source"]
    else:
        cells.insert(0, badges)
    setup = [c for c in cells if _tagged(c, "course-setup")]
    if setup:
        setup[0]["source"] = _lines(setup_source(url))
    else:
        first_code = next((i for i, c in enumerate(cells) if c["cell_type"] == "code"), len(cells))
        cells.insert(first_code, {"cell_type": "code", "execution_count": None, "id": "course-setup",
                                  "metadata": {"tags": ["course-setup"]}, "outputs": [],
                                  "source": _lines(setup_source(url))})
    return nb


def readme_badges(url: str) -> str:
    slug = url.removeprefix("https://github.com/")
    first = "00_setup.ipynb"
    return (f"[![Binder](https://mybinder.org/badge_logo.svg)](https://mybinder.org/v2/gh/{slug}/{BRANCH}"
            f"?labpath=notebooks%2F{first}) "
            f"[![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)]"
            f"(https://colab.research.google.com/github/{slug}/blob/{BRANCH}/notebooks/{first})")


def _module_links(modules: list[str], folder: str) -> str:
    return ", ".join(f"[{m.removeprefix('exercises.')}]({folder}{m.replace('.', '/')}.py)" for m in modules) or "–"


MAP_HEADER = "| notebook | what it teaches | helpers it imports (`course_utils/`) | checkers (`course_utils/exercises/`) |"


def readme_notebook_map(header: str = MAP_HEADER, folder: str = "notebooks/",
                        translate: dict[str, str] | None = None,
                        appendix: str = "for the curious and for maintainers") -> str:
    """README's notebook table: each lesson (then each appendix), what it teaches, and the course_utils modules
    its cells import. The Chinese README's table is the same with its ``header``, ``folder``, ``appendix``
    note, and titles and lessons through ``translate``."""
    words = translate or {}
    rows = [header, "|---|---|---|---|"]
    for stem, title, teaches in lessons_and_appendices():
        path = ROOT / "notebooks" / f"{stem}.ipynb"
        modules = notebook_modules(path) if path.is_file() else []
        helpers = [m for m in modules if not m.startswith("exercises")]
        checkers = [m for m in modules if m.startswith("exercises.")]
        number, name = title.split(" · ", 1)
        what = words.get(teaches, teaches) if teaches else appendix
        rows.append(f"| [{number} · {words.get(name, name)}]({folder}{stem}.ipynb) | {what} | "
                    f"{_module_links(helpers, 'course_utils/')} | {_module_links(checkers, 'course_utils/')} |")
    return "\n".join(rows)


def readme_commands() -> str:
    """README's command table, from the ``##`` comments above the Makefile's targets."""
    rows = ["| command | what |", "|---|---|"]
    rows += [f"| `make {t.name}` | {t.help} |" for t in make_targets() if t.name != "help"]
    return "\n".join(rows)


def contributing_curriculum() -> str:
    """CONTRIBUTING's list of the notebook files: every lesson of tools/project.py, then every appendix."""
    rows = ["| file | title | what it teaches |", "|---|---|---|"]
    for stem, title, teaches in lessons_and_appendices():
        rows.append(f"| `notebooks/{stem}.ipynb` | {title} | {teaches or 'for the curious and for maintainers'} |")
    return "\n".join(rows)


def replace_block(text: str, name: str, body: str, file: str = "README.md") -> str:
    """``text`` with the generated block ``<!-- name: ... -->`` … ``<!-- /name -->`` of ``file`` holding ``body``."""
    pattern = re.compile(rf"(<!-- {name}:[^\n]*-->\n).*?(\n<!-- /{name} -->)", re.S)
    if not pattern.search(text):
        sys.exit(f"{file} has no <!-- {name}: ... --> ... <!-- /{name} --> block to fill")
    return pattern.sub(lambda m: m.group(1) + body + m.group(2), text)


def sync_readme(text: str, url: str) -> str:
    text = replace_block(text, "badges", readme_badges(url))
    text = replace_block(text, "notebooks", readme_notebook_map())
    return replace_block(text, "commands", readme_commands())


def sync_contributing(text: str) -> str:
    text = replace_block(text, "curriculum", contributing_curriculum(), "CONTRIBUTING.md")
    return replace_block(text, "commands", readme_commands(), "CONTRIBUTING.md")


def dump(nb: dict) -> str:
    return json.dumps(nb, sort_keys=True, indent=1, ensure_ascii=False) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--check", action="store_true", help="report notebooks that are out of date")
    parser.add_argument("paths", nargs="*", type=Path)
    args = parser.parse_args()
    url = repository_url()
    paths = args.paths or sorted((ROOT / "notebooks").glob("*.ipynb"))
    stale = []
    for path in paths:
        before = path.read_text(encoding="utf-8")
        after = dump(sync(json.loads(before), path.name, url))
        if after != before:
            stale.append(path)
            if not args.check:
                path.write_text(after, encoding="utf-8")
    documents = {ROOT / "README.md": lambda text: sync_readme(text, url),
                 ROOT / "CONTRIBUTING.md": sync_contributing}
    for document, sync_document in documents.items():
        if not document.is_file() or args.paths:
            continue
        before = document.read_text(encoding="utf-8")
        after = sync_document(before)
        if after != before:
            stale.append(document)
            if not args.check:
                document.write_text(after, encoding="utf-8")
    return report_stale(stale, args.check)


def report_stale(stale: list[Path], check: bool) -> int:
    """Prints each file that was out of date (``--check``) or rewritten; the exit status: 1 for ``--check``
    with anything out of date."""
    verb = "out of date" if check else "updated"
    for path in stale:
        print(f"{verb}: {path.relative_to(ROOT) if path.is_absolute() else path}")
    return 1 if (check and stale) else 0


if __name__ == "__main__":
    sys.exit(main())
