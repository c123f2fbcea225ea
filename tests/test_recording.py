"""The %%gpu magic: runs with a GPU, replays a labelled recording without one, records in record mode."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from IPython.core.interactiveshell import InteractiveShell
from IPython.utils.capture import capture_output

import course_utils.recording as rec


@pytest.fixture
def shell(tmp_path, monkeypatch):
    monkeypatch.setenv("COURSE_RECORDINGS_DIR", str(tmp_path))
    monkeypatch.delenv("COURSE_RECORD", raising=False)
    monkeypatch.setattr(rec, "_LIVE", {})  # no live run of an earlier test
    sh = InteractiveShell.instance()
    sh.run_cell("%matplotlib inline")  # as in a Jupyter kernel: figures display as PNG
    sh.run_cell("%load_ext course_utils")
    return sh


def run(sh, source):
    with capture_output() as cap:
        result = sh.run_cell(source)
    texts = [o.data.get("text/plain", "") for o in cap.outputs]
    return result, cap, texts


def fake_gpus(monkeypatch, n):
    monkeypatch.setattr(rec, "_have_gpus", lambda: n)


def test_missing_recording_is_a_note_not_an_error(shell, monkeypatch):
    fake_gpus(monkeypatch, 0)
    result, cap, texts = run(shell, "%%gpu 99-missing\nraise SystemExit('must not run')")
    assert result.success
    assert texts == ["Not run: this notebook ran without a CUDA GPU. On a machine with an NVIDIA GPU (on Colab: a GPU "
                     "runtime) it runs the code above. No output of this cell (99-missing) from such a machine "
                     "comes with the course yet."]


def test_missing_recording_says_what_the_cell_shows_and_where_it_runs(shell, monkeypatch):
    fake_gpus(monkeypatch, 1)
    result, _, texts = run(shell, '%%gpu 99-two --gpus 2 --shows "which physical GPU each logical id is"\n'
                                  "raise SystemExit('must not run')")
    assert result.success
    assert texts == ["Not run: this cell needs 2 CUDA GPUs; this notebook ran with 1. On a machine with 2 NVIDIA "
                     "GPUs (a lab or cloud server; Colab gives one) it shows which physical GPU each logical id "
                     "is. No output of this cell (99-two) from such a machine comes with the course yet."]
    assert not any(word in texts[0] for word in ("make", "maintainer", "course_utils/recorded"))


@pytest.mark.parametrize("line, parsed", [("01-a", ("01-a", 1, "", "", 0.0)),
                                          ("01-a --gpus 2", ("01-a", 2, "", "", 0.0)),
                                          ('01-a --shows "x y" --gpus 4', ("01-a", 4, "x y", "", 0.0)),
                                          ('01-a --slow "takes 7 min" --shows s', ("01-a", 1, "s", "takes 7 min", 0.0)),
                                          ('01-a --needs-gib 19 --shows s', ("01-a", 1, "s", "", 19.0)),
                                          ('01-a --needs-gib 7.5', ("01-a", 1, "", "", 7.5))])
def test_parse_gpu_line(line, parsed):
    assert rec.parse_gpu_line(line) == parsed


@pytest.mark.parametrize("line", ["", "a b", "01-a --gpus", "01-a --gpus two", "01-a --shows", "01-a --slow",
                                  "01-a --needs-gib", "01-a --needs-gib lots", "01-a --needs-gib 0",
                                  "01-a --needs-gib -4", "01-a --needs-gib inf", "01-a --needs-gib nan"])
def test_parse_gpu_line_rejects(line):
    with pytest.raises(ValueError):
        rec.parse_gpu_line(line)


@pytest.mark.parametrize("content", ["{not json", '{"meta": {}}', '{"meta": [], "outputs": []}',
                                     '{"meta": {}, "outputs": [{"output_type": "bogus"}]}', ""])
def test_corrupt_recording_is_a_note(shell, monkeypatch, tmp_path, content):
    fake_gpus(monkeypatch, 0)
    (tmp_path / "99-bad.json").write_text(content)
    result, _, texts = run(shell, "%%gpu 99-bad\nprint('x')")
    assert result.success
    assert texts[0].startswith("Not run: this notebook ran without a CUDA GPU.") and "99-bad" in texts[0]


def test_record_then_replay(shell, monkeypatch, tmp_path):
    fake_gpus(monkeypatch, 1)
    monkeypatch.setenv("COURSE_RECORD", "1")
    source = ("import matplotlib.pyplot as plt\nprint('hello from the GPU')\n"
              "fig = plt.figure(); plt.plot([1, 2, 3])\n6 * 7")
    result, cap, texts = run(shell, "%%gpu 99-demo\n" + source)
    assert result.success
    assert cap.stdout == "hello from the GPU\n"
    data = json.loads((tmp_path / "99-demo.json").read_text())
    kinds = [o["output_type"] for o in data["outputs"]]
    assert kinds == ["stream", "display_data", "display_data"]
    assert data["outputs"][1]["data"]["text/plain"] == "42"
    assert "image/png" in data["outputs"][2]["data"]
    meta = data["meta"]
    assert {"device", "gpu_count", "torch", "cuda", "date", "cell_digest"} <= set(meta)
    assert meta["cell_digest"] == rec.cell_digest(source)
    assert re.fullmatch(r"\d{4}-\d\d-\d\d", meta["date"])

    # On a machine without a GPU the same cell shows the recording under a label.
    fake_gpus(monkeypatch, 0)
    monkeypatch.delenv("COURSE_RECORD")
    result, cap, texts = run(shell, "%%gpu 99-demo\nraise SystemExit('must not run')")
    assert result.success
    assert texts[0].startswith("Recorded output (this notebook ran without a CUDA GPU), recorded on ")
    assert rec.recording_label(meta) in texts[0]
    assert cap.stdout == "hello from the GPU\n"
    assert texts[1] == "42" and texts[2].startswith("<Figure size")


def test_errors_are_recorded_and_reraised(shell, monkeypatch, tmp_path):
    fake_gpus(monkeypatch, 1)
    monkeypatch.setenv("COURSE_RECORD", "1")
    result, cap, _ = run(shell, "%%gpu 99-err\nprint('before')\nraise RuntimeError('Expected all tensors')")
    assert isinstance(result.error_in_exec, RuntimeError)
    data = json.loads((tmp_path / "99-err.json").read_text())
    assert data["outputs"][-1] == {"output_type": "error", "ename": "RuntimeError",
                                   "evalue": "Expected all tensors"}
    fake_gpus(monkeypatch, 0)
    result, cap, _ = run(shell, "%%gpu 99-err\nx")
    assert result.success
    assert cap.stdout == "before\n"
    assert "RuntimeError: Expected all tensors" in cap.stderr


def test_runs_for_real_with_enough_gpus(shell, monkeypatch, tmp_path):
    fake_gpus(monkeypatch, 2)
    result, cap, _ = run(shell, "%%gpu 99-real --gpus 2\nvalue_from_gpu_cell = 5\nprint(value_from_gpu_cell)")
    assert result.success and cap.stdout == "5\n"
    assert not (tmp_path / "99-real.json").exists()  # not in record mode: nothing written


def test_needs_more_gpus_than_present(shell, monkeypatch):
    fake_gpus(monkeypatch, 1)
    _, _, texts = run(shell, "%%gpu 99-multi --gpus 4\nprint('x')")
    assert "this cell needs 4 CUDA GPUs; this notebook ran with 1" in texts[0]


@pytest.mark.parametrize("line", ["%%gpu", "%%gpu Bad Name", "%%gpu a --gpus", "%%gpu a --gpus two",
                                  "%%gpu UPPER"])
def test_bad_magic_lines(shell, line):
    result, _, _ = run(shell, line + "\nprint(1)")
    assert isinstance(result.error_in_exec, ValueError)


def test_widget_outputs_are_not_recorded(shell, monkeypatch, tmp_path):
    fake_gpus(monkeypatch, 1)
    monkeypatch.setenv("COURSE_RECORD", "1")
    run(shell, "%%gpu 99-widget\nimport ipywidgets\ndisplay(ipywidgets.IntSlider())\nprint('done')")
    data = json.loads((tmp_path / "99-widget.json").read_text())
    assert [o["output_type"] for o in data["outputs"]] == ["stream"]


def test_figure_as_last_expression_is_shown_once(shell, monkeypatch, tmp_path):
    fake_gpus(monkeypatch, 1)
    monkeypatch.setenv("COURSE_RECORD", "1")
    run(shell, "%%gpu 99-fig\nimport matplotlib.pyplot as plt\nfig = plt.figure(); plt.plot([1, 2])\nfig")
    data = json.loads((tmp_path / "99-fig.json").read_text())
    assert [o["data"]["text/plain"][:7] for o in data["outputs"]] == ["<Figure"]


def test_label_names_the_driver_when_known():
    meta = {"gpu_count": 1, "device": "NVIDIA H200", "torch": "2.11.0+cu130", "cuda": "13.0",
            "driver": "580.159.04", "date": "2026-12-02"}
    assert rec.recording_label(meta) == "1× NVIDIA H200 · PyTorch 2.11.0+cu130 · CUDA 13.0 · driver 580.159.04 · 2026-12-02"
    del meta["driver"]  # recordings made before the driver was noted
    assert rec.recording_label(meta) == "1× NVIDIA H200 · PyTorch 2.11.0+cu130 · CUDA 13.0 · 2026-12-02"


def test_recordings_never_show_the_hosts_package_folder(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv(rec.DIR_ENV, str(tmp_path))
    warning = "/opt/torch/.venv/lib/python3.12/site-packages/torch/profiler/profiler.py:224: UserWarning: x\n"
    outputs = [{"output_type": "stream", "name": "stderr", "text": warning},
               {"output_type": "error", "ename": "E", "evalue": "v",
                "traceback": ["File /usr/lib/python3/dist-packages/numpy/core.py:1"]}]
    rec.save_recording("scrubbed", outputs, {"device": "d"})
    saved = rec.load_recording("scrubbed").outputs
    assert saved[0]["text"] == "torch/profiler/profiler.py:224: UserWarning: x\n"
    assert saved[1]["traceback"] == ["File numpy/core.py:1"]
    assert outputs[0]["text"] == warning  # the caller's outputs are left as they were
    for path in (Path(rec.__file__).parent / "recorded").glob("*.json"):
        assert "-packages/" not in path.read_text(encoding="utf-8"), path.name


def test_only_the_named_cells_run_on_a_gpu_host(shell, monkeypatch, tmp_path):
    """COURSE_GPU_CELLS (make record GPU_CELLS=...): the cells named there run and are recorded; the others
    show their recordings, or the note, even with a GPU."""
    fake_gpus(monkeypatch, 1)
    monkeypatch.setenv("COURSE_RECORD", "1")
    monkeypatch.setenv("COURSE_GPU_CELLS", "99-chosen, 99-other")
    result, cap, _ = run(shell, "%%gpu 99-chosen\nprint('ran')")
    assert result.success and cap.stdout == "ran\n" and (tmp_path / "99-chosen.json").exists()
    result, cap, texts = run(shell, "%%gpu 99-left-out\nraise SystemExit('must not run')")
    assert result.success and not (tmp_path / "99-left-out.json").exists()
    assert "COURSE_GPU_CELLS leaves this cell out" in texts[0]
    monkeypatch.delenv("COURSE_GPU_CELLS")  # unset: every cell runs
    result, cap, _ = run(shell, "%%gpu 99-left-out\nprint('ran too')")
    assert result.success and cap.stdout == "ran too\n" and (tmp_path / "99-left-out.json").exists()


def test_a_slow_cell_shows_its_recording_on_a_gpu_until_asked(shell, monkeypatch, tmp_path):
    fake_gpus(monkeypatch, 1)
    monkeypatch.delenv("COURSE_SLOW_CELLS", raising=False)
    monkeypatch.delenv("COURSE_GPU_CELLS", raising=False)
    monkeypatch.setenv("COURSE_RECORD", "1")
    monkeypatch.setenv("COURSE_GPU_CELLS", "99-slow")  # named: it runs (and records) although slow
    result, cap, _ = run(shell, '%%gpu 99-slow --slow "compiles for 7 minutes"\nprint("tuned")')
    assert result.success and cap.stdout == "tuned\n"
    monkeypatch.delenv("COURSE_GPU_CELLS")
    monkeypatch.delenv("COURSE_RECORD")
    cell = '%%gpu 99-slow --slow "compiles for 7 minutes"\nraise SystemExit("must not run")'
    result, cap, texts = run(shell, cell)  # on the GPU, not asked for: the recording
    assert result.success and cap.stdout == "tuned\n"
    assert texts[0].startswith("Recorded output (this cell compiles for 7 minutes, so it runs only when asked: "
                               "run `%env COURSE_SLOW_CELLS=1` in this notebook, then this cell again)")
    fake_gpus(monkeypatch, 0)  # no GPU: the usual label
    _, _, texts = run(shell, cell)
    assert texts[0].startswith("Recorded output (this notebook ran without a CUDA GPU)")
    fake_gpus(monkeypatch, 1)
    monkeypatch.setenv("COURSE_SLOW_CELLS", "1")  # asked for: it runs
    result, cap, _ = run(shell, '%%gpu 99-slow --slow "compiles for 7 minutes"\nprint("ran again")')
    assert result.success and cap.stdout == "ran again\n"


def test_a_cell_that_needs_more_gpu_memory_than_is_free_shows_its_recording(shell, monkeypatch, tmp_path):
    fake_gpus(monkeypatch, 1)
    monkeypatch.delenv("COURSE_GPU_CELLS", raising=False)
    monkeypatch.setattr(rec, "_usable_gib", lambda gpus=1: 40.0)  # a large GPU: it runs
    monkeypatch.setenv("COURSE_RECORD", "1")
    result, cap, _ = run(shell, "%%gpu 99-big --needs-gib 19\nprint('measured')")
    assert result.success and cap.stdout == "measured\n"
    monkeypatch.delenv("COURSE_RECORD")
    monkeypatch.setattr(rec, "_usable_gib", lambda gpus=1: 14.96)  # a 16 GB card: the recording, and why
    cell = "%%gpu 99-big --needs-gib 19\nraise SystemExit('must not run')"
    result, cap, texts = run(shell, cell)
    assert result.success and cap.stdout == "measured\n"
    assert texts[0].startswith("Recorded output (this cell needs about 19 GiB of GPU memory free; "
                               "this GPU has 14.9 GiB free), recorded on ")  # rounded down, never up to 19.0
    monkeypatch.setattr(rec, "_usable_gib", lambda gpus=1: 18.96)
    _, _, texts = run(shell, cell)
    assert "this GPU has 18.9 GiB free" in texts[0]
    (tmp_path / "99-big.json").unlink()  # no recording: the note says why it did not run
    _, _, texts = run(shell, cell)
    assert texts[0].startswith("Not run: this cell needs about 19 GiB of GPU memory free; this GPU has 18.9 GiB")
    monkeypatch.setenv("COURSE_RECORD", "1")  # a recording run never keeps an old recording: it runs
    result, _, _ = run(shell, "%%gpu 99-big --needs-gib 19\nprint('recorded on a small GPU')")
    assert result.success and "recorded on a small GPU" in (tmp_path / "99-big.json").read_text()
    monkeypatch.delenv("COURSE_RECORD")
    monkeypatch.setenv("COURSE_GPU_CELLS", "99-big")  # named: a maintainer asked for it, so it runs
    result, cap, _ = run(shell, "%%gpu 99-big --needs-gib 19\nprint('ran although small')")
    assert result.success and cap.stdout == "ran although small\n"
    fake_gpus(monkeypatch, 0)  # no GPU: the usual reason, and no memory query
    monkeypatch.delenv("COURSE_GPU_CELLS")
    monkeypatch.setattr(rec, "_usable_gib", lambda gpus=1: pytest.fail("asked a missing GPU for its memory"))
    _, _, texts = run(shell, cell)
    assert texts[0].startswith("Recorded output (this notebook ran without a CUDA GPU)")


def test_usable_memory_is_what_the_driver_has_free_and_the_allocator_holds_unused(monkeypatch):
    import torch

    gib = 2**30
    free = {0: 10 * gib, 1: 3 * gib}
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda i: (free[i], 80 * gib))
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda i: 6 * gib)
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda i: 2 * gib)
    assert rec._usable_gib() == 14  # 10 free + (6 reserved - 2 allocated)
    assert rec._usable_gib(2) == 7  # the least of the GPUs the cell uses
    assert rec._too_little_memory("99-x", 14) is None  # exactly enough: it runs
    assert rec._too_little_memory("99-x", 14.5) == 14.0
    assert rec._too_little_memory("99-x", 8, gpus=2) == 7.0


def _folding(lines: list[str], after: str = "") -> tuple[str, list[str], str]:
    """What a target stream shows before and after the cell ends, and what the outputs keep."""
    import io

    target, outputs = io.StringIO(), []
    stream = rec._FoldingStream("stderr", target, outputs)
    for line in lines:
        stream.write(line)
    before = target.getvalue()
    stream.end("99-x")
    stream.write(after)
    return before, [o["text"] for o in outputs], target.getvalue()


def test_a_folding_stream_shows_lines_as_they_come_and_the_tail_at_the_end():
    before, kept, shown = _folding([f"{i}\n" for i in range(45)], after="a late warning\n")
    assert before == "".join(f"{i}\n" for i in range(rec.FOLD_LINES))  # as they came, before the end
    assert shown == before + ("[... 2 more lines of stderr; course_utils.recording.last_run('99-x').outputs has "
                              "them all ...]\n42\n43\n44\na late warning\n")  # after the end: straight through
    assert kept == ["".join(f"{i}\n" for i in range(45))]  # the late write is not the cell's
    _, _, shown = _folding([f"{i}\n" for i in range(44)])
    assert shown == "".join(f"{i}\n" for i in range(44))  # 4 lines held back: shown, no fold line for them
    progress = [f"{i}\n" for i in range(40)] + [f"\r{p}%" for p in range(0, 101, 5)] + ["\n", "done"]
    _, _, shown = _folding(progress)  # a progress bar rewrites one line: 2 lines held back, not 22
    assert shown.endswith("39\n" + "".join(f"\r{p}%" for p in range(0, 101, 5)) + "\ndone")


def test_a_long_stream_of_a_live_run_is_folded_as_it_comes_and_kept_whole(shell, monkeypatch, tmp_path):
    fake_gpus(monkeypatch, 1)
    for key in ("COURSE_RECORD", "COURSE_GPU_CELLS", "COURSE_SLOW_CELLS"):
        monkeypatch.delenv(key, raising=False)
    cell = ("%%gpu 99-chatty\nimport sys\nfor i in range(100):\n    print('tuning', end='', file=sys.stderr)\n"
            "    print(f' {i}', file=sys.stderr)\nprint('done')")
    result, cap, _ = run(shell, cell)
    assert result.success and cap.stdout == "done\n"
    shown = cap.stderr.splitlines()
    assert shown[:rec.FOLD_LINES] == [f"tuning {i}" for i in range(rec.FOLD_LINES)]
    assert shown[rec.FOLD_LINES:] == ["[... 57 more lines of stderr; course_utils.recording.last_run('99-chatty')"
                                      ".outputs has them all ...]", "tuning 97", "tuning 98", "tuning 99"]
    whole = rec.last_run("99-chatty")
    assert whole.meta["live"] and [o["name"] for o in whole.outputs] == ["stderr", "stdout"]
    assert whole.outputs[0]["text"] == "".join(f"tuning {i}\n" for i in range(100))
    assert not (tmp_path / "99-chatty.json").exists()  # a live run is not a recording
    result, cap, _ = run(shell, "%%gpu 99-short\nprint('\\n'.join(map(str, range(43))))")  # 3 over: shown whole
    assert cap.stdout == "".join(f"{i}\n" for i in range(43))
    (tmp_path / "99-elsewhere.json").write_text(json.dumps({"meta": {"device": "X"}, "outputs": []}))
    assert rec.last_run("99-elsewhere").meta == {"device": "X"}  # not run here: its recording
    with pytest.raises(rec.RecordingError):
        rec.last_run("99-never")
    result, cap, _ = run(shell, "%%gpu 99-elsewhere\nprint('half way')\nraise RuntimeError('out of memory')")
    assert not result.success and cap.stdout.startswith("half way\n")  # then the traceback
    assert rec.last_run("99-elsewhere").meta == {"device": "X"}  # a run that failed: still the recording
    run(shell, "%%gpu 99-elsewhere\nprint('ran here')")
    assert rec.last_run("99-elsewhere").meta["live"]
    monkeypatch.setenv("COURSE_RECORD", "1")  # re-recorded in this kernel: the new recording, not the live run
    run(shell, "%%gpu 99-elsewhere\nprint('recorded')")
    assert rec.last_run("99-elsewhere").outputs[0]["text"] == "recorded\n" and "live" not in rec.last_run(
        "99-elsewhere").meta


def test_a_long_recorded_stream_is_shown_folded(shell, monkeypatch, tmp_path):
    fake_gpus(monkeypatch, 0)
    log = "".join(f"line {i}\n" for i in range(1, 101))
    (tmp_path / "99-long.json").write_text(json.dumps({"meta": {"device": "X"}, "outputs": [
        {"output_type": "stream", "name": "stderr", "text": log},
        {"output_type": "stream", "name": "stdout", "text": "".join(f"{i}\n" for i in range(rec.FOLD_LINES))}]}))
    result, cap, _ = run(shell, "%%gpu 99-long\nprint(1)")
    assert result.success
    assert cap.stderr.splitlines() == ["line 1", "line 2", "line 3", "line 4", "line 5",
                                       "[... 92 more lines of the recorded stderr; course_utils.recording."
                                       "load_recording('99-long').outputs has them all ...]",
                                       "line 98", "line 99", "line 100"]
    assert cap.stdout == "".join(f"{i}\n" for i in range(rec.FOLD_LINES))  # 40 lines: shown whole
    assert rec.load_recording("99-long").outputs[0]["text"] == log  # the file keeps everything


def test_a_noted_rename_keeps_the_recording_and_says_so(shell, monkeypatch, tmp_path):
    """Code that moved after it was recorded: the recording matches once the rename is undone, the banner names
    the rename, any other change is refused, and a new recording drops the note."""
    fake_gpus(monkeypatch, 1)
    monkeypatch.setenv("COURSE_RECORD", "1")
    old = "from os import path as ospath\nprint(ospath.__name__.endswith('path'))"
    run(shell, "%%gpu 99-moved\n" + old)
    new = old.replace("ospath", "os_path")
    meta = rec.load_recording("99-moved").meta
    assert rec.recorded_from(meta, old) and not rec.recorded_from(meta, new)

    with pytest.raises(rec.RecordingError, match="more than the renames"):
        rec.note_rename("99-moved", [("ospath", "os_path")], new + "\nprint(1)")
    rec.note_rename("99-moved", [("ospath", "os_path")], new, date="2026-12-05")
    meta = rec.load_recording("99-moved").meta
    assert rec.recorded_from(meta, new) and not rec.recorded_from(meta, new.replace("print", "len"))
    with pytest.raises(ValueError, match="at least one"):
        rec.note_rename("99-moved", [], new)

    fake_gpus(monkeypatch, 0)
    monkeypatch.delenv("COURSE_RECORD")
    _, cap, texts = run(shell, "%%gpu 99-moved\n" + new)
    assert "(renamed since: ospath is now os_path):" in texts[0]
    assert cap.stdout == "True\n"

    fake_gpus(monkeypatch, 1)
    monkeypatch.setenv("COURSE_RECORD", "1")
    run(shell, "%%gpu 99-moved\n" + new)
    assert "renamed_since" not in rec.load_recording("99-moved").meta


def test_recordings_name_no_folder_of_the_recording_machine() -> None:
    from course_utils.recording import scrub_paths

    outputs = [{"output_type": "stream", "name": "stderr",
                "text": "/tmp/site/torchao/quantization/quant_api.py:1542: SyntaxWarning: invalid escape\n"
                        "/opt/venv/lib/python3.12/site-packages/torch/profiler/profiler.py:224: UserWarning\n"},
               {"output_type": "error", "traceback": ["File /root/repo/course_utils/x.py, line 3"]}]
    clean = scrub_paths(outputs, folders=["/tmp/site", "/root/repo/", "", "relative"])
    assert clean[0]["text"] == ("torchao/quantization/quant_api.py:1542: SyntaxWarning: invalid escape\n"
                                "torch/profiler/profiler.py:224: UserWarning\n")
    assert clean[1]["traceback"] == ["File course_utils/x.py, line 3"]
    assert outputs[0]["text"].startswith("/tmp/site/")  # the input is left as it was
