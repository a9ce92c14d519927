"""Figures from a hand-made results table: files, the data table, its NEST gains, the panel and
legend contents, the sweep kind, and byte-identical output on a second run."""

import math

import matplotlib.colors as mcolors
import matplotlib.pyplot as plt
import pandas as pd
import pytest

from nest.reports import figures
from nest.reports.figures import (TABLE_COLUMNS, figure_kind, figure_table, planner_color, plot_figure,
                          plot_throughput)
from nest.experiments.results import COLUMNS

# (model, num_devices, planner) -> throughput, or a status without one
SCALE = {
    ("llama2_7b", 64, "manual"): 100.0, ("llama2_7b", 64, "nest"): 150.0,
    ("llama2_7b", 64, "mcmc"): 120.0, ("llama2_7b", 64, "phaze"): "infeasible",
    ("llama2_7b", 128, "manual"): 180.0, ("llama2_7b", 128, "nest"): 300.0,
    ("llama2_7b", 128, "mcmc"): "no_plan", ("llama2_7b", 128, "phaze"): 250.0,
    ("bert_large", 64, "manual"): "infeasible", ("bert_large", 64, "nest"): 40.0,
    ("bert_large", 64, "mcmc"): 32.0, ("bert_large", 64, "phaze"): "crashed",
    ("bert_large", 128, "manual"): 50.0, ("bert_large", 128, "nest"): "infeasible",
    ("bert_large", 128, "mcmc"): 64.0, ("bert_large", 128, "phaze"): 60.0,
}
# the ground-truth planner covers no point of this figure
SCALE.update({(m, n, "exhaustive"): "not_applicable" for m, n, _ in list(SCALE)})
# Manual's reference (smallest feasible device count at mbs 1), per model
REF = {"llama2_7b": 100.0, "bert_large": 50.0}


def _row(model, n, mbs, planner, value, ref, cluster="tpuv4_fattree"):
    r = dict.fromkeys(COLUMNS)
    ok = not isinstance(value, str)
    r.update(model=model, cluster=cluster, num_devices=n, mbs=mbs, planner=planner,
             status="feasible" if ok else value, feasible=ok, reason="" if ok else value,
             budget_exhausted=False)
    if ok:
        r.update(throughput_samples_per_s=value, time_per_batch_s=4096 / value,
                 normalized_throughput=value / ref if ref else None, pp=1, dp=n, tp=1)
    return r


def _scale_df(normalized=True):
    rows = [_row(m, n, 1, p, v, REF[m] if normalized else None)
            for (m, n, p), v in SCALE.items()]
    return pd.DataFrame(rows, columns=COLUMNS)  # llama2_7b first: panels must reorder


def _sweep_df():
    tput = {("llama3_70b", "manual"): [10.0, 12.0, 13.0, "infeasible"],
            ("llama3_70b", "nest"): [15.0, 18.0, 20.0, 21.0],
            ("llama3_70b", "mist"): [14.0, "no_plan", 19.0, 20.0],
            ("bert_large", "manual"): [100.0, 110.0, 120.0, 125.0],
            ("bert_large", "nest"): [130.0, 140.0, 150.0, 160.0],
            ("bert_large", "mist"): [120.0, 135.0, 150.0, 155.0]}
    rows = [_row(m, 256, b, p, v, tput[(m, "manual")][0])
            for (m, p), vs in tput.items() for b, v in zip([1, 2, 4, 8], vs)]
    return pd.DataFrame(rows, columns=COLUMNS), tput


def bar_axes(fig):
    """The throughput panels (the gain panels carry figures.GAIN_GID)."""
    return [ax for ax in fig.axes if ax.axison and ax.get_gid() != figures.GAIN_GID]


def gain_axes(fig):
    return [ax for ax in fig.axes if ax.axison and ax.get_gid() == figures.GAIN_GID]


@pytest.fixture
def captured(monkeypatch):
    """The figures plot_figure draws, kept open for inspection (closed afterwards)."""
    figs = []
    monkeypatch.setattr(figures.plt, "close", figs.append)
    yield figs
    monkeypatch.undo()
    for f in figs:
        plt.close(f)


def _plot(df, d, name="fig", **kw):
    d.mkdir(parents=True, exist_ok=True)
    paths = [d / f"{name}.png", d / f"{name}.pdf", d / f"{name}_table.csv"]
    tab = plot_figure(df, *paths, "a title", **kw)
    return tab, paths


@pytest.fixture(scope="module")
def scale_plot(tmp_path_factory):
    """_scale_df() plotted once for the tests that only read what it made: (table returned,
    [png, pdf, csv], [the figure drawn, kept open])."""
    figs = []
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(figures.plt, "close", figs.append)
        tab, paths = _plot(_scale_df(), tmp_path_factory.mktemp("scale"))
    yield tab, paths, figs
    for f in figs:
        plt.close(f)


def test_scale_files_table_rows_and_order(scale_plot):
    tab, paths, _ = scale_plot
    for p in paths:
        assert p.exists() and p.stat().st_size > 0
    assert paths[0].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert paths[1].read_bytes()[:5] == b"%PDF-"
    table = pd.read_csv(paths[2])
    assert list(table.columns) == TABLE_COLUMNS
    assert len(table) == len(SCALE)  # one row per (model, cluster, devices, mbs, planner)
    assert not table.duplicated(["model", "cluster", "num_devices", "mbs", "planner"]).any()
    # the paper's panel order, then devices, then the fixed planner order
    assert list(dict.fromkeys(table.model)) == ["bert_large", "llama2_7b"]
    first = table[(table.model == "bert_large") & (table.num_devices == 64)]
    assert list(first.planner) == ["manual", "mcmc", "phaze", "nest", "exhaustive"]
    assert list(table.num_devices[table.model == "bert_large"]) == [64] * 5 + [128] * 5
    # not_applicable rows are marked and carry no numbers
    na = table[table.planner == "exhaustive"]
    assert len(na) == 4 and set(na.status) == {"not_applicable"}
    assert na[["normalized_throughput", "throughput_samples_per_s", "nest_gain"]].isna().all().all()
    assert table.equals(pd.read_csv(paths[2]))
    pd.testing.assert_frame_equal(tab.reset_index(drop=True), table, check_exact=False,
                                  rtol=1e-8)


def test_nest_gain_is_the_hand_computed_ratio(scale_plot):
    _, paths, _ = scale_plot
    table = pd.read_csv(paths[2])
    for r in table.itertuples():
        mine = SCALE[(r.model, r.num_devices, r.planner)]
        nest = SCALE[(r.model, r.num_devices, "nest")]
        if isinstance(mine, str) or isinstance(nest, str):
            assert math.isnan(r.nest_gain), r
        else:
            assert r.nest_gain == pytest.approx(nest / mine, rel=1e-8), r
            assert r.throughput_samples_per_s == pytest.approx(mine, rel=1e-8)
            assert r.normalized_throughput == pytest.approx(mine / REF[r.model], rel=1e-8)
        assert r.status == (mine if isinstance(mine, str) else "feasible")
    g = table.set_index(["model", "num_devices", "planner"]).nest_gain
    assert g["llama2_7b", 64, "manual"] == pytest.approx(1.5)
    assert g["llama2_7b", 128, "phaze"] == pytest.approx(1.2)
    assert g["llama2_7b", 64, "nest"] == pytest.approx(1.0)
    assert math.isnan(g["bert_large", 128, "mcmc"])  # NEST infeasible there


def test_table_floats_at_nine_significant_digits(tmp_path):
    df = _scale_df()
    df.loc[df.throughput_samples_per_s.notna(), "throughput_samples_per_s"] *= 1 / 3
    _, paths = _plot(df, tmp_path)
    text = paths[2].read_bytes()
    assert b"\r\n" not in text
    line = next(ln for ln in text.decode().splitlines()
                if ln.startswith("llama2_7b,tpuv4_fattree,64,1,manual,"))
    assert line.split(",")[TABLE_COLUMNS.index("throughput_samples_per_s")] == "33.3333333"


def test_two_runs_give_identical_bytes(scale_plot, tmp_path):
    _, a, _ = scale_plot
    _, b = _plot(_scale_df().sample(frac=1, random_state=1), tmp_path / "b")  # row order too
    for pa, pb in zip(a, b):
        assert pa.read_bytes() == pb.read_bytes(), pa.name
    _, c = _plot(_sweep_df()[0], tmp_path / "c")
    _, d = _plot(_sweep_df()[0], tmp_path / "d")
    for pc, pd_ in zip(c, d):
        assert pc.read_bytes() == pd_.read_bytes(), pc.name


def test_panels_bars_marks_and_legend(scale_plot):
    (fig,) = scale_plot[2]
    axes = bar_axes(fig)
    assert [ax.get_title() for ax in axes] == ["bert_large", "llama2_7b"]
    for ax in axes:
        assert [t.get_text() for t in ax.get_xticklabels()] == ["64", "128"]
        assert ax.get_ylabel() == "throughput / Manual"
        assert any(list(ln.get_ydata()) == [1.0, 1.0] for ln in ax.lines)  # the y = 1 line
    bars = {ax.get_title(): {c.get_label(): len(c) for c in ax.containers} for ax in axes}
    assert bars == {"bert_large": {"manual": 1, "mcmc": 2, "phaze": 1, "nest": 1},
                    "llama2_7b": {"manual": 2, "mcmc": 1, "phaze": 1, "nest": 2}}
    marks = {ax.get_title(): sorted(ln.get_label() for ln in ax.lines
                                    if ln.get_label().startswith("_") and ":" in ln.get_label())
             for ax in axes}
    # no reason_class column in this table: classes from the status (figures.STATUS_CLASS)
    assert marks == {"bert_large": ["_crash:phaze", "_memory:manual", "_memory:nest"],
                     "llama2_7b": ["_memory:phaze", "_none_found:mcmc"]}
    # bars of a group stay within it, in the fixed planner order
    ax = axes[0]
    xs = {c.get_label(): [p.get_x() for p in c] for c in ax.containers}
    assert 0.5 < xs["manual"][0] < xs["mcmc"][1] < 1.5  # both at 128
    assert -0.5 < xs["mcmc"][0] < xs["nest"][0] < 0.5  # both at 64
    assert all(-0.5 < p.get_x() and p.get_x() + p.get_width() < 1.5
               for c in ax.containers for p in c)
    # one legend for the figure, none per panel; not_applicable-only planners left out
    assert all(ax.get_legend() is None for ax in fig.axes)
    (legend,) = fig.legends
    labels = [t.get_text() for t in legend.get_texts()]
    assert labels[:4] == ["manual", "mcmc", "phaze", "nest"]
    assert "exhaustive" not in labels and len(labels) == 7
    assert labels[4:] == ["M: does not fit in memory", "N: the planner found no plan",
                          "!: the planner crashed"]
    colours = {h.get_label(): mcolors.to_hex(h.get_facecolor()) for h in legend.legend_handles
               if h.get_label() in ("manual", "nest")}
    assert colours == {"manual": planner_color("manual"), "nest": planner_color("nest")}


def test_not_applicable_planner_loses_its_slot_only_where_all_na(tmp_path, captured):
    df = _scale_df()
    na = (df.model == "bert_large") & (df.planner == "phaze")
    df.loc[na, "status"] = "not_applicable"
    df.loc[na, ["feasible"]] = False
    df.loc[na, ["throughput_samples_per_s", "normalized_throughput", "time_per_batch_s"]] = None
    _plot(df, tmp_path)
    (fig,) = captured
    bert, llama = bar_axes(fig)
    assert "phaze" not in {c.get_label() for c in bert.containers}
    assert "phaze" in {c.get_label() for c in llama.containers}
    assert {t.get_text() for t in fig.legends[0].get_texts()} >= {"phaze"}
    assert "!: the planner crashed" not in {t.get_text() for t in fig.legends[0].get_texts()}
    # three planners share bert_large's groups: wider bars than llama2_7b's four
    assert bert.containers[0][0].get_width() == pytest.approx(0.84 / 3)
    assert llama.containers[0][0].get_width() == pytest.approx(0.84 / 4)


def test_throughput_fallback_when_normalization_is_empty(tmp_path, captured):
    _plot(_scale_df(normalized=False), tmp_path)
    (fig,) = captured
    for ax in bar_axes(fig):  # the unit is said, never switched silently
        assert ax.get_ylabel() == "samples/s (no Manual point)"
        assert ax.get_title().endswith(": samples/s")
        assert max(p.get_height() for c in ax.containers for p in c) > 10


def test_sweep_kind_groups_by_micro_batch(tmp_path, captured):
    df, tput = _sweep_df()
    assert figure_kind(df) == "mbs" and figure_kind(_scale_df()) == "num_devices"
    tab, paths = _plot(df, tmp_path)
    table = pd.read_csv(paths[2])
    assert len(table) == 24 and set(table.num_devices) == {256}
    assert list(table[(table.model == "bert_large") & (table.planner == "nest")].mbs) == \
        [1, 2, 4, 8]
    assert list(dict.fromkeys(table.model)) == ["bert_large", "llama3_70b"]
    assert list(table.planner[:3]) == ["manual", "mist", "nest"]
    for r in table.itertuples():
        mine = tput[(r.model, r.planner)][[1, 2, 4, 8].index(r.mbs)]
        nest = tput[(r.model, "nest")][[1, 2, 4, 8].index(r.mbs)]
        if isinstance(mine, str):
            assert r.status == mine and math.isnan(r.nest_gain)
        else:
            assert r.nest_gain == pytest.approx(nest / mine, rel=1e-8)
    (fig,) = captured
    axes = bar_axes(fig)
    for ax in gain_axes(fig):
        assert ax.get_xlabel() == "micro-batch size"
    for ax in axes:
        assert [t.get_text() for t in ax.get_xticklabels()] == ["1", "2", "4", "8"]
    assert {c.get_label(): len(c) for c in axes[1].containers} == \
        {"manual": 3, "mist": 3, "nest": 4}


def test_explicit_x_overrides_detection(tmp_path, captured):
    df, _ = _sweep_df()
    _plot(df, tmp_path, x="scale")  # one device count: one group per (devices, mbs) pair
    ax = gain_axes(captured[0])[0]
    assert ax.get_xlabel() == "devices"
    assert [t.get_text() for t in ax.get_xticklabels()][0] == "256\nmbs 1"
    assert figure_kind(df, "sweep") == "mbs"
    with pytest.raises(ValueError):
        figure_kind(df, "bogus")


def test_planner_colours_fixed_and_fallback_stable():
    assert planner_color("nest") != planner_color("manual")
    assert planner_color("new_planner") == planner_color("new_planner")
    assert len({planner_color(p) for p in figures.PLANNER_ORDER}) == len(figures.PLANNER_ORDER)
    assert mcolors.to_hex(planner_color("zzz")) == mcolors.to_hex(
        figures.matplotlib.colormaps[figures.FALLBACK_CMAP](
            __import__("zlib").crc32(b"zzz") % 20))


def test_unknown_models_follow_the_paper_order_alphabetically():
    df = _scale_df()
    extra = df[df.model == "bert_large"].assign(model="a_custom")
    extra2 = df[df.model == "bert_large"].assign(model="z_custom")
    mixtral = df[df.model == "bert_large"].assign(model="mixtral_8x7b")
    tab = figure_table(pd.concat([extra2, df, mixtral, extra]))  # index labels repeat
    assert list(dict.fromkeys(tab.model)) == ["bert_large", "llama2_7b", "mixtral_8x7b",
                                              "a_custom", "z_custom"]
    assert len(tab) == len(df) + 3 * len(extra)
    assert list(tab.planner[:5]) == ["manual", "mcmc", "phaze", "nest", "exhaustive"]


def test_several_clusters_give_a_panel_per_model_and_cluster(tmp_path, captured):
    df = _scale_df()
    _plot(pd.concat([df.assign(cluster="h100_spineleaf"), df]), tmp_path)
    titles = [ax.get_title() for ax in bar_axes(captured[0])]
    assert titles == ["bert_large (h100_spineleaf)", "bert_large (tpuv4_fattree)",
                      "llama2_7b (h100_spineleaf)", "llama2_7b (tpuv4_fattree)"]


def test_plot_throughput_alias(tmp_path):
    plot_throughput(_scale_df(), tmp_path / "f.png", tmp_path / "f.pdf", "t")
    assert (tmp_path / "f.png").exists() and (tmp_path / "f.pdf").exists()


def _classed_df():
    """The scale table with the results' reason classes (nest.experiments.results.REASON_CLASSES) and one
    batch-adjusted bar."""
    df = _scale_df()
    cls = {("llama2_7b", 64, "phaze"): ("infeasible", "batch"),
           ("llama2_7b", 128, "mcmc"): ("no_plan", "devices"),
           ("bert_large", 64, "manual"): ("infeasible", "memory"),
           ("bert_large", 64, "phaze"): ("crashed", "crash"),
           ("bert_large", 128, "nest"): ("no_plan", "none_found")}
    df["reason_class"] = ["fits" if f else None for f in df.feasible]
    df["batch_adjusted"] = False
    for (m, n, p), (status, c) in cls.items():
        i = (df.model == m) & (df.num_devices == n) & (df.planner == p)
        df.loc[i, ["status", "reason_class"]] = [status, c]
    df.loc[df.planner == "exhaustive", "reason_class"] = "not_applicable"
    df.loc[(df.model == "llama2_7b") & (df.num_devices == 128) & (df.planner == "phaze"),
           "batch_adjusted"] = True
    return df, cls


def test_marks_carry_the_reason_class(tmp_path, captured):
    df, cls = _classed_df()
    tab, paths = _plot(df, tmp_path)
    table = pd.read_csv(paths[2])
    for (m, n, p), (_, c) in cls.items():
        row = table[(table.model == m) & (table.num_devices == n) & (table.planner == p)]
        assert list(row.reason_class) == [c]
    (fig,) = captured
    marks = sorted(ln.get_label() for ax in bar_axes(fig) for ln in ax.lines
                   if ln.get_label().startswith("_") and ":" in ln.get_label())
    assert marks == sorted(f"_{c}:{p}" for (_, _, p), (_, c) in cls.items())
    # one letter per class, as the marker and in the legend
    letters = {ln.get_label(): ln.get_marker() for ax in bar_axes(fig) for ln in ax.lines
               if ln.get_label().startswith("_")}
    assert letters["_batch:phaze"] == "$B$" and letters["_devices:mcmc"] == "$D$"
    assert letters["_memory:manual"] == "$M$" and letters["_none_found:nest"] == "$N$"
    legend = [t.get_text() for t in fig.legends[0].get_texts()]
    assert [t[0] for t in legend if t[1:3] == ": "] == ["M", "B", "D", "N", "!"]
    assert not any("OOM" in t for t in legend)
    # the batch-adjusted bar is hatched, the others not; the legend says what hatching means
    llama = bar_axes(fig)[1]
    hatched = {(c.get_label(), round(p.get_x() + p.get_width() / 2)) for c in llama.containers
               for p in c if p.get_hatch()}
    assert hatched == {("phaze", 1)}
    assert "scored on the batch it processes (throughput)" in legend


def test_gain_panel_is_nest_over_each_planner_on_a_log_scale(tmp_path, captured):
    _plot(_scale_df(), tmp_path, paper_gains={"mcmc": 1.71, "phaze": 1.19, "alpa_e": 2.43})
    (fig,) = captured
    bert, llama = gain_axes(fig)
    assert llama.get_yscale() == "log" and llama.get_xlabel() == "devices"
    lines = {ln.get_label(): list(zip(ln.get_xdata(), ln.get_ydata())) for ln in llama.lines}
    # NEST / planner throughput at each device count where both fit (SCALE, by hand), each
    # planner's point above its own bar
    bars = {c.get_label(): [p.get_x() + p.get_width() / 2 for p in c]
            for c in bar_axes(fig)[1].containers}
    assert lines["_gain:manual"] == [(pytest.approx(bars["manual"][0]), pytest.approx(1.5)),
                                     (pytest.approx(bars["manual"][1]), pytest.approx(300 / 180))]
    assert lines["_gain:mcmc"] == [(pytest.approx(bars["mcmc"][0]), pytest.approx(150 / 120))]
    assert lines["_gain:phaze"] == [(pytest.approx(bars["phaze"][0]), pytest.approx(1.2))]
    # the paper's average gains as horizontal lines; alpa_e is not on this figure
    assert [y for _, y in lines["_paper:mcmc"]] == [1.71, 1.71]
    assert [y for _, y in lines["_paper:phaze"]] == [1.19, 1.19]
    assert not any("alpa_e" in k for k in lines)
    lo, hi = llama.get_ylim()
    assert lo < 1 < 1.71 < hi  # every line inside the panel
    assert "paper: NEST's average gain over that planner" in [
        t.get_text() for t in fig.legends[0].get_texts()]


def test_long_titles_wrap_inside_the_figure(tmp_path, captured):
    title = ("Figure 7: H100 spine-leaf (2:1 over the spine), global batch 4096, mbs 1, with a "
             "title long enough to run past the edge of a two-panel figure")
    df = _scale_df()
    plot_figure(df[df.model == "bert_large"], tmp_path / "t.png", tmp_path / "t.pdf", None,
                title)
    (fig,) = captured
    text = fig._suptitle
    assert "\n" in text.get_text() and text.get_text().replace("\n", " ") == title
    fig.canvas.draw()
    box = text.get_window_extent()
    assert box.x0 >= 0 and box.x1 <= fig.bbox.width
