"""The GitHub workflows (.github/workflows/) against the README and the course's rules for them.

`make lint` runs actionlint and zizmor over the workflows; these tests check what those tools cannot know:
the test workflow runs the README's test command (so the two cannot drift apart), every action is pinned to
a commit, the GPU job stays off unless the repository turns it on, and the site is deployed only from main.
Each rule is a function that lists what is wrong with a parsed workflow; the tests at the bottom show that
each one catches a broken copy.
"""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any

import pytest

yaml = pytest.importorskip("yaml", reason="the workflow tests need PyYAML (tests/requirements.txt)")

ROOT = Path(__file__).resolve().parents[1]
WORKFLOWS = ROOT / ".github" / "workflows"
PINNED = re.compile(r"^[\w.-]+/[\w./-]+@[0-9a-f]{40}$")
VERSION_COMMENT = re.compile(r"uses:\s*(\S+)\s+#\s*v\d+(\.\d+)*\s*$")
DEPLOY_IF = "github.event_name == 'push' && github.ref == 'refs/heads/main'"
# The deploy job also needs Pages turned on: the original repository has it, a fork opts in with a variable
# (configure-pages fails on every push to main of a fork without Pages).
PAGES_ON = "vars.COURSE_PAGES == 'true'"


def load(name: str) -> dict[str, Any]:
    return yaml.safe_load((WORKFLOWS / name).read_text(encoding="utf-8"))


def triggers(workflow: dict[str, Any]) -> dict[str, Any]:
    """The ``on:`` block (YAML 1.1 reads the bare key ``on`` as True)."""
    on = workflow.get("on", workflow.get(True))
    return {name: None for name in on} if isinstance(on, list) else dict(on or {})


def readme_test_command() -> str:
    """The test command of README's "The two commands" block: the line whose comment says it runs the tests."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    section = text.split("## The two commands", 1)[1]
    block = re.search(r"```bash\n(.*?)```", section, re.S)
    assert block, "README.md: no ```bash block under '## The two commands'"
    commands = []
    for line in block.group(1).splitlines():
        command, _, comment = line.partition("#")
        if re.search(r"\btests?\b|nbval", comment):
            commands.append(command.strip())
    assert len(commands) == 1, f"README.md: expected one test command in the two commands, found {commands}"
    return commands[0]


def run_lines(job: dict[str, Any]) -> list[str]:
    """Every line of every ``run:`` script of a job, stripped."""
    return [line.strip() for step in job.get("steps", []) for line in str(step.get("run", "")).splitlines()]


def runs(job: dict[str, Any], command: str) -> bool:
    """Whether one of the job's ``run:`` lines is ``command`` (alone, with arguments, or piped on)."""
    return any(re.match(rf"{re.escape(command)}(\s|$)", line) for line in run_lines(job))


def uses(workflow: dict[str, Any]) -> list[str]:
    found = []
    for job in workflow["jobs"].values():
        if "uses" in job:
            found.append(job["uses"])
        found += [step["uses"] for step in job.get("steps", []) if "uses" in step]
    return found


# --- the rules ---------------------------------------------------------------------------------------------

def problems_of_the_tests_workflow(workflow: dict[str, Any], test_command: str) -> list[str]:
    problems = []
    on = triggers(workflow)
    if not {"push", "pull_request"} <= set(on):
        problems.append(f"tests.yml must run on push and pull_request, not only {sorted(on)}")
    jobs = workflow["jobs"]
    testing = [name for name, job in jobs.items() if runs(job, test_command)]
    if not testing:
        problems.append(f"no job of tests.yml runs the README's test command {test_command!r}")
    for name in testing:
        job = jobs[name]
        if job.get("runs-on") != "ubuntu-latest":
            problems.append(f"job {name}: the test command runs on {job.get('runs-on')!r}, not ubuntu-latest")
        pythons = [str(s.get("with", {}).get("python-version")) for s in job.get("steps", [])
                   if str(s.get("uses", "")).startswith("actions/setup-python@")]
        if pythons != ["3.11"]:
            problems.append(f"job {name}: Python {pythons}, not the 3.11 the pinned test environment is for")
        cached = [s for s in job.get("steps", []) if str(s.get("uses", "")).startswith("actions/setup-python@")
                  and s.get("with", {}).get("cache-dependency-path") == "tests/constraints.txt"]
        if not cached:
            problems.append(f"job {name}: pip's cache is not keyed on tests/constraints.txt")
    browser = [name for name, job in jobs.items() if runs(job, "make browser-test")]
    if not browser:
        problems.append("no job of tests.yml runs make browser-test")
    for name in browser:
        lines = "\n".join(run_lines(jobs[name]))
        if not re.search(r"apt-get install\b.*\bchromium\b", lines) or "playwright install" in lines:
            problems.append(f"job {name}: Chromium must come from the distribution (apt-get install chromium), "
                            "never from playwright install")
    for name in testing + browser:
        uploads = [s for s in jobs[name].get("steps", []) if str(s.get("uses", "")).startswith(
            "actions/upload-artifact@")]
        if not any(s.get("if") == "failure()" and "test-output" in str(s.get("with", {}).get("path"))
                   for s in uploads):
            problems.append(f"job {name}: test-output/ (screenshots, logs) is not uploaded when it fails")
    concurrency = workflow.get("concurrency") or {}
    if concurrency.get("cancel-in-progress") is not True or "github.ref" not in str(concurrency.get("group")):
        problems.append("tests.yml: a concurrency group per ref must cancel superseded runs")
    return problems


def problems_of_the_gpu_job(workflow: dict[str, Any]) -> list[str]:
    gpu = {name: job for name, job in workflow["jobs"].items() if runs(job, "make gpu-check")}
    if len(gpu) != 1:
        return [f"tests.yml must have one job that runs make gpu-check, not {sorted(gpu)}"]
    (name, job), = gpu.items()
    problems = []
    labels = job.get("runs-on")
    labels = [labels] if isinstance(labels, str) else list(labels or [])
    if set(labels) != {"self-hosted", "gpu"}:
        problems.append(f"job {name}: runs-on {labels}, not the self-hosted runner labelled gpu")
    condition = str(job.get("if", ""))
    if "vars.COURSE_GPU_CI == 'true'" not in condition:
        problems.append(f"job {name}: must run only when vars.COURSE_GPU_CI == 'true' (if: {condition!r})")
    if "||" in condition:
        problems.append(f"job {name}: an `||` in its condition could run it without the variable: {condition!r}")
    if "github.event_name == 'push'" not in condition:
        problems.append(f"job {name}: must not run for pull requests (a fork's code on the GPU machine)")
    checking = [step for step in job.get("steps", []) if "make gpu-check" in str(step.get("run", ""))]
    if not all("${{ github.workspace }}" in str((step.get("env") or {}).get("PYTHONPATH", "")) for step in checking):
        problems.append(f"job {name}: make gpu-check must import the pushed course_utils (PYTHONPATH set to "
                        "the checkout), not whichever one the runner has installed")
    return problems


def problems_of_the_site_workflow(workflow: dict[str, Any]) -> list[str]:
    problems = []
    on = triggers(workflow)
    if not {"push", "pull_request"} <= set(on):
        problems.append(f"site.yml must build on push and pull_request, not only {sorted(on)}")
    jobs = workflow["jobs"]
    builders = [name for name, job in jobs.items() if runs(job, "make site")]
    if not builders:
        problems.append("no job of site.yml runs make site")
    deployers = {name: job for name, job in jobs.items()
                 if any(str(s.get("uses", "")).startswith("actions/deploy-pages@") for s in job.get("steps", []))}
    if len(deployers) != 1:
        return problems + [f"site.yml must have one job that deploys to Pages, not {sorted(deployers)}"]
    (name, deploy), = deployers.items()
    condition = str(deploy.get("if", "")).strip()
    if not condition.startswith(f"{DEPLOY_IF} && (") or PAGES_ON not in condition:
        problems.append(f"job {name}: deploys on {deploy.get('if')!r}; it must deploy only on {DEPLOY_IF!r} "
                        f"and where Pages is on ({PAGES_ON!r} for a fork)")
    if deploy.get("permissions") != {"pages": "write", "id-token": "write"}:
        problems.append(f"job {name}: permissions must be exactly pages: write and id-token: write")
    environment = deploy.get("environment")
    if (environment.get("name") if isinstance(environment, dict) else environment) != "github-pages":
        problems.append(f"job {name}: must deploy to the github-pages environment")
    if not set(builders) & set(deploy.get("needs", []) if isinstance(deploy.get("needs"), list)
                               else [deploy.get("needs")]):
        problems.append(f"job {name}: must need the job that runs make site")
    for other, job in jobs.items():
        if other != name and set(job.get("permissions") or {}) & {"pages", "id-token"}:
            problems.append(f"job {other}: only the deploy job may have pages or id-token permissions")
    for builder in builders:
        pages = [s for s in jobs[builder].get("steps", [])
                 if str(s.get("uses", "")).startswith("actions/upload-pages-artifact@")]
        if [str(s.get("with", {}).get("path", "")).rstrip("/") for s in pages] != ["site"]:
            problems.append(f"job {builder}: must upload site/ with actions/upload-pages-artifact")
        if any(str(s.get("if", "")).strip() != DEPLOY_IF for s in pages):
            problems.append(f"job {builder}: must upload the Pages artifact only on {DEPLOY_IF!r}")
    return problems


def problems_of_any_workflow(workflow: dict[str, Any], text: str) -> list[str]:
    """Least privilege and pinned actions, for every workflow."""
    problems = []
    if workflow.get("permissions") not in ({}, {"contents": "read"}):
        problems.append(f"top-level permissions must be {{}} or contents: read, not {workflow.get('permissions')!r}")
    for name, job in workflow["jobs"].items():
        if "permissions" not in job:
            problems.append(f"job {name}: no permissions of its own")
    for action in uses(workflow):
        if not PINNED.match(action):
            problems.append(f"{action}: not pinned to a full commit SHA (owner/name@<40 hex digits>)")
    for line in text.splitlines():
        if re.match(r"\s*(-\s+)?uses:", line) and not VERSION_COMMENT.search(line):
            problems.append(f"{line.strip()!r}: the pin needs its version in a comment (# vX.Y.Z)")
    for name, job in workflow["jobs"].items():
        for step in job.get("steps", []):
            if str(step.get("uses", "")).startswith("actions/checkout@") and \
                    step.get("with", {}).get("persist-credentials") is not False:
                problems.append(f"job {name}: actions/checkout without persist-credentials: false")
    return problems


# --- the workflows of this repository ----------------------------------------------------------------------

WORKFLOW_FILES = sorted(p.name for p in WORKFLOWS.glob("*.yml"))


def test_the_workflows_are_there():
    assert {"tests.yml", "site.yml"} <= set(WORKFLOW_FILES)


def test_the_readme_test_command_is_what_ci_runs():
    command = readme_test_command()
    assert command == "make test"  # what the README says today; change both together
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8").splitlines()
    assert any(re.match(rf"{re.escape(command)}(\s|$)", line.strip()) for line in ci), \
        f".ci/run does not run the README's test command {command!r}"


def test_the_tests_workflow():
    assert problems_of_the_tests_workflow(load("tests.yml"), readme_test_command()) == []


def test_the_gpu_job_is_off_unless_turned_on():
    assert problems_of_the_gpu_job(load("tests.yml")) == []


def test_the_site_is_deployed_only_from_main():
    assert problems_of_the_site_workflow(load("site.yml")) == []


@pytest.mark.parametrize("name", WORKFLOW_FILES)
def test_least_privilege_and_pinned_actions(name):
    assert problems_of_any_workflow(load(name), (WORKFLOWS / name).read_text(encoding="utf-8")) == []


# --- each rule catches a broken workflow -------------------------------------------------------------------

def _first_step(job: dict[str, Any], prefix: str) -> dict[str, Any]:
    return next(s for s in job["steps"] if str(s.get("uses", "")).startswith(prefix))


def _job_running(workflow: dict[str, Any], command: str) -> dict[str, Any]:
    return next(job for job in workflow["jobs"].values() if runs(job, command))


def test_a_workflow_that_drifted_from_the_readme_fails():
    broken = copy.deepcopy(load("tests.yml"))
    for job in broken["jobs"].values():
        for step in job["steps"]:
            if "run" in step:
                step["run"] = step["run"].replace("make test ", "make unit ")
    assert any("README's test command" in p for p in problems_of_the_tests_workflow(broken, "make test"))
    # and README's command changing alone is caught too
    assert any("README's test command" in p for p in problems_of_the_tests_workflow(load("tests.yml"), "make check"))


def test_a_downloaded_browser_fails():
    broken = copy.deepcopy(load("tests.yml"))
    job = _job_running(broken, "make browser-test")
    for step in job["steps"]:
        if "apt-get install" in str(step.get("run", "")):
            step["run"] = ".venv/bin/python -m playwright install chromium"
    assert any("distribution" in p for p in problems_of_the_tests_workflow(broken, "make test"))


def test_no_artifact_on_failure_fails():
    broken = copy.deepcopy(load("tests.yml"))
    _first_step(_job_running(broken, "make test"), "actions/upload-artifact@")["if"] = "success()"
    assert any("not uploaded" in p for p in problems_of_the_tests_workflow(broken, "make test"))


def test_a_gpu_job_that_is_on_by_default_fails():
    broken = copy.deepcopy(load("tests.yml"))
    job = _job_running(broken, "make gpu-check")
    job["if"] = "github.event_name == 'push'"
    assert any("COURSE_GPU_CI" in p for p in problems_of_the_gpu_job(broken))
    job["if"] = "vars.COURSE_GPU_CI == 'true' || github.event_name == 'push'"
    assert any("||" in p for p in problems_of_the_gpu_job(broken))
    job["if"] = "vars.COURSE_GPU_CI == 'true'"
    assert any("pull requests" in p for p in problems_of_the_gpu_job(broken))
    job["runs-on"] = "ubuntu-latest"
    assert any("labelled gpu" in p for p in problems_of_the_gpu_job(broken))
    for step in job["steps"]:
        (step.get("env") or {}).pop("PYTHONPATH", None)
    assert any("pushed course_utils" in p for p in problems_of_the_gpu_job(broken))


def test_deploying_from_a_pull_request_fails():
    broken = copy.deepcopy(load("site.yml"))
    deploy = next(job for job in broken["jobs"].values() if "environment" in job)
    deploy["if"] = "github.ref == 'refs/heads/main'"
    assert any("deploy only" in p for p in problems_of_the_site_workflow(broken))
    del deploy["if"]
    assert any("deploy only" in p for p in problems_of_the_site_workflow(broken))
    deploy["if"] = DEPLOY_IF  # a fork without Pages would fail at configure-pages on every push
    assert any("where Pages is on" in p for p in problems_of_the_site_workflow(broken))
    broken = copy.deepcopy(load("site.yml"))
    build = _job_running(broken, "make site")
    build["permissions"] = {"contents": "read", "pages": "write"}
    assert any("only the deploy job" in p for p in problems_of_the_site_workflow(broken))


def test_an_unpinned_action_fails():
    text = (WORKFLOWS / "tests.yml").read_text(encoding="utf-8")
    sha = re.search(r"actions/checkout@([0-9a-f]{40})", text).group(1)
    broken_text = text.replace(f"actions/checkout@{sha} # v", "actions/checkout@v6 # v", 1)
    problems = problems_of_any_workflow(yaml.safe_load(broken_text), broken_text)
    assert any("actions/checkout@v6: not pinned" in p for p in problems)
    no_comment = text.replace(f"actions/checkout@{sha} # v6.0.2", f"actions/checkout@{sha}", 1)
    assert any("version in a comment" in p for p in problems_of_any_workflow(yaml.safe_load(no_comment), no_comment))


def test_broad_permissions_and_persisted_credentials_fail():
    broken = copy.deepcopy(load("tests.yml"))
    broken["permissions"] = "write-all"
    _first_step(_job_running(broken, "make test"), "actions/checkout@")["with"] = {}
    text = (WORKFLOWS / "tests.yml").read_text(encoding="utf-8")
    problems = problems_of_any_workflow(broken, text)
    assert any("top-level permissions" in p for p in problems)
    assert any("persist-credentials" in p for p in problems)


def test_every_repository_variable_a_workflow_reads_is_explained_for_forks():
    """A fork's instructor learns from CONTRIBUTING.md which repository variables turn things on."""
    contributing = (ROOT / "CONTRIBUTING.md").read_text(encoding="utf-8")
    read = {name for path in WORKFLOWS.glob("*.yml")
            for name in re.findall(r"\bvars\.([A-Z_]+)", path.read_text(encoding="utf-8"))}
    assert {"COURSE_PAGES", "COURSE_GPU_CI"} <= read
    assert not [name for name in read if f"`{name}`" not in contributing], "CONTRIBUTING.md must name each"
