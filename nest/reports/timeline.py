"""Simulated schedule -> a Gantt picture that stays readable at thousands of micro-batches.

Up to MAX_EXACT micro-batches every operation is drawn (nest.costs.simulate.plot_timeline). Above, the
fill and the drain are drawn to scale and the steady state between them is one compressed band
per device, labelled with the number of micro-batches it holds: the time axis is broken at
t_a and t_b (dashed lines) and [t_a, t_b] is drawn BAND_SHARE of the picture's width.
    t_a: end of device 0's forward of micro-batch min(2 p + 2, m / 3) (the fill has ended: the
         last stage has started its 1F1B steady state)
    t_b: start of device 0's backward of micro-batch m - 1 - min(2 p + 2, m / 3) (the drain has
         not begun)
An operation inside [t_a, t_b] is counted in its device's band, one crossing t_a or t_b is
drawn clipped; the drawn rectangles are bounded by the fill and drain (O(p^2) with p stages),
never by m. Rectangles are drawn as one collection per (device, kind).
"""

from __future__ import annotations

from pathlib import Path

MAX_EXACT = 64  # micro-batches: at most this many, draw every operation
BAND_SHARE = 0.3  # of the drawn width, for the compressed steady state
COLORS = {"F": "#4c72b0", "B": "#dd8452", "sync": "#55a868", "opt": "#8172b3"}
NAMES = {"F": "forward", "B": "backward", "sync": "DP sync", "opt": "optimizer"}


def plot(res, path=None, title: str = ""):
    """The timeline of a SimResult (nest.costs.simulate): exact up to MAX_EXACT micro-batches,
    compressed above. Writes `path` (and a .pdf beside a .png) if given; returns the figure."""
    window = _window(res)
    if window is None:
        from nest.costs.simulate import plot_timeline

        return plot_timeline(res, path, title=title)
    return _plot_compressed(res, window, path, title)


def _window(res):
    """(t_a, t_b) of the compressed band, or None to draw every operation."""
    m, p = res.num_microbatches, res.num_stages
    if m <= MAX_EXACT:
        return None
    # interleaved: device 0's fill already holds (v - 1) p + 2 (p - 1) chunk forwards (~p + 2
    # micro-batches), so p micro-batches past the start is past the fill
    k = max(1, min(p if res.num_chunks > 1 else 2 * p + 2, m // 3))
    dev0 = [op for op in res.timeline if op.stage % p == 0 and op.kind in ("F", "B")]
    fwd = [op.end_s for op in dev0 if op.kind == "F" and op.microbatch == k]
    bwd = [op.start_s for op in dev0 if op.kind == "B" and op.microbatch == m - 1 - k]
    if not fwd or not bwd:
        return None
    t_a, t_b = max(fwd), min(bwd)
    return (t_a, t_b) if t_b > t_a else None


class _Axis:
    """The broken time axis: identity up to t_a, [t_a, t_b] squeezed to `band`, shifted after."""

    def __init__(self, t_a: float, t_b: float, end: float):
        self.t_a, self.t_b = t_a, t_b
        outside = t_a + max(end - t_b, 0.0)
        self.band = BAND_SHARE / (1 - BAND_SHARE) * outside
        self.g = self.band / (t_b - t_a)

    def __call__(self, t: float) -> float:
        if t <= self.t_a:
            return t
        if t >= self.t_b:
            return t - (self.t_b - self.t_a) + self.band
        return self.t_a + (t - self.t_a) * self.g

    def inverse(self, x: float) -> float | None:
        if x <= self.t_a:
            return x
        if x >= self.t_a + self.band:
            return x + (self.t_b - self.t_a) - self.band
        return None  # inside the band: no tick label


def _plot_compressed(res, window, path, title):
    import matplotlib

    matplotlib.use("agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch, Rectangle
    from matplotlib.ticker import FuncFormatter

    p = res.num_stages
    t_a, t_b = window
    end = max(op.end_s for op in res.timeline)
    f = _Axis(t_a, t_b, end)
    scale = 1e3 if end < 10 else 1.0
    unit = "ms" if scale == 1e3 else "s"
    bars: dict[tuple[int, str], list[tuple[float, float]]] = {}
    inside: dict[int, set[int]] = {d: set() for d in range(p)}
    busy = [0.0] * p
    for op in res.timeline:
        d = res.device_of(op.stage)
        if op.start_s >= t_a and op.end_s <= t_b:
            if op.kind in ("F", "B"):
                inside[d].add(op.microbatch)
                busy[d] += op.end_s - op.start_s
            continue
        x0, x1 = f(op.start_s), f(op.end_s)
        bars.setdefault((d, op.kind), []).append((x0 * scale, (x1 - x0) * scale))
    fig, ax = plt.subplots(figsize=(10, 0.45 * p + 1.4))
    x_a, x_b = f(t_a) * scale, (f(t_a) + f.band) * scale
    for d in range(p):
        share = busy[d] / (t_b - t_a)
        ax.add_patch(Rectangle((x_a, d - 0.4), x_b - x_a, 0.8, facecolor="#b8c4d6",
                               edgecolor="none"))
        ax.text((x_a + x_b) / 2, d, f"{len(inside[d])} micro-batches, {share:.0%} busy",
                ha="center", va="center", fontsize=6)
    thin = sum(map(len, bars.values())) > 40 * p  # no white edges between narrow bars
    for (d, kind), spans in bars.items():
        ax.broken_barh(spans, (d - 0.4, 0.8), facecolors=COLORS[kind],
                       edgecolor="none" if thin else "white", linewidth=0 if thin else 0.3)
    for x in (x_a, x_b):
        ax.axvline(x, color="black", linestyle="--", linewidth=0.7)
    ax.xaxis.set_major_formatter(FuncFormatter(
        lambda x, _: "" if (t := f.inverse(x / scale)) is None else f"{t * scale:.4g}"))
    ax.set_xlim(0, f(end) * scale * 1.01)
    ax.set_yticks(range(p), [f"stage {d}" for d in range(p)])
    ax.set_ylim(p - 0.5, -0.5)
    ax.set_xlabel(f"time ({unit}); the steady state between the dashed lines "
                  f"({(t_b - t_a) * scale:.4g} {unit}) is compressed")
    info = (f"{res.schedule}, p={p}, m={res.num_microbatches}"
            + (f", v={res.num_chunks}" if res.num_chunks > 1 else "")
            + f", makespan {res.makespan_s * scale:.4g} {unit}")
    ax.set_title((f"{title}\n{info}" if title else info).replace("$", r"\$"), fontsize=9)
    kinds = [k for k in COLORS if any(k == kind for _, kind in bars)]
    ax.legend(handles=[Patch(color=COLORS[k], label=NAMES[k]) for k in kinds]
              + [Patch(color="#b8c4d6", label="steady state (compressed)")],
              loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=7, frameon=False)
    if path is not None:
        path = Path(path)
        fig.tight_layout()
        from nest.common.atomic_io import savefig_atomic

        savefig_atomic(fig, path)
        if path.suffix.lower() == ".png":
            savefig_atomic(fig, path.with_suffix(".pdf"))
    return fig


def num_rectangles(fig) -> int:
    """Rectangles drawn on a figure's axes: patches plus the paths of its collections (tests)."""
    n = 0
    for ax in fig.axes:
        n += len(ax.patches) + sum(len(c.get_paths()) for c in ax.collections)
    return n
