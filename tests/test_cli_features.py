"""The CLI's conveniences (issue 14, item 4): --version, help on every option, progress on stderr,
`nest compare`, the placement and memory pictures, a timeline readable at 2,048 micro-batches.
In-process through nest.interfaces.cli.main on tiny_gpt / tiny_cluster; pictures through matplotlib's Agg."""

from __future__ import annotations

import argparse
import contextlib
import csv
import io
import time

import matplotlib
import pytest

matplotlib.use("agg")

from nest.interfaces import cli  # noqa: E402

from nest.common import progress

TINY = ["--model", "tiny_gpt", "--cluster", "tiny_cluster", "--num-devices", "8"]


def run(capsys, *argv):
    rc = cli.main(list(argv))
    out = capsys.readouterr()
    return rc, out.out, out.err


@pytest.fixture(scope="module")
def plan8(tmp_path_factory):
    """The manual plan of tiny_gpt on 8 tiny_cluster devices: pp=2, dp=2, tp=2, 2,048
    micro-batches."""
    path = tmp_path_factory.mktemp("plan") / "p.json"
    assert cli.main(["plan", *TINY, "--planner", "manual", "-o", str(path), "-q"]) == 0
    return path


def test_version(capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(["--version"])
    assert e.value.code == 0
    from importlib.metadata import version

    assert capsys.readouterr().out.startswith(f"nest-harness {version('nest-harness')}")


def _parsers(p: argparse.ArgumentParser, name="nest"):
    yield name, p
    for a in p._actions:
        if isinstance(a, argparse._SubParsersAction):
            for sub, sp in a.choices.items():
                yield from _parsers(sp, f"{name} {sub}")


def test_every_option_has_help():
    from nest.profiling.gpu_run import _parser as profile_parser

    missing = [f"{name}: {'/'.join(a.option_strings) or a.dest}"
               for parser in (cli.build_parser(), profile_parser())
               for name, p in _parsers(parser, parser.prog)
               for a in p._actions
               if not a.help or a.help == argparse.SUPPRESS]
    assert not missing, missing


def test_plan_help_lists_planners_and_exit_codes():
    from nest.planners.registry import planner_names

    parsers = dict(_parsers(cli.build_parser()))
    for cmd in ("nest plan", "nest compare"):
        text = parsers[cmd].format_help()
        assert all(n in text for n in planner_names()), cmd
        assert "exit codes:" in text and "130" in text
    for cmd in ("nest evaluate", "nest export", "nest graph"):
        assert "exit codes:" in parsers[cmd].format_help()


class _Tty(io.StringIO):
    def isatty(self):
        return True


def test_progress_line_on_a_terminal_only(monkeypatch):
    monkeypatch.setattr(progress, "DELAY_S", 0.0)
    monkeypatch.setattr(progress, "TICK_S", 0.01)
    monkeypatch.delenv("NEST_PROGRESS", raising=False)
    tty = _Tty()
    monkeypatch.setattr("sys.stderr", tty)
    with progress.status("planning with nest"):
        progress.update(3, 40)
        t0 = time.monotonic()  # until the line is drawn (a loaded machine may take a while)
        while "3/40" not in tty.getvalue() and time.monotonic() - t0 < 120:
            time.sleep(0.01)
    text = tty.getvalue()
    assert "planning with nest" in text and "3/40" in text
    assert text.endswith("\r")  # erased: the next line starts clean
    for off in ("quiet", "env", "pipe"):
        stream = io.StringIO() if off == "pipe" else _Tty()
        monkeypatch.setattr("sys.stderr", stream)
        progress.set_enabled(off != "quiet")
        if off == "env":
            monkeypatch.setenv("NEST_PROGRESS", "0")
        try:
            with progress.status("x"):
                progress.update(1, 2)
                progress.log("better: T=1")
                time.sleep(0.05)
        finally:
            progress.set_enabled(True)
            monkeypatch.delenv("NEST_PROGRESS", raising=False)
        assert stream.getvalue() == "", off
    progress.update(1, 2)  # outside a status: a no-op


def test_progress_does_not_change_stdout(capsys, tmp_path, monkeypatch):
    argv = ["plan", *TINY, "--planner", "nest"]
    rc0, out0, _ = run(capsys, *argv, "-q")
    monkeypatch.setattr(progress, "active", lambda: True)  # as on a terminal
    monkeypatch.setattr(progress, "DELAY_S", 0.0)
    rc1, out1, _ = run(capsys, *argv)
    strip = [ln for ln in out0.splitlines() if "solve time" not in ln]
    assert rc0 == rc1 == 0 and strip == [ln for ln in out1.splitlines() if "solve time" not in ln]


def test_compare_table_and_csv(capsys, tmp_path):
    out_csv = tmp_path / "c.csv"
    rc, out, err = run(capsys, "compare", *TINY, "--planners", "manual,nest,paper_manual",
                       "-o", str(out_csv), "-q")
    assert rc == 0, err
    assert "vs best" in out and "best" in out and "Traceback" not in err
    rows = list(csv.DictReader(out_csv.open()))
    by = {r["planner"]: r for r in rows}
    assert list(by) == ["manual", "nest", "paper_manual"]  # named: kept, even not applicable
    assert by["paper_manual"]["status"] == "not_applicable" and by["paper_manual"]["reason"]
    best = min(float(r["time_per_batch_s"]) for r in rows if r["time_per_batch_s"])
    for r in rows:
        if r["time_per_batch_s"]:
            t = float(r["time_per_batch_s"])
            assert float(r["vs_best"]) == pytest.approx(t / best - 1)
            assert float(r["throughput_samples_per_s"]) > 0 and 0 < float(r["mfu"]) <= 1
    assert float(by["nest"]["time_per_batch_s"]) <= float(by["manual"]["time_per_batch_s"])
    # the nest row is not `nest plan`'s answer: the table says which space it searched
    assert "the nest row is the paper's search" in out and "`nest plan` searches" in out


def test_compare_holds_the_highest_mfu_to_the_published_ceiling(capsys, monkeypatch):
    """`nest compare` prints the MFU check `nest plan` prints, for the table's highest MFU: the
    ceiling note when above, or 'MFU unchecked' on hardware without a published class."""
    import nest.fidelity.uncertainty as u

    seen = []

    def fake(ev, pr):
        seen.append(ev.mfu)
        return "ABOVE the best published MFU of its class: fake"

    monkeypatch.setattr(u, "mfu_ceiling_note", fake)
    rc, out, err = run(capsys, "compare", *TINY, "--planners", "manual,nest", "-q")
    assert rc == 0, err
    rows = [ln.split() for ln in out.splitlines() if ln.startswith(("manual ", "nest "))]
    top = max(float(r[4].rstrip("%")) for r in rows if r[1] == "feasible")
    assert len(seen) == 1 and round(seen[0] * 100, 1) == top
    assert "warning:" in out and "ABOVE the best published MFU of its class: fake" in out
    monkeypatch.setattr(u, "mfu_ceiling_note", lambda ev, pr: "")
    monkeypatch.setattr(u, "mfu_unchecked_note", lambda pr: "MFU unchecked: fake")
    rc, out, err = run(capsys, "compare", *TINY, "--planners", "nest", "-q")
    assert rc == 0 and "note: MFU unchecked: fake" in out


def test_compare_default_lineup_leaves_out_not_applicable(capsys):
    from nest.planners.registry import planner_names

    rc, out, err = run(capsys, "compare", *TINY, "-q")
    assert rc == 0, err
    assert "not applicable here (left out): paper_manual" in out
    table = out.split("not applicable here")[0]
    assert all(n in table for n in planner_names(figures_only=True) if not n.startswith("paper"))


def test_compare_bad_inputs_before_any_solve(capsys, tmp_path):
    rc, _, err = run(capsys, "compare", *TINY, "--planners", "nest,magic")
    assert rc == 2 and "unknown planner 'magic'" in err and len(err.strip().splitlines()) == 1
    rc, _, err = run(capsys, "compare", *TINY, "-o", str(tmp_path / "no" / "c.csv"))
    assert rc == 2 and "does not exist" in err
    rc, _, err = run(capsys, "compare", *TINY, "--planners", " , ")
    assert rc == 2 and "--planners" in err


def test_placement_and_memory_pictures(capsys, tmp_path, plan8):
    pl, mem = tmp_path / "place.png", tmp_path / "mem.svg"
    rc, out, err = run(capsys, "evaluate", str(plan8), "--memory", "--memory-picture", str(mem),
                       "--placement-picture", str(pl))
    assert rc == 0, err
    assert pl.stat().st_size > 0 and mem.stat().st_size > 0
    assert "memory per stage" in out
    for key in ("weights", "gradients", "optimizer", "activations", "working", "fragment.",
                "framework", "peak", "stage 1"):
        assert key in out
    rc, _, err = run(capsys, "plan", *TINY, "--placement-picture", str(tmp_path / "p.png"), "-q")
    assert rc == 0 and (tmp_path / "p.png").stat().st_size > 0
    for opt in ("--placement-picture", "--memory-picture"):  # checked before any work
        rc, out, err = run(capsys, "evaluate", str(plan8), opt, str(tmp_path / "x.jpg"))
        assert rc == 2 and opt in err and out == ""


def test_memory_rows_sum_to_peak(plan8):
    from nest.problem.evaluate import evaluate
    from nest.problem.plan_spec import load_plan
    from nest.reports.plan_views import memory_rows

    plan, problem = load_plan(str(plan8))
    for _, parts, peak in memory_rows(plan, evaluate(plan, problem)):
        assert sum(parts.values()) == pytest.approx(peak)


def test_placement_picture_at_1024_devices_aggregates_by_node(tmp_path):
    from nest.problem.plan import Plan, stages_from_cuts
    from nest.spec.catalog import load_cluster
    from nest.reports.plan_views import device_roles, placement_picture

    c = load_cluster("dgx_h100_superpod", 1024)
    pp, dp, tp = 16, 16, 4
    cuts = [(2 * j, 2 * j + 1) for j in range(pp)]
    stages = stages_from_cuts(cuts, pp, dp, tp, "stage_major", [1] * pp, ["none"] * pp)
    plan = Plan("test", "m", c.name, 1024, 1, 1024, 64, tp, pp, dp, 1, 1, False, stages,
                "stage_major")
    roles = device_roles(plan)
    assert len(roles) == 1024 and roles[stages[3].device_ids[tp]] == (3, 1, 0)
    fig = placement_picture(plan, c, tmp_path / "p.png")
    assert (tmp_path / "p.png").stat().st_size > 0
    # one cell per node (128), each split into at most 8 stage slices, plus an outline
    assert len(fig.axes[0].patches) <= 128 * 9


def test_timeline_compressed_at_2048_microbatches(tmp_path):
    from nest.costs.simulate import simulate
    from nest.reports.timeline import MAX_EXACT, num_rectangles, plot

    p = 4
    r = simulate("1f1b", [1.0, 1.1, 1.0, 1.2], [2.0, 2.1, 2.0, 2.2], 2048,
                 sync_s=[5.0] * p)
    fig = plot(r, tmp_path / "t.png")
    assert (tmp_path / "t.png").stat().st_size > 0 and (tmp_path / "t.pdf").exists()
    n = num_rectangles(fig)
    assert n < 40 * p * p, n  # the fill and drain only: O(p^2), not O(m)
    labels = [t.get_text() for t in fig.axes[0].texts]
    counts = [int(t.split()[0]) for t in labels if "micro-batches" in t]
    assert len(counts) == p and all(2048 - 4 * (2 * p + 2) <= k <= 2048 for k in counts)
    small = simulate("1f1b", [1.0] * p, [2.0] * p, MAX_EXACT)  # exact: every op drawn
    assert num_rectangles(plot(small)) >= 2 * p * MAX_EXACT
    ri = simulate("interleaved", [1.0] * p, [2.0] * p, 2048, num_chunks=2)
    assert num_rectangles(plot(ri, tmp_path / "i.png")) < 80 * p * p


def test_timeline_through_the_cli(capsys, tmp_path, plan8):
    rc, out, err = run(capsys, "evaluate", str(plan8), "--timeline", str(tmp_path / "t.png"),
                       "-q")
    assert rc == 0, err
    assert (tmp_path / "t.png").stat().st_size > 0 and "timeline written" in out


def test_quiet_holds_for_one_command_only():
    """`nest -q ...` called in-process switched progress lines off for the rest of the process
    (a later call without -q, or a test after it, drew none)."""
    assert progress.enabled()
    with contextlib.redirect_stdout(io.StringIO()):
        assert cli.main(["-q", "models"]) == 0
    assert progress.enabled()


def test_quiet_before_validate_is_accepted(tmp_path):
    """`nest -q validate ...` (the global -q before the command, as `nest -q plan` takes it)
    failed with "unrecognized arguments" for every validate option: validate's own parser was
    only reached when argv began with "validate"."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
        assert cli.main(["-q", "validate", "--published", "--only", "korthikanti_1t_full",
                         "-o", str(tmp_path / "v.md")]) == 0
        assert cli.main(["--quiet", "validate", "--hardware", "nope", "-o", "-"]) == 2
    assert "korthikanti_1t_full" in out.getvalue()
    assert progress.enabled()


def test_placement_picture_legend_names_every_chunk_of_an_interleaved_device_group(tmp_path):
    """An interleaved plan's devices hold chunks j, j + pp, ...: the legend names the device
    group's layer ranges, not only its first chunk's (it read 'stage 0: layers 0-1')."""
    from nest.problem.plan_spec import load_plan
    from nest.reports.plan_views import placement_picture

    spec = tmp_path / "il.yaml"
    spec.write_text("model: tiny_gpt\ncluster: tiny_cluster\nnum_devices: 8\nglobal_batch: 64\n"
                    "pp: 2\ndp: 4\nschedule: interleaved\nvirtual_stages: 2\n")
    plan, _ = load_plan(spec)
    assert len(plan.stages) == 4
    fig = placement_picture(plan, load_cluster_of(plan), tmp_path / "p.png")
    labels = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    for j in range(plan.pp):  # chunks j and j + pp (Megatron-LM's interleaving)
        ranges = [f"{plan.stages[c].first_layer}-{plan.stages[c].last_layer}"
                  for c in (j, j + plan.pp)]
        assert any(lab.startswith(f"device group {j}:") and all(r in lab for r in ranges)
                   for lab in labels), labels


def load_cluster_of(plan):
    from nest.spec.catalog import load_cluster

    return load_cluster(plan.cluster, plan.num_devices)


def test_placement_picture_outlines_every_device_of_a_node_wider_than_a_row(tmp_path):
    """A first level wider than a picture row (GB200 NVL72: 72 devices, rows of at most
    MAX_ROW cells) is outlined on every row it covers: the outlines' cells add up to the
    devices shown (only each node's first row was outlined: 56 of 144 cells)."""
    from matplotlib.patches import Rectangle

    from nest.problem.plan import Plan, stages_from_cuts
    from nest.reports.plan_views import MAX_ROW, placement_picture
    from nest.spec.catalog import load_cluster

    c = load_cluster("gb200_nvl72", 144)
    assert c.levels[0].devices_per_group > MAX_ROW
    pp, dp, tp = 2, 18, 4
    stages = stages_from_cuts([(0, 1), (2, 3)], pp, dp, tp, "replica_major", [1] * pp,
                              ["none"] * pp)
    plan = Plan("test", "m", c.name, 144, 1, 144, 8, tp, pp, dp, 1, 1, False, stages,
                "replica_major")
    fig = placement_picture(plan, c, tmp_path / "p.png")
    outlines = [p for p in fig.axes[0].patches if isinstance(p, Rectangle) and not p.get_fill()]
    assert sum(p.get_width() for p in outlines) == 144
