"""A stage's place in the pipeline x per-stage times -> time per batch: the one module for both.

Every planner, bound, message and the evaluator asks this module where a stage sits (its stash,
its neighbours, its tied partner, its device group) and what a batch takes; nothing else writes
these formulas, including the two longer closed forms at its end (the 1F1B path family and the
overlapped gradient-sync tail); nest.costs.simulate holds the discrete-event simulation.

Position. A pipeline of p stages (device groups), stage j = 0..p-1 counted from the first (the
embedding's), m micro-batches; an interleaved plan has n = p v chunks, chunk j on device group
j mod p (`device_group`). Stage j's neighbours are stages j - 1 and j + 1 (none at the ends); the
first and the last stage of a tied model are each other's tied partner (Megatron's embedding
group), `links`. The stash is the number of micro-batches of a stage's activations held at its
memory peak (`stash`), in units of one micro-batch through the whole stage:
    1F1B         min(p - j, m)  stage 0 holds p, the last one 1 (Narayanan et al. 2021a)
    GPipe        m              every micro-batch before the first backward (Huang et al. 2019)
    interleaved  min(2 (p - d - 1) + (v - 1) p + 1, m v) / v for device d (Megatron-Core's warm-up
                 count + 1, megatron/core/pipeline_parallel/schedules.py,
                 get_pp_rank_microbatches: every forward a warm-up one when the count reaches
                 m v), i.e. p + (p - 1) / v on device 0 (Korthikanti et al. 2022, section 4.2.3).
                 Megatron-LM before November 2024 (commit 4295be1, "tunable schedule") also made
                 every forward of every device a warm-up one when m == p; the current code does
                 not, and for m == p it holds fewer on the last devices (d > p / 2 - 1)
and a stage's allocated bytes are fixed + stash x activations, or its optimizer step's bytes if
more (`held_bytes`; nest.costs.memory turns them into the peak).

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
    "critical_path"  1F1B: the 1F1B path family below (a lower bound within 0.4% of the
                     simulation for m >= 4p); for m < 4p the simulation
    "simulated"      the discrete-event simulation (nest.costs.simulate) of the whole batch
GPipe is exact in every form: sum_j (f_j + b_j) + (m - 1) (max_j f_j + max_j b_j), two flow
shops (Huang et al. 2019). Interleaved forms other than "paper" run the simulation.
The training setting `dp_overlap` picks the tail after the pipeline (`tail_s`): "none" max_j u_j
(the paper's, after the flush), "stage" / "bucketed" nest.costs.pipeline.dp_sync_tail_s.
`tp_comm_overlap` and `param_gather_overlap` act inside the stage kernel (t_j and u_j), so every
form prices them the same way. `overlap_p2p_comm` (interleaved only) leaves in t_d only the sends
of the warm-up forwards and cool-down backwards (`interleaved_busy`, below).

Planner objectives (`objective_s`): what a planner minimises over its stage arrays, the same
forms on (t_j, u_j) or, with an overlapped sync, on the kernel's tail terms (e_j, r_j):
`solver_form` names the form a planner can optimise exactly, `EXACT` which settings it is.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from nest.costs.memory import allocatable, allocated

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
    if schedule == "interleaved":  # Megatron-Core's warm-up count + 1 (module docstring)
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


def held_bytes(fixed, num_stashed, act, step):
    """Allocated bytes of a stage: its position-free part plus its stash of activations, or
    what its optimizer step holds if more (step: nest.costs.stage.step_bytes;
    nest.costs.memory.allocated). Scalars or broadcasting arrays."""
    return allocated(fixed + num_stashed * act, step)


def stash_capacity(fixed, act, hw, step):
    """The most micro-batches a stage can stash and still fit (the inverse of `held_bytes`
    under nest.costs.memory.peak): floor((allocatable - fixed) / act), inf without activations,
    -1 where even the fixed part, or what the optimizer step holds, does not fit (the step's
    bytes do not depend on the stash: max(fixed + s act, step) <= cap iff both are)."""
    cap = allocatable(hw) * (1 + 1e-9)
    room = cap - fixed
    with np.errstate(divide="ignore", over="ignore", invalid="ignore"):
        n = np.floor(room / act)
    return np.where((room >= 0) & (step <= cap), np.where(np.isnan(n), np.inf, n), -1)


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


def pipeline_s(dt: DeviceTimes, schedule: str, form: str, m: int, v: int = 1,
               overlap_p2p: bool = False) -> float:
    """Time from the first forward to the last backward of one batch, per the module
    docstring's forms; overlap_p2p: the interleaved schedule's sends under compute
    (overlap_p2p_comm; the paper's form on `interleaved_busy`; other schedules ignore it)."""
    check_form(form)
    p = dt.p
    if schedule == "gpipe":
        return time_gpipe_s(dt.fwd, dt.bwd, m, dt.send_fwd, dt.send_bwd)
    t_max = max(dt.t)
    if form == "paper":
        if schedule == "interleaved":
            busy = interleaved_busy(dt.t, dt.send_fwd, dt.send_bwd, m, v, overlap_p2p)
            return paper_interleaved(float(busy.max()), m, p, v)
        return paper_1f1b(t_max, m, p)
    if form == "dapple" and schedule == "1f1b":
        return dapple(sum(dt.t), t_max, m)
    if form == "critical_path" and schedule == "1f1b" and m >= 4 * p:
        return time_1f1b_s(dt.fwd, dt.bwd, m, dt.send_fwd, dt.send_bwd, form="critical_path")
    return simulate_times(dt, schedule, m, v, None, overlap_p2p).pipeline_s


def tail_s(dt: DeviceTimes, schedule: str, overlap: str, m: int, v: int = 1) -> float:
    """Gradient sync + optimizer step (+ ZeRO-1/2's weight all-gather) after the last backward:
    "none" max_j (S_j + O_j) (they do not overlap); "stage" / "bucketed"
    nest.costs.pipeline.dp_sync_tail_s (exact for equal stages, an upper bound otherwise); the
    all-gather comes after the optimizer step and never overlaps the backward."""
    if overlap == "none":
        return max(s + o for s, o in zip(dt.sync, dt.opt))
    return dp_sync_tail_s([s - g for s, g in zip(dt.sync, dt.gather)], dt.fwd, dt.bwd,
                          dt.send_fwd, dt.send_bwd, overlap=overlap, num_buckets=dt.buckets,
                          recompute_s=dt.recompute, schedule=schedule,
                          num_chunks=v if schedule == "interleaved" else 1,
                          num_microbatches=m, opt_s=dt.opt, gather_s=dt.gather)


def simulate_times(dt: DeviceTimes, schedule: str, m: int, v: int = 1,
                   overlap: str | None = None, overlap_p2p: bool = False):
    """Discrete-event simulation (nest.costs.simulate) of the schedule with these times; overlap
    None: the pipeline alone, else the gradient sync and optimizer step too (interleaved: a
    device's compute split evenly over its chunks, its sends over the chunks that send,
    `interleaved_chunk_sends`; overlap_p2p: the steady state's sends under compute, as
    overlap_p2p_comm runs them)."""
    from nest.costs.simulate import simulate

    v = v if schedule == "interleaved" else 1
    kw = {}
    if overlap is not None:
        kw = dict(sync_s=[s - g for s, g in zip(dt.sync, dt.gather)], opt_s=dt.opt,
                  overlap=overlap, num_buckets=dt.buckets, recompute_s=dt.recompute,
                  gather_s=dt.gather)
    if v > 1:
        sf, sb = interleaved_chunk_sends(dt.send_fwd, dt.send_bwd, v)
    else:
        sf, sb = dt.send_fwd, dt.send_bwd
    return simulate(schedule, dt.fwd, dt.bwd, m, num_chunks=v, send_fwd_s=sf, send_bwd_s=sb,
                    overlap_p2p=overlap_p2p and v > 1, **kw)


def interleaved_chunk_sends(send_fwd, send_bwd, v: int) -> tuple[np.ndarray, np.ndarray]:
    """(v, p) arrays [chunk, device group]: the blocking send after each chunk's forward (of
    its output) and backward (of its input's gradient), as the simulation runs them, from each
    group's sums over its chunks (DeviceTimes.send_fwd / send_bwd): a group's sum split evenly
    over its chunks that send. Megatron-Core's interleaved loop sends no activation from the
    last virtual stage (chunk v - 1 of group p - 1) and no gradient from the first (chunk 0 of
    group 0): schedules.py, forward_backward_pipelining_with_interleaving, sets output_tensor /
    input_tensor_grad to None there (0.16.1); every other chunk sends, group p - 1's chunks to
    group 0 (p2p_communication: next rank (r + 1) mod p) and back. The stage kernel prices those
    two chunks without the send (nest.costs.pipeline.links), so those two sums hold v - 1
    sends, and each sending chunk gets sum / (v - 1) there, sum / v elsewhere: a group's ops
    send exactly its sum per micro-batch."""
    sf = np.array(send_fwd, dtype=float)
    sb = np.array(send_bwd, dtype=float)
    p = len(sf)
    nf, nb = np.full(p, float(v)), np.full(p, float(v))
    nf[-1] = nb[0] = max(v - 1, 1)
    SF, SB = np.tile(sf / nf, (v, 1)), np.tile(sb / nb, (v, 1))
    SF[v - 1, p - 1] = 0.0
    SB[0, 0] = 0.0
    return SF, SB


# ---- overlap_p2p_comm: the interleaved schedule's sends under compute ------------------------
# Megatron-Core's forward_backward_pipelining_with_interleaving with config.overlap_p2p_comm
# (megatron/core/pipeline_parallel/schedules.py at core_v0.16.1, the same waits in core_v0.14.0 -
# v0.17.0; overlap_p2p_comm_warmup_flush False, its default; docs/modeling.md, "Pipeline sends
# under compute", for core_r0.8.0's and core_v0.18.0's differences):
#   warm-up   every forward's send is blocking: send_forward_recv_forward without
#             overlap_p2p_comm waits on its send (and the next input's receive);
#   steady    pp_post_forward / pp_post_backward post the send (and the next receive) and return:
#             the device runs its next operation meanwhile, and waits for that send only after
#             its next forward's (backward's) compute, when it posts the next one
#             (send_next_wait_handle / send_prev_wait_handle); pp_pre_forward / pp_pre_backward
#             wait for the receive just before the compute that needs it;
#   cool-down every backward's send is blocking again (send_backward_recv_backward).
# So a device waits for the sends of its W warm-up forwards and W cool-down backwards
# (`interleaved_warmup`), and for a steady send only beyond the two operations after it. NCCL's
# send kernel takes a few SMs and network-rate HBM reads while it runs under a GEMM: not priced
# (docs/modeling.md, "Pipeline sends under compute").


def interleaved_blocking(p: int, m: int, v: int, d: int) -> tuple[np.ndarray, np.ndarray]:
    """(nf, nb), length v: device group d's forwards of chunk c whose send stays blocking under
    overlap_p2p_comm (nf[c], its W warm-up forwards k = 0 .. W - 1) and its backwards of chunk c
    likewise (nb[c], its W cool-down backwards k = m v - W .. m v - 1), chunks as
    `interleaved_order` runs them."""
    W, n = interleaved_warmup(p, m, v, d), m * v
    nf = np.bincount((np.arange(W) // p) % v, minlength=v)
    nb = np.bincount(v - 1 - (np.arange(n - W, n) // p) % v, minlength=v)
    return nf.astype(float), nb.astype(float)


def exposed_sends(send_fwd, send_bwd, m: int, v: int) -> np.ndarray:
    """(p,): the sends each device group still waits for per batch under overlap_p2p_comm:
    those of its `interleaved_blocking` operations, each operation's send as the simulation
    runs it (`interleaved_chunk_sends`)."""
    sf, sb = interleaved_chunk_sends(send_fwd, send_bwd, v)
    p = sf.shape[1]
    out = np.empty(p)
    for d in range(p):
        nf, nb = interleaved_blocking(p, m, v, d)
        out[d] = nf @ sf[:, d] + nb @ sb[:, d]
    return out


def interleaved_busy(t, send_fwd, send_bwd, m: int, v: int, overlap_p2p: bool):
    """Each device group's busy time per micro-batch (axis 0: t_d, its chunks' sum with their
    sends; trailing axes broadcast): t_d itself with blocking sends; under overlap_p2p_comm
    t_d - SF_d - SB_d + X_d / m, X_d = `exposed_sends` (sends 0: t_d exactly)."""
    t = np.asarray(t, dtype=float)
    if not overlap_p2p:
        return t
    axes = (slice(None),) + (None,) * (t.ndim - 1)
    SF = np.asarray(send_fwd, dtype=float)
    SB = np.asarray(send_bwd, dtype=float)
    return t - SF[axes] - SB[axes] + (exposed_sends(SF, SB, m, v) / m)[axes]


def interleaved_floor(t, send_fwd, send_bwd, m: int, v: int, overlap_p2p: bool = False):
    """A floor on the simulated interleaved pipeline (`simulate_times`: the time from the first
    forward to the last backward) from each device group's busy time per micro-batch t_d (axis
    0: the sum of its chunks' times, sends included; trailing axes broadcast; floors of t with
    the sends given are floors of this) and its sums of sends (length p). The simulation runs
    group d's m v forwards and m v backwards for m t_d in all (its compute split evenly over its
    chunks, its sends over the chunks that send, `interleaved_chunk_sends`); group j's first
    operation, micro-batch 0's forward of chunk 0, waits for that forward of chunk 0 on groups
    0 .. j - 1, and its last, micro-batch m - 1's backward of chunk 0 (`interleaved_order`),
    precedes that backward on groups j - 1 .. 0. Chunk 0's two operations on group d take
    e_d = (t_d - SF_d - SB_d) / v + sf[0, d] + sb[0, d] (t_d / v but on group 0, whose chunk 0
    sends no gradient), so the batch takes at least max_j m t_j + sum_{d<j} e_d
    (<= the paper's form (m + (p - 1) / v) max_d t_d when the sends are 0). overlap_p2p:
    group j is busy for m `interleaved_busy` instead; both chunk-0 operations are a warm-up
    forward and a cool-down backward (W >= (v - 1) p >= 1), whose sends stay blocking, so the
    e_d are the same."""
    t = np.asarray(t, dtype=float)
    sf, sb = interleaved_chunk_sends(send_fwd, send_bwd, v)
    axes = (slice(None),) + (None,) * (t.ndim - 1)
    SF = np.asarray(send_fwd, dtype=float)[axes]
    SB = np.asarray(send_bwd, dtype=float)[axes]
    c = (sf[0] + sb[0])[axes] - (SF + SB) / v  # e_d - t_d / v: 0 without sends
    before = (np.cumsum(t, axis=0) - t) / v + (np.cumsum(c, axis=0) - c)
    busy = interleaved_busy(t, send_fwd, send_bwd, m, v, overlap_p2p)
    return np.max(m * busy + before, axis=0)


def overlaps_p2p(training, schedule: str, v: int) -> bool:
    """Whether the settings' overlap_p2p_comm acts on this schedule: interleaved with v > 1 only
    (Megatron-Core's non-interleaved schedule refuses it; Megatron-LM's validate_args turns it
    off without virtual stages)."""
    return bool(training.overlap_p2p_comm) and schedule == "interleaved" and v > 1


def batch_time_s(dt: DeviceTimes, schedule: str, training, m: int, v: int = 1,
                 simulated: bool = False):
    """(pipeline, total, simulation or None): the time per batch under the training settings'
    pipeline_time, dp_overlap and overlap_p2p_comm; with `simulated` the simulation is run (and
    returned) even when the form does not need it."""
    form = training.pipeline_time
    check_form(form)
    sim = None
    p2p = overlaps_p2p(training, schedule, v)
    if simulated or form == "simulated":
        sim = simulate_times(dt, schedule, m, v, training.dp_overlap, p2p)
    if form == "simulated":
        return sim.pipeline_s, sim.makespan_s, sim
    pipe = pipeline_s(dt, schedule, form, m, v, p2p)
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
    kernel's terms (nest.costs.stage.overlap_terms), as nest.costs.pipeline.dp_sync_tail_s prices it."""
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


def interleaved_warmup(p: int, m: int, v: int, d: int, group: int | None = None) -> int:
    """Device d's warm-up forwards under interleaved 1F1B: 2 (p - d - 1) + (v - 1) group, at
    most all m v (Megatron-Core get_pp_rank_microbatches; `interleaved_order`). The cool-down
    runs as many backwards."""
    return min(2 * (p - d - 1) + (v - 1) * (group or p), m * v)


def interleaved_order(p: int, m: int, v: int, d: int, group: int | None = None):
    """Device d's operation order under Megatron-LM's interleaved 1F1B (Narayanan et al. 2021b,
    section 2.2; megatron/core/pipeline_parallel/schedules.py, forward_backward_pipelining_with_
    interleaving): forwards run chunk 0 for `group` consecutive micro-batches (Megatron's
    microbatch_group_size_per_vp_stage, default p; the Llama 3 paper's N, Grattafiori et al.
    2024, section 3.3.2), then chunk 1, ...; backwards the same with the chunks reversed.
    Warm-up: 2 (p - d - 1) + (v - 1) group forwards (at most all m v of them; Megatron-Core's
    get_pp_rank_microbatches, without the pre-November-2024 rule that made every forward a
    warm-up one when m = p), then one forward and one backward at a time.
    Yields ('F' | 'B', chunk, micro-batch)."""
    n = group or p
    total = m * v

    def fwd(k):
        return (k // n) % v, (k // (n * v)) * n + k % n

    def bwd(k):
        c, mb = fwd(k)
        return v - 1 - c, mb

    warm = interleaved_warmup(p, m, v, d, group)
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
    held = np.cumsum(interleaved_deltas(np.asarray(act_C, dtype=float), p, m, d, group))
    return max(0.0, float(held.max()))


def interleaved_deltas(act_C: np.ndarray, p: int, m: int, d: int, group: int | None = None
                       ) -> np.ndarray:
    """What each operation of `interleaved_order` adds to the activations held (+act_C[c] for a
    forward of chunk c, -act_C[c] for a backward), as one array in the order's order, built
    without walking it: forward k sits at k (warm-up) or warm + 2 (k - warm), backward k at
    warm + 2 k + 1 (steady) or total + k (drain). np.cumsum adds in that order, one addition at
    a time, so its running sums are the walk's, bit for bit."""
    v, n = len(act_C), group or p
    total = m * v
    warm = interleaved_warmup(p, m, v, d, group)
    k = np.arange(total)
    chunk = (k // n) % v
    out = np.empty(2 * total)
    out[np.where(k < warm, k, 2 * k - warm)] = act_C[chunk]
    out[np.where(k < total - warm, warm + 2 * k + 1, total + k)] = -act_C[v - 1 - chunk]
    return out


# ---- the 1F1B critical-path family and the data-parallel gradient-sync tail -----------------
# and the time per batch, and calls these).
#
# Legend: p stages (devices), j stage index (0 = first), m micro-batches, v model chunks per device
# (interleaved), F_j / B_j forward / backward time of stage j for one micro-batch (B_j includes
# the recomputed forward), sf_j the send of stage j's output activation to j + 1, sb_j the send of
# its input gradient to j - 1 (sf_{p-1} = sb_0 = 0). Sends are blocking: the sender is busy for
# them, as the evaluator charges them (f_j = F_j + sf_j, b_j = B_j + sb_j, t_j = f_j + b_j).
# 1F1B critical path (`critical_path_1f1b`): max over home stages b of the longest of a family of
# paths through the 1F1B precedence graph (ours); a lower bound, exact in ~96% of random
# heterogeneous cases; against the discrete-event simulation (nest.costs.simulate) at most 0.4% below for
# m >= 4p (8,000 random and hypothesis cases, p <= 16), 2.2% for p <= m < 4p.
# Data-parallel gradient sync (see `dp_sync_tail_s`).


def _vec(x, p: int, name: str) -> np.ndarray:
    a = np.zeros(p) if x is None else np.asarray(x, dtype=float)
    if a.ndim == 0:
        a = np.full(p, float(a))
    if a.shape != (p,):
        raise ValueError(f"{name}: expected {p} values (one per stage), got shape {a.shape}")
    return a


def fb_times(fwd_s, bwd_s, send_fwd_s, send_bwd_s) -> tuple[np.ndarray, np.ndarray]:
    """Busy time per micro-batch of each stage's forward (f_j = F_j + sf_j) and backward
    (b_j = B_j + sb_j), the ends' missing sends dropped."""
    F = np.atleast_1d(np.asarray(fwd_s, dtype=float))
    p = len(F)
    B = _vec(bwd_s, p, "bwd_s")
    sf = _vec(send_fwd_s, p, "send_fwd_s").copy()
    sb = _vec(send_bwd_s, p, "send_bwd_s").copy()
    sf[-1] = 0.0
    sb[0] = 0.0
    return F + sf, B + sb


def critical_path_1f1b(f: np.ndarray, b: np.ndarray, m: int) -> float:
    """Longest of these paths through the 1F1B precedence graph (each is a real path, so the
    max is a lower bound on the makespan), for every home stage h (w = p - h - 1 warm-ups):
      fill:  F(0) reaches h after sum_{k<=h} f_k; h's warm-up forwards arrive at the slowest
             upstream forward's pace (flow shop: F(q)@h ends at sum_{k<=h} f_k + q max_{a<=h} f_a);
             B(0)@h starts after F(w)@h, or after a round trip leaving h at F(q) down to a
             stage c > h, through c's warm-up forwards F(q..p-c-1), and back up with B(0):
             E(q) + sum_{h<k<=c} (f_k + b_k) + (p - c - 1 - q) f_c  (q = 0 or p - c - 1);
      home:  B(0) .. F(m-1) on h back to back: (m - 1 - w) t_h;
      drain: h's last p - h backwards back to back, or a trip from F(m-1)@h down to c, through
             c's drain backwards B(m-p+c .. i) and back up with B(i), then the remaining
             backwards B(i+1 .. m-1) at the slowest upstream backward's pace, and the last one
             up to stage 0: sum_{k<h} b_k  (i = m - p + c or m - 1).
    Misses the rare paths that switch home stage in mid-batch (two near-equal bottlenecks)."""
    p = len(f)
    t = f + b
    Sf = np.concatenate([[0.0], np.cumsum(f)])  # Sf[k] = sum_{i<k} f_i
    Sb = np.concatenate([[0.0], np.cumsum(b)])
    best = 0.0
    for h in range(p):
        w = p - h - 1
        fu, bu = f[: h + 1].max(), b[: h + 1].max()
        e0 = Sf[h + 1]  # end of F(0)@h
        fill = e0 + w * fu  # end of F(w)@h
        c = np.arange(h + 1, p)
        if len(c):
            down = (Sf[c + 1] - Sf[h + 1]) + (Sb[c + 1] - Sb[h + 1])  # sum_{h<k<=c} t_k
            for q in (np.zeros_like(c), p - c - 1):
                fill = max(fill, float(np.max(e0 + q * fu + down + (p - c - 1 - q) * f[c])))
        x = fill + (m - 1 - w) * t[h]  # end of F(m-1)@h
        end = x + (w + 1) * b[h] + Sb[h]
        if len(c):
            trip = x + (Sf[c + 1] - Sf[h + 1]) + (Sb[c] - Sb[h])  # f_{h+1..c} + b_{h..c-1}
            for i in (m - p + c, np.full_like(c, m - 1)):
                val = trip + (i - (m - p + c) + 1) * b[c] + (m - 1 - i) * bu + Sb[h]
                end = max(end, float(np.max(val)))
        best = max(best, end)
    return float(best)


# --------------------------------------------------------------------------------------------
# Data-parallel gradient synchronisation
# --------------------------------------------------------------------------------------------


def dp_sync_exposed_s(sync_s, window_s, num_buckets=1):
    """Sync time left after the end of the gradient-producing part of a stage's last backward.
    Gradients accumulate over micro-batches, so nothing can be sent before the last
    micro-batch's backward (Megatron-LM overlap_grad_reduce; PyTorch DDP no_sync). With k
    equal buckets, bucket i is ready (i + 1) / k of the way through the window W and the
    buckets go out one after another, each taking S / k (Li et al. 2020, "PyTorch Distributed",
    section 3.2.3): the last one ends S / k after the window if the network keeps up
    (S <= W), else S - W (k - 1) / k after it:
        exposed = S / k + max(0, S - W) (k - 1) / k        (k = 1: no overlap, S)
    Scalars or NumPy arrays (the stage kernel's grids, element-wise)."""
    k = np.maximum(np.asarray(num_buckets, dtype=float), 1.0)
    out = sync_s / k + np.maximum(0.0, np.asarray(sync_s) - window_s) * (k - 1) / k
    return float(out) if np.ndim(out) == 0 else out


def dp_sync_tail_s(sync_s, fwd_s, bwd_s, send_fwd_s=None, send_bwd_s=None, *,
                   overlap: str = "none", num_buckets=1, recompute_s=None,
                   schedule: str = "1f1b", num_chunks: int = 1,
                   num_microbatches: int | None = None, opt_s=None, gather_s=None) -> float:
    """Time the data-parallel gradient sync (then the optimizer step, O_j, which cannot overlap
    anything: it needs the synced gradients) adds after the pipeline's last backward.
    num_buckets: one k for all stages or one per stage.
      "none":     every stage syncs after the whole flush: max_j (S_j + O_j) (the paper's).
      "stage":    stage j syncs when its own last backward is done (Megatron-LM without
                  overlap_grad_reduce: finalize_model_grads runs per rank, and the DP groups of
                  different stages are disjoint), while the backward of the last micro-batch
                  still drains through stages j-1 .. 0, which takes at least
                  D_j = sum_{k<j} b_k (b_k / v per chunk when interleaved):
                  tail = max_j max(0, S_j - D_j).
      "bucketed": as "stage", and the sync overlaps the gradient part of the last backward,
                  W_j = B_j - R_j (R_j the recomputed forward, done first), in k buckets:
                  tail = max_j max(0, dp_sync_exposed_s(S_j, W_j, k) - sb_j - D_j).
    D_j is a lower bound on the real gap, so "stage" and "bucketed" tails are upper bounds
    (exact for equal stages). GPipe's backward phase is a flow shop, so its gap is exact:
    D_j = sum_{k<j} b_k + (m - 1) (max_k b_k - max_{k>=j} b_k) (needs num_microbatches).
    Interleaved: only the last chunk's backward is counted as window
    (conservative: Megatron reduces each chunk's buckets after that chunk's last backward).
    gather_s (A_j): what runs after the optimizer step, ZeRO-1/2's all-gather of the updated
    weights (or its exposed part, nest.costs.stage.gather_exposed): added after O_j in every
    form, it needs the stepped weights, so no backward can hide it."""
    F = np.atleast_1d(np.asarray(fwd_s, dtype=float))
    p, v = len(F), max(int(num_chunks), 1)
    S = _vec(sync_s, p, "sync_s")
    O = _vec(opt_s, p, "opt_s") + _vec(gather_s, p, "gather_s")
    K = np.broadcast_to(np.asarray(num_buckets), (p,))
    if overlap == "none":
        return float((S + O).max())
    if overlap not in ("stage", "bucketed"):
        raise ValueError(f"overlap: '{overlap}' is not one of none, stage, bucketed")
    B = _vec(bwd_s, p, "bwd_s") / v
    sb = _vec(send_bwd_s, p, "send_bwd_s").copy()
    sb[0] = 0.0
    drain = np.concatenate([[0.0], np.cumsum(B + sb)])[:p]  # D_j = sum_{k<j} (B_k + sb_k)
    if schedule == "gpipe" and num_microbatches:
        b = B + sb
        tail_max = np.maximum.accumulate(b[::-1])[::-1]  # max_{k>=j} b_k
        drain = drain + (num_microbatches - 1) * (b.max() - tail_max)
    if overlap == "stage":
        exposed = S + O
    else:
        R = _vec(recompute_s, p, "recompute_s") / v
        exposed = np.array([dp_sync_exposed_s(S[j], B[j] - R[j], int(K[j])) - sb[j]
                            for j in range(p)]) + O
    return float(max(0.0, np.max(exposed - drain)))
