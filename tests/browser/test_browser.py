"""The course as a student meets it: every notebook in real JupyterLab in a real browser, and the static site.

Run with `make browser-test` (it installs tests/requirements-browser.txt into .venv and builds the site).
Not collected by the default `pytest` run (pyproject's norecursedirs leaves out tests/browser).

JupyterLab runs on 127.0.0.1 with a token, temporary config/settings/runtime/workspace folders and GPUs
hidden (CUDA_VISIBLE_DEVICES= COURSE_DEVICE=cpu), over a temporary copy of notebooks/, so the committed
stored outputs are never touched. Playwright drives Debian's Chromium (/usr/bin/chromium, or $CHROMIUM);
no browser is downloaded. Every request that leaves 127.0.0.1 (or, for the site, file://) is blocked, and
fails the test unless it is a remote image of a markdown cell in JupyterLab (the Binder and Colab badges).

For each notebook: open it, wait for the kernel, run all cells (JupyterLab's own `notebook:run-all-cells`),
wait until it finishes and the kernel is idle, then assert that
  - every code cell was executed (run-all was not stopped by an error),
  - no cell shows an error output, except cells tagged raises-exception (and those whose stored output
    is an error show one here too),
  - where the stored notebook has ipywidgets, the same number of widget outputs render as live widgets
    (ipywidgets DOM, not the text repr such as "HBox(children=..."), and a slider or dropdown of the
    course's `live` panels changes the output when moved,
and save a screenshot in test-output/browser/ (NN_name.png, plus NN_name-widget.png at the first widget).
The site (site/, `make site`), opened from disk (file://) with every other request blocked, and failing on any
console error: every page of each edition (site/, and site/zh/ when built) loads with no broken image or link
and every stored plot shown; the sidebar lists the notebooks in file-name order (lessons, then appendices)
with previous/next links; a solution is folded until clicked; a recorded GPU output
shows its banner and plot; the Binder, Colab and repository buttons point at pyproject's Repository; the
language switch leads to the same page in the other edition (skipped when site/zh/ is not built). The search:
test_site_search.py. Screenshots: test-output/browser/site-*.png.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

playwright_sync = pytest.importorskip("playwright.sync_api", reason="make browser-test installs playwright")

from browser_support import (  # noqa: E402
    NOTEBOOK_DIR,
    NOTEBOOKS,
    OUTPUT,
    ROOT,
    SITE,
    ZH_IN_LAB,
    offline_context,
    open_site,
)

WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
NOTEBOOK_TIMEOUT_S = float(os.environ.get("BROWSER_NOTEBOOK_TIMEOUT", "300"))

# JupyterLab user settings for the test: every cell in the DOM (no windowing), no news, no update check.
LAB_SETTINGS = {
    "@jupyterlab/notebook-extension/tracker.jupyterlab-settings": {"windowingMode": "none"},
    "@jupyterlab/apputils-extension/notification.jupyterlab-settings": {"fetchNews": "false",
                                                                        "checkForUpdates": False},
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def stored_widgets(path: Path) -> tuple[int, int]:
    """(widget outputs, of which control panels such as HBox(...)) in the notebook's stored outputs."""
    nb = json.loads(path.read_text(encoding="utf-8"))
    total = panels = 0
    for cell in nb["cells"]:
        for out in cell.get("outputs", []):
            data = out.get("data", {})
            if WIDGET_VIEW in data:
                total += 1
                panels += bool(re.match(r"^[A-Z]\w*\(", "".join(data.get("text/plain", ""))))
    return total, panels


def remote_images(path: Path) -> set[str]:
    """Images in markdown cells that live on the web (the Binder and Colab badges): blocked, expected."""
    nb = json.loads(path.read_text(encoding="utf-8"))
    sources = "".join("".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "markdown")
    return set(re.findall(r"!\[[^\]]*\]\((https?://[^)\s]+)\)", sources))


def stored_error_cells(path: Path) -> set[int]:
    nb = json.loads(path.read_text(encoding="utf-8"))
    return {i for i, cell in enumerate(nb["cells"])
            if any(out.get("output_type") == "error" for out in cell.get("outputs", []))}


def solution_cells(path: Path) -> int:
    nb = json.loads(path.read_text(encoding="utf-8"))
    return sum("solution" in cell["metadata"].get("tags", []) for cell in nb["cells"])


def stored_images(path: Path) -> int:
    nb = json.loads(path.read_text(encoding="utf-8"))
    return sum("image/png" in out.get("data", {}) and WIDGET_VIEW not in out.get("data", {})
               for cell in nb["cells"] for out in cell.get("outputs", []))


@pytest.fixture(scope="session")
def lab(tmp_path_factory):
    """JupyterLab on 127.0.0.1 over a temporary copy of notebooks/: yields (base URL, token, folder)."""
    tmp = tmp_path_factory.mktemp("lab")
    work = tmp / "notebooks"
    shutil.copytree(NOTEBOOK_DIR, work, ignore=shutil.ignore_patterns(".ipynb_checkpoints", "scratch_*"))
    settings = tmp / "settings"
    for rel, value in LAB_SETTINGS.items():
        (settings / rel).parent.mkdir(parents=True, exist_ok=True)
        (settings / rel).write_text(json.dumps(value))
    token, port = secrets.token_hex(16), free_port()
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="", COURSE_DEVICE="cpu", PYTHONHASHSEED="0",
               JUPYTER_CONFIG_DIR=str(tmp / "config"), JUPYTER_RUNTIME_DIR=str(tmp / "runtime"),
               JUPYTERLAB_SETTINGS_DIR=str(settings), JUPYTERLAB_WORKSPACES_DIR=str(tmp / "workspaces"),
               IPYTHONDIR=str(tmp / "ipython"), MPLCONFIGDIR=str(tmp / "mpl"))
    env.pop("COURSE_RECORD", None)
    cmd = [sys.executable, "-m", "jupyterlab", "--no-browser", "--ip=127.0.0.1", f"--port={port}",
           "--port-retries=0", f"--IdentityProvider.token={token}", f"--ServerApp.root_dir={work}",
           "--allow-root", "--LabApp.expose_app_in_browser=True", "--LabApp.news_url=None",
           "--LabApp.check_for_updates_class=jupyterlab.handlers.announcements.NeverCheckForUpdate",
           "--ServerApp.disable_check_xsrf=False"]
    log = open(tmp / "jupyterlab.log", "w")
    proc = subprocess.Popen(cmd, cwd=work, env=env, stdout=log, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 90
        while True:
            try:
                with urllib.request.urlopen(f"{base}/api/status?token={token}", timeout=2):
                    break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    log.flush()
                    pytest.fail("JupyterLab did not start:\n" + (tmp / "jupyterlab.log").read_text()[-4000:])
                time.sleep(0.5)
        yield base, token, work
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()
        OUTPUT.mkdir(parents=True, exist_ok=True)
        shutil.copy(tmp / "jupyterlab.log", OUTPUT / "jupyterlab.log")


KERNEL_IDLE = """(path) => {
  const w = window.jupyterapp && window.jupyterapp.shell.currentWidget;
  if (!w || !w.context || w.context.path !== path || !w.sessionContext) return false;
  const k = w.sessionContext.session && w.sessionContext.session.kernel;
  return !!k && k.status === 'idle' && w.context.isReady;
}"""

RUN_ALL = """() => {
  window.__courseRun = null;
  window.jupyterapp.commands.execute('notebook:run-all-cells').then(
    ok => { window.__courseRun = {ok: ok}; }, err => { window.__courseRun = {ok: false, err: String(err)}; });
}"""

RUN_FINISHED = """() => {
  const w = window.jupyterapp.shell.currentWidget;
  const k = w.sessionContext.session && w.sessionContext.session.kernel;
  const busyPrompt = [...document.querySelectorAll('.jp-InputArea-prompt')].some(e => e.textContent.includes('*'));
  return window.__courseRun !== null && k && k.status === 'idle' && !busyPrompt;
}"""

CELL_REPORT = """() => {
  const w = window.jupyterapp.shell.currentWidget;
  return w.content.widgets.map((cell, i) => {
    const m = cell.model;
    if (m.type !== 'code') return {index: i, type: m.type};
    const outputs = [];
    for (let j = 0; j < m.outputs.length; j++) {
      const o = m.outputs.get(j).toJSON();
      outputs.push({type: o.output_type, ename: o.ename || null, evalue: o.evalue || null,
                    mimes: Object.keys(o.data || {})});
    }
    return {index: i, type: 'code', source: m.sharedModel.getSource().slice(0, 80),
            executionCount: m.executionCount, tags: m.getMetadata('tags') || [], outputs: outputs};
  });
}"""

WIDGET_REPORT = """() => {
  const outs = [...document.querySelectorAll('.jp-OutputArea-output')];
  const live = outs.filter(e => e.querySelector('.jupyter-widgets'));
  const textRepr = outs.filter(e => !e.querySelector('.jupyter-widgets') &&
    /^\\s*(HBox|VBox|Box|IntSlider|FloatSlider|Dropdown|Checkbox|interactive|ToggleButtons|Output)\\(/.test(e.innerText));
  const controls = document.querySelectorAll('.jp-OutputArea-output .widget-slider, .jp-OutputArea-output .widget-dropdown');
  const errors = [...document.querySelectorAll('.jp-OutputArea-output')].filter(
    e => /Error displaying widget|Failed to load model class|Loading widget\\.\\.\\./.test(e.innerText)).length;
  return {live: live.length, textRepr: textRepr.map(e => e.innerText.slice(0, 80)),
          controls: controls.length, widgetErrors: errors};
}"""


def lab_name(path: Path) -> str:
    """The notebook's path in JupyterLab (zh/06_loading_across_devices.ipynb), and its test id with - for /."""
    return path.relative_to(NOTEBOOK_DIR).as_posix()


@pytest.mark.parametrize("path", NOTEBOOKS + ZH_IN_LAB, ids=lambda p: lab_name(p).removesuffix(".ipynb").replace("/", "-"))
def test_notebook_runs_in_jupyterlab(lab, browser, path):
    base, token, _ = lab
    shot = lab_name(path).removesuffix(".ipynb").replace("/", "-")
    OUTPUT.mkdir(parents=True, exist_ok=True)
    context, blocked = offline_context(browser, (base,))
    page = context.new_page()
    console_errors: list[str] = []
    page.on("pageerror", lambda exc: console_errors.append(str(exc)))
    try:
        page.goto(f"{base}/lab/tree/{lab_name(path)}?token={token}&reset", wait_until="domcontentloaded")
        page.wait_for_function(KERNEL_IDLE, arg=lab_name(path), timeout=120_000, polling=250)
        t0 = time.monotonic()
        page.evaluate(RUN_ALL)
        page.wait_for_function(RUN_FINISHED, timeout=NOTEBOOK_TIMEOUT_S * 1000, polling=500)
        wait_until_settled(page, t0 + NOTEBOOK_TIMEOUT_S)
        elapsed = time.monotonic() - t0
        page.wait_for_timeout(1500)  # let late display updates (widgets, images) render
        run = page.evaluate("() => window.__courseRun")
        cells = page.evaluate(CELL_REPORT)
        widgets = page.evaluate(WIDGET_REPORT)
        page.screenshot(path=str(OUTPUT / f"{shot}.png"))
        if path in ZH_IN_LAB:  # the Chinese text is what JupyterLab shows
            title = json.loads(path.read_text(encoding="utf-8"))["cells"][1]["source"][0]
            heading = title.strip("# \n").split("：")[0]  # 06 · 跨设备加载 (what follows has inline code)
            assert page.get_by_text(heading).count() > 0, f"{lab_name(path)}: its heading {heading!r} not shown"

        stored_errors = stored_error_cells(path)
        problems = []
        for cell in cells:
            if cell["type"] != "code" or not cell["source"].strip():
                continue
            tagged = "raises-exception" in cell["tags"]
            errors = [o for o in cell["outputs"] if o["type"] == "error"]
            if cell["executionCount"] is None:
                problems.append(f"cell {cell['index']} was not executed: {cell['source']!r}")
            elif errors and not tagged:
                e = errors[0]
                problems.append(f"cell {cell['index']} shows {e['ename']}: {e['evalue']} ({cell['source']!r})")
            elif tagged and not errors and cell["index"] in stored_errors:
                problems.append(f"cell {cell['index']} is tagged raises-exception but shows no error")
        assert not problems, f"{path.name} in JupyterLab ({elapsed:.0f} s, run-all: {run}):\n" + \
            "\n".join(problems)

        total, panels = stored_widgets(path)
        if total:
            assert not widgets["textRepr"], f"widgets shown as their text repr: {widgets['textRepr']}"
            assert widgets["widgetErrors"] == 0, f"{widgets['widgetErrors']} widget outputs failed to render"
            assert widgets["live"] >= total, (f"{path.name}: {widgets['live']} live widget outputs, "
                                              f"the stored notebook has {total}")
        if panels:
            assert widgets["controls"] > 0, f"{path.name}: no slider or dropdown rendered"
            first = page.locator(".jp-OutputArea-output .widget-slider, .jp-OutputArea-output "
                                 ".widget-dropdown").first
            first.scroll_into_view_if_needed()
            page.wait_for_timeout(300)
            page.screenshot(path=str(OUTPUT / f"{shot}-widget.png"))
            assert_widget_is_live(page)
        unexpected = [url for url in blocked if url not in remote_images(path)]
        assert not unexpected, f"the page tried to reach beyond 127.0.0.1: {unexpected[:5]}"
    finally:
        try:  # shut the kernel down, so notebooks do not pile up kernels
            page.evaluate("() => window.jupyterapp.commands.execute('kernelmenu:shutdown')")
        except Exception:
            pass
        context.close()


PROGRESS = """() => {
  const w = window.jupyterapp.shell.currentWidget;
  const k = w.sessionContext.session && w.sessionContext.session.kernel;
  const code = w.content.widgets.filter(c => c.model.type === 'code' && c.model.sharedModel.getSource().trim());
  const busy = [...document.querySelectorAll('.jp-InputArea-prompt')].some(e => e.textContent.includes('*'));
  return {done: code.filter(c => c.model.executionCount !== null).length, total: code.length,
          idle: !!k && k.status === 'idle' && !busy};
}"""


def wait_until_settled(page, deadline: float, quiet_s: float = 15.0) -> None:
    """Wait until every code cell has run and the kernel is idle, or nothing has changed for quiet_s.

    run-all's promise can resolve before the last cells have run (JupyterLab reports ok=false when a
    raises-exception cell raised), so completion is judged from the cells themselves. A run stopped by an
    error leaves cells unexecuted: after quiet_s of idle kernel with no progress, the report shows them.
    """
    last, since = None, time.monotonic()
    while time.monotonic() < deadline:
        state = page.evaluate(PROGRESS)
        if state["idle"] and state["done"] == state["total"]:
            return
        if state != last:
            last, since = state, time.monotonic()
        elif state["idle"] and time.monotonic() - since > quiet_s:
            return
        page.wait_for_timeout(500)


def assert_widget_is_live(page) -> None:
    """Move the first control of the first `live` panel and see the panel's output change."""
    panel = page.locator(".jp-OutputArea-output .widget-hbox, .jp-OutputArea-output .widget-vbox").filter(
        has=page.locator(".widget-slider, .widget-dropdown")).first
    output_area = panel.locator("xpath=ancestor::div[contains(concat(' ', normalize-space(@class), ' '), "
                                "' jp-OutputArea ')][1]")
    before = output_area.inner_html()
    select = panel.locator("select")
    if select.count():
        options = select.first.locator("option").all_inner_texts()
        current = select.first.input_value()
        choice = next(i for i, o in enumerate(options) if select.first.locator("option").nth(i)
                      .get_attribute("value") != current)
        select.first.select_option(index=choice)
    else:
        handle = panel.locator(".noUi-handle, .widget-slider [role=slider]").first
        handle.click()
        handle.press("ArrowRight")
        handle.press("ArrowRight")
    deadline = time.monotonic() + 60
    while output_area.inner_html() == before:
        assert time.monotonic() < deadline, "moving a widget control did not change its output: not live"
        page.wait_for_timeout(250)


# --- the static site (site/, `make site`: Sphinx + MyST-NB + sphinx-book-theme) ------------------------------

SITE_EDITIONS = [("en", SITE, NOTEBOOKS)] + (
    [("zh", SITE / "zh", sorted((ROOT / "notebooks" / "zh").glob("*.ipynb")))] if (SITE / "zh").is_dir() else [])


@pytest.mark.parametrize("lang,folder,notebooks", SITE_EDITIONS, ids=[e[0] for e in SITE_EDITIONS])
def test_site_pages_load_offline(site_page, lang, folder, notebooks):
    """Every page of an edition: no error, no request, no broken image or link, every stored plot shown."""
    page, problems = site_page, []
    pages = ["index.html", "search.html", "genindex.html"] + [f"{p.stem}.html" for p in notebooks]
    for name in pages:
        open_site(page, str((folder / name).relative_to(SITE)))
        images = page.eval_on_selector_all(
            "img", "els => els.map(e => ({src: e.src.slice(0, 60), ok: e.complete && e.naturalWidth > 0}))")
        problems += [f"{name}: broken image {im['src']}" for im in images if not im["ok"]]
        stem = name.removesuffix(".html")
        if (folder_nb := next((p for p in notebooks if p.stem == stem), None)) is not None:
            plots = page.locator("article .cell_output img").count()
            if plots < stored_images(folder_nb):
                problems.append(f"{name}: {plots} plots, the notebook stores {stored_images(folder_nb)}")
        for href in page.eval_on_selector_all("a[href]", "els => els.map(e => e.getAttribute('href'))"):
            target = href.split("#")[0].split("?")[0]
            if target and not re.match(r"^(https?:|mailto:)", href) and not (folder / target).exists():
                problems.append(f"{name}: link {href!r} leads nowhere")
        page.screenshot(path=str(OUTPUT / f"site-{lang}-{stem}.png"))
    assert not problems, "\n".join(problems)


def test_site_sidebar_in_course_order(site_page):
    open_site(site_page, "index.html")
    sidebar = site_page.eval_on_selector_all(
        ".bd-sidenav a.reference.internal", "els => els.map(e => e.getAttribute('href'))")
    assert [h for h in sidebar if h != "#"] == [f"{p.stem}.html" for p in NOTEBOOKS], sidebar
    index_links = site_page.eval_on_selector_all("article a[href$='.html']", "els => els.map(e => e.getAttribute('href'))")
    assert sorted(set(index_links)) == [f"{p.stem}.html" for p in NOTEBOOKS], "the notebook map links every page"
    open_site(site_page, f"{NOTEBOOKS[1].stem}.html")  # previous / next at the bottom of a lesson
    assert site_page.get_attribute("a.left-prev", "href") == f"{NOTEBOOKS[0].stem}.html"
    assert site_page.get_attribute("a.right-next", "href") == f"{NOTEBOOKS[2].stem}.html"


def test_site_solution_hidden_until_clicked(site_page):
    path = next(p for p in NOTEBOOKS if solution_cells(p))
    open_site(site_page, f"{path.stem}.html")
    toggles = site_page.locator("details.hide.above-input")
    assert toggles.count() == solution_cells(path)
    code = toggles.first.locator(".cell_input")
    assert not code.is_visible(), "a solution is shown before a click"
    toggles.first.locator("summary").click()
    assert code.is_visible(), "a solution does not open on a click"
    code.scroll_into_view_if_needed()
    site_page.screenshot(path=str(OUTPUT / "site-solution-open.png"))


@pytest.mark.parametrize("folder,banner_text", [("", "Output recorded on 1× NVIDIA H200"),
                                               ("zh/", "此单元格的输出录制于 1× NVIDIA H200")])
def test_site_recorded_gpu_output(site_page, folder, banner_text):
    """01's matmul sweep: the recording's banner (worded for a page: where it was recorded, not "this notebook
    ran without a CUDA GPU", which a reader takes for their own machine), its text and its plot."""
    if not (SITE / folder / "01_cpu_vs_gpu.html").exists():
        pytest.skip(f"site/{folder} is not built")
    open_site(site_page, f"{folder}01_cpu_vs_gpu.html")
    cell = site_page.locator("div.cell").filter(has_text="%%gpu 01-matmul-sweep")
    banner = cell.get_by_text(banner_text)
    plot = cell.locator(".cell_output img")
    banner.scroll_into_view_if_needed()
    assert banner.is_visible()
    assert plot.is_visible() and plot.evaluate("e => e.naturalWidth") > 100
    assert not site_page.get_by_text("this notebook ran without").count()
    assert not site_page.get_by_text("本笔记本运行时没有").count()
    if folder:  # and the checkers' frame in Chinese
        assert site_page.get_by_text("✘ 还不对。").count() and not site_page.get_by_text("✘ Not yet.").count()
    site_page.screenshot(path=str(OUTPUT / f"site-gpu-recording{'-zh' if folder else ''}.png"))


def test_site_launch_buttons(site_page):
    sys.path.insert(0, str(ROOT / "tools"))
    from project import repository_url

    repo = repository_url().removeprefix("https://github.com/")
    open_site(site_page, "02_moving_data.html")
    hrefs = site_page.eval_on_selector_all("a[href]", "els => els.map(e => e.href)")
    assert f"https://mybinder.org/v2/gh/{repo}/main?urlpath=lab/tree/notebooks/02_moving_data.ipynb" in hrefs
    assert f"https://colab.research.google.com/github/{repo}/blob/main/notebooks/02_moving_data.ipynb" in hrefs
    assert f"https://github.com/{repo}" in hrefs  # the repository button
    assert not site_page.locator("img[src^='http']").count(), "a remote image (the notebook's badges?)"


def test_site_download_gives_the_notebook(site_page):
    """The theme's "Download .ipynb" leads to the notebook itself, with its stored outputs (it was a 404)."""
    for rel, source in [("02_moving_data.html", ROOT / "notebooks" / "02_moving_data.ipynb"),
                        ("zh/02_moving_data.html", ROOT / "notebooks" / "zh" / "02_moving_data.ipynb")]:
        if not (SITE / rel).exists():
            continue
        open_site(site_page, rel)
        href = site_page.get_attribute("a.btn-download-source-button", "href")
        target = (SITE / rel).parent / href
        assert target.is_file(), f"{rel}: the download link {href!r} is not a file"
        downloaded = json.loads(target.read_text(encoding="utf-8"))
        assert downloaded["nbformat"] == 4 and downloaded["cells"] == json.loads(source.read_text())["cells"]


def test_site_language_switch(site_page):
    if not (SITE / "zh").is_dir():
        open_site(site_page, "index.html")
        assert not site_page.locator(".course-language-switch").count(), "a switch to an edition not built"
        pytest.skip("no Chinese edition (notebooks/zh/) in site/")
    open_site(site_page, "02_moving_data.html")
    site_page.click(".course-language-switch")
    site_page.wait_for_load_state("load")
    assert site_page.url.endswith("/zh/02_moving_data.html")
    assert site_page.get_attribute("html", "lang") == "zh-CN"
    site_page.screenshot(path=str(OUTPUT / "site-zh-switch.png"))
    open_site(site_page, "zh/02_moving_data.html")
    site_page.click(".course-language-switch")
    site_page.wait_for_load_state("load")
    assert site_page.url.endswith("/site/02_moving_data.html")
