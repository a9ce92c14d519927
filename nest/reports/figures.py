"""Results CSV (`nest.results/v4`) -> the paper's bar figures (PNG + PDF) and their data table.

Two kinds of figure, told apart by the data (`figure_kind`):

* "scale" (Figures 5 and 7): bars grouped by device count, one micro-batch size;
* "sweep" (Figures 6 and 11): bars grouped by micro-batch size, one device count.

One column of two panels per model (per model and cluster when a figure holds several clusters),
in the paper's order (`MODEL_ORDER`). Top: one bar per planner in each group, each planner in one
fixed colour on every figure (`planner_color`); y is `normalized_throughput` (throughput over
Manual's at its smallest micro-batch and smallest feasible device count, `nest.experiments.results.
_normalize`), or samples/s in a panel where it is empty, said in the axis label and the title.
A bar scored on the batch its plan processes rather than the configured one (`batch_adjusted`,
baselines.manual.on_processed_batch) is hatched. A point without a throughput is marked at its
bar's place on the baseline by the letter of its reason class (`MARKS`: M memory, B batch, D
devices, N none found, a red ! crash); not_applicable points are left blank and a planner whose
points in a panel are all not_applicable has no bar slot there. Bottom (`_gain_panel`): NEST's
throughput over each planner's at every group, on a log scale, so a gain at the largest device
count reads as well as one at the smallest; where the paper states NEST's average gain over that
planner (config/paper/claims.yaml `nest_gain_over`, passed as `paper_gains`), a dashed line in
the planner's colour. One legend for the whole figure; titles wrap instead of being clipped.

The table (`figure_table`) is the figure's data, one row per (model, cluster, num_devices, mbs,
planner), with `nest_gain` = NEST's throughput / the planner's where both are feasible, written at
9 significant digits. The PNG, PDF and table carry no dates: the same CSV gives the same bytes.
"""

from __future__ import annotations

import textwrap
import zlib
from pathlib import Path

import matplotlib

matplotlib.use("agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
from matplotlib.lines import Line2D  # noqa: E402
from matplotlib.patches import Patch  # noqa: E402

from nest.experiments.results import write_frame  # noqa: E402

# The paper's panel order; models not listed follow, alphabetically.
MODEL_ORDER = ["bert_large", "llama2_7b", "llama3_70b", "gpt3_175b", "gpt3_35b", "mixtral_8x7b"]
# Bar order within a group and legend order; planners not listed follow, alphabetically.
PLANNER_ORDER = ["manual", "paper_manual", "mcmc", "paper_mcmc", "phaze", "paper_phaze",
                 "alpa_e", "mist", "nest"]
# One colour per planner on every figure; each paper_* baseline is a lighter shade of its own.
PLANNER_COLORS = {
    "manual": "#7f7f7f", "paper_manual": "#c7c7c7",
    "mcmc": "#1f77b4", "paper_mcmc": "#aec7e8",
    "phaze": "#2ca02c", "paper_phaze": "#98df8a",
    "alpa_e": "#9467bd", "mist": "#ff7f0e", "nest": "#d62728",
    "exhaustive": "#8c564b",
}
FALLBACK_CMAP = "tab20b"  # planners without an entry: a colour fixed by a CRC of the name

TABLE_COLUMNS = ["model", "cluster", "num_devices", "mbs", "planner", "status",
                 "reason_class", "batch_adjusted", "normalized_throughput",
                 "throughput_samples_per_s", "time_per_batch_s", "nest_gain"]
# reason class (nest.experiments.results.REASON_CLASSES) of a point without a bar -> (letter, legend text)
MARKS = {"memory": ("M", "does not fit in memory"),
         "batch": ("B", "mbs x dp x ep does not divide the global batch"),
         "devices": ("D", "needs more devices than the point has"),
         "none_found": ("N", "the planner found no plan"),
         "crash": ("!", "the planner crashed")}
# results without a reason_class column (older CSVs, hand-made tables): from the status
STATUS_CLASS = {"feasible": "fits", "infeasible": "memory", "no_plan": "none_found",
                "crashed": "crash", "not_applicable": "not_applicable"}
GAIN_GID = "gain"  # the gid of the gain panels (tests tell the two kinds apart by it)
X_LABEL = {"num_devices": "devices", "mbs": "micro-batch size"}
FONT = 7


def model_rank(model: str) -> tuple:
    return (0, MODEL_ORDER.index(model), "") if model in MODEL_ORDER else (1, 0, model)


def planner_rank(planner: str) -> tuple:
    return ((0, PLANNER_ORDER.index(planner), "") if planner in PLANNER_ORDER
            else (1, 0, planner))


def planner_color(planner: str):
    """The planner's colour: fixed by name, the same on every figure and every run."""
    if planner in PLANNER_COLORS:
        return PLANNER_COLORS[planner]
    cmap = matplotlib.colormaps[FALLBACK_CMAP]
    return cmap(zlib.crc32(planner.encode()) % cmap.N)


def figure_kind(df: pd.DataFrame, x: str | None = None) -> str:
    """The column the bars are grouped by: 'mbs' for a micro-batch sweep (more than one micro-batch
    size on one device count), else 'num_devices'. `x` ('mbs' / 'sweep' or 'num_devices' /
    'scale') overrides the detection."""
    if x is not None:
        aliases = {"sweep": "mbs", "mbs": "mbs", "scale": "num_devices",
                   "num_devices": "num_devices", "devices": "num_devices"}
        if x not in aliases:
            raise ValueError(f"figure x {x!r}: expected one of {sorted(aliases)}")
        return aliases[x]
    if df["mbs"].nunique() > 1 and df["num_devices"].nunique() == 1:
        return "mbs"
    return "num_devices"


def _prepare(df: pd.DataFrame) -> pd.DataFrame:
    d = df.reset_index(drop=True)  # a concatenation may repeat index labels
    for c in ("normalized_throughput", "throughput_samples_per_s", "time_per_batch_s"):
        d[c] = pd.to_numeric(d[c], errors="coerce").astype(float)
    feasible = d["feasible"].astype("boolean").fillna(False).astype(bool)
    status = d["status"].astype(object)
    missing = status.isna()
    status[missing] = np.where(feasible[missing], "feasible", "infeasible")
    d["status"] = status.astype(str)
    cls = d["reason_class"].astype(object) if "reason_class" in d else pd.Series(
        [None] * len(d), index=d.index, dtype=object)
    missing = cls.isna()
    cls[missing] = d.status[missing].map(STATUS_CLASS).fillna("none_found")
    d["reason_class"] = cls.astype(str)
    adj = d["batch_adjusted"] if "batch_adjusted" in d else pd.Series(False, index=d.index)
    d["batch_adjusted"] = adj.astype("boolean").fillna(False).astype(bool)
    d["num_devices"] = d["num_devices"].astype(int)
    d["mbs"] = d["mbs"].astype(int)
    return d


def _sort(d: pd.DataFrame) -> pd.DataFrame:
    key = pd.DataFrame({"m": d.model.map(model_rank), "c": d.cluster, "n": d.num_devices,
                        "b": d.mbs, "p": d.planner.map(planner_rank)}, index=d.index)
    order = sorted(range(len(d)), key=lambda i: tuple(key.iloc[i]))
    return d.iloc[order].reset_index(drop=True)


def figure_table(df: pd.DataFrame) -> pd.DataFrame:
    """The figure's data: one row per (model, cluster, num_devices, mbs, planner) in panel, group
    and bar order. `nest_gain` is NEST's throughput over this planner's at the same point (1 on
    NEST's own rows), NaN where either is not feasible or NEST has no row there; not_applicable
    rows stay, marked by their status."""
    d = _prepare(df)
    point = ["model", "cluster", "num_devices", "mbs"]
    ok = (d.status == "feasible") & d.throughput_samples_per_s.notna()
    nest = d[(d.planner == "nest") & ok].set_index(point).throughput_samples_per_s
    nest = nest[~nest.index.duplicated()]
    ref = pd.Series([nest.get(tuple(k), np.nan) for k in d[point].itertuples(index=False)],
                    index=d.index, dtype=float)
    d["nest_gain"] = np.where(ok, ref / d.throughput_samples_per_s.where(ok), np.nan)
    return _sort(d[TABLE_COLUMNS[:-1] + ["nest_gain"]])


def write_table(table: pd.DataFrame, path: str | Path) -> None:
    write_frame(table, path)


def save_figure(fig, png: str | Path, pdf: str | Path, dpi: int = 120) -> None:
    """PNG and PDF with deterministic bytes (no software, date or producer stamps); closes fig."""
    from nest.common.atomic_io import savefig_atomic

    savefig_atomic(fig, png, dpi=dpi, metadata={"Software": None})
    savefig_atomic(fig, pdf, metadata={"CreationDate": None, "Producer": None})
    plt.close(fig)


def plot_figure(df: pd.DataFrame, png: str | Path, pdf: str | Path, table: str | Path | None,
                title: str, x: str | None = None,
                paper_gains: dict | None = None) -> pd.DataFrame:
    """Results -> bar figure (PNG and PDF) and its data table (CSV; skipped when `table` is None).
    `x` forces the kind ('scale'/'num_devices' or 'sweep'/'mbs'); by default it is read from the
    data (`figure_kind`). `paper_gains`: {planner: the paper's average NEST gain over it}, drawn
    on the gain panels (also for the paper_<planner> replay). Returns the table."""
    tab = figure_table(df)
    if table is not None:
        write_table(tab, table)
    xcol = figure_kind(tab, x) if len(tab) else "num_devices"
    other = "mbs" if xcol == "num_devices" else "num_devices"
    several = tab[other].nunique() > 1  # both vary: a group per (x, other) pair
    gcols = [xcol, other] if several else [xcol]
    clusters = tab.cluster.nunique() > 1
    panels = list(dict.fromkeys(zip(tab.model, tab.cluster)))  # already in panel order

    shown = tab[tab.status != "not_applicable"]
    legend_planners = sorted(set(shown.planner), key=planner_rank)
    groups = {p: shown[(shown.model == p[0]) & (shown.cluster == p[1])]
              [gcols].drop_duplicates().sort_values(gcols).itertuples(index=False, name=None)
              for p in panels}
    groups = {p: list(g) for p, g in groups.items()}
    n_groups = max([len(g) for g in groups.values()] + [1])
    n_bars = max(len(legend_planners), 1)

    n = max(len(panels), 1)
    ncols = min(n, 3)
    nrows = -(-n // ncols)
    group_in = max(0.45, 0.085 * n_bars)  # inches per group: ~6 pt per bar
    panel_w = max(2.4, 0.75 + n_groups * group_in)
    width_in = ncols * panel_w
    with plt.rc_context({"font.size": FONT, "axes.titlesize": FONT + 1,
                         "axes.labelsize": FONT, "xtick.labelsize": FONT,
                         "ytick.labelsize": FONT, "legend.fontsize": FONT}):
        fig, axes = plt.subplots(2 * nrows, ncols, figsize=(width_in, 3.4 * nrows + 1.0),
                                 squeeze=False, layout="constrained",
                                 gridspec_kw={"height_ratios": [1.6, 1.0] * nrows})
        bar_axes = [axes[2 * (i // ncols), i % ncols] for i in range(nrows * ncols)]
        gain_axes = [axes[2 * (i // ncols) + 1, i % ncols] for i in range(nrows * ncols)]
        marks: set[str] = set()
        adjusted = False
        for ax, gax, key in zip(bar_axes, gain_axes, panels):
            adjusted |= _panel(ax, tab, key, groups[key], gcols, several, clusters, marks)
            _gain_panel(gax, tab, key, groups[key], gcols, several, paper_gains or {})
        for ax in bar_axes[len(panels):] + gain_axes[len(panels):]:
            ax.set_axis_off()
        if not panels:
            bar_axes[0].text(0.5, 0.5, "no results", ha="center", va="center",
                             transform=bar_axes[0].transAxes)
        handles = [Patch(facecolor=planner_color(p), label=p) for p in legend_planners]
        if adjusted:
            handles.append(Patch(facecolor="white", edgecolor="0.3", hatch="////",
                                 label="scored on the batch it processes (throughput)"))
        for cls, (letter, text) in MARKS.items():
            if cls in marks:
                handles.append(Line2D([], [], color="red" if cls == "crash" else "k",
                                      marker=f"${letter}$", linestyle="none",
                                      label=f"{letter}: {text}"))
        if paper_gains:
            handles.append(Line2D([], [], color="0.3", linestyle="--",
                                  label="paper: NEST's average gain over that planner"))
        if handles:  # as few rows as the width allows, the entries spread evenly over them
            rows = -(-len(handles) // max(3, int(width_in / 1.6)))
            fig.legend(handles=handles, loc="outside lower center", frameon=False,
                       ncol=-(-len(handles) // rows))
        fig.suptitle(wrap(title.replace("$", r"\$"), width_in, FONT + 2),  # text, not mathtext
                     fontsize=FONT + 2)
        save_figure(fig, png, pdf, dpi=150)
    return tab


def wrap(text: str, width_in: float, size: float) -> str:
    """`text` broken into lines that fit `width_in` inches at `size` points (about 0.55 em per
    character), so a title is never clipped."""
    chars = max(20, int(width_in * 72 / (0.55 * size)))
    return "\n".join(textwrap.wrap(text, chars)) if text else text


def _xpos(groups: list[tuple]) -> dict:
    return {g: i for i, g in enumerate(groups)}


def _xticks(ax, groups: list[tuple], gcols: list[str], several: bool) -> None:
    ax.set_xticks(range(len(groups)))
    if several:  # both device count and micro-batch size vary
        ax.set_xticklabels([f"{g[0]}\n{'mbs ' if gcols[1] == 'mbs' else 'n='}{g[1]}"
                            for g in groups])
    else:
        ax.set_xticklabels([str(g[0]) for g in groups])
    ax.set_xlim(-0.5, len(groups) - 0.5)
    ax.set_xlabel(X_LABEL[gcols[0]])
    ax.tick_params(axis="x", length=0)


def _panel(ax, tab: pd.DataFrame, key: tuple, groups: list[tuple], gcols: list[str],
           several: bool, clusters: bool, marks: set[str]) -> bool:
    """The throughput bars of one panel; True if a bar is batch-adjusted (hatched)."""
    model, cluster = key
    sub = tab[(tab.model == model) & (tab.cluster == cluster)]
    planners = sorted(set(sub.planner[sub.status != "not_applicable"]), key=planner_rank)
    norm = sub.normalized_throughput.notna().any()
    ycol = "normalized_throughput" if norm else "throughput_samples_per_s"
    width = 0.84 / max(len(planners), 1)
    pos = _xpos(groups)
    adjusted = False
    for j, planner in enumerate(planners):
        offset = (j - (len(planners) - 1) / 2) * width
        rows = sub[sub.planner == planner]
        xs, ys, hatch = [], [], []
        for r in rows.itertuples(index=False):
            g = tuple(getattr(r, c) for c in gcols)
            if g not in pos:  # only not_applicable points there
                continue
            xc = pos[g] + offset
            y = getattr(r, ycol)
            if r.status == "feasible" and not np.isnan(y):
                xs.append(xc)
                ys.append(y)
                hatch.append(bool(r.batch_adjusted))
            elif r.reason_class in MARKS:
                cls = r.reason_class
                marks.add(cls)
                ax.plot([xc], [0], marker=f"${MARKS[cls][0]}$", markersize=6,
                        color="red" if cls == "crash" else planner_color(planner),
                        markeredgecolor="k" if cls != "crash" else "red", markeredgewidth=0.2,
                        linestyle="none", clip_on=False, zorder=3, label=f"_{cls}:{planner}")
        if xs:
            bars = ax.bar(xs, ys, width=width, color=planner_color(planner), linewidth=0,
                          zorder=2, label=planner)
            for patch, h in zip(bars, hatch):
                if h:
                    patch.set_hatch("////")
                    patch.set_edgecolor("0.3")
                    adjusted = True
    if norm:
        ax.axhline(1.0, color="k", linewidth=0.5, linestyle="--", zorder=1)
    _xticks(ax, groups, gcols, several)
    ax.set_xlabel("")
    ax.set_ylim(bottom=0)
    ax.set_ylabel("throughput / Manual" if norm else "samples/s (no Manual point)")
    name = f"{model} ({cluster})" if clusters else model
    ax.set_title(name if norm else f"{name}: samples/s")
    ax.grid(axis="y", alpha=0.3, linewidth=0.5, zorder=0)
    return adjusted


GAIN_TICKS = (0.25, 0.5, 0.67, 0.8, 0.9, 1, 1.1, 1.25, 1.5, 2, 3, 5, 10, 20, 50, 100)


def _gain_panel(ax, tab: pd.DataFrame, key: tuple, groups: list[tuple], gcols: list[str],
                several: bool, paper_gains: dict) -> None:
    """NEST's throughput over each planner's per group (log scale), one line per planner; the
    paper's average gain over a planner as a dashed line of its colour."""
    from matplotlib.ticker import FixedLocator, NullLocator

    ax.set_gid(GAIN_GID)
    model, cluster = key
    panel = tab[(tab.model == model) & (tab.cluster == cluster)]
    slots = sorted(set(panel.planner[panel.status != "not_applicable"]), key=planner_rank)
    width = 0.84 / max(len(slots), 1)  # each planner's points above its bar (none hidden)
    sub = panel[panel.planner != "nest"]
    pos = _xpos(groups)
    values = [1.0]
    for planner in sorted(set(sub.planner), key=planner_rank):
        rows = sub[(sub.planner == planner) & sub.nest_gain.notna()]
        off = (slots.index(planner) - (len(slots) - 1) / 2) * width if planner in slots else 0
        pts = sorted((pos[g] + off, r.nest_gain) for r in rows.itertuples(index=False)
                     if (g := tuple(getattr(r, c) for c in gcols)) in pos)
        paper = paper_gains.get(planner, paper_gains.get(planner.removeprefix("paper_")))
        if pts:
            x, y = zip(*pts)
            ax.plot(x, y, marker="o", markersize=2.5, linewidth=0.8,
                    color=planner_color(planner), label=f"_gain:{planner}", zorder=3)
            values += list(y)
        if paper is not None and (pts or planner in set(sub.planner)):
            ax.axhline(float(paper), color=planner_color(planner), linestyle="--",
                       linewidth=0.8, zorder=2, label=f"_paper:{planner}")
            values.append(float(paper))
    ax.axhline(1.0, color="k", linewidth=0.5, zorder=1)
    ax.set_yscale("log")
    lo, hi = min(values) / 1.08, max(values) * 1.08
    lo, hi = min(lo, 0.92), max(hi, 1.1)
    ax.set_ylim(lo, hi)
    ticks, gap = [], 0.1 * np.log(hi / lo)  # ticks at least a tenth of the axis apart
    for t in sorted(GAIN_TICKS, key=lambda t: (t != 1, abs(np.log(t)))):  # 1 first, outwards
        if lo <= t <= hi and all(abs(np.log(t / u)) >= gap for u in ticks):
            ticks.append(t)
    ticks.sort()
    ax.yaxis.set_major_locator(FixedLocator(ticks))
    ax.yaxis.set_minor_locator(NullLocator())
    ax.set_yticklabels([f"{t:g}x" for t in ticks])
    _xticks(ax, groups, gcols, several)
    ax.set_ylabel("NEST / planner")
    ax.grid(axis="y", alpha=0.3, linewidth=0.5, zorder=0)


def plot_throughput(df: pd.DataFrame, png: str | Path, pdf: str | Path, title: str,
                    table: str | Path | None = None) -> pd.DataFrame:
    """The former entry point: `plot_figure` with the table optional."""
    return plot_figure(df, png, pdf, table, title)
