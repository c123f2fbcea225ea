"""benchmarks/decode_ladder.py and benchmarks/inference_memory.py run end to end (their --smoke modes: a tiny model on
the CPU, nothing compiled, nothing measured on a GPU)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_the_ladder_script_writes_every_rung(tmp_path: Path) -> None:
    r = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "decode_ladder.py"), "--output", str(tmp_path),
                        "--smoke", "--prompt", "4", "--tokens", "4", "--rounds", "1", "--profile"],
                       capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert r.returncode == 0, r.stderr[-3000:]
    report = json.loads((tmp_path / "decode_ladder.json").read_text())
    rungs = report["models"]["tiny"]["rungs"]
    for name in ("eager-fp32", "eager-bf16", "compiled-bf16", "int8-by-hand"):
        assert rungs[name]["ms_per_token"] > 0 and 0 < rungs[name]["mbu"] < 1, (name, rungs[name])
        assert rungs[name]["profile"]["wall_s"] > 0
    assert rungs["int8-by-hand"]["weight_bytes"] < rungs["eager-fp32"]["weight_bytes"]
    for name in ("torchao-int8", "torchao-int4"):
        assert "ms_per_token" in rungs[name] or rungs[name]["skipped"]
    assert {"device", "torch", "date", "peak_gbps"} <= set(report)


def test_the_ladder_script_refuses_a_cpu_without_smoke(tmp_path: Path) -> None:
    r = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "decode_ladder.py"), "--output", str(tmp_path)],
                       capture_output=True, text=True, timeout=120, cwd=ROOT, env={"CUDA_VISIBLE_DEVICES": "",
                                                                                  "PATH": "/usr/bin:/bin"})
    assert r.returncode == 2 and "this machine has none" in r.stdout


def test_the_memory_script_writes_the_plan_of_every_job(tmp_path: Path) -> None:
    r = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "inference_memory.py"), "--output", str(tmp_path),
                        "--smoke"], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert r.returncode == 0, r.stderr[-3000:]
    report = json.loads((tmp_path / "inference_memory.json").read_text())
    assert [row["weights"] for row in report["rows"]] == ["fp32", "int8"]
    for row in report["rows"]:
        assert row["predicted"]["prefill"] >= row["predicted"]["decode"] > 0
