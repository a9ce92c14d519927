"""workflow/scripts/_job.py: the runtime guard, crash records as one line without absolute paths,
atomic writes."""

import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "workflow" / "scripts"))
import _job  # noqa: E402


def test_one_line_keeps_the_first_line_and_cuts_absolute_paths():
    msg = ("planner crashed: FileNotFoundError: [Errno 2] No such file: '/home/u/nest/config/"
           "x.yaml'\nTraceback (most recent call last):\n  File \"/home/u/nest/a.py\"")
    assert _job.one_line(msg) == "planner crashed: FileNotFoundError: [Errno 2] No such file: " \
                                 "'x.yaml'"
    assert _job.one_line("ratio 12.5/50, tp/pp  fine") == "ratio 12.5/50, tp/pp fine"


def test_crash_record_is_one_line_and_the_traceback_goes_to_the_log(capsys):
    try:
        raise RuntimeError("boom in /abs/path/to/solver.py\nsecond line")
    except RuntimeError as e:
        rec, ev = _job.crash_records("nest", SimpleNamespace(num_devices=4, mbs=1), "m", "c", e,
                                     time.perf_counter())
    assert rec["status"] == "crashed"
    assert rec["reason"] == ev["reason"] == "planner crashed: RuntimeError: boom in solver.py"
    assert "Traceback" in capsys.readouterr().err


def test_the_guard_stops_a_hung_planner(monkeypatch):
    # a job that starts now with a 0.4 s runtime: the guard keeps min(120 s, runtime / 4) back,
    # so it raises 0.3 s into this block (the job's start is reset: a session's T0 may be minutes
    # old, and with runtime / 4 above 120 s the guard would wait for minutes)
    monkeypatch.setattr(_job, "T0", time.monotonic())
    monkeypatch.setattr(_job, "_RUNTIME_S", 0.4)
    t0 = time.monotonic()
    with pytest.raises(_job.PlannerTimeout, match="runtime guard: nest still running"):
        with _job.planner_guard("nest"):
            while time.monotonic() - t0 < 600:  # a hang guard only: the guard fires at 0.3 s
                sum(range(1000))


def test_no_runtime_no_guard(monkeypatch):
    monkeypatch.setattr(_job, "_RUNTIME_S", None)
    with _job.planner_guard("nest"):
        pass


def test_write_json_leaves_no_temporary_file(tmp_path):
    _job.write_json({"b": 1, "a": [1, 2]}, tmp_path / "x.json")
    assert [p.name for p in tmp_path.iterdir()] == ["x.json"]
    assert (tmp_path / "x.json").read_text() == '{\n "a": [\n  1,\n  2\n ],\n "b": 1\n}\n'
