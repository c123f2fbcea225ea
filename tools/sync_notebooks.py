#!/usr/bin/env python3
"""Rebuild what is generated: every notebook's badge and setup cells, and README's badges, notebook map
and command table.

The sources (see tools/project.py): the repository URL in pyproject.toml, the curriculum in
tools/project.py, the ``course_utils`` imports in each notebook's code cells, and the ``##`` comments of
the Makefile. Each notebook's first cell (tagged ``course-badges``) gets Open-in-Colab and Binder badges
for that notebook, and its first code cell (tagged ``course-setup``) installs course_utils from the
repository when it is missing (Colab opens single notebooks) and loads the ``%%gpu`` magic.

    python tools/sync_notebooks.py            # rewrite what is out of date
    python tools/sync_notebooks.py --check    # exit 1 if anything is out of date (used by the tests)

Only the text of those cells and README's marked blocks change; stored outputs are kept.
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


def sync(nb: dict, name: str, url: str) -> dict:
    cells = nb["cells"]
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


def readme_notebook_map() -> str:
    """README's notebook table: each lesson, what it teaches, and the course_utils modules its cells import."""
    rows = ["| notebook | what it teaches | helpers it imports (`course_utils/`) | checkers (`course_utils/exercises/`) |",
            "|---|---|---|---|"]
    for lesson in CURRICULUM:
        path = ROOT / "notebooks" / f"{lesson.stem}.ipynb"
        modules = notebook_modules(path) if path.is_file() else []
        helpers = [m for m in modules if not m.startswith("exercises")]
        checkers = [m for m in modules if m.startswith("exercises.")]
        rows.append(f"| [{lesson.stem[:2]} · {lesson.title}](notebooks/{lesson.stem}.ipynb) | {lesson.teaches} | "
                    f"{_module_links(helpers, 'course_utils/')} | {_module_links(checkers, 'course_utils/')} |")
    return "\n".join(rows)


def readme_commands() -> str:
    """README's command table, from the ``##`` comments above the Makefile's targets."""
    rows = ["| command | what |", "|---|---|"]
    rows += [f"| `make {t.name}` | {t.help} |" for t in make_targets() if t.name != "help"]
    return "\n".join(rows)


def _replace_block(text: str, name: str, body: str) -> str:
    pattern = re.compile(rf"(<!-- {name}:[^\n]*-->\n).*?(\n<!-- /{name} -->)", re.S)
    if not pattern.search(text):
        sys.exit(f"README.md has no <!-- {name}: ... --> ... <!-- /{name} --> block to fill")
    return pattern.sub(lambda m: m.group(1) + body + m.group(2), text)


def sync_readme(text: str, url: str) -> str:
    text = _replace_block(text, "badges", readme_badges(url))
    text = _replace_block(text, "notebooks", readme_notebook_map())
    return _replace_block(text, "commands", readme_commands())


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
    readme = ROOT / "README.md"
    if readme.is_file() and not args.paths:
        before = readme.read_text(encoding="utf-8")
        after = sync_readme(before, url)
        if after != before:
            stale.append(readme)
            if not args.check:
                readme.write_text(after, encoding="utf-8")
    verb = "out of date" if args.check else "updated"
    for path in stale:
        print(f"{verb}: {path.relative_to(ROOT) if path.is_absolute() else path}")
    return 1 if (args.check and stale) else 0


if __name__ == "__main__":
    sys.exit(main())
