"""NEST's gain decomposed, and the network co-design sweep.

Decomposition. Each ablation is NEST with one capability switched off (config/planners.yaml,
entries nest_*; every one keeps NEST's settings but its switch):

    nest_flat_network     network awareness: plan on nest.network.collectives.flattened(cluster)
                          (solver setting network: flat), scored on the real network
    nest_no_zero          ZeRO: zero_stages [0]
    nest_no_recompute     recomputation: recompute_modes [none]
    nest_even_cuts        uneven cuts: the most even split of the blocks (solver setting
                          even_cuts: true)
    nest_fixed_placement  placement search: placements [replica_major]
    nest_homogeneous      heterogeneous stages: one variant, one ZeRO stage and one
                          recomputation mode for all stages (what Megatron-LM launches:
                          nest.solver.launchable with 1F1B and the point's micro-batch)
    nest_no_sp_cp_ep      SP / CP / EP: sp [false], cp [1], ep [1]

Every ablated space is a subset of NEST's (the flat-network plan is one of NEST's plans, scored
where NEST optimises), so T(ablation) >= T(nest) at every point, NEST being exact: the ratio
T(ablation) / T(nest) is the throughput the capability buys there, and an ablation that finds no
plan where NEST does shows a capability that makes the point fit at all. `decomposition_table`
summarises it per ablation and cluster; a ratio below 1 would be a solver bug and is counted
(`points_ablation_faster`, expected 0).

Ties. Where an ablation's own objective cannot tell placements apart (the flattened network
prices a ring inside a node and one across nodes microseconds apart), its plan is the one in
Megatron-LM's default rank order (nest.planners.ties, in the solver every nest_* planner runs), and the
results carry the range over the tied placements on the real network: the table counts those
points (`points_tied`) and gives the worst tie's ratio (`max_ratio_tied`), the figure draws it as
a thin line, so no headline rests on a tie-break.

Co-design. One model on a cluster whose inter-node bandwidth and oversubscription are swept
(`derive_cluster`): per network, NEST (network-aware) and the flat-network planner, both scored
on that network; gain = T(flat) / T(nest), the flat plan's tie (if any) broken as above and its
worst tied placement on the cell's network reported beside it. Each point is cached as JSON under a folder, keyed by
a digest of the run's inputs, so an interrupted sweep resumes and a changed input recomputes.
"""

from __future__ import annotations

import hashlib
import json
import math
from pathlib import Path

import matplotlib

matplotlib.use("agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from nest.reports.figures import save_figure  # noqa: E402
from nest.experiments.results import write_frame as write_csv  # noqa: E402,F401 - the pipeline's CSV writer
from nest.experiments.tables import comm_share  # noqa: E402 - one classification of the breakdown's terms

CAPABILITIES = {
    "nest_flat_network": "network awareness",
    "nest_no_zero": "ZeRO",
    "nest_no_recompute": "recomputation",
    "nest_even_cuts": "uneven cuts",
    "nest_fixed_placement": "placement search",
    "nest_homogeneous": "heterogeneous stages",
    "nest_no_sp_cp_ep": "SP / CP / EP",
}
KEY = ["model", "cluster", "num_devices", "mbs"]
TABLE_COLUMNS = ["ablation", "capability", "cluster", "points", "points_both_feasible",
                 "mean_ratio", "min_ratio", "max_ratio", "points_equal",
                 "points_only_nest_feasible", "points_ablation_faster", "points_crashed",
                 "points_tied", "max_ratio_tied"]
# points_tied: points where the ablation's objective tied several placements (nest.planners.ties: the plan
# is the Megatron-order one); max_ratio_tied: the largest T(worst tied placement) / T(reference)
# over the points both fit, what an arbitrary tie-break could have reported instead
EQUAL = 1e-9  # relative: T(ablation) within this of T(nest) counts as "capability unused"


def capability(planner: str) -> str:
    return CAPABILITIES.get(planner, planner)


# -- decomposition -------------------------------------------------------------------------------
def decomposition_table(df: pd.DataFrame, reference: str = "nest",
                        ablations: list[str] | None = None) -> pd.DataFrame:
    """Per ablation and cluster: T(ablation) / T(reference) over the points where both are
    feasible (mean, min, max), how many of those are equal (the capability unused), how many
    points only the reference fits (the ablation found no plan or an infeasible one) and how many
    the ablation crashed on. Ablations in the given order (default: as they appear in df),
    clusters sorted by name."""
    ablations = ablations or [p for p in dict.fromkeys(df.planner) if p != reference]
    ref = df[df.planner == reference].set_index(KEY)[["feasible", "time_per_batch_s"]]
    rows = []
    for planner in ablations:
        for cluster in sorted(set(df.cluster)):
            g = df[(df.planner == planner) & (df.cluster == cluster)].set_index(KEY)
            g = g.join(ref.add_suffix("_ref"), how="left")
            ref_ok = g.feasible_ref.fillna(False).astype(bool)
            both = g[g.feasible.astype(bool) & ref_ok]
            ratio = (both.time_per_batch_s / both.time_per_batch_s_ref).astype(float)
            worst = (_tied_max(both) / both.time_per_batch_s_ref).astype(float)
            lost = g.status.isin(["infeasible", "no_plan"]) & ref_ok
            nan = float("nan")
            rows.append({
                "ablation": planner, "capability": capability(planner), "cluster": cluster,
                "points": len(g), "points_both_feasible": len(both),
                "mean_ratio": ratio.mean() if len(both) else nan,
                "min_ratio": ratio.min() if len(both) else nan,
                "max_ratio": ratio.max() if len(both) else nan,
                "points_equal": int((ratio <= 1 + EQUAL).sum()),
                "points_only_nest_feasible": int(lost.sum()),
                "points_ablation_faster": int((ratio < 1 - EQUAL).sum()),
                "points_crashed": int((g.status == "crashed").sum()),
                "points_tied": int((_tied_count(g) > 1).sum()),
                "max_ratio_tied": worst.max() if len(both) else nan})
    return pd.DataFrame(rows, columns=TABLE_COLUMNS)


def _tied_count(g: pd.DataFrame) -> pd.Series:
    if "tied_candidates" not in g:
        return pd.Series(1, index=g.index)
    return pd.to_numeric(g.tied_candidates, errors="coerce").fillna(1)


def _tied_max(g: pd.DataFrame) -> pd.Series:
    """The worst tied placement's time per batch (the row's own where nothing tied)."""
    if "time_per_batch_tied_max_s" not in g:
        return g.time_per_batch_s.astype(float)
    return pd.to_numeric(g.time_per_batch_tied_max_s, errors="coerce").fillna(
        g.time_per_batch_s.astype(float))


def decomposition_markdown(table: pd.DataFrame, reference: str = "nest") -> str:
    lines = ["# NEST's gain decomposed: one capability off at a time", "",
             f"T(ablation) / T({reference}) = the throughput the capability buys, over the points "
             "where both fit (mean, min-max); 'unused' counts the points where switching it off "
             f"costs nothing; 'only {reference} fits' the points it takes to fit at all.", "",
             f"| capability off (planner) | cluster | both fit | mean | min-max | unused "
             f"| only {reference} fits | tied placements (worst tie) |",
             "|---|---|---|---|---|---|---|---|"]
    for r in table.itertuples():
        if r.points_both_feasible:
            stats = f"{r.mean_ratio:.3f}x | {r.min_ratio:.3f}-{r.max_ratio:.3f}x"
        else:
            stats = "- | -"
        extra = f" (crashed: {r.points_crashed})" if r.points_crashed else ""
        tie = (f"{r.points_tied} ({r.max_ratio_tied:.3f}x)" if r.points_tied
               and not pd.isna(r.max_ratio_tied) else str(r.points_tied))
        lines.append(f"| {r.capability} ({r.ablation}) | {r.cluster} | "
                     f"{r.points_both_feasible}/{r.points} | {stats} | {r.points_equal} | "
                     f"{r.points_only_nest_feasible}{extra} | {tie} |")
    bad = int(table.points_ablation_faster.sum())
    lines += ["", "Tied placements: points where the ablation's own objective could not tell "
              "placements apart (nest.planners.ties); its plan is then the one in Megatron-LM's default "
              "rank order, and the worst tie is what another tie-break would have reported.",
              "", "Check: no ablation is faster than NEST anywhere." if not bad else
              f"WARNING: an ablation beats NEST at {bad} point(s) (NEST should be exact)."]
    return "\n".join(lines) + "\n"


MARKERS = "osD^v<>pP*X"
CLIP = 2.0  # decomposition figure: ratios above this are drawn at the top edge, value written


def plot_decomposition(df: pd.DataFrame, table: pd.DataFrame, png: str | Path, pdf: str | Path,
                       reference: str = "nest", title: str = "") -> None:
    """One panel per cluster: per ablation, T(ablation) / T(reference) of every point where both
    fit (one marker per model, devices spread sideways), the mean as a bar, and how many points
    only the reference fits above it. The y axis ends at CLIP x at most, so that ratios near 1
    stay readable: a point or mean above it is drawn at the edge as a triangle with its value.
    Where the ablation's objective tied placements (nest.planners.ties), a thin line runs from the point
    up to the worst tied placement's ratio (what another tie-break would have given)."""
    clusters = sorted(set(table.cluster))
    ablations = list(dict.fromkeys(table.ablation))
    models = list(dict.fromkeys(df.model))
    ref = df[df.planner == reference].set_index(KEY)[["feasible", "time_per_batch_s"]]
    ncl = max(len(clusters), 1)
    fig, axes = plt.subplots(1, ncl, squeeze=False, layout="constrained",
                             figsize=(0.9 * max(len(ablations), 2) * ncl + 1.5, 3.9))
    hi = float(np.nanmax(table.max_ratio.to_numpy(dtype=float), initial=1.0))
    top = max(1.1, min(hi, CLIP) * 1.04)  # a worst tie above it is cut, its value written
    edge = top / 1.02
    for ax, cluster in zip(axes[0], clusters):
        sizes = sorted(set(df[df.cluster == cluster].num_devices))
        for i, planner in enumerate(ablations):
            row = table[(table.ablation == planner) & (table.cluster == cluster)].iloc[0]
            if row.points_both_feasible:
                ax.bar(i, min(row.mean_ratio, edge) - 1, bottom=1, width=0.7, color="0.85",
                       zorder=1)
                if row.mean_ratio > edge:
                    ax.text(i, edge, f"mean\n{row.mean_ratio:.2f}x", ha="center", va="top",
                            fontsize=6)
            g = df[(df.planner == planner) & (df.cluster == cluster)].set_index(KEY)
            g = g.join(ref.add_suffix("_ref"), how="left")
            g = g[g.feasible.astype(bool) & g.feasible_ref.fillna(False).astype(bool)]
            for k, model in enumerate(models):
                pts = g[g.index.get_level_values("model") == model]
                if pts.empty:
                    continue
                n = pts.index.get_level_values("num_devices")
                x = i + np.array([(sizes.index(v) / max(len(sizes) - 1, 1) - 0.5) * 0.5
                                  for v in n]) + (k - (len(models) - 1) / 2) * 0.03
                y = (pts.time_per_batch_s / pts.time_per_batch_s_ref).astype(float).to_numpy()
                worst = (_tied_max(pts) / pts.time_per_batch_s_ref).astype(float).to_numpy()
                for xi, yi, wi in zip(x, y, worst):
                    if wi > yi * (1 + EQUAL):
                        ax.plot([xi, xi], [min(yi, edge), min(wi, edge)], color=f"C{k}",
                                linewidth=0.6, alpha=0.6, zorder=1.5)
                        if wi > edge:
                            ax.text(xi, edge, f"tie: {wi:.1f}x", rotation=90, ha="right",
                                    va="top", fontsize=6, color=f"C{k}")
                inside = y <= edge
                ax.plot(x[inside], y[inside], linestyle="none",
                        marker=MARKERS[k % len(MARKERS)], markersize=4, color=f"C{k}",
                        label=model, zorder=2)
                for xi, yi in zip(x[~inside], y[~inside]):
                    ax.plot([xi], [edge], marker="^", markersize=5, color=f"C{k}", zorder=3)
                    ax.annotate(f"{yi:.2f}x", (xi, edge), xytext=(0, -9),
                                textcoords="offset points", ha="center", fontsize=6,
                                color=f"C{k}")
            if row.points_only_nest_feasible:
                ax.text(i, 1.0 + (top - 1) * 0.55, f"+{row.points_only_nest_feasible}\nno fit",
                        ha="center", va="top", fontsize=7, color="C3")
        ax.axhline(1.0, color="k", linewidth=0.6)
        ax.set_xticks(range(len(ablations)))
        ax.set_xticklabels([capability(p) for p in ablations], rotation=35, ha="right",
                           fontsize=7)
        ax.set_ylim(0.98, top)
        ax.set_ylabel(f"T(capability off) / T({reference})", fontsize=8)
        ax.set_title(f"{cluster} ({len(sizes)} sizes)", fontsize=9)
        ax.grid(axis="y", alpha=0.3)
    handles, labels = axes[0][0].get_legend_handles_labels()
    uniq = dict(zip(labels, handles))
    fig.legend(uniq.values(), uniq.keys(), fontsize=7, loc="outside lower center",
               ncol=max(len(uniq), 1), frameon=False)
    note = [f"axis cut at {top:.2f}x, larger values written"] if hi > edge else []
    if "max_ratio_tied" in table and (table.points_tied > 0).any():
        note.append("thin line: up to the worst placement the ablation's objective tied")
    fig.suptitle(title or "NEST's gain decomposed: one capability off at a time (bar: mean"
                 + "".join(f"; {x}" for x in note) + ")", fontsize=9, wrap=True)
    save_figure(fig, png, pdf)


# -- co-design -----------------------------------------------------------------------------------
def derive_cluster_dict(base: dict, bandwidth_GBps: float, oversubscription: float) -> dict:
    """A cluster YAML mapping with every level above the innermost (the inter-node ones: leaf and
    spine of h100_spineleaf) at `bandwidth_GBps` per device and the outermost level at
    `oversubscription` (the levels between keep theirs); named after the change."""
    d = json.loads(json.dumps(base))  # a deep copy of plain YAML data
    for lv in d["levels"][1:]:
        lv["bandwidth_GBps"] = float(bandwidth_GBps)
    if len(d["levels"]) > 1:
        d["levels"][-1]["oversubscription"] = float(oversubscription)
    d["name"] = f"{base['name']}_bw{bandwidth_GBps:g}_os{oversubscription:g}".replace(".", "p")
    return d


def derive_cluster(base: str, num_devices: int, bandwidth_GBps: float, oversubscription: float):
    from nest.spec.catalog import cluster_from_dict, config_dir, read_yaml

    path = Path(base) if str(base).endswith((".yaml", ".yml")) else (
        config_dir() / "clusters" / f"{base}.yaml")
    base_d = read_yaml(path)
    if "network" in base_d:  # a named builder or graph file: its levels (nest.network.fabric)
        from nest.network.fabric import expand_network

        base_d = expand_network(base_d, str(path))[0]
    d = derive_cluster_dict(base_d, bandwidth_GBps, oversubscription)
    return cluster_from_dict(d, f"{path} (bandwidth {bandwidth_GBps:g} GB/s above the node, "
                                f"oversubscription {oversubscription:g})", num_devices)


def digest(paths=(), extra=None) -> str:
    """sha256 of the bytes of `paths` (in the order given) and of `extra` as sorted JSON."""
    h = hashlib.sha256()
    for p in paths:
        h.update(str(p).encode() + b"\0" + Path(p).read_bytes() + b"\0")
    h.update(json.dumps(extra, sort_keys=True, default=str).encode())
    return h.hexdigest()


def plan_desc(plan) -> str:
    if plan is None:
        return ""
    return (f"pp={plan.pp} dp={plan.dp} tp={plan.tp} sp={int(plan.sp)} ep={plan.ep} "
            f"cp={plan.cp} {plan.placement}")


CODESIGN_SCHEMA = "nest.codesign_point/v1"  # a cached point; the key covers schema and columns
CODESIGN_COLUMNS = ["model", "cluster", "num_devices", "inter_node_bandwidth_GBps",
                    "oversubscription", "nest_time_s", "flat_time_s", "gain", "nest_plan",
                    "flat_plan", "nest_comm_share", "flat_comm_share", "flat_tied_placements",
                    "flat_time_tied_max_s", "reason"]
# flat_tied_placements: placements the flat planner's objective tied (nest.planners.ties; its plan is the
# Megatron-order one); flat_time_tied_max_s: the worst of them on the cell's network (each with
# the flat plan's cuts and options), what another tie-break would have reported


def codesign_sweep(model: str, cluster: str, sizes, bandwidths, oversubscriptions,
                   cache_dir: str | Path, inputs_digest: str = "", graph=None,
                   planner: str = "nest", flat_planner: str = "nest_flat_network",
                   training=None, log=print) -> pd.DataFrame:
    """Per (devices, bandwidth, oversubscription): `planner` and `flat_planner` each run on the
    derived cluster and scored there by the shared evaluator. Every point is written to
    cache_dir/<model>_<cluster>_n<N>_bw<B>_os<O>.json with `inputs_digest` and reused while the
    digest matches (an interrupted run resumes). A flat-network planner (settings network: flat)
    sees only the flattened cluster, so its plan is solved once per flattened network and scored
    on each real one. `training` replaces config/training.yaml's settings (for tests)."""
    from nest.problem.evaluate import evaluate, make_problem
    from nest.network.collectives import flattened
    from nest.planners.registry import planner_entry, run_planner
    from nest.planners.ties import with_placement

    cache_dir = Path(cache_dir)
    cache_dir.mkdir(parents=True, exist_ok=True)
    flat_is_blind = planner_entry(flat_planner)[1].get("network") == "flat"
    flat_plans: dict = {}
    rows = []
    for n in sizes:
        base = make_problem(model, cluster, n, graph=graph, training=training)
        for bw in bandwidths:
            for os_ in oversubscriptions:
                c = derive_cluster(cluster, n, bw, os_)
                key = digest(extra={"inputs": inputs_digest, "model": model, "cluster": repr(c),
                                    "training": repr(base.training), "schema": CODESIGN_SCHEMA,
                                    "columns": CODESIGN_COLUMNS,
                                    "planners": [planner, flat_planner]})
                path = cache_dir / f"{model}_{cluster}_n{n}_bw{bw:g}_os{os_:g}.json"
                if path.exists():
                    rec = json.loads(path.read_text())
                    if rec.get("key") == key:
                        rows.append(rec["row"])
                        continue
                pr = base.with_cluster(c)
                aware = run_planner(planner, pr)
                blind_key = (flat_planner, n, flattened(c).levels)
                if flat_is_blind and blind_key in flat_plans:  # the same flat problem: reuse
                    plan, reason = flat_plans[blind_key]
                    ev = evaluate(plan, pr) if plan is not None else None
                    solve_s = 0.0
                else:
                    out = run_planner(flat_planner, pr)
                    plan, ev, reason, solve_s = (out.plan, out.evaluation, out.reason,
                                                 out.solve_time_s)
                    if flat_is_blind:
                        flat_plans[blind_key] = (plan, out.reason)
                tied = (plan.extra.get("tied") or {}).get("placements", []) if plan else []
                worst = [evaluate(with_placement(plan, pl), pr) for pl in tied[1:]]
                a_ok = aware.evaluation is not None and aware.evaluation.feasible
                f_ok = ev is not None and ev.feasible
                ta = aware.evaluation.time_per_batch_s if a_ok else None
                tf = ev.time_per_batch_s if f_ok else None
                row = {"model": model, "cluster": cluster, "num_devices": n,
                       "inter_node_bandwidth_GBps": float(bw), "oversubscription": float(os_),
                       "nest_time_s": ta, "flat_time_s": tf,
                       "gain": tf / ta if ta and tf else None,
                       "nest_plan": plan_desc(aware.plan), "flat_plan": plan_desc(plan),
                       "nest_comm_share": comm_share(aware.evaluation),
                       "flat_comm_share": comm_share(ev),
                       "flat_tied_placements": max(len(tied), 1) if plan else None,
                       "flat_time_tied_max_s": max([tf, *(w.time_per_batch_s for w in worst
                                                          if w.feasible)]) if f_ok else None,
                       "reason": "; ".join(r for r in (
                           "" if a_ok else f"{planner}: {aware.reason}",
                           "" if f_ok else f"{flat_planner}: {ev.reason if ev else reason}")
                           if r)}
                rec = {"schema": CODESIGN_SCHEMA, "key": key, "row": row,
                       "solve_time_s": {planner: aware.solve_time_s, flat_planner: solve_s}}
                from nest.common.atomic_io import write_text_atomic  # old file or new, whole

                write_text_atomic(path, json.dumps(rec, indent=1, sort_keys=True) + "\n")
                log(f"N={n} bw={bw:g} os={os_:g}: nest {ta} s, flat {tf} s, gain "
                    f"{row['gain']} (solve {aware.solve_time_s:.1f} s + {solve_s:.1f} s)")
                rows.append(row)
    df = pd.DataFrame(rows, columns=CODESIGN_COLUMNS)
    return df.sort_values(["num_devices", "inter_node_bandwidth_GBps", "oversubscription"],
                          kind="stable").reset_index(drop=True)


def plot_codesign(df: pd.DataFrame, png: str | Path, pdf: str | Path, title: str = "") -> None:
    """Heatmap of the gain T(flat) / T(nest) per bandwidth x oversubscription, one panel per
    device count (grey: a planner found no plan that fits)."""
    from matplotlib.colors import LogNorm
    from matplotlib.ticker import FixedLocator, NullLocator

    sizes = sorted(set(df.num_devices))
    bws = sorted(set(df.inter_node_bandwidth_GBps))
    oss = sorted(set(df.oversubscription))
    gains = df.gain.astype(float)
    vmax = max(float(np.nanmax(gains.to_numpy(), initial=1.0)), 1.1)
    fig, axes = plt.subplots(1, max(len(sizes), 1), squeeze=False, layout="constrained",
                             figsize=(0.8 * len(bws) * max(len(sizes), 1) + 2.4,
                                      0.5 * len(oss) + 2.0))
    cmap = matplotlib.colormaps["viridis"].with_extremes(bad="0.8")
    norm = LogNorm(vmin=1.0, vmax=vmax)
    im = None
    for k, (ax, n) in enumerate(zip(axes[0], sizes)):
        grid = np.full((len(oss), len(bws)), np.nan)
        for r in df[df.num_devices == n].itertuples():
            grid[oss.index(r.oversubscription), bws.index(r.inter_node_bandwidth_GBps)] = (
                np.nan if r.gain is None or pd.isna(r.gain) else float(r.gain))
        im = ax.imshow(np.ma.masked_invalid(grid), origin="lower", aspect="auto", cmap=cmap,
                       norm=norm)
        for i in range(len(oss)):
            for j in range(len(bws)):
                v = grid[i, j]
                bright = not math.isnan(v) and math.log(v) > 0.6 * math.log(vmax)
                ax.text(j, i, "-" if math.isnan(v) else f"{v:.2f}", ha="center", va="center",
                        fontsize=7, color="k" if bright or math.isnan(v) else "w")
        ax.set_xticks(range(len(bws)))
        ax.set_xticklabels([f"{b:g}" for b in bws], fontsize=8)
        ax.set_yticks(range(len(oss)))
        ax.set_yticklabels([f"{o:g}:1" for o in oss], fontsize=8)
        ax.set_xlabel("inter-node GB/s per device", fontsize=8)
        if k == 0:
            ax.set_ylabel("oversubscription (outermost level)", fontsize=8)
        ax.set_title(f"{n} devices", fontsize=9)
    if im is not None:
        cb = fig.colorbar(im, ax=axes[0].tolist(), shrink=0.9)
        ticks = [t for t in ((1, 1.5, 2, 3, 5, 10, 20, 50) if vmax > 3 else
                             (1, 1.05, 1.1, 1.25, 1.5, 2, 3)) if t <= vmax]
        cb.ax.yaxis.set_major_locator(FixedLocator(ticks))
        cb.ax.yaxis.set_minor_locator(NullLocator())
        cb.ax.set_yticklabels([f"{t:g}x" for t in ticks], fontsize=7)
        cb.set_label("T(flat-planned) / T(NEST)", fontsize=8)
    model = df.model.iloc[0] if len(df) else ""
    cluster = df.cluster.iloc[0] if len(df) else ""
    fig.suptitle(title or f"Where network awareness pays: {model} on {cluster}", fontsize=10)
    save_figure(fig, png, pdf)


def codesign_markdown(df: pd.DataFrame, threshold: float = 1.05) -> str:
    """The gain per bandwidth x oversubscription for each device count, and per device count
    and oversubscription the largest bandwidth at which the gain still reaches `threshold`."""
    if df.empty:
        return "# Co-design sweep\n\n(no points)\n"
    lines = [f"# Co-design sweep: {df.model.iloc[0]} on {df.cluster.iloc[0]}", "",
             "gain = T(plan of the flattened network) / T(NEST), both scored on the network of "
             "the cell (inter-node bandwidth per device in GB/s x oversubscription of the "
             "outermost level).", ""]
    bws = sorted(set(df.inter_node_bandwidth_GBps))
    if "flat_tied_placements" in df:
        tied = df[pd.to_numeric(df.flat_tied_placements, errors="coerce").fillna(1) > 1]
        if len(tied):
            worst = (tied.flat_time_tied_max_s.astype(float) / tied.nest_time_s.astype(float))
            lines += [f"In {len(tied)} of {len(df)} cells the flat planner's own objective tied "
                      f"placements; its plan is then the one in Megatron-LM's default rank "
                      f"order (nest.planners.ties). Another tie-break would have given a gain of up to "
                      f"{worst.max():.2f}x there.", ""]
    for n in sorted(set(df.num_devices)):
        sub = df[df.num_devices == n]
        lines += [f"## {n} devices", "",
                  "| oversubscription | " + " | ".join(f"{b:g} GB/s" for b in bws) + " |",
                  "|---|" + "---|" * len(bws)]
        pays = []
        for o in sorted(set(sub.oversubscription)):
            cells = []
            for b in bws:
                r = sub[(sub.oversubscription == o) & (sub.inter_node_bandwidth_GBps == b)]
                g = r.gain.iloc[0] if len(r) else None
                cells.append("-" if g is None or pd.isna(g) else f"{float(g):.2f}x")
            lines.append(f"| {o:g}:1 | " + " | ".join(cells) + " |")
            ok = sub[(sub.oversubscription == o) & (sub.gain.astype(float) >= threshold)]
            top = ok.inter_node_bandwidth_GBps.max() if len(ok) else None
            pays.append(f"{o:g}:1 up to {top:g} GB/s" if top is not None else
                        f"{o:g}:1 nowhere")
        lines += ["", f"Gain >= {threshold:g}x: " + "; ".join(pays) + ".", ""]
    return "\n".join(lines)
