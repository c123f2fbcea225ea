#!/usr/bin/env python3
"""Rebuild the badge cell and the setup cell of every notebook (and README's badges) from the repository URL.

The URL lives in one place: ``[project.urls] Repository`` in pyproject.toml. Each notebook's first cell
(tagged ``course-badges``) gets Open-in-Colab and Binder badges for that notebook, and its first code
cell (tagged ``course-setup``) installs course_utils from the repository when it is missing (Colab opens
single notebooks) and loads the ``%%gpu`` magic.

    python tools/sync_notebooks.py            # rewrite notebooks/*.ipynb where needed
    python tools/sync_notebooks.py --check    # exit 1 if any notebook is out of date (used by the tests)

Only the text of those two cells changes; stored outputs are kept.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BRANCH = "main"


def repository_url() -> str:
    text = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    m = re.search(r'^Repository\s*=\s*"(https://github\.com/[^"]+?)/?"', text, re.M)
    if not m:
        sys.exit("pyproject.toml: [project.urls] needs Repository = \"https://github.com/OWNER/NAME\"")
    return m.group(1)


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


def sync_readme(text: str, url: str) -> str:
    pattern = re.compile(r"(<!-- badges:[^\n]*-->\n).*?(\n<!-- /badges -->)", re.S)
    return pattern.sub(lambda m: m.group(1) + readme_badges(url) + m.group(2), text)


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
