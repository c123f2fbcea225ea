# GPU Usage in PyTorch: the two commands (lab, test) and the maintainer targets.
# `make help` lists them. Each target's description is the `## ` comment right above its rule: README's
# command table is generated from those lines (tools/sync_notebooks.py), so write them there only.
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

.PHONY: help lab test test-slow nbval-other-cpu soak compat unit refresh gpu-check record sync venv-test clean lint site browser-test binder-check

## this list
help:
	@$(PYTHON) tools/project.py help

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip

$(VENV)/.lab-installed: requirements.txt pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install -r requirements.txt -e .
	touch $@

$(VENV)/.test-installed: tests/requirements.txt tests/constraints.txt pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install -q -c tests/constraints.txt -r tests/requirements.txt -e .
	touch $@

# make browser-test and make site: JupyterLab and Playwright, Sphinx, MyST-NB and sphinx-book-theme on top of
# the test environment.
$(VENV)/.browser-installed: tests/requirements-browser.txt tests/constraints.txt $(VENV)/.test-installed
	$(BIN)/python -m pip install -q -c tests/constraints.txt -r tests/requirements-browser.txt
	touch $@

venv-test: $(VENV)/.test-installed

## JupyterLab on the course, in .venv (on a server: LAB_ARGS="--no-browser --ip=0.0.0.0 --port=8888"; ZH=1: the Chinese edition)
lab: $(VENV)/.lab-installed
	cd notebooks && ../$(BIN)/jupyter lab $(if $(ZH),zh/)00_setup.ipynb $(LAB_ARGS)

# Stored outputs come from a CPU run, so the tests hide any GPU (a GPU host validates with gpu-check).
CPU_ONLY := CUDA_VISIBLE_DEVICES= COURSE_DEVICE=cpu

# The stored outputs must hold on any CPU, so make test runs strict nbval a second time on another code
# path: one thread, AVX2 kernels in ATen, MKL and oneDNN (how one machine imitates another CPU; the
# variables are in tools/run_tests.py, which runs both passes). OTHER_CPU_ISA=default makes ATen use its
# plain kernels instead.
OTHER_CPU_ISA ?= avx2
# ZH_STALE=mark: a Chinese block whose English changed shows in English and is marked, not a failing test.
ZH_STALE ?=

## pinned .venv; lint; unit tests and strict nbval over every notebook (GPUs hidden: stored outputs
## are from a CPU run), and beside it strict nbval again on another CPU code path (nbval-other-cpu); whole
## logs in test-output/ (tools/run_tests.py). In a fork whose maintainers do not read Chinese:
## `make sync && make test ZH_STALE=mark` marks the Chinese pages whose English changed instead of failing
test: $(VENV)/.test-installed
	COURSE_ZH_STALE=$(ZH_STALE) OTHER_CPU_ISA=$(OTHER_CPU_ISA) $(BIN)/python tools/run_tests.py --lint "$(MAKE) --no-print-directory lint" $(if $(PYTEST_ARGS),-- $(PYTEST_ARGS))

## the tests marked slow (real compiles of broken toolchains, an AOTInductor package), which make test leaves out
test-slow: $(VENV)/.test-installed
	$(CPU_ONLY) $(BIN)/python -m pytest tests -m slow $(PYTEST_ARGS)

## strict nbval over every notebook on one thread with AVX2 kernels, as another CPU runs it
## (OTHER_CPU_ISA=default: ATen's plain kernels)
nbval-other-cpu: $(VENV)/.test-installed
	OTHER_CPU_ISA=$(OTHER_CPU_ISA) $(BIN)/python tools/run_tests.py --only other-cpu $(if $(PYTEST_ARGS),-- $(PYTEST_ARGS))

N ?= 10
BURN ?= 0
## the flake budget: make test on N fresh clones of HEAD, one after another (BURN=K busy processes beside
## each run, as on a loaded CI runner); each run's result, time and failing tests; logs in test-output/soak/
soak:
	$(PYTHON) tools/soak.py --runs $(N) --burn $(BURN)

TORCH ?=
## TORCH=X.Y.Z: a separate venv with that torch (build/compat-X.Y.Z); every notebook executed (deliberate
## errors must still raise) and the unit tests
compat:
	@test -n "$(TORCH)" || { echo "usage: make compat TORCH=2.9.0"; exit 2; }
	$(PYTHON) tools/compat.py $(TORCH)

## the unit tests only (tests/), in the pinned .venv
unit: $(VENV)/.test-installed
	$(CPU_ONLY) $(BIN)/python -m pytest tests $(PYTEST_ARGS)

## ruff over course_utils, tests, tools, benchmarks and the notebooks; mypy over course_utils; actionlint (with
## shellcheck) and zizmor over .github/workflows (part of test)
lint: $(VENV)/.test-installed
	$(BIN)/ruff check course_utils tests tools benchmarks notebooks
	$(BIN)/mypy course_utils
	$(BIN)/actionlint -config-file .github/actionlint.yaml -shellcheck=$(BIN)/shellcheck -pyflakes= .github/workflows/*.yml
	$(BIN)/zizmor --offline --no-progress .github/workflows

## the course as a website in site/ (Sphinx, MyST-NB, sphinx-book-theme) from the stored outputs: search, launch
## buttons, solutions folded, offline, any warning fails; site/zh/ when notebooks/zh/ has the Chinese edition
site: $(VENV)/.browser-installed
	$(BIN)/python site_src/course_site.py

# Chromium comes from the system (Debian: apt-get install chromium), never from `playwright install`.
CHROMIUM ?= /usr/bin/chromium
## every notebook run in JupyterLab in Debian's Chromium (apt-get install chromium), widgets live, no
## errors; the site checked offline (pages, sidebar, search, solutions, GPU recordings, launch buttons,
## language switch); screenshots in test-output/browser/
browser-test: site
	@test -x $(CHROMIUM) || { echo "browser-test needs Chromium at $(CHROMIUM): apt-get install -y chromium"; exit 1; }
	$(CPU_ONLY) CHROMIUM=$(CHROMIUM) $(BIN)/python -m pytest tests/browser -v --durations=0 $(PYTEST_ARGS)

## binder/'s environment in a fresh venv (build/binder-venv); every notebook executed there
binder-check:
	$(PYTHON) tools/check_binder.py

## re-execute every notebook in place in the pinned CPU environment (their stored outputs)
refresh: $(VENV)/.test-installed
	$(BIN)/python tools/refresh_notebooks.py $(NOTEBOOKS)
	$(BIN)/python tools/translations.py

## regenerate every notebook's badge and setup cells, README's badges, notebook map and command table,
## and CONTRIBUTING's curriculum and command table, from pyproject.toml, tools/project.py, the notebooks
## and the Makefile; then the Chinese edition: the catalogues in i18n/zh_CN/, notebooks/zh/, README.zh-CN.md's map
sync: $(VENV)/.test-installed
	$(PYTHON) tools/sync_notebooks.py
	$(BIN)/python tools/translations.py

GPU_BUDGET_GB ?=
# GPU_BUDGET_GB=15: a helper process holds all but that many GiB of each GPU while the tests run (tools/gpu_budget.py)
GPU_BUDGET := $(if $(GPU_BUDGET_GB),$(PY) tools/gpu_budget.py --leave-gib $(GPU_BUDGET_GB) --,)
SLOW ?=
## on a GPU host: every notebook and unit test with the GPU visible; outputs not compared; any error fails
## (GPU_BUDGET_GB=15: with only 15 GiB of each GPU free, as on a Colab T4; SLOW=1: also the %%gpu --slow cells)
gpu-check:
	$(PY) -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 'make gpu-check needs a CUDA GPU: none is visible')"
	COURSE_SLOW_CELLS=$(SLOW) $(GPU_BUDGET) $(PY) -m pytest --nbval-lax -v --durations=0 $(PYTEST_ARGS)

GPU_CELLS ?=
## on a GPU host: as gpu-check, and every %%gpu cell that runs rewrites its recording
## (NB=notebooks/01_cpu_vs_gpu.ipynb for one notebook; GPU_CELLS=07-profile,07-compile for only those cells,
## slow ones included; SLOW=1 for every --slow cell too)
record:
	$(PY) -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 'make record needs a CUDA GPU: none is visible')"
	COURSE_SLOW_CELLS=$(SLOW) COURSE_RECORD=1 COURSE_GPU_CELLS=$(GPU_CELLS) TQDM_DISABLE=1 $(PY) -m pytest --nbval-lax -v $(PYTEST_ARGS) $(NB)

## remove .venv, build/ and the egg-info
clean:
	rm -rf $(VENV) build *.egg-info
