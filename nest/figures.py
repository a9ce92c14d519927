"""Results CSV (`nest.results/v3`) -> the paper's bar figures (PNG + PDF) and their data table.

Two kinds of figure, told apart by the data (`figure_kind`):

* "scale" (Figures 5 and 7): bars grouped by device count, one micro-batch size;
* "sweep" (Figures 6 and 11): bars grouped by micro-batch size, one device count.

One panel per model (per model and cluster when a figure holds several clusters), in the paper's
order (`MODEL_ORDER`); in each group one bar per planner, each planner in one fixed colour on every
figure (`planner_color`). y is `normalized_throughput` (throughput over Manual's at its smallest
micro-batch and smallest feasible device count, `nest.results._normalize`), or samples/s in a
panel where it is empty. A point that has no throughput is marked at its bar's place on the
baseline: 'x' with 'OOM' (infeasible: the plan does not fit) or 'none' (no_plan: the planner found
no plan), a red '!' (crashed); not_applicable points are left blank and a planner whose points in
a panel are all not_applicable has no bar slot there. One legend for the whole figure.

The table (`figure_table`) is the figure's data, one row per (model, cluster, num_devices, mbs,
planner), with `nest_gain` = NEST's throughput / the planner's where both are feasible, written at
9 significant digits. The PNG, PDF and table carry no dates: the same CSV gives the same bytes.
"""

from __future__ import annotations

import zlib
from pathlib import Path

import matplotlib

matplotlib.use("agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
from matplotlib.lines import Line2D  # noqa: E402
from matplotlib.patches import Patch  # noqa: E402

from nest.results import write_frame  # noqa: E402

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
                 "normalized_throughput", "throughput_samples_per_s", "time_per_batch_s",
                 "nest_gain"]
NO_BAR = {"infeasible": "OOM", "no_plan": "none"}  # status -> label under its 'x'
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
    from nest.atomic_io import savefig_atomic

    savefig_atomic(fig, png, dpi=dpi, metadata={"Software": None})
    savefig_atomic(fig, pdf, metadata={"CreationDate": None, "Producer": None})
    plt.close(fig)


def plot_figure(df: pd.DataFrame, png: str | Path, pdf: str | Path, table: str | Path | None,
                title: str, x: str | None = None) -> pd.DataFrame:
    """Results -> bar figure (PNG and PDF) and its data table (CSV; skipped when `table` is None).
    `x` forces the kind ('scale'/'num_devices' or 'sweep'/'mbs'); by default it is read from the
    data (`figure_kind`). Returns the table."""
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
    with plt.rc_context({"font.size": FONT, "axes.titlesize": FONT + 1,
                         "axes.labelsize": FONT, "xtick.labelsize": FONT,
                         "ytick.labelsize": FONT, "legend.fontsize": FONT}):
        fig, axes = plt.subplots(nrows, ncols, figsize=(ncols * panel_w, 2.1 * nrows + 0.7),
                                 squeeze=False, layout="constrained")
        flat = list(axes.flat)
        marks: set[str] = set()
        for ax, key in zip(flat, panels):
            _panel(ax, tab, key, groups[key], gcols, several, clusters, marks)
        for ax in flat[len(panels):]:
            ax.set_axis_off()
        if not panels:
            flat[0].text(0.5, 0.5, "no results", ha="center", va="center",
                         transform=flat[0].transAxes)
        handles = [Patch(facecolor=planner_color(p), label=p) for p in legend_planners]
        if marks & {"infeasible", "no_plan"}:
            handles.append(Line2D([], [], color="k", marker="x", linestyle="none",
                                  label="no plan: does not fit (OOM) / none found"))
        if "crashed" in marks:
            handles.append(Line2D([], [], color="red", marker="$!$", linestyle="none",
                                  label="crashed"))
        if handles:  # as few rows as the width allows, the entries spread evenly over them
            rows = -(-len(handles) // max(4, int(ncols * panel_w / 1.1)))
            fig.legend(handles=handles, loc="outside lower center", frameon=False,
                       ncol=-(-len(handles) // rows))
        fig.suptitle(title.replace("$", r"\$"), fontsize=FONT + 2)  # text, not mathtext
        save_figure(fig, png, pdf, dpi=150)
    return tab


def _panel(ax, tab: pd.DataFrame, key: tuple, groups: list[tuple], gcols: list[str],
           several: bool, clusters: bool, marks: set[str]) -> None:
    model, cluster = key
    sub = tab[(tab.model == model) & (tab.cluster == cluster)]
    planners = sorted(set(sub.planner[sub.status != "not_applicable"]), key=planner_rank)
    norm = sub.normalized_throughput.notna().any()
    ycol = "normalized_throughput" if norm else "throughput_samples_per_s"
    width = 0.84 / max(len(planners), 1)
    pos = {g: i for i, g in enumerate(groups)}
    for j, planner in enumerate(planners):
        offset = (j - (len(planners) - 1) / 2) * width
        rows = sub[sub.planner == planner]
        xs, ys = [], []
        for r in rows.itertuples(index=False):
            g = tuple(getattr(r, c) for c in gcols)
            if g not in pos:  # only not_applicable points there
                continue
            xc = pos[g] + offset
            y = getattr(r, ycol)
            if r.status == "feasible" and not np.isnan(y):
                xs.append(xc)
                ys.append(y)
            elif r.status in NO_BAR:
                marks.add(r.status)
                ax.plot([xc], [0], marker="x", markersize=3.5, markeredgewidth=0.9,
                        color=planner_color(planner), linestyle="none", clip_on=False,
                        zorder=3, label=f"_{r.status}:{planner}")
                ax.annotate(NO_BAR[r.status], (xc, 0), xytext=(0, 3),
                            textcoords="offset points", ha="center", va="bottom",
                            rotation=90, fontsize=FONT - 2.5, color="0.3")
            elif r.status == "crashed":
                marks.add("crashed")
                ax.plot([xc], [0], marker="$!$", markersize=5, color="red",
                        linestyle="none", clip_on=False, zorder=3, label=f"_crashed:{planner}")
        if xs:
            ax.bar(xs, ys, width=width, color=planner_color(planner), linewidth=0, zorder=2,
                   label=planner)
    if norm:
        ax.axhline(1.0, color="k", linewidth=0.5, linestyle="--", zorder=1)
    ax.set_xticks(range(len(groups)))
    if several:  # both device count and micro-batch size vary
        ax.set_xticklabels([f"{g[0]}\n{'mbs ' if gcols[1] == 'mbs' else 'n='}{g[1]}"
                            for g in groups])
    else:
        ax.set_xticklabels([str(g[0]) for g in groups])
    ax.set_xlim(-0.5, len(groups) - 0.5)
    ax.set_ylim(bottom=0)
    ax.set_xlabel(X_LABEL[gcols[0]])
    ax.set_ylabel("throughput / Manual" if norm else "samples/s")
    ax.set_title(f"{model} ({cluster})" if clusters else model)
    ax.grid(axis="y", alpha=0.3, linewidth=0.5, zorder=0)
    ax.tick_params(axis="x", length=0)


def plot_throughput(df: pd.DataFrame, png: str | Path, pdf: str | Path, title: str,
                    table: str | Path | None = None) -> pd.DataFrame:
    """The former entry point: `plot_figure` with the table optional."""
    return plot_figure(df, png, pdf, table, title)
