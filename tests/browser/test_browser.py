"""The course as a student meets it: every notebook in real JupyterLab in a real browser, and the static site.

Run with `make browser-test` (it installs tests/requirements-browser.txt into .venv and builds the site).
Not collected by the default `pytest` run (pyproject's norecursedirs leaves out tests/browser).

JupyterLab runs on 127.0.0.1 with a token, temporary config/settings/runtime/workspace folders and GPUs
hidden (CUDA_VISIBLE_DEVICES= COURSE_DEVICE=cpu), over a temporary copy of notebooks/, so the committed
stored outputs are never touched. Playwright drives Debian's Chromium (/usr/bin/chromium, or $CHROMIUM);
no browser is downloaded. Every request that leaves 127.0.0.1 (or, for the site, file://) is blocked, and
fails the test unless it is a remote image of a markdown cell (the Binder and Colab badges).

For each notebook: open it, wait for the kernel, run all cells (JupyterLab's own `notebook:run-all-cells`),
wait until it finishes and the kernel is idle, then assert that
  - every code cell was executed (run-all was not stopped by an error),
  - no cell shows an error output, except cells tagged raises-exception (and those whose stored output
    is an error show one here too),
  - where the stored notebook has ipywidgets, the same number of widget outputs render as live widgets
    (ipywidgets DOM, not the text repr such as "HBox(children=..."), and a slider or dropdown of the
    course's `live` panels changes the output when moved,
and save a screenshot in test-output/browser/ (NN_name.png, plus NN_name-widget.png at the first widget).
The site (site/, `make site`): every page opens from index.html's links, has no broken image (each <img>
loaded with naturalWidth > 0; as many as the notebook has stored plots), and fetches nothing from the
network; a screenshot of each page goes to test-output/browser/site-*.png.
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

ROOT = Path(__file__).resolve().parents[2]
# BROWSER_NOTEBOOKS_DIR: another folder of notebooks to run (e.g. to see the test fail on a broken one).
NOTEBOOK_DIR = Path(os.environ.get("BROWSER_NOTEBOOKS_DIR", ROOT / "notebooks"))
NOTEBOOKS = sorted(NOTEBOOK_DIR.glob("*.ipynb"))
OUTPUT = ROOT / "test-output" / "browser"
SITE = ROOT / "site"
CHROMIUM = os.environ.get("CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]
WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
NOTEBOOK_TIMEOUT_S = float(os.environ.get("BROWSER_NOTEBOOK_TIMEOUT", "300"))
VIEWPORT = {"width": 1400, "height": 1000}

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


@pytest.fixture(scope="session")
def browser():
    if not Path(CHROMIUM).exists():
        pytest.fail(f"{CHROMIUM} not found: apt-get install -y chromium (never `playwright install`)")
    with playwright_sync.sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        yield b
        b.close()


def offline_context(browser, allowed: tuple[str, ...]):
    """A browser context that blocks (and records) every request not starting with an allowed prefix."""
    context = browser.new_context(viewport=VIEWPORT)
    blocked: list[str] = []

    def route(r):
        if r.request.url.startswith(allowed) or r.request.url.startswith(("data:", "blob:")):
            r.continue_()
        else:
            blocked.append(r.request.url)
            r.abort()

    context.route("**/*", route)
    return context, blocked


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


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_runs_in_jupyterlab(lab, browser, path):
    base, token, _ = lab
    OUTPUT.mkdir(parents=True, exist_ok=True)
    context, blocked = offline_context(browser, (base,))
    page = context.new_page()
    console_errors: list[str] = []
    page.on("pageerror", lambda exc: console_errors.append(str(exc)))
    try:
        page.goto(f"{base}/lab/tree/{path.name}?token={token}&reset", wait_until="domcontentloaded")
        page.wait_for_function(KERNEL_IDLE, arg=path.name, timeout=120_000, polling=250)
        t0 = time.monotonic()
        page.evaluate(RUN_ALL)
        page.wait_for_function(RUN_FINISHED, timeout=NOTEBOOK_TIMEOUT_S * 1000, polling=500)
        wait_until_settled(page, t0 + NOTEBOOK_TIMEOUT_S)
        elapsed = time.monotonic() - t0
        page.wait_for_timeout(1500)  # let late display updates (widgets, images) render
        run = page.evaluate("() => window.__courseRun")
        cells = page.evaluate(CELL_REPORT)
        widgets = page.evaluate(WIDGET_REPORT)
        page.screenshot(path=str(OUTPUT / f"{path.stem}.png"))

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
            page.screenshot(path=str(OUTPUT / f"{path.stem}-widget.png"))
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


def site_pages() -> list[str]:
    return ["index.html"] + [f"{p.stem}.html" for p in NOTEBOOKS]


def test_static_site_renders_offline(browser):
    if not (SITE / "index.html").exists():
        subprocess.run([sys.executable, str(ROOT / "tools" / "build_site.py")], check=True, cwd=ROOT)
    OUTPUT.mkdir(parents=True, exist_ok=True)
    context, blocked = offline_context(browser, ("file://",))
    page = context.new_page()
    index = (SITE / "index.html").resolve().as_uri()
    page.goto(index)
    links = page.eval_on_selector_all("main a[href$='.html']", "els => els.map(e => e.getAttribute('href'))")
    assert sorted(set(links)) == sorted(f"{p.stem}.html" for p in NOTEBOOKS), \
        f"the index should link every notebook page: {links}"
    page.screenshot(path=str(OUTPUT / "site-index.png"))
    problems = []
    for i, href in enumerate(sorted(set(links))):
        page.goto(index)
        page.click(f"main a[href='{href}']")
        page.wait_for_load_state("load")
        assert page.url.endswith("/" + href)
        images = page.eval_on_selector_all(
            "img", "els => els.map(e => ({src: e.src.slice(0, 40), ok: e.complete && e.naturalWidth > 0}))")
        broken = [im["src"] for im in images if not im["ok"]]
        if broken:
            problems.append(f"{href}: {len(broken)} broken image(s): {broken[:3]}")
        expected = stored_images(NOTEBOOKS[i])
        if len(images) < expected:
            problems.append(f"{href}: {len(images)} images, the notebook stores {expected} plots")
        if not page.locator(".jp-Cell").count():
            problems.append(f"{href}: no notebook cells rendered")
        solutions = page.locator("details.course-solution")
        if solutions.count() != solution_cells(NOTEBOOKS[i]):
            problems.append(f"{href}: {solutions.count()} collapsed solutions, the notebook has "
                            f"{solution_cells(NOTEBOOKS[i])} solution cells")
        for k in range(solutions.count()):
            code = solutions.nth(k).locator("pre.course-solution-code")
            if code.is_visible():
                problems.append(f"{href}: solution {k + 1} is open before a click")
            solutions.nth(k).locator("summary").click()
            if not code.is_visible():
                problems.append(f"{href}: solution {k + 1} does not open on a click")
        for rel in ("prev", "next"):
            nav = page.locator(f"nav.course-nav a[rel={rel}]")
            if nav.count() and not (SITE / nav.first.get_attribute("href")).exists():
                problems.append(f"{href}: {rel} link is broken")
        for a in page.eval_on_selector_all("a[href]", "els => els.map(e => e.getAttribute('href'))"):
            if not re.match(r"^(https?:|#|mailto:)", a) and not (SITE / a.split("#")[0]).exists():
                problems.append(f"{href}: link {a!r} leads nowhere")
        page.screenshot(path=str(OUTPUT / f"site-{Path(href).stem}.png"))
    context.close()
    assert not problems, "\n".join(problems)
    assert not blocked, f"the site fetched from the network: {blocked[:5]}"
