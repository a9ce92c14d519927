"""Results CSV -> throughput figures (PNG + PDF), one panel per model, one line per planner."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402

MARKERS = "osD^v<>pP*X"


def plot_throughput(df: pd.DataFrame, png: str | Path, pdf: str | Path, title: str) -> None:
    models = list(dict.fromkeys(df.model))
    planners = sorted(set(df.planner), key=lambda p: (p != "manual", p))
    fig, axes = plt.subplots(1, max(len(models), 1), figsize=(3.2 * max(len(models), 1), 3.0),
                             squeeze=False)
    for ax, model in zip(axes[0], models):
        sub = df[df.model == model]
        use_norm = sub.normalized_throughput.notna().any()
        for i, planner in enumerate(planners):
            pts = sub[(sub.planner == planner) & sub.feasible].sort_values("num_devices")
            y = pts.normalized_throughput if use_norm else pts.throughput_samples_per_s
            ax.plot(pts.num_devices, y.astype(float), marker=MARKERS[i % len(MARKERS)],
                    label=planner)
            for _, r in sub[(sub.planner == planner) & ~sub.feasible].iterrows():
                ax.plot([r.num_devices], [0], marker="x", color="grey", linestyle="none")
        ax.set_xscale("log", base=2)
        ax.set_title(model, fontsize=9)
        ax.set_xlabel("devices")
        ax.set_ylabel("throughput / Manual (smallest fit)" if use_norm else "samples/s",
                      fontsize=8)
        ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=7)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(png, dpi=120, metadata={"Software": None})
    fig.savefig(pdf, metadata={"CreationDate": None, "Producer": None})
    plt.close(fig)
