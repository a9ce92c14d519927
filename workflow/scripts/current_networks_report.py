"""Snakemake adapter: the current-networks experiment's results CSVs -> one figure that reads at a
glance (figures/current_networks.png / .pdf: per cluster and device count, NEST's speed-up over
its network-blind ablation and over Phaze, one bar per model) and a Markdown section for
REPRODUCTION.md (results/current_networks.md: the table of every point and what it finds, every
number computed here from the CSVs). Runnable by hand:
    python workflow/scripts/current_networks_report.py results/current_rail.csv ... OUT.md OUT.png
"""


import csv
import sys
from collections import defaultdict

BLIND, BASELINES = "nest_flat_network", ("phaze",)
CLUSTER_NAMES = {"dgx_h100_rail_superpod": "H100 rail SuperPOD", "gb200_nvl72": "GB200 NVL72",
                 "tpuv4_torus": "TPU v4 torus"}


def read(paths):
    rows = []
    for p in paths:
        with open(p) as f:
            rows += list(csv.DictReader(f))
    return rows


def points(rows):
    """{(cluster, model, devices): {planner: row}} in the CSVs' order."""
    out: dict = defaultdict(dict)
    for r in rows:
        out[(r["cluster"], r["model"], int(r["num_devices"]))][r["planner"]] = r
    return out


def t(row):
    return float(row["time_per_batch_s"]) if row and row["feasible"] == "True" else None


def gain(pt, planner):
    if planner not in pt or "nest" not in pt:
        return None, "-"
    a, b = t(pt.get("nest")), t(pt.get(planner))
    if a is None:
        return None, "NEST: none fits" if b is None else "only the baseline fits"
    if b is None:
        return None, f"{planner}: none fits"
    return b / a, f"{b / a:.3f}x"


def plan_text(r):
    s = f"{r['pp']} x {r['dp']} x {r['tp']}"
    extra = [f"{k} {r[k]}" for k in ("cp", "ep") if r.get(k) not in (None, "1", "")]
    return s + (f" ({', '.join(extra)})" if extra else "")


def section(rows) -> str:
    pts = points(rows)
    lines = ["## current_networks: where network awareness pays on current clusters", "",
             "NEST against its network-blind ablation (`nest_flat_network`: planned on the "
             "flattened network, every level at the innermost bandwidth, scored on the real one) "
             "and Phaze, global batch 4096, micro-batch 1 (config/current_clusters.yaml; "
             "`snakemake -j2 current_networks`). Gain = the planner's time per batch over "
             "NEST's, both under the shared evaluator.", "",
             "| cluster | model | devices | NEST s/batch (MFU) | NEST pp x dp x tp | gain over "
             "blind | gain over Phaze | NEST solve s |", "|---|---|---|---|---|---|---|---|"]
    best: dict = defaultdict(lambda: (0.0, None))
    for (cl, model, n), by in pts.items():
        nest = by.get("nest")
        if nest is None:
            continue
        g_blind, s_blind = gain(by, BLIND)
        g_ph, s_ph = gain(by, "phaze")
        if g_blind is not None and g_blind > best[cl][0]:
            best[cl] = (g_blind, (model, n))
        what = (f"{float(nest['time_per_batch_s']):.2f} ({float(nest['mfu']):.1%})"
                if t(nest) else "none fits")
        lines.append(f"| {CLUSTER_NAMES.get(cl, cl)} | {model} | {n:,} | {what} | "
                     f"{plan_text(nest) if t(nest) else '-'} | {s_blind} | {s_ph} | "
                     f"{float(nest['solve_time_s'] or 'nan'):.1f} |")
    lines += ["", "What it finds (computed from the table):", ""]
    for cl, (g, where) in best.items():
        if where is None:
            continue
        lines.append(f"- {CLUSTER_NAMES.get(cl, cl)}: network awareness gains at most "
                     f"{g:.2f}x over the blind plan ({where[0]} on {where[1]:,} devices)"
                     + ("; the blind plan is within 5% everywhere" if g < 1.05 else ""))
    solves = [float(by["nest"]["solve_time_s"]) for by in pts.values()
              if by.get("nest") and by["nest"]["solve_time_s"]]
    if solves:
        lines.append(f"- NEST's solve: {min(solves):.1f}-{max(solves):.1f} s per point, wall-clock "
                     f"of the plan jobs as run (two at a time on the machine's cores, shared "
                     f"with whatever else ran); CPU seconds per point: "
                     f"benchmarks/network_solve.py")
    return "\n".join(lines) + "\n"


def plot(rows, out_png: str, out_pdf: str | None = None) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    pts = points(rows)
    clusters = list(dict.fromkeys(cl for cl, _, _ in pts))
    models = list(dict.fromkeys(m for _, m, _ in pts))
    fig, axes = plt.subplots(2, len(clusters), figsize=(4.2 * len(clusters), 6.4),
                             squeeze=False, sharey="row")
    for ci, cl in enumerate(clusters):
        sizes = sorted({n for c, _, n in pts if c == cl})
        for ri, (planner, label) in enumerate(((BLIND, "over the network-blind plan"),
                                               ("phaze", "over Phaze"))):
            ax = axes[ri][ci]
            w = 0.8 / max(len(models), 1)
            for mi, m in enumerate(models):
                gs = [gain(pts.get((cl, m, n), {}), planner) for n in sizes]
                xs = [i + (mi - (len(models) - 1) / 2) * w for i in range(len(sizes))]
                ax.bar([x for x, (y, _) in zip(xs, gs) if y], [y for y, _ in gs if y], w,
                       label=m, color=f"C{mi}")
                for x, (y, why) in zip(xs, gs):
                    if y is None and "none fits" in why:
                        ax.text(x, 0.02, "x", ha="center", va="bottom", fontsize=8,
                                transform=ax.get_xaxis_transform())
                    elif y is not None and y >= 1.05:
                        ax.text(x, y, f"{y:.2g}", ha="center", va="bottom", fontsize=7)
            ax.axhline(1.0, color="k", lw=0.8)
            ax.set_ylim(bottom=0)
            ax.set_xlim(-0.5, len(sizes) - 0.5)
            ax.set_xticks(range(len(sizes)), [f"{n:,}" for n in sizes])
            ax.set_title(f"{CLUSTER_NAMES.get(cl, cl)}: NEST {label}", fontsize=9)
            if ci == 0:
                ax.set_ylabel("speed-up (x)")
            if ri == 1:
                ax.set_xlabel("devices")
    axes[0][0].legend(fontsize=8)
    fig.text(0.01, 0.005, "x: that planner found no plan that fits", fontsize=7)
    fig.tight_layout()
    fig.savefig(out_png, dpi=130)
    if out_pdf:
        fig.savefig(out_pdf)


def main(csvs, md, png, pdf=None) -> None:
    rows = read(csvs)
    text = section(rows)
    with open(md, "w") as f:
        f.write(text)
    plot(rows, png, pdf)
    print(text)


if "snakemake" in globals():
    sm = snakemake  # noqa: F821 - injected by Snakemake
    main(list(sm.input), sm.output.md, sm.output.png, sm.output.pdf)
elif __name__ == "__main__":
    main(sys.argv[1:-2], sys.argv[-2], sys.argv[-1])
