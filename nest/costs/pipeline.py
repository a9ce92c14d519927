"""A stage's place in the pipeline x per-stage times -> time per batch: the one module for both.

Every planner, bound, message and the evaluator asks this module where a stage sits (its stash,
its neighbours, its tied partner, its device group) and what a batch takes; nothing else writes
these formulas. nest.costs.critical_path holds the two closed forms too long to sit here (the 1F1B path
family and the overlapped gradient-sync tail), nest.costs.simulate the discrete-event simulation.

Position. A pipeline of p stages (device groups), stage j = 0..p-1 counted from the first (the
embedding's), m micro-batches; an interleaved plan has n = p v chunks, chunk j on device group
j mod p (`device_group`). Stage j's neighbours are stages j - 1 and j + 1 (none at the ends); the
first and the last stage of a tied model are each other's tied partner (Megatron's embedding
group), `links`. The stash is the number of micro-batches of a stage's activations held at its
memory peak (`stash`), in units of one micro-batch through the whole stage:
    1F1B         min(p - j, m)  stage 0 holds p, the last one 1 (Narayanan et al. 2021a)
    GPipe        m              every micro-batch before the first backward (Huang et al. 2019)
    interleaved  min(2 (p - d - 1) + (v - 1) p + 1, m v) / v for device d (Megatron-LM's warm-up
                 count + 1; all m when m == p), i.e. p + (p - 1) / v on device 0 (Korthikanti
                 et al. 2022, section 4.2.3)
and a stage's allocated bytes are fixed + stash x activations (`held_bytes`; nest.costs.memory
turns them into the peak).

Time per batch. Legend: F_j / B_j forward / backward time of stage j for one micro-batch (B_j
includes the recomputed forward), sf_j / sb_j its blocking sends (sf_{p-1} = sb_0 = 0),
t_j = F_j + B_j + sf_j + sb_j, u_j its gradient sync + optimizer step (+ ZeRO-1/2's weight
all-gather after it) when nothing overlaps. The training setting `pipeline_time` picks the form
(`FORMS`; one name for each, the settings' name):
    "paper"          1F1B (m + p - 1) max_j t_j (Narayanan et al. 2021a: fill, steady state and
                     drain at the bottleneck's pace; exact for equal stages, else an upper bound);
                     interleaved (m + (p - 1) / v) max_d t_d (Narayanan et al. 2021b, 2.2.2)
    "dapple"         1F1B sum_j t_j + (m - 1) max_j t_j (Fan et al. 2021, DAPPLE, section 3.2;
                     an upper bound, exact for equal stages)
    "critical_path"  1F1B: nest.costs.critical_path's path family (a lower bound within 0.4% of the
                     simulation for m >= 4p); for m < 4p the simulation
    "simulated"      the discrete-event simulation (nest.costs.simulate) of the whole batch
GPipe is exact in every form: sum_j (f_j + b_j) + (m - 1) (max_j f_j + max_j b_j), two flow
shops (Huang et al. 2019). Interleaved forms other than "paper" run the simulation.
The training setting `dp_overlap` picks the tail after the pipeline (`tail_s`): "none" max_j u_j
(the paper's, after the flush), "stage" / "bucketed" nest.costs.critical_path.dp_sync_tail_s.
`tp_comm_overlap` and `param_gather_overlap` act inside the stage kernel (t_j and u_j), so every
form prices them the same way.

Planner objectives (`objective_s`): what a planner minimises over its stage arrays, the same
forms on (t_j, u_j) or, with an overlapped sync, on the kernel's tail terms (e_j, r_j):
`solver_form` names the form a planner can optimise exactly, `EXACT` which settings it is.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from nest.costs.memory import allocatable
from nest.costs.critical_path import critical_path_1f1b, dp_sync_tail_s, fb_times

FORMS = ("paper", "dapple", "critical_path", "simulated")
OVERLAPS = ("none", "stage", "bucketed")
SCHEDULES = ("1f1b", "gpipe", "interleaved")


def check_form(form: str) -> None:
    if form not in FORMS:
        raise ValueError(f"pipeline_time: '{form}' is not one of {', '.join(FORMS)}")


# --------------------------------------------------------------------------------------------
# Position
# --------------------------------------------------------------------------------------------


def stash(p: int, j: int, m: int, schedule: str = "1f1b", v: int = 1):
    """Micro-batches of stage (or device group) j's activations held at its peak (see the
    module docstring); 1F1B: min(p - j, m), an int."""
    if schedule == "1f1b":
        return min(p - j, m)  # Narayanan et al. 2021a
    if schedule == "gpipe":
        return m  # Huang et al. 2019: every micro-batch before the first backward
    if schedule == "interleaved":
        if m == p:  # Megatron-LM: all forwards are warm-up
            return float(m)
        return min(2 * (p - j - 1) + (v - 1) * p + 1, m * v) / v
    raise ValueError(f"schedule: '{schedule}' is not one of {', '.join(SCHEDULES)}")


def stashes(schedule: str, p: int, m: int, v: int = 1) -> list[float]:
    """`stash` of every device group 0..p-1, as floats."""
    return [float(stash(p, j, m, schedule, v)) for j in range(p)]


def device_group(j: int, p: int) -> int:
    """The device group (pipeline position) that runs stage j; interleaved chunk j: j mod p."""
    return j % p


def chunks_of(d: int, p: int, n: int) -> range:
    """Stage indices of device group d among n stages: d, d + p, ... (interleaved chunks)."""
    return range(d, n, p)


def links(ids, j: int) -> dict:
    """Stage j's neighbours' devices and tied partner among the stages' device ids `ids` (one
    entry per stage, in pipeline order), as nest.costs.stage.stage_cost takes them: next_ids /
    prev_ids (None at the ends) and tied_partner (the stage at the other end, for the first and
    the last stage of a pipeline of more than one stage)."""
    last = len(ids) - 1
    return {"next_ids": ids[j + 1] if j < last else None,
            "prev_ids": ids[j - 1] if j > 0 else None,
            "tied_partner": ids[last - j] if last > 0 and j in (0, last) else None}


def held_bytes(fixed, num_stashed, act):
    """Allocated bytes of a stage: its position-free part plus its stash of activations
    (scalars or broadcasting arrays)."""
    return fixed + num_stashed * act


def stash_capacity(fixed, act, hw):
    """The most micro-batches a stage can stash and still fit (the inverse of `held_bytes`
    under nest.costs.memory.peak): floor((allocatable - fixed) / act), inf without activations,
    -1 where even the fixed part does not fit."""
    room = allocatable(hw) * (1 + 1e-9) - fixed
    with np.errstate(divide="ignore", over="ignore", invalid="ignore"):
        n = np.floor(room / act)
    return np.where(room >= 0, np.where(np.isnan(n), np.inf, n), -1)


# --------------------------------------------------------------------------------------------
# Closed forms
# --------------------------------------------------------------------------------------------


def paper_1f1b(t_max, m: int, p: int):
    """(m + p - 1) max_j t_j: fill + steady state + drain (Narayanan et al. 2021a)."""
    return (m + p - 1) * t_max


def paper_interleaved(t_max, m: int, p: int, v: int):
    """(m + (p - 1) / v) max_d t_d (Narayanan et al. 2021b, section 2.2.2)."""
    return (m + (p - 1) / v) * t_max


def dapple(t_sum, t_max, m: int):
    """sum_j t_j + (m - 1) max_j t_j (Fan et al. 2021, DAPPLE, section 3.2)."""
    return t_sum + (m - 1) * t_max


def gpipe(f, b, m: int) -> float:
    """Two flow shops of m identical jobs (Huang et al. 2019): exact."""
    return float(f.sum() + b.sum() + (m - 1) * (f.max() + b.max()))


def stage_time_s(fwd_s, bwd_s, send_fwd_s=None, send_bwd_s=None) -> np.ndarray:
    """t_j = F_j + B_j + sf_j (j < p - 1) + sb_j (j > 0): stage j's busy time per micro-batch."""
    f, b = fb_times(fwd_s, bwd_s, send_fwd_s, send_bwd_s)
    return f + b


def bubble_fraction(schedule: str, num_stages: int, num_microbatches: int,
                    num_chunks: int = 1) -> float:
    """Idle share of the pipeline time for equal stages: bubble / (ideal + bubble). Narayanan
    et al. 2021b state the ratio bubble / ideal = (p - 1) / m, divided by v when interleaved."""
    p, m, v = num_stages, num_microbatches, num_chunks
    if schedule not in SCHEDULES:
        raise ValueError(f"schedule: '{schedule}' is not one of {', '.join(SCHEDULES)}")
    bubble = (p - 1) / (v if schedule == "interleaved" else 1)
    return bubble / (m + bubble)


def time_1f1b_s(fwd_s, bwd_s, num_microbatches: int, send_fwd_s=None, send_bwd_s=None,
                form: str = "paper") -> float:
    """Time of one batch's 1F1B pipeline (without DP sync and optimizer step) from per-stage
    F, B and sends."""
    f, b = fb_times(fwd_s, bwd_s, send_fwd_s, send_bwd_s)
    t, p, m = f + b, len(f), num_microbatches
    if form == "paper":
        return float(paper_1f1b(t.max(), m, p))
    if form == "dapple":
        return float(dapple(t.sum(), t.max(), m))
    if form == "critical_path":
        if m < p:  # stages with m <= p - j - 1 run GPipe-like; the path family assumes m >= p
            from nest.costs.simulate import simulate

            return simulate("1f1b", f, b, m).pipeline_s
        return critical_path_1f1b(f, b, m)
    raise ValueError(f"form: '{form}' is not one of paper, dapple, critical_path")


def time_gpipe_s(fwd_s, bwd_s, num_microbatches: int, send_fwd_s=None,
                 send_bwd_s=None) -> float:
    """GPipe's pipeline time from per-stage F, B and sends (`gpipe`)."""
    f, b = fb_times(fwd_s, bwd_s, send_fwd_s, send_bwd_s)
    return gpipe(f, b, num_microbatches)


def time_interleaved_s(fwd_s, bwd_s, num_microbatches: int, num_chunks: int,
                       send_fwd_s=None, send_bwd_s=None) -> float:
    """Interleaved 1F1B from per-device F, B (all chunks) and per-chunk sends: each of the v
    chunks sends its own activation and gradient, t_d = F_d + B_d + v (sf_d + sb_d)."""
    F = np.atleast_1d(np.asarray(fwd_s, dtype=float))
    p, v = len(F), num_chunks

    def vec(x):
        return np.zeros(p) if x is None else np.broadcast_to(np.asarray(x, dtype=float), (p,))

    t = F + vec(bwd_s) + v * (vec(send_fwd_s) + vec(send_bwd_s))
    return float(paper_interleaved(t.max(), num_microbatches, p, v))


# --------------------------------------------------------------------------------------------
# The batch time of a plan (the evaluator's)
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class DeviceTimes:
    """Per device group d = 0..p-1 (lists): t the busy time per micro-batch (fwd + bwd + sends;
    the chunks' sum when interleaved), its forward and backward parts and sends, the gradient
    sync (gather included), the optimizer step, ZeRO-1/2's weight all-gather (gather), the
    recomputed forward inside the backward, and the gradient buckets."""

    t: list
    fwd: list
    bwd: list
    send_fwd: list
    send_bwd: list
    sync: list
    opt: list
    gather: list
    recompute: list
    buckets: list

    @property
    def p(self) -> int:
        return len(self.t)


def pipeline_s(dt: DeviceTimes, schedule: str, form: str, m: int, v: int = 1) -> float:
    """Time from the first forward to the last backward of one batch, per the module
    docstring's forms."""
    check_form(form)
    p = dt.p
    if schedule == "gpipe":
        return time_gpipe_s(dt.fwd, dt.bwd, m, dt.send_fwd, dt.send_bwd)
    t_max = max(dt.t)
    if form == "paper":
        if schedule == "interleaved":
            return paper_interleaved(t_max, m, p, v)
        return paper_1f1b(t_max, m, p)
    if form == "dapple" and schedule == "1f1b":
        return dapple(sum(dt.t), t_max, m)
    if form == "critical_path" and schedule == "1f1b" and m >= 4 * p:
        return time_1f1b_s(dt.fwd, dt.bwd, m, dt.send_fwd, dt.send_bwd, form="critical_path")
    return simulate_times(dt, schedule, m, v, None).pipeline_s


def tail_s(dt: DeviceTimes, schedule: str, overlap: str, m: int, v: int = 1) -> float:
    """Gradient sync + optimizer step (+ ZeRO-1/2's weight all-gather) after the last backward:
    "none" max_j (S_j + O_j) (they do not overlap); "stage" / "bucketed"
    nest.costs.critical_path.dp_sync_tail_s (exact for equal stages, an upper bound otherwise); the
    all-gather comes after the optimizer step and never overlaps the backward."""
    if overlap == "none":
        return max(s + o for s, o in zip(dt.sync, dt.opt))
    return dp_sync_tail_s([s - g for s, g in zip(dt.sync, dt.gather)], dt.fwd, dt.bwd,
                          dt.send_fwd, dt.send_bwd, overlap=overlap, num_buckets=dt.buckets,
                          recompute_s=dt.recompute, schedule=schedule,
                          num_chunks=v if schedule == "interleaved" else 1,
                          num_microbatches=m, opt_s=dt.opt, gather_s=dt.gather)


def simulate_times(dt: DeviceTimes, schedule: str, m: int, v: int = 1,
                   overlap: str | None = None):
    """Discrete-event simulation (nest.costs.simulate) of the schedule with these times; overlap
    None: the pipeline alone, else the gradient sync and optimizer step too (interleaved: per
    chunk, the mean of the device's chunks' sends)."""
    from nest.costs.simulate import simulate

    v = v if schedule == "interleaved" else 1
    kw = {}
    if overlap is not None:
        kw = dict(sync_s=[s - g for s, g in zip(dt.sync, dt.gather)], opt_s=dt.opt,
                  overlap=overlap, num_buckets=dt.buckets, recompute_s=dt.recompute,
                  gather_s=dt.gather)
    return simulate(schedule, dt.fwd, dt.bwd, m, num_chunks=v,
                    send_fwd_s=[x / v for x in dt.send_fwd],
                    send_bwd_s=[x / v for x in dt.send_bwd], **kw)


def batch_time_s(dt: DeviceTimes, schedule: str, training, m: int, v: int = 1,
                 simulated: bool = False):
    """(pipeline, total, simulation or None): the time per batch under the training settings'
    pipeline_time and dp_overlap; with `simulated` the simulation is run (and returned) even
    when the form does not need it."""
    form = training.pipeline_time
    check_form(form)
    sim = None
    if simulated or form == "simulated":
        sim = simulate_times(dt, schedule, m, v, training.dp_overlap)
    if form == "simulated":
        return sim.pipeline_s, sim.makespan_s, sim
    pipe = pipeline_s(dt, schedule, form, m, v)
    return pipe, pipe + tail_s(dt, schedule, training.dp_overlap, m, v), sim


# --------------------------------------------------------------------------------------------
# Planner objectives over stage arrays
# --------------------------------------------------------------------------------------------

# (pipeline_time, overlapped sync) pairs whose batch time a planner's stage-level objective
# equals exactly (1F1B): the rest are optimised through `solver_form`'s upper bound
EXACT = {("paper", False), ("dapple", False), ("paper", True)}


def solver_form(training) -> str:
    """The form a planner optimises over stage arrays: "dapple" when the settings ask for it,
    else "paper" (the paper's form, an upper bound of critical_path and simulated)."""
    return "dapple" if training.pipeline_time == "dapple" else "paper"


def is_exact(training) -> bool:
    """Whether `objective_s` under `solver_form` equals the evaluator's time per batch."""
    return (training.pipeline_time, training.dp_overlap != "none") in EXACT


def bottleneck_weight(form: str, m: int, p: int) -> int:
    """C in C max_j t_j: m + p - 1 for the paper's 1F1B form, m for DAPPLE's (whose sum_j t_j
    >= max_j t_j makes C max t + max u a lower bound of it)."""
    return m if form == "dapple" else m + p - 1


def overlap_tail(e, r) -> float:
    """max(0, max_j (e_j - D_j)), D_j = sum_{k<j} r_k: the overlapped sync's tail on the
    kernel's terms (nest.costs.stage.overlap_terms), as nest.costs.critical_path.dp_sync_tail_s prices it."""
    D, worst = 0.0, 0.0
    for ej, rj in zip(e, r):
        worst = max(worst, float(ej) - D)
        D += float(rj)
    return worst


def objective_s(form: str, m: int, t, u=None, e=None, r=None) -> float:
    """A 1F1B plan's time per batch from its stages' kernel values (lists in stage order):
    the pipeline in `form` ("paper" or "dapple") plus max_j u_j, or with the overlapped sync's
    terms e, r the tail `overlap_tail`."""
    p, t_max = len(t), max(t)
    pipe = dapple(sum(t), t_max, m) if form == "dapple" else paper_1f1b(t_max, m, p)
    return float(pipe + (overlap_tail(e, r) if e is not None else max(u)))


def alpa_objective(t, num_microbatches: int) -> float:
    """Alpa's inter-operator objective (Zheng et al. 2022, Eq. 2): sum_i t_i + (B - 1) max_j t_j
    with t_i the stage latencies (Alpa-E's, gradient sync amortised inside them): DAPPLE's form,
    part of what Alpa is (baselines.alpa_e optimises it whatever pipeline_time says)."""
    return float(dapple(sum(t), max(t), num_microbatches))


def order_1f1b(p: int, m: int, j: int) -> list[tuple[str, int, int]]:
    """Stage j's operation order under 1F1B (PipeDream-Flush, Narayanan et al. 2021a, section 3;
    Megatron-LM's forward_backward_pipelining_without_interleaving): min(p - j - 1, m) warm-up forwards (the stash less the forward in flight),
    then one forward and one backward at a time, then the remaining backwards.
    ('F' | 'B', stage, micro-batch) per operation."""
    warm = min(p - j - 1, m)
    ops = [("F", j, i) for i in range(warm)]
    for i in range(m - warm):
        ops += [("F", j, warm + i), ("B", j, i)]
    ops += [("B", j, i) for i in range(m - warm, m)]
    return ops


def order_gpipe(p: int, m: int, j: int) -> list[tuple[str, int, int]]:
    """Stage j's operation order under GPipe (Huang et al. 2019, section 2.3): all m forwards,
    then all m backwards, the last micro-batch first (as autograd unwinds them)."""
    return [("F", j, i) for i in range(m)] + [("B", j, i) for i in reversed(range(m))]


def interleaved_order(p: int, m: int, v: int, d: int, group: int | None = None):
    """Device d's operation order under Megatron-LM's interleaved 1F1B (Narayanan et al. 2021b,
    section 2.2; megatron/core/pipeline_parallel/schedules.py, forward_backward_pipelining_with_
    interleaving): forwards run chunk 0 for `group` consecutive micro-batches (Megatron's
    microbatch_group_size_per_vp_stage, default p; the Llama 3 paper's N, Grattafiori et al.
    2024, section 3.3.2), then chunk 1, ...; backwards the same with the chunks reversed.
    Warm-up: 2 (p - d - 1) + (v - 1) group forwards (all of them when m = p), then one forward
    and one backward at a time.
    Yields ('F' | 'B', chunk, micro-batch)."""
    n = group or p
    total = m * v

    def fwd(k):
        return (k // n) % v, (k // (n * v)) * n + k % n

    def bwd(k):
        c, mb = fwd(k)
        return v - 1 - c, mb

    # m = p: every forward is warm-up (Megatron-LM's interleaved schedule, all_warmup_microbatches,
    # as `stash` prices it)
    warm = total if m == p else min(2 * (p - d - 1) + (v - 1) * n, total)
    for k in range(warm):
        yield ("F",) + fwd(k)
    for k in range(total - warm):
        yield ("F",) + fwd(warm + k)
        yield ("B",) + bwd(k)
    for k in range(total - warm, total):
        yield ("B",) + bwd(k)


def interleaved_peak_activations(act_C, p: int, m: int, d: int, group: int | None = None):
    """Peak activation bytes device d holds under interleaved 1F1B, act_C[c]: what one
    micro-batch leaves stashed in its chunk c. Walks `interleaved_order`, so chunks of unequal
    size are weighed as they are held: Meta's Llama 3 405B layout puts only the embedding in the
    first chunk and only the head in the last (Grattafiori et al. 2024, section 3.3.2), and the
    extra warm-up micro-batches of the first device sit in that embedding chunk. With equal
    chunks this is Korthikanti et al. 2022's p (1 + (p - 1) / (p v)) micro-batches of a stage
    (section 4.2.3) on the first device."""
    held = peak = 0.0
    for kind, c, _ in interleaved_order(p, m, len(act_C), d, group):
        held += act_C[c] if kind == "F" else -act_C[c]
        peak = max(peak, held)
    return peak
