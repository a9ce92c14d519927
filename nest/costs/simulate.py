"""Pipeline schedule x per-stage op times -> discrete-event simulation: makespan and timeline.

Every device runs its operations in the fixed order its schedule prescribes; an operation starts
when its device is free and its input has arrived, and its end is an event that may let the next
operation of its own device or of a neighbour start. The per-device orders (1F1B, GPipe,
Megatron-LM's interleaved 1F1B) are nest.costs.pipeline's `order_1f1b`, `order_gpipe` and
`interleaved_order`, where a stage's place in the pipeline is written once.
Dependencies: forward of micro-batch i on (virtual) stage s needs forward of i on s - 1 plus its
transfer; backward of i on s needs backward of i on s + 1 plus its transfer and its own forward.
Transfers: with `blocking_sends` (default, the evaluator's pricing) the sender is busy for the
send right after the op (F_s + send_fwd_s, B_s + send_bwd_s), as in Megatron's synchronous
p2p; otherwise the send is a pure delay on the receiver's input (links never congest).
`overlap_p2p` (interleaved; Megatron-Core's overlap_p2p_comm, nest.costs.pipeline): the warm-up
forwards and cool-down backwards keep blocking sends; a steady-state operation's send is a
delay on the receiver's input, and the device's operation three after it waits for it when the
one two after it is a steady one too (the send is waited after that operation's compute).
Data-parallel gradient sync (optional, per device): "none" starts every device's sync after the
whole flush; "stage" after the device's own last backward (Megatron without overlap_grad_reduce:
each stage's DP group is independent); "bucketed" splits it in k equal buckets, bucket i ready
(i + 1) / k of the way through the gradient part of the device's last backward (PyTorch DDP, Li
et al. 2020 section 3.2.3; Megatron overlap_grad_reduce), buckets sent one after another.

Legend: p stages (devices), v chunks per device, P = p v virtual stages, m micro-batches.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

import numpy as np

from nest.costs.pipeline import (OVERLAPS, SCHEDULES, interleaved_order, interleaved_warmup,
                                 order_1f1b, order_gpipe)


class Op(NamedTuple):
    """One timeline entry. `stage` is the virtual stage (== device unless interleaved);
    kind is "F", "B", "sync" or "opt" (micro-batch -1 for sync buckets and the optimizer)."""

    stage: int
    kind: str
    microbatch: int
    start_s: float
    end_s: float


@dataclass
class SimResult:
    schedule: str
    num_stages: int  # p, devices
    num_chunks: int  # v
    num_microbatches: int
    makespan_s: float  # end of the last backward, or of the last sync bucket if any
    pipeline_s: float  # end of the last backward
    timeline: list[Op] = field(default_factory=list)
    peak_in_flight: list[int] = field(default_factory=list)  # per device, (chunk, mb) stashed

    def device_of(self, stage: int) -> int:
        return stage % self.num_stages

    def stash_microbatches(self) -> list[float]:
        """Peak stash per device in units of one micro-batch of the whole device's activations
        (equal chunks assumed: one chunk's activations are 1/v of the device's)."""
        return [n / self.num_chunks for n in self.peak_in_flight]

    def bubble_fraction(self) -> float:
        """Idle share of the pipeline makespan, averaged over devices."""
        busy = np.zeros(self.num_stages)
        for op in self.timeline:
            if op.kind in ("F", "B"):
                busy[self.device_of(op.stage)] += op.end_s - op.start_s
        return float(1 - busy.mean() / self.pipeline_s)


# --------------------------------------------------------------------------------------------
# Per-device operation orders: lists of (kind, virtual stage, micro-batch)
# --------------------------------------------------------------------------------------------


def order_interleaved(p: int, m: int, v: int, d: int) -> list[tuple[str, int, int]]:
    """Megatron-LM's interleaved order on device d (nest.costs.pipeline.interleaved_order, with
    its default group of p micro-batches), chunk c as virtual stage c p + d."""
    if m % p:
        raise ValueError(f"interleaved schedule: num_microbatches={m} must be a multiple of "
                         f"the number of stages p={p} (Megatron-LM requires it)")
    return [(kind, c * p + d, mb) for kind, c, mb in interleaved_order(p, m, v, d)]


# --------------------------------------------------------------------------------------------
# The simulation
# --------------------------------------------------------------------------------------------


def _per_virtual(x, p: int, v: int, name: str, split: bool = True) -> np.ndarray:
    """Per-virtual-stage vector (index c p + d): from a scalar, a per-device vector of length p
    (times split evenly over the v chunks, or repeated for transfers), or a (v, p) array
    [chunk, device]."""
    a = np.zeros(p) if x is None else np.asarray(x, dtype=float)
    if a.ndim == 0:
        a = np.full(p, float(a))
    if a.shape == (p,):
        return np.tile(a / v if split else a, v)
    if a.shape == (v, p):
        return a.reshape(-1).copy()
    raise ValueError(f"{name}: expected shape ({p},) or ({v}, {p}), got {a.shape}")


def simulate(schedule: str, fwd_s, bwd_s, num_microbatches: int, *, send_fwd_s=None,
             send_bwd_s=None, num_chunks: int = 1, blocking_sends: bool = True,
             sync_s=None, overlap: str = "none", num_buckets=1,
             recompute_s=None, opt_s=None, gather_s=None, overlap_p2p: bool = False
             ) -> SimResult:
    """Simulate one batch. fwd_s / bwd_s / send_*: per device (length p; the interleaved
    schedule splits each evenly over its v chunks) or, interleaved, a (v, p) array [chunk,
    device] for virtual stage c p + d; send_fwd_s is stage s -> s + 1, send_bwd_s is s -> s - 1
    (the ends' missing sends are ignored; per device, interleaved, every chunk of device d
    sends the same boundary activation, and send_fwd_s[p - 1] is the wrap p - 1 -> 0).
    sync_s / recompute_s / opt_s: per device (length p); recompute_s is the recomputed-forward
    part of a device's backward (gradients only appear after it); opt_s, the optimizer step,
    runs after the device's last sync bucket; gather_s, the all-gather of the stepped weights
    (ZeRO-1/2), after the optimizer step. num_buckets: one k, or one per device."""
    if schedule not in SCHEDULES:
        raise ValueError(f"schedule: '{schedule}' is not one of {SCHEDULES}")
    if overlap not in OVERLAPS:
        raise ValueError(f"overlap: '{overlap}' is not one of {OVERLAPS}")
    v = num_chunks if schedule == "interleaved" else 1
    if v < 1:
        raise ValueError(f"num_chunks: {v} must be >= 1")
    F0 = np.asarray(fwd_s, dtype=float)
    p = F0.shape[-1] if F0.ndim else 1
    m = num_microbatches
    if m < 1:
        raise ValueError(f"num_microbatches: {m} must be >= 1")
    P = p * v
    F = _per_virtual(fwd_s, p, v, "fwd_s")
    B = _per_virtual(bwd_s, p, v, "bwd_s")
    sf = _per_virtual(send_fwd_s, p, v, "send_fwd_s", split=False)
    sb = _per_virtual(send_bwd_s, p, v, "send_bwd_s", split=False)
    sf[P - 1] = 0.0
    sb[0] = 0.0

    if schedule == "1f1b":
        orders = [order_1f1b(p, m, j) for j in range(p)]
    elif schedule == "gpipe":
        orders = [order_gpipe(p, m, j) for j in range(p)]
    else:
        orders = [order_interleaved(p, m, v, d) for d in range(p)]

    # busy time of each op on its device; delay before its output reaches the neighbour
    busy = {"F": F + (sf if blocking_sends else 0), "B": B + (sb if blocking_sends else 0)}
    delay = {"F": np.zeros(P) if blocking_sends else sf, "B": np.zeros(P) if blocking_sends else sb}
    send = {"F": sf, "B": sb}
    # overlap_p2p: device d's ops [lo, hi) are the steady state's, their sends under compute
    warm = [interleaved_warmup(p, m, v, d) for d in range(p)]
    steady = [(w, 2 * m * v - w) if overlap_p2p and schedule == "interleaved" else (0, 0)
              for w in warm]
    hold: list[dict[int, float]] = [{} for _ in range(p)]  # op index -> a send it waits for
    done: dict[tuple[str, int, int], float] = {}  # op -> time its output is at the neighbour
    free = [0.0] * p
    ptr = [0] * p
    timeline: list[Op] = []
    left = sum(len(o) for o in orders)
    while left:
        progressed = False
        for d in range(p):
            while ptr[d] < len(orders[d]):
                kind, s, i = orders[d][ptr[d]]
                if kind == "F":
                    dep = ("F", s - 1, i) if s > 0 else None
                else:
                    dep = ("B", s + 1, i) if s < P - 1 else ("F", s, i)
                if dep is not None and dep not in done:
                    break
                start = max(free[d], done[dep] if dep is not None else 0.0,
                            hold[d].pop(ptr[d], 0.0))
                lo, hi = steady[d]
                if lo <= ptr[d] < hi:  # posted, not waited: the receiver sees it send_s later
                    end = start + (F if kind == "F" else B)[s]
                    done[(kind, s, i)] = end + send[kind][s]
                    if ptr[d] + 2 < hi:  # waited after the compute of the op two after it
                        hold[d][ptr[d] + 3] = end + send[kind][s]
                else:
                    end = start + busy[kind][s]
                    done[(kind, s, i)] = end + delay[kind][s]
                free[d] = end
                timeline.append(Op(s, kind, i, start, end))
                ptr[d] += 1
                left -= 1
                progressed = True
        if not progressed:
            raise AssertionError(f"{schedule} schedule deadlocked (p={p}, m={m}, v={v})")

    pipeline_s = max(op.end_s for op in timeline)
    peak = _peak_in_flight(timeline, p)
    res = SimResult(schedule, p, v, m, pipeline_s, pipeline_s, timeline, peak)
    if sync_s is not None:
        _add_sync(res, np.asarray(sync_s, dtype=float), B, recompute_s, overlap, num_buckets,
                  opt_s, gather_s)
    res.timeline.sort(key=lambda op: (op.start_s, op.stage))
    return res


def _peak_in_flight(timeline: list[Op], p: int) -> list[int]:
    """Per device, the most (chunk, micro-batch) activations held at once: a forward's
    activations are allocated when it starts and freed when its backward ends."""
    events: list[list[tuple[float, int]]] = [[] for _ in range(p)]
    for op in timeline:
        d = op.stage % p
        if op.kind == "F":
            events[d].append((op.start_s, 1))
        elif op.kind == "B":
            events[d].append((op.end_s, -1))
    peaks = []
    for ev in events:
        n = best = 0
        for _, x in sorted(ev, key=lambda e: (e[0], e[1])):  # frees before allocations on ties
            n += x
            best = max(best, n)
        peaks.append(best)
    return peaks


def _add_sync(res: SimResult, sync: np.ndarray, B: np.ndarray, recompute_s, overlap: str,
              num_buckets, opt_s=None, gather_s=None) -> None:
    p = res.num_stages
    if sync.shape != (p,):
        raise ValueError(f"sync_s: expected {p} values (one per device), got shape {sync.shape}")
    R = np.zeros(p) if recompute_s is None else np.asarray(recompute_s, dtype=float)
    O = np.zeros(p) if opt_s is None else np.asarray(opt_s, dtype=float)
    A = np.zeros(p) if gather_s is None else np.asarray(gather_s, dtype=float)
    K = np.broadcast_to(np.asarray(num_buckets), (p,))
    last_b: dict[int, Op] = {}
    for op in res.timeline:
        d = op.stage % p
        if op.kind == "B" and (d not in last_b or op.end_s > last_b[d].end_s):
            last_b[d] = op
    ends = [res.pipeline_s]
    for d in range(p):
        if sync[d] + O[d] + A[d] <= 0:
            continue
        lb, k = last_b[d], max(int(K[d]), 1)
        if overlap == "none":
            ready = [res.pipeline_s] * k
        elif overlap == "stage":
            ready = [lb.end_s] * k
        else:
            grad0 = lb.start_s + R[d] / res.num_chunks if res.num_chunks > 1 else lb.start_s + R[d]
            window = B[lb.stage] - (R[d] / res.num_chunks if res.num_chunks > 1 else R[d])
            ready = [grad0 + (b + 1) / k * window for b in range(k)]
        t = 0.0
        for b in range(k):
            start = max(t, ready[b])
            t = start + sync[d] / k
            if sync[d] > 0:
                res.timeline.append(Op(d, "sync", -1, start, t))
        if O[d] > 0:  # the optimizer step needs every synced gradient
            start, t = max(t, ready[-1]), max(t, ready[-1]) + O[d]
            res.timeline.append(Op(d, "opt", -1, start, t))
        if A[d] > 0:  # the stepped weights' all-gather (ZeRO-1/2)
            start, t = max(t, ready[-1]), max(t, ready[-1]) + A[d]
            res.timeline.append(Op(d, "sync", -1, start, t))
        ends.append(t)
    res.makespan_s = max(ends)


# --------------------------------------------------------------------------------------------
# Plot
# --------------------------------------------------------------------------------------------


def plot_timeline(res: SimResult, path: str | Path | None = None, ax=None, title: str = ""):
    """Gantt chart of a simulated schedule, one row per device (agg backend). Writes `path`
    (and its .pdf sibling when it is a .png) if given; returns the figure."""
    import matplotlib

    matplotlib.use("agg")
    import matplotlib.pyplot as plt

    fig = None
    if ax is None:
        fig, ax = plt.subplots(figsize=(10, 0.45 * res.num_stages + 1.2))
    else:
        fig = ax.figure
    colors = {"F": "#4c72b0", "B": "#dd8452", "sync": "#55a868", "opt": "#8172b3"}
    scale = 1e3 if res.makespan_s < 10 else 1.0
    unit = "ms" if scale == 1e3 else "s"
    for op in res.timeline:
        d = res.device_of(op.stage)
        chunk = op.stage // res.num_stages
        alpha = 1.0 - 0.35 * chunk / max(res.num_chunks - 1, 1) if res.num_chunks > 1 else 1.0
        ax.broken_barh([(op.start_s * scale, (op.end_s - op.start_s) * scale)], (d - 0.4, 0.8),
                       facecolors=colors[op.kind], edgecolor="white", linewidth=0.3, alpha=alpha)
        if op.kind in ("F", "B") and res.num_microbatches <= 32:
            ax.text((op.start_s + op.end_s) / 2 * scale, d, str(op.microbatch), ha="center",
                    va="center", fontsize=6, color="white")
    ax.set_yticks(range(res.num_stages), [f"stage {d}" for d in range(res.num_stages)])
    ax.invert_yaxis()
    ax.set_xlabel(f"time ({unit})")
    ax.set_title(title or f"{res.schedule}: p={res.num_stages}, m={res.num_microbatches}"
                 + (f", v={res.num_chunks}" if res.num_chunks > 1 else "")
                 + f", makespan {res.makespan_s * scale:.3g} {unit}")
    from matplotlib.patches import Patch

    kinds = [k for k in colors if any(op.kind == k for op in res.timeline)]
    ax.legend(handles=[Patch(color=colors[k], label={"F": "forward", "B": "backward",
                                                    "sync": "DP sync",
                                                    "opt": "optimizer"}[k]) for k in kinds],
              loc="upper right", fontsize=7)
    if path is not None:
        path = Path(path)
        fig.tight_layout()
        from nest.common.atomic_io import savefig_atomic

        savefig_atomic(fig, path)
        if path.suffix == ".png":
            savefig_atomic(fig, path.with_suffix(".pdf"))
    return fig
