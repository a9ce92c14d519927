"""Interrupted pipelines resume to the same results: the tiny pipeline is killed mid-run with
SIGINT (Ctrl-C: the whole process group), SIGTERM and SIGKILL (Snakemake alone, as a scheduler
or the OOM killer would), resumed with the README's commands (`snakemake --unlock` after a
SIGKILL, then the same command with `--rerun-incomplete`), and its results CSVs must equal an
uninterrupted run's byte for byte (solve_time_s, a wall-clock measurement, aside).

The uninterrupted run is the session's `tiny_run` (tests/conftest.py, shared with
test_expected.py). Each kill test starts from a copy of it with one model's points (tiny_llama:
its plans and evaluations) and every results CSV removed, so the killed run has those points and
everything downstream of them to make; it is killed after a few of them, then resumed; what was
kept is not redone.
"""

import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

from nest.experiments.expected import machine_free
from tiny_pipeline import SNAKEMAKE, TINY, snakemake


def sigint_as_in_a_terminal() -> None:
    """preexec_fn: SIGINT's default disposition in the child (a background shell job, as a CI
    runner may start this suite, inherits SIGINT ignored)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


pytestmark = pytest.mark.skipif(not SNAKEMAKE.exists(),
                                reason="snakemake is not installed beside this Python")

REMOVED = "tiny_llama"  # the model whose points each kill test makes again


def _results(d: Path) -> dict[str, str]:
    return {p.name: machine_free(p) for p in sorted((d / "results").glob("*.csv"))}


def _processes_in(d: Path) -> list[int]:
    """Pids of processes whose command line names a file under d (the run's jobs)."""
    out = []
    for p in Path("/proc").iterdir():
        if p.name.isdigit():
            try:
                if str(d).encode() in (p / "cmdline").read_bytes():
                    out.append(int(p.name))
            except OSError:
                pass
    return out


@pytest.fixture(scope="module")
def reference(tiny_run):
    res = _results(tiny_run)
    # the tiny config's figures with their tables, and the robustness experiment with the
    # decomposition and co-design points it reruns (config/tiny.yaml)
    assert sorted(res) == ["codesign.csv", "decomposition.csv", "robustness.csv", "tiny.csv",
                           "tiny_scaling.csv", "tiny_scaling_table.csv", "tiny_table.csv"], \
        sorted(res)
    return tiny_run, res


def _partly_made(reference, dst: Path) -> tuple[list[Path], dict[Path, int]]:
    """A copy of the reference run in dst without REMOVED's points and the results CSVs: the
    removed evaluations, and the mtimes of the evaluations kept."""
    shutil.copytree(reference[0], dst, symlinks=True, dirs_exist_ok=True)
    removed = sorted((dst / "results" / "evaluations").glob(f"*/{REMOVED}/**/*.json"))
    assert len(removed) >= 10, removed  # enough to kill the run after a few
    for kind in ("plans", "evaluations"):
        for f in (dst / "results" / kind).glob(f"*/{REMOVED}/**/*.json"):
            f.unlink()
    for f in (dst / "results").glob("*.csv"):
        f.unlink()
    kept = {f: f.stat().st_mtime_ns for f in (dst / "results" / "evaluations").rglob("*.json")}
    assert kept
    return removed, kept


@pytest.mark.parametrize("sig", ["SIGINT", "SIGTERM", "SIGKILL"])
def test_killed_run_resumes_to_the_same_results(sig, reference, tmp_path):
    removed, kept = _partly_made(reference, tmp_path)
    log = open(tmp_path / "killed.log", "w")
    proc = subprocess.Popen([str(SNAKEMAKE), *TINY], cwd=tmp_path, stdout=log,
                            stderr=subprocess.STDOUT, start_new_session=True,
                            preexec_fn=sigint_as_in_a_terminal)
    t0 = time.monotonic()
    while sum(f.exists() for f in removed) < 4:  # killed after a few points, mid-run
        assert proc.poll() is None, (tmp_path / "killed.log").read_text()[-3000:]
        assert time.monotonic() - t0 < 600, "no progress in 10 minutes"
        time.sleep(0.2)
    if sig == "SIGINT":  # Ctrl-C in a terminal: the whole foreground process group
        os.killpg(proc.pid, signal.SIGINT)
    else:
        os.kill(proc.pid, getattr(signal, sig))
    assert proc.wait(timeout=600) != 0
    log.close()
    assert not (tmp_path / "results" / "tiny_scaling.csv").exists(), "killed too late"
    if sig == "SIGKILL":
        # the jobs notice that Snakemake is gone and stop (workflow/scripts/_job.py)
        t0 = time.monotonic()
        while _processes_in(tmp_path) and time.monotonic() - t0 < 300:  # watchdog: 1 s polls
            time.sleep(0.5)
        assert not _processes_in(tmp_path), "orphaned jobs still running 5 min after SIGKILL"
        locked = snakemake(tmp_path, *TINY, "--rerun-incomplete")
        assert locked.returncode != 0 and "--unlock" in locked.stdout + locked.stderr
        r = snakemake(tmp_path, "--unlock")
        assert r.returncode == 0, r.stderr[-3000:]
    r = snakemake(tmp_path, *TINY, "--rerun-incomplete")
    assert r.returncode == 0, r.stderr[-3000:]
    assert _results(tmp_path) == reference[1]
    assert all(f.exists() for f in removed)
    assert {f: f.stat().st_mtime_ns for f in kept} == kept  # nothing kept was redone


def test_a_moved_clone_has_nothing_to_rerun(reference, tmp_path):
    """Nothing of a finished run depends on where it lies: moved elsewhere, it is up to date
    (params carry the library's digest over relative paths, not the clone's path)."""
    moved = tmp_path / "elsewhere"
    shutil.copytree(reference[0], moved, symlinks=True)
    r = snakemake(moved, *TINY, "-n")
    assert r.returncode == 0, r.stderr[-3000:]
    assert "Nothing to be done" in r.stdout + r.stderr, (r.stdout + r.stderr)[-3000:]
