# GPU Usage in PyTorch: the two commands (lab, test) and the maintainer targets.
#   make lab         JupyterLab on the course, in .venv (LAB_ARGS="--no-browser --ip=0.0.0.0" on a server)
#   make test        pinned test environment in .venv, unit tests, strict nbval over every notebook,
#                    then strict nbval again on another CPU code path (make nbval-other-cpu)
#   make compat TORCH=2.6.0  a venv with that torch: every notebook executed, and the unit tests
#   make refresh     re-execute every notebook in place (pinned CPU environment) to regenerate outputs
#   make gpu-check   on a GPU host: run every notebook (outputs not compared), fail on any error
#   make record      on a GPU host: run the notebooks and rewrite the recorded GPU outputs
#                    (NB=notebooks/01_cpu_vs_gpu.ipynb for one notebook)
#   make sync        rebuild the badge and setup cells of every notebook from pyproject's Repository URL
#   make lint        ruff over course_utils, tests, tools, benchmarks and the notebooks (make test runs it)
#   make site        static HTML of the course from the stored outputs into site/ (index = notebook map)
#   make browser-test  every notebook in JupyterLab driven through Debian's Chromium (apt-get install
#                    chromium), and the site; screenshots in test-output/browser/
#   make binder-check  binder/'s environment in a fresh venv; every notebook executed there (nbclient)
# gpu-check and record use $(PY) (default python3) as it is, e.g. with packages on PYTHONPATH from a
# wheelhouse on an offline host; they never create .venv.

PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
PY ?= python3
LAB_ARGS ?=
PYTEST_ARGS ?=
NB ?= notebooks
NOTEBOOKS := $(sort $(wildcard notebooks/*.ipynb))

.PHONY: lab test nbval-other-cpu compat unit nbval refresh gpu-check record sync venv-test clean lint site browser-test binder-check

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip

$(VENV)/.lab-installed: requirements.txt pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install -r requirements.txt -e .
	touch $@

$(VENV)/.test-installed: tests/requirements.txt tests/constraints.txt pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install -q -c tests/constraints.txt -r tests/requirements.txt -e .
	touch $@

# make browser-test and make site: JupyterLab, Playwright and nbconvert on top of the test environment.
$(VENV)/.browser-installed: tests/requirements-browser.txt tests/constraints.txt $(VENV)/.test-installed
	$(BIN)/python -m pip install -q -c tests/constraints.txt -r tests/requirements-browser.txt
	touch $@

venv-test: $(VENV)/.test-installed

lab: $(VENV)/.lab-installed
	cd notebooks && ../$(BIN)/jupyter lab 00_setup.ipynb $(LAB_ARGS)

# Stored outputs come from a CPU run, so the tests hide any GPU (a GPU host validates with gpu-check).
CPU_ONLY := CUDA_VISIBLE_DEVICES= COURSE_DEVICE=cpu

# The stored outputs must hold on any CPU, so make test runs strict nbval a second time on another code
# path: one thread, AVX2 kernels in ATen, MKL and oneDNN (how one machine imitates another CPU).
# OTHER_CPU_ISA=default makes ATen use its plain kernels instead.
OTHER_CPU_ISA ?= avx2
OTHER_CPU := OMP_NUM_THREADS=1 MKL_ENABLE_INSTRUCTIONS=AVX2 ATEN_CPU_CAPABILITY=$(OTHER_CPU_ISA) ONEDNN_MAX_CPU_ISA=AVX2

test: $(VENV)/.test-installed lint
	$(CPU_ONLY) $(BIN)/python -m pytest --durations=10 $(PYTEST_ARGS)
	$(MAKE) --no-print-directory nbval-other-cpu

nbval-other-cpu: $(VENV)/.test-installed
	$(CPU_ONLY) $(OTHER_CPU) $(BIN)/python -m pytest -q notebooks

# make compat TORCH=2.6.0: a separate venv (build/compat-2.6.0) with that torch; every notebook executed
# (outputs not compared; cells tagged raises-exception must still raise, no other cell may) and the unit tests.
TORCH ?=
compat:
	@test -n "$(TORCH)" || { echo "usage: make compat TORCH=2.6.0"; exit 2; }
	$(PYTHON) tools/compat.py $(TORCH)

unit: $(VENV)/.test-installed
	$(CPU_ONLY) $(BIN)/python -m pytest tests $(PYTEST_ARGS)

lint: $(VENV)/.test-installed
	$(BIN)/ruff check course_utils tests tools benchmarks notebooks

site: $(VENV)/.browser-installed
	$(BIN)/python tools/build_site.py

# Chromium comes from the system (Debian: apt-get install chromium), never from `playwright install`.
CHROMIUM ?= /usr/bin/chromium
browser-test: site
	@test -x $(CHROMIUM) || { echo "browser-test needs Chromium at $(CHROMIUM): apt-get install -y chromium"; exit 1; }
	$(CPU_ONLY) CHROMIUM=$(CHROMIUM) $(BIN)/python -m pytest tests/browser -v --durations=0 $(PYTEST_ARGS)

# A fresh venv in build/binder-venv with binder/requirements.txt and postBuild; every notebook runs there.
binder-check:
	$(PYTHON) tools/check_binder.py

refresh: $(VENV)/.test-installed
	$(BIN)/python tools/refresh_notebooks.py $(NOTEBOOKS)

sync:
	$(PYTHON) tools/sync_notebooks.py

gpu-check:
	$(PY) -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 'make gpu-check needs a CUDA GPU: none is visible')"
	$(PY) -m pytest --nbval-lax -v --durations=0 $(PYTEST_ARGS)

record:
	$(PY) -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 'make record needs a CUDA GPU: none is visible')"
	COURSE_RECORD=1 TQDM_DISABLE=1 $(PY) -m pytest --nbval-lax -v $(PYTEST_ARGS) $(NB)

clean:
	rm -rf $(VENV) build *.egg-info
