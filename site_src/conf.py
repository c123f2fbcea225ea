"""Sphinx configuration of the course's website: `make site` (``python site_src/course_site.py``).

Sphinx + MyST-NB + sphinx-book-theme render the notebooks from their stored outputs (nothing executes) into
site/, the Chinese edition (notebooks/zh/) into site/zh/ with ``language = "zh_CN"``. What differs between
the two editions (title, source folder, UI strings) and the course's own rules (solution cells collapsed,
badge cells dropped, links to repository files sent to GitHub, widget outputs shown statically) live in
the local extension ``course_site.py`` beside this file.
"""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent / "tools")]

from project import repository_url  # noqa: E402  (tools/project.py: pyproject's [project.urls] Repository)

extensions = ["myst_nb", "sphinx_copybutton", "course_site"]
root_doc = "index"  # generated from README's notebook map at build time
templates_path = ["_templates"]
# course-layout.css/.js: code that wraps instead of being cut off, folded tracebacks, pages that fit a phone.
html_static_path = ["_static"]
html_css_files = ["course-layout.css"]
html_js_files = ["course-layout.js"]
# Copy buttons on code cells and code blocks, not on outputs; a copy leaves out prompts (>>>, $, In [1]:) and,
# where there are prompts, the output lines between them.
copybutton_selector = 'div[class*="highlight-"]:not(.output) > div.highlight > pre'  # copybutton.js quotes it with '
copybutton_exclude = ".linenos, .gp, .go"
copybutton_prompt_text = r">>> |\.\.\. |\$ |In \[\d*\]: | {2,5}\.\.\.: "
copybutton_prompt_is_regexp = True

# Notebooks are shown as committed: their stored outputs (a CPU run, and GPU recordings under banners).
nb_execution_mode = "off"
# Every notebook is read through course_site.read_notebook (course_site sets its arguments per edition).
nb_custom_formats = {".ipynb": ["course_site.read_notebook", {}, False]}
# No ipywidgets manager (require.js and the HTML manager come from a CDN): every widget cell also has a
# static output, and read_notebook drops the widget views.
nb_ipywidgets_js: dict[str, dict[str, str]] = {}
# Heading ids as GitHub makes them ("## 4. Pinned memory and `non_blocking`" -> #4-pinned-memory-and-non_blocking),
# so that links like 02_moving_data.ipynb#4-pinned-memory-and-non_blocking work on GitHub and here, and a
# wrong one fails the build.
myst_heading_anchors = 6
# Pygments' IPython-traceback lexer stumbles on some messages (a backtick in torch.load's) and then colours
# the traceback in its relaxed mode: not a fault of the site, so the one warning that would fail -W is off.
suppress_warnings = ["misc.highlighting_failure"]

html_theme = "sphinx_book_theme"
html_title = "GPU Usage in PyTorch"  # replaced by the edition's README title (course_site)
# The theme's download button (.ipynb) links _sources/<page>.ipynb: copy each notebook there as it is (its
# stored outputs included), without Sphinx's default ".txt" suffix; no "show source" link besides it.
html_copy_source = True
html_sourcelink_suffix = ""
html_show_sourcelink = False
# Sphinx's search results would fetch each page for an excerpt, which a browser refuses for a site opened from
# disk (file://): off. The search page ranks and shows excerpts from data made at build time (course_search.py).
html_show_search_summary = False
# Light or dark as the reader's system is (the theme's own default, but left unset it logs a console error).
html_context = {"default_mode": "auto"}
html_theme_options = {
    # The footer: the repository (the theme's default shows an author and a copyright line).
    "footer_content_items": ["extra-footer.html"],
    "extra_footer": f'<a href="{repository_url()}">{repository_url()}</a> · code MIT, text CC BY 4.0',
    "repository_url": repository_url(),
    "repository_branch": "main",
    "path_to_docs": "notebooks",  # notebooks/zh for the Chinese edition (course_site)
    "use_repository_button": True,
    "launch_buttons": {
        "binderhub_url": "https://mybinder.org",
        "colab_url": "https://colab.research.google.com",
        "notebook_interface": "jupyterlab",
    },
    "home_page_in_toc": True,
    # No header bar above the sidebar (it held only a second search button): search is the sidebar's field,
    # and at phone width, with the sidebar folded, the magnifier among the article's buttons.
    "navbar_persistent": [],
}
# The theme's sidebar with a language switch under the title: English <-> 中文 on every page when both
# editions are built (_templates/language-switch.html).
html_sidebars = {"**": ["navbar-logo.html", "language-switch.html", "icon-links.html", "search-button-field.html",
                        "sbt-sidebar-nav.html"]}
