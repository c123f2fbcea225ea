"""The site's search as a student uses it, offline from disk (file://), in both editions (site/zh/ when built).

  - a table of what students type and the lesson that teaches it: that lesson comes first;
  - results show an excerpt with the words highlighted, from data only the search page loads;
  - a result opens its page at the section of the match, highlighted; a page opened any other way after a
    search (the sidebar) shows no highlight and opens at its top;
  - one search control, at desktop width and at phone width (400 px, the sidebar folded).
Screenshots: test-output/browser/site-search-*.png.
"""

from __future__ import annotations

import pytest
from browser_support import OUTPUT, SITE, VIEWPORT, open_site, search

# What a student types, in which edition, and the lesson that teaches it (the course's map, README).
QUERIES = [
    ("en", "pin_memory", "02_moving_data"),
    ("en", "non_blocking", "02_moving_data"),
    ("en", "CUDA_VISIBLE_DEVICES", "03_torch_cuda_api"),
    ("en", "CUDA out of memory", "03_torch_cuda_api"),  # 03: memory, OOM and recovery
    ("en", "free memory nvidia-smi", "03_torch_cuda_api"),  # 03: choosing GPUs by free memory
    ("en", "DataParallel", "04_data_parallel"),
    ("en", "torchrun", "05_distributed_data_parallel"),
    ("en", "all-reduce", "05_distributed_data_parallel"),
    ("en", "map_location", "06_loading_across_devices"),
    ("en", "weights_only", "06_loading_across_devices"),
    ("en", "mixed precision", "07_performance_toolbox"),
    ("en", "GradScaler", "07_performance_toolbox"),
    ("en", "fully_shard", "08_fully_sharded_data_parallel"),  # 07 only names it in its summary
    ("en", "activation checkpointing", "08_fully_sharded_data_parallel"),
    ("en", "device-side assert", "09_when_it_breaks"),
    ("en", "synchronize timing", "01_cpu_vs_gpu"),  # 01: asynchronous execution and timing it right
    ("zh", "数据并行", "04_data_parallel"),  # 04 says DataParallel: the glossary's data parallelism
    ("zh", "固定内存", "02_moving_data"),
    ("zh", "混合精度", "07_performance_toolbox"),
    ("zh", "激活检查点", "08_fully_sharded_data_parallel"),
    ("zh", "显存不足", "03_torch_cuda_api"),
    ("zh", "随机种子", "03_torch_cuda_api"),
    ("zh", "吞吐量 延迟", "01_cpu_vs_gpu"),
    ("zh", "map_location", "06_loading_across_devices"),
]
# Each term, the notebook that teaches it, and the heading of the section its result opens at.
SEARCH_TERMS = [("pin_memory", "02_moving_data", "Pinned memory and non_blocking"),
                ("reshard_after_forward", "08_fully_sharded_data_parallel", "FSDP2: shard parameters"),
                ("CUDA_VISIBLE_DEVICES", "03_torch_cuda_api", "Physical and logical GPUs")]
DATA = "_static/course-search-data.js"
DATA_BUDGET = 700_000  # bytes per edition; 0.43 MB (English) and 0.46 MB (Chinese) when written


def edition_root(edition: str) -> str:
    if edition == "zh" and not (SITE / "zh").is_dir():
        pytest.skip("no Chinese edition (notebooks/zh/) in site/")
    return "zh/" if edition == "zh" else ""


def highlights(page) -> int:
    return page.locator("span.highlighted").count()


@pytest.mark.parametrize("edition,query,notebook", QUERIES, ids=[f"{e}-{q}" for e, q, _ in QUERIES])
def test_site_search_ranks_the_lesson_first(site_page, edition, query, notebook):
    open_site(site_page, f"{edition_root(edition)}index.html")
    results = search(site_page, query)
    assert results[0].startswith(f"{notebook}.html"), f"{query!r}: {[r.split('?')[0] for r in results[:5]]}"


def test_site_search_shows_excerpts(site_page):
    """Every result has an excerpt from its page, with the query's words highlighted in it."""
    for root, query, word in [("", "pin_memory", "pin_memory"), ("zh/", "固定内存", "固定内存")]:
        if root and not (SITE / "zh").is_dir():
            continue
        open_site(site_page, f"{root}index.html")
        results = search(site_page, query)
        items = site_page.locator("#search-results ul li")
        assert items.count() == len(results) >= 3, results
        for i in range(items.count()):
            excerpt = items.nth(i).locator("p.context")
            assert len(excerpt.inner_text()) > 60, f"{query}: result {i} has no excerpt"
            marked = excerpt.locator("span.highlighted").all_inner_texts()
            assert any(word in m.lower() for m in marked), f"{query}: result {i} highlights {marked}"
        site_page.screenshot(path=str(OUTPUT / f"site-search-excerpts-{root.strip('/') or 'en'}.png"))


def test_site_search_data_only_on_search_page():
    for root in ["", "zh/"]:
        if not (SITE / root / "search.html").exists():
            continue
        assert "course-search-data.js" in (SITE / root / "search.html").read_text(encoding="utf-8")
        assert "course-search-data.js" not in (SITE / root / "02_moving_data.html").read_text(encoding="utf-8")
        size = (SITE / root / DATA).stat().st_size
        assert size < DATA_BUDGET, f"{root}{DATA}: {size} bytes, over the budget of {DATA_BUDGET}"


@pytest.mark.parametrize("term,notebook,section", SEARCH_TERMS, ids=[t[0] for t in SEARCH_TERMS])
def test_site_search_finds(site_page, term, notebook, section):
    """A result opens its page at its section, with the first match there highlighted and in view."""
    open_site(site_page, "index.html")
    results = search(site_page, term)
    assert results and results[0].startswith(f"{notebook}.html"), f"{term}: {results[:5]}"
    site_page.locator("#search-results ul li a").first.click()
    site_page.wait_for_load_state("load")
    site_page.wait_for_timeout(500)  # the scroll to the first match
    anchor = site_page.evaluate("() => decodeURIComponent(location.hash.slice(1))")
    assert anchor, f"{term}: the result does not lead to a section ({site_page.url})"
    hit = site_page.locator(f"section[id='{anchor}'] span.highlighted").first
    assert hit.is_visible() and 0 <= hit.evaluate("e => e.getBoundingClientRect().top") < VIEWPORT["height"], \
        f"{term}: the page does not open at the match in its section #{anchor}"
    # The lesson's section: the nearest enclosing section headed by an h2 (a match may sit in an h3 subsection).
    heading = hit.evaluate("e => { let s = e.closest('section');"
                           " while (s && !s.querySelector(':scope > h2')) s = s.parentElement.closest('section');"
                           " return s ? s.querySelector(':scope > h2').textContent : null; }")
    assert section in heading, f"{term}: opens in section {heading!r}"
    site_page.screenshot(path=str(OUTPUT / f"site-search-{term}.png"))


def test_site_search_highlight_does_not_carry_over(site_page):
    """After a search, a page opened from the sidebar (not from a result) has no highlight and opens at its top,
    even where it has the searched word (07 has pin_memory); so has the next page after a result's."""
    open_site(site_page, "index.html")
    search(site_page, "pin_memory")
    site_page.locator(".bd-sidenav a[href='07_performance_toolbox.html']").click()
    site_page.wait_for_load_state("load")
    site_page.wait_for_timeout(500)
    assert "pin_memory" in site_page.locator("article").inner_text()
    assert highlights(site_page) == 0, "a page opened from the sidebar highlights the last search's words"
    assert site_page.evaluate("() => window.scrollY") == 0, "a page opened from the sidebar is scrolled"

    search(site_page, "pin_memory")
    site_page.locator("#search-results ul li a").first.click()
    site_page.wait_for_load_state("load")
    site_page.wait_for_timeout(500)
    assert highlights(site_page) > 0, "a result's page shows no highlight"
    site_page.locator(".bd-sidenav a[href='07_performance_toolbox.html']").click()
    site_page.wait_for_load_state("load")
    site_page.wait_for_timeout(500)
    assert highlights(site_page) == 0 and site_page.evaluate("() => window.scrollY") == 0, \
        "the page after a result's page highlights the search's words"


SEARCH_CONTROLS = """() => [...document.querySelectorAll('.search-button__button, input[name=q]')]
  .filter(e => !e.closest('dialog') && e.getClientRects().length && getComputedStyle(e).visibility !== 'hidden')
  .map(e => e.className)"""


@pytest.mark.parametrize("width", [VIEWPORT["width"], 400], ids=["desktop", "phone"])
def test_site_search_one_control(site_page, width):
    """One search control on a lesson's page, at desktop width and at phone width (sidebar folded), and it
    searches."""
    site_page.set_viewport_size({"width": width, "height": VIEWPORT["height"]})
    open_site(site_page, "02_moving_data.html")
    if width < 960:
        assert not site_page.locator("#pst-primary-sidebar").is_visible(), "the sidebar is not folded"
    controls = site_page.evaluate(SEARCH_CONTROLS)
    assert len(controls) == 1, f"{width} px: search controls {controls}"
    assert not site_page.locator("#pst-header").is_visible(), "a header bar above the sidebar"
    results = search(site_page, "map_location")
    assert results[0].startswith("06_loading_across_devices.html"), results
    site_page.screenshot(path=str(OUTPUT / f"site-search-{width}px.png"))
