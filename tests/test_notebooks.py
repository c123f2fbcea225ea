"""Guards for the notebooks: collected by strict nbval, executed, no stray errors, recordings in step."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from course_utils.recording import RecordingError, load_recording, parse_gpu_line, recorded_from

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))
from project import APPENDIX, CURRICULUM  # noqa: E402  (tools/project.py: the curriculum, one place)

NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
# Paths that belong to one machine, whoever's it is: home folders, temporary folders, an absolute path into
# an installed package, and this checkout's own location.
MACHINE_PATH = re.compile("|".join([
    r"/root/", r"/home/[^/\s]+/", r"/Users/[^/\s]+/", r"[A-Za-z]:\\+Users\\+",  # home folders
    r"/tmp/", r"/var/tmp/", r"/var/folders/", r"AppData\\+Local\\+Temp",  # temporary folders
    r"/[\w.+-]+(/[\w.+-]+)*/(site|dist)-packages/",  # an installed package's absolute path
    re.escape(str(ROOT)),
]))


def load(path: Path) -> dict:
    return json.loads(path.read_text(encoding="utf-8"))


def _joined(value: str | list[str]) -> str:
    return value if isinstance(value, str) else "\n".join(value)


def code_cells(nb: dict):
    for i, cell in enumerate(nb["cells"]):
        if cell["cell_type"] == "code" and "".join(cell["source"]).strip():
            yield i, cell


def gpu_cells(nb: dict):
    """(cell index, name, GPUs needed, body) of each %%gpu cell, its line read as the magic reads it."""
    for i, cell in code_cells(nb):
        source = "".join(cell["source"])
        first, _, body = source.partition("\n")
        if first.startswith("%%gpu"):
            name, gpus, *_ = parse_gpu_line(first.removeprefix("%%gpu"))
            yield i, name, gpus, body


def test_a_gpu_cell_without_a_recording_says_what_it_shows():
    """A student on a machine with too few GPUs reads what the cell would show (`--shows`), not a blank."""
    problems = []
    for path in NOTEBOOKS:
        for i, cell in code_cells(load(path)):
            first = "".join(cell["source"]).partition("\n")[0]
            if not first.startswith("%%gpu"):
                continue
            name, _, shows, *_ = parse_gpu_line(first.removeprefix("%%gpu"))
            try:
                load_recording(name)
            except (RecordingError, ValueError):
                if len(shows.split()) < 3:
                    problems.append(f"{path.name} cell {i} ({name}): no recording and no --shows \"...\"")
    assert not problems, "\n".join(problems)


def test_the_notebook_set_is_the_curriculum():
    stems = [p.stem for p in NOTEBOOKS]
    lessons = [s for s in stems if not s.startswith("9")]
    want = [lesson.stem for lesson in CURRICULUM]
    assert lessons == want, (f"the lessons must be exactly the curriculum (tools/project.py): missing "
                             f"{sorted(set(want) - set(lessons))}, unknown {sorted(set(lessons) - set(want))}")
    odd = [s for s in stems if s.startswith("9") and not APPENDIX.match(s)]
    assert not odd, f"appendices are named 9N_appendix_topic.ipynb: {odd}"


def test_machine_path_guard_catches_any_machine():
    for path in ["/root/x", "/home/ana/course/x.py", "/Users/bo/x", "C:\\Users\\bo\\x", "/tmp/ipykernel_1/2.py",
                 "/var/folders/ab/T/x", "/opt/conda/lib/python3.12/site-packages/torch/x.py",
                 "/usr/lib/python3/dist-packages/x.py", str(ROOT / "course_utils" / "x.py")]:
        assert MACHINE_PATH.search(path), path
    for fine in ["<site-packages>/torch/serialization.py", "course_utils/checkpoints/loading.py", "data/06_x.pt",
                 "scratch_06/weights.pt", "/shared/ckpt"]:
        assert not MACHINE_PATH.search(fine), fine


def test_every_notebook_is_collected_by_strict_nbval():
    out = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "notebooks"], cwd=ROOT,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    collected = {line.split("::")[0] for line in out.stdout.splitlines() if "::" in line}
    missing = [p.name for p in NOTEBOOKS if f"notebooks/{p.name}" not in collected]
    assert not missing, f"not collected by pytest --nbval: {missing}"
    config = (ROOT / "pyproject.toml").read_text()
    assert '"--nbval ' in config.replace("addopts = ", "") or "--nbval " in config
    assert "--nbval-lax" not in config, "strict nbval: never lax in the default configuration"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_hygiene(path):
    nb = load(path)
    assert nb["metadata"].get("kernelspec", {}).get("name") == "python3", "kernelspec must be python3"
    problems = []
    for i, cell in code_cells(nb):
        tags = set(cell.get("metadata", {}).get("tags", []))
        if cell.get("execution_count") is None:
            problems.append(f"cell {i} was never executed (strict nbval would not compare it)")
        for out in cell.get("outputs", []):
            if out.get("output_type") == "error" and not tags & {"raises-exception", "nbval-raises-exception"}:
                problems.append(f"cell {i} stores an error ({out.get('ename')}) without a raises-exception tag")
            text = "\n".join(_joined(out.get(k, "")) for k in ("text", "evalue", "traceback"))
            text += _joined(out.get("data", {}).get("text/plain", ""))
            if MACHINE_PATH.search(text):
                problems.append(f"cell {i} shows a machine path in its output: {MACHINE_PATH.search(text)[0]!r}")
        if "nbval-skip" in tags:
            problems.append(f"cell {i} is tagged nbval-skip: it would not run in the tests")
        if "solution" in tags and not (cell["metadata"].get("jupyter", {}).get("source_hidden")
                                       and cell["metadata"].get("cellView") == "form"
                                       and _joined(cell["source"]).startswith("#@title ")):
            problems.append(f"solution cell {i} is not hidden (JupyterLab: source_hidden; Colab: a #@title form)")
    assert nb["metadata"].get("nbval", {}).get("lax") is not True, "whole notebook tagged lax"
    assert not problems, "\n".join(problems)


def test_setup_course_map_lists_every_notebook():
    """Notebook 00's map of the course links every lesson and appendix, in order (it once stopped at 06)."""
    text = next(_joined(c["source"]) for c in load(ROOT / "notebooks" / "00_setup.ipynb")["cells"]
                if _joined(c["source"]).startswith("## 7. The map of the course"))
    linked = re.findall(r"\]\(([\w]+)\.ipynb\)", text)
    assert linked == [p.stem for p in NOTEBOOKS], f"notebook 00's map links {linked}"


def test_one_next_link_per_notebook():
    """The generated 'Next:' cell is the only next-lesson line (notebook 01 once had a hand-written one too)."""
    for path in NOTEBOOKS:
        lines = [line for c in load(path)["cells"] for line in _joined(c["source"]).splitlines()
                 if re.match(r"\**Next:?\**:?", line)]
        assert len(lines) == 1, f"{path.name}: {lines}"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_title_and_next_link(path):
    cells = load(path)["cells"]
    title = _joined(cells[1]["source"]).split("\n")[0]
    assert cells[1]["cell_type"] == "markdown" and title.startswith(f"# {path.stem[:2]} · "), \
        f"{path.name}: the cell after the badges must open with '# {path.stem[:2]} · Title', not {title!r}"
    last = cells[-1]
    assert "course-next" in last["metadata"].get("tags", []) and _joined(last["source"]).startswith("**Next:**"), \
        f"{path.name}: the last cell must be the generated 'Next:' link (make sync)"


def test_badge_and_setup_cells_are_in_sync():
    out = subprocess.run([sys.executable, str(ROOT / "tools" / "sync_notebooks.py"), "--check"], cwd=ROOT,
                         capture_output=True, text=True)
    assert out.returncode == 0, f"run `make sync`:\n{out.stdout}{out.stderr}"
    for path in NOTEBOOKS:
        cells = load(path)["cells"]
        assert "course-badges" in cells[0]["metadata"].get("tags", []), f"{path.name}: badge cell first"
        first_code = next(c for c in cells if c["cell_type"] == "code")
        assert "course-setup" in first_code["metadata"].get("tags", []), f"{path.name}: setup cell first"


def test_gpu_cell_names_are_unique_and_prefixed():
    seen: dict[str, str] = {}
    for path in NOTEBOOKS:
        for i, name, _, _ in gpu_cells(load(path)):
            assert name.startswith(path.stem[:2] + "-"), f"{path.name} cell {i}: name {name!r} must start " \
                                                          f"with {path.stem[:2]}-"
            assert name not in seen, f"{name!r} used in {seen[name]} and {path.name}"
            seen[name] = path.name


# One-GPU cells whose recording is still to be made, each with the reason. Students see the cell's note
# ("No output of this cell ... comes with the course yet"); the test below fails once a recording exists, so
# that a name does not stay here after it is recorded.
PENDING_RECORDINGS: dict[str, str] = {}


def test_single_gpu_cells_have_current_recordings():
    """Every one-GPU cell has a recording made from its current code (`make record` on a GPU host), except
    the ones listed in PENDING_RECORDINGS.

    Multi-GPU cells may have none yet: they show a note saying so.
    """
    problems = []
    for path in NOTEBOOKS:
        for i, name, gpus, body in gpu_cells(load(path)):
            try:
                recording = load_recording(name)
            except Exception as exc:
                if gpus == 1 and name not in PENDING_RECORDINGS:
                    problems.append(f"{path.name} cell {i} ({name}): {exc}")
                continue
            if name in PENDING_RECORDINGS:
                problems.append(f"{name} has a recording now: take it out of PENDING_RECORDINGS")
            if not recorded_from(recording.meta, body):
                problems.append(f"{path.name} cell {i} ({name}): the code changed since it was recorded; "
                                "run `make record` on a GPU host")
            if recording.meta.get("gpu_count", 0) < gpus:
                problems.append(f"{path.name} cell {i} ({name}): recorded with fewer GPUs than it needs")
    assert not problems, "\n".join(problems)


def test_no_orphan_recordings():
    used = {name for path in NOTEBOOKS for _, name, _, _ in gpu_cells(load(path))}
    shipped = {p.stem for p in (ROOT / "course_utils" / "recorded").glob("*.json")}
    assert not shipped - used, f"recordings no cell uses: {sorted(shipped - used)}"


def test_links_between_notebooks_also_open_on_colab():
    """On Colab one notebook is opened from GitHub, with no folder around it: a relative link to the next lesson
    (or, from the Chinese edition, to the English notebook) resolves nowhere, so each comes with its Colab link."""
    from project import repository_url

    colab = f"https://colab.research.google.com/github/{repository_url().removeprefix('https://github.com/')}/blob/main/"
    for path in NOTEBOOKS:
        nxt = _joined(load(path)["cells"][-1]["source"])
        for target in re.findall(r"\]\((\d\d_[\w]+\.ipynb)\)", nxt)[:1]:
            assert f"({colab}notebooks/{target})" in nxt, f"{path.name}: the Next line needs the Colab link"
        zh = ROOT / "notebooks" / "zh" / path.name
        if zh.is_file():
            cells = load(zh)["cells"]
            assert f"[English](../{path.name})（[在 Colab 中打开]({colab}notebooks/{path.name})）" in \
                _joined(cells[0]["source"]), f"zh/{path.name}: the English link needs its Colab link"
            for target in re.findall(r"\]\((\d\d_[\w]+\.ipynb)\)", _joined(cells[-1]["source"]))[:1]:
                assert f"({colab}notebooks/zh/{target})" in _joined(cells[-1]["source"])
    readme = (ROOT / "README.zh-CN.md").read_text(encoding="utf-8")
    assert f"({colab}notebooks/zh/00_setup.ipynb)" in readme and "labpath=notebooks%2Fzh%2F00_setup.ipynb" in readme
