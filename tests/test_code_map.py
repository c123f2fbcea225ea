"""The code map holds: each helper module names the notebooks that use it, ``__all__`` lists the public
names, and no module imports another module's private names."""

from __future__ import annotations

import ast
import importlib
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))
from project import CURRICULUM, notebook_modules  # noqa: E402

PACKAGE = ROOT / "course_utils"
MODULES = sorted(p for p in PACKAGE.rglob("*.py") if "__pycache__" not in p.parts)


def dotted(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def users() -> dict[str, list[str]]:
    """module (``timing``, ``exercises.setup``) → the numbers of the notebooks whose cells import it."""
    found: dict[str, list[str]] = {}
    for path in sorted((ROOT / "notebooks").glob("*.ipynb")):  # the lessons and the appendices
        for module in notebook_modules(path):
            found.setdefault(module, []).append(path.stem[:2])
    return found


HELPERS = [p for p in MODULES if p.name != "__init__.py" and p.parent != PACKAGE / "exercises"]
SUBPACKAGES = [p for p in MODULES if p.name == "__init__.py" and p.parent not in (PACKAGE, PACKAGE / "exercises")]


def below_package(path: Path) -> str:
    """``course_utils/hardware/gpus.py`` → ``hardware.gpus``, as `notebook_modules` names modules."""
    return ".".join(path.relative_to(PACKAGE).with_suffix("").parts)


@pytest.mark.parametrize("path", HELPERS, ids=below_package)
def test_helper_docstring_opens_with_its_notebooks(path: Path) -> None:
    doc = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8"))) or ""
    opening = doc.split("\n\n")[0]
    assert re.search(r"[Nn]otebook", opening), f"{path.name}: the docstring's first paragraph names no notebook"
    if path.stem == "recording":
        assert "every notebook" in opening.lower()
        return
    numbers = users().get(below_package(path), [])
    missing = [n for n in numbers if not re.search(rf"\b{n}\b", opening)]
    assert not missing, (f"{path.name} is imported by notebook(s) {', '.join(numbers)}; its docstring's first "
                         f"paragraph does not name {', '.join(missing)}")


def test_every_checker_module_is_named_after_a_notebook() -> None:
    stems = {lesson.stem[3:] for lesson in CURRICULUM}
    checkers = {p.stem for p in (PACKAGE / "exercises").glob("*.py") if p.stem != "__init__"}
    assert checkers <= stems, f"checker modules without a notebook of that name: {sorted(checkers - stems)}"


@pytest.mark.parametrize("path", SUBPACKAGES, ids=lambda p: p.parent.name)
def test_subpackage_lists_its_modules(path: Path) -> None:
    """A subpackage's ``__init__`` imports nothing; its ``__all__`` and docstring name every module in it."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    assert not [n for n in tree.body if isinstance(n, ast.Import | ast.ImportFrom)], "a subpackage imports nothing"
    modules = sorted(p.stem for p in path.parent.glob("*.py") if p.name != "__init__.py")
    declared = next(ast.literal_eval(n.value) for n in tree.body if isinstance(n, ast.Assign)
                    and any(isinstance(t, ast.Name) and t.id == "__all__" for t in n.targets))
    assert sorted(declared) == modules, f"__all__ {sorted(declared)} is not the modules {modules}"
    doc = ast.get_docstring(tree) or ""
    assert not [m for m in modules if f"`{m}`" not in doc], "the docstring does not name every module"


@pytest.mark.parametrize("path", [p for p in MODULES if p not in SUBPACKAGES],
                         ids=lambda p: str(p.relative_to(PACKAGE)))
def test_all_lists_the_public_names(path: Path) -> None:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    defined = {node.name for node in tree.body
               if isinstance(node, ast.FunctionDef | ast.ClassDef) and not node.name.startswith("_")}
    module = importlib.import_module(dotted(path))
    declared = set(getattr(module, "__all__", ()))
    assert declared, f"{path.name} has no __all__"
    assert not {n for n in declared if not hasattr(module, n)}, "names in __all__ that do not exist"
    if path.name != "__init__.py":
        assert defined <= declared, f"public but not in __all__: {sorted(defined - declared)} (or make them _private)"


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_no_private_names_imported(path: Path) -> None:
    bad = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module != "__future__":
            if any(part.startswith("_") for part in (node.module or "").split(".")):
                bad.append(f"from {node.module} import ...")
            bad += [f"{node.module}.{a.name}" for a in node.names if a.name.startswith("_")]
        elif isinstance(node, ast.Import):
            bad += [a.name for a in node.names if any(part.startswith("_") for part in a.name.split("."))]
    assert not bad, f"{path.name} imports private names: {bad}"


def test_an_install_ships_every_subpackage() -> None:
    """pyproject.toml's package list finds every folder of the package (a plain ``pip install .`` would
    otherwise leave a subpackage out, which an editable install hides)."""
    import tomllib
    from setuptools import find_packages

    config = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    include = config["tool"]["setuptools"]["packages"]["find"]["include"]
    shipped = set(find_packages(str(ROOT), include=include))
    folders = {".".join(p.parent.relative_to(ROOT).parts) for p in PACKAGE.rglob("__init__.py")
               if "__pycache__" not in p.parts}
    assert shipped == folders, f"shipped {sorted(shipped)}, package folders {sorted(folders)}"
