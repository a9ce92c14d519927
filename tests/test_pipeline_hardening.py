"""The pipeline verifies what it reads and recovers from a corrupt intermediate file (issue 22,
items 3 and 9).

- nest.experiments.results.read_point refuses an evaluation / plan pair that is not what the plan rule
  writes (unreadable, another schema or version, inconsistent: throughput x time != global
  batch, another point), naming the file in one line;
- end to end on a small config: a corrupt evaluation fails the collect job with one line naming
  it and is moved aside; the README's command run again recomputes that point alone and the
  results CSV is back, equal to the first run's (machine-dependent columns aside);
- a `$` in a figure title is text, not mathtext.
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from nest.interfaces import cli
from nest.experiments.results import CorruptIntermediate, quarantine, read_point

ROOT = Path(__file__).resolve().parents[1]
SNAKEMAKE = Path(sys.executable).parent / "snakemake"
TINY = ["--model", "tiny_gpt", "--cluster", "tiny_cluster", "--num-devices", "4"]


@pytest.fixture(scope="module")
def point(tmp_path_factory) -> tuple[dict, dict]:
    """A real (evaluation, plan) pair of the tiny model, as the CLI writes them."""
    t = tmp_path_factory.mktemp("point")
    with contextlib.redirect_stdout(io.StringIO()):
        assert cli.main(["plan", *TINY, "--quiet", "-o", str(t / "p.json")]) == 0
        assert cli.main(["evaluate", str(t / "p.json"), "--quiet", "-o", str(t / "e.json")]) == 0
    return json.loads((t / "e.json").read_text()), json.loads((t / "p.json").read_text())


def _set(d: dict, **kw) -> dict:
    return {**d, **kw}


def _drop(d: dict, key: str) -> dict:
    return {k: v for k, v in d.items() if k != key}


# case -> (which file is bad, how the pair is changed): the text written, or a dict
CORRUPT = {
    "truncated": ("evaluation", lambda e, p: json.dumps(e)[:50]),
    "empty": ("evaluation", lambda e, p: ""),
    "binary": ("evaluation", lambda e, p: "\x00\xff\xfe garbage"),
    "a_list": ("evaluation", lambda e, p: "[1, 2, 3]"),
    "schema_v99": ("evaluation", lambda e, p: _set(e, schema="nest.evaluation/v99")),
    "schema_missing": ("evaluation", lambda e, p: _drop(e, "schema")),
    "foreign_kind": ("evaluation", lambda e, p: _set(e, schema="nest.layer_graph/v1")),
    "throughput_x10": ("evaluation", lambda e, p: _set(
        e, throughput_samples_per_s=10 * e["throughput_samples_per_s"])),
    "time_x10": ("evaluation", lambda e, p: _set(e, time_per_batch_s=10 * e["time_per_batch_s"])),
    "negative_time": ("evaluation", lambda e, p: _set(
        e, time_per_batch_s=-e["time_per_batch_s"],
        throughput_samples_per_s=-e["throughput_samples_per_s"])),
    "nan_time": ("evaluation", lambda e, p: json.dumps(_set(e, time_per_batch_s=math.nan))),
    "infinite_throughput": ("evaluation", lambda e, p: json.dumps(
        _set(e, throughput_samples_per_s=math.inf))),
    "feasible_without_time": ("evaluation", lambda e, p: _set(
        e, time_per_batch_s=None, throughput_samples_per_s=None)),
    "missing_key": ("evaluation", lambda e, p: _drop(e, "stages")),
    "wrong_type": ("evaluation", lambda e, p: _set(e, num_devices="4")),
    "other_model": ("evaluation", lambda e, p: _set(e, model="tiny_llama")),
    "other_devices": ("evaluation", lambda e, p: _set(e, num_devices=8)),
    "plan_v99": ("plan", lambda e, p: _set(p, schema="nest.plan/v99")),
    "plan_truncated": ("plan", lambda e, p: json.dumps(p)[:80]),
    "plan_bad_stages": ("plan", lambda e, p: _set(p, stages=[{"first_layer": 0}])),
    "no_plan_without_reason": ("plan", lambda e, p: {"schema": "nest.no_plan/v1",
                                                      **{k: p[k] for k in (
                                                          "planner", "model", "cluster",
                                                          "num_devices", "mbs")}}),
}


@pytest.mark.parametrize("case", sorted(CORRUPT))
def test_a_corrupt_or_foreign_intermediate_is_named_in_one_line(case, point, tmp_path):
    which, change = CORRUPT[case]
    e, p = point
    paths = {"evaluation": tmp_path / "e.json", "plan": tmp_path / "p.json"}
    paths["evaluation"].write_text(json.dumps(e))
    paths["plan"].write_text(json.dumps(p))
    bad = change(e, p)
    paths[which].write_text(bad if isinstance(bad, str) else json.dumps(bad))
    with pytest.raises(CorruptIntermediate) as err:
        read_point(paths["evaluation"], paths["plan"])
    assert err.value.path == paths[which]
    msg = str(err.value)
    assert msg.startswith(f"{paths[which]}: ") and "\n" not in msg and len(msg) < 500, msg


def test_the_real_pair_reads_back(point, tmp_path):
    e, p = point
    (tmp_path / "e.json").write_text(json.dumps(e))
    (tmp_path / "p.json").write_text(json.dumps(p))
    assert read_point(tmp_path / "e.json", tmp_path / "p.json") == (e, p)
    # the consistency the check relies on, computed the other way
    assert e["throughput_samples_per_s"] * e["time_per_batch_s"] == pytest.approx(
        e["global_batch"], rel=1e-9)


def test_quarantine_moves_the_file_aside(tmp_path):
    f = tmp_path / "mbs1.json"
    f.write_text("{")
    aside = quarantine(f)
    assert not f.exists() and aside == tmp_path / "mbs1.json.corrupt" and aside.read_text() == "{"


@pytest.mark.parametrize("title", ["cost $5", "$x^2$ and $", r"\$ a $\alpha", "50% {braces} _"])
def test_a_dollar_in_a_figure_title_is_text(title, point, tmp_path):
    from nest.reports.figures import plot_figure
    from nest.experiments.results import collect_records

    e, p = point
    df = collect_records([(e, p)])
    plot_figure(df, tmp_path / "f.png", tmp_path / "f.pdf", tmp_path / "t.csv", title)
    assert (tmp_path / "f.png").stat().st_size > 0 and (tmp_path / "f.pdf").stat().st_size > 0


SMALL = """run: [small]
figures:
  small:
    title: "Tiny GPT: Manual, cost $1"
    models: [tiny_gpt]
    clusters: [tiny_cluster]
    num_devices: [4, 8]
    planners: [manual]
expected_name: small
"""


def _run(d: Path) -> subprocess.CompletedProcess:
    return subprocess.run([str(SNAKEMAKE), "-j2", "figures", "--configfile", "config/small.yaml"],
                          cwd=d, capture_output=True, text=True, timeout=900, check=False)


@pytest.fixture(scope="module")
def small_run(tmp_path_factory) -> Path:
    """A clean run of the small config (copied per test: Snakemake's records are relative)."""
    d = tmp_path_factory.mktemp("small") / "run"
    d.mkdir()
    for name in ("Snakefile", "workflow", "config"):
        src = ROOT / name
        (shutil.copytree if src.is_dir() else shutil.copy)(src, d / name)
    (d / "config" / "small.yaml").write_text(SMALL)
    r = _run(d)
    assert r.returncode == 0, r.stderr[-2000:]
    return d


@pytest.mark.skipif(not SNAKEMAKE.exists(), reason="snakemake is not installed beside this Python")
@pytest.mark.parametrize("corruption", ["truncated", "v99_and_10x_throughput"])
def test_a_corrupt_evaluation_is_recomputed_by_the_next_run(corruption, small_run, tmp_path):
    from nest.experiments.expected import machine_free

    tmp_path = tmp_path / "run"
    shutil.copytree(small_run, tmp_path, symlinks=True)
    csv = tmp_path / "results" / "small.csv"
    first = machine_free(csv)
    ev = tmp_path / "results/evaluations/manual/tiny_gpt/tiny_cluster/8/mbs1.json"
    other = tmp_path / "results/evaluations/manual/tiny_gpt/tiny_cluster/4/mbs1.json"
    kept = other.stat().st_mtime_ns
    if corruption == "truncated":
        ev.write_text(ev.read_text()[:60])
    else:
        d = json.loads(ev.read_text())
        d.update(schema="nest.evaluation/v99",
                 throughput_samples_per_s=10 * d["throughput_samples_per_s"])
        ev.write_text(json.dumps(d))
    r = _run(tmp_path)  # the collect job fails: one line naming the file, which is moved aside
    assert r.returncode != 0
    lines = [ln for ln in r.stderr.splitlines() if ln.startswith("error: ")]
    assert len(lines) == 1 and str(ev.relative_to(tmp_path)) in lines[0], r.stderr[-3000:]
    assert "moved aside" in lines[0] and not ev.exists()
    assert ev.with_name("mbs1.json.corrupt").exists()
    r = _run(tmp_path)  # the README's command again: the point is recomputed, the CSV is back
    assert r.returncode == 0, r.stderr[-2000:]
    assert "Nothing to be done" not in r.stdout + r.stderr
    assert csv.exists() and machine_free(csv) == first
    assert other.stat().st_mtime_ns == kept  # nothing already computed was redone
    for f in ("figures/small.png", "figures/small.pdf", "results/small_table.csv",
              "results/small_summary.md"):
        assert (tmp_path / f).exists(), f
    r = _run(tmp_path)
    assert r.returncode == 0 and "Nothing to be done" in r.stdout + r.stderr
