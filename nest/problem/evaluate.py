"""Plan x problem -> evaluation: the one shared evaluator that scores every planner's plan.

Each stage (each chunk of an interleaved plan) is one cell of the stage kernel (nest.costs.stage)
at its pipeline position; the stages' times are combined into the time per batch by
nest.costs.pipeline (the training settings' pipeline_time form and dp_overlap; by default the
paper's 1F1B form with the gradient sync and optimizer step after the flush, docs/modeling.md, what
the NEST solver optimises exactly), which also says where each stage sits (its stash, neighbours
and tied partner). GPipe and interleaved 1F1B plans are priced there too.
F_j / B_j: roofline compute of the stage's layers (nest.costs.roofline) plus the collectives the
sub-graph variant inserts, priced on the network levels their device groups span
(nest.network.collectives); B_j adds the recomputed forward ops (Korthikanti et al. 2022,
section 5) and, for full recomputation, the forward collectives again. ZeRO (Rajbhandari et al.
2020, section 5): stage 1 replaces the all-reduce by reduce-scatter + all-gather of the
parameters; stage 2 reduce-scatters gradients every micro-batch (DeepSpeed behaviour with gradient
accumulation); stage 3 also all-gathers parameters before forward and before backward.

Peak memory of stage j at its pipeline position: weights + gradients + optimizer states (sharded
by ZeRO over the data-parallel group) + its stash of activations (nest.costs.pipeline.stash) +
the working set of one recomputed layer, times (1 + allocator fragmentation), plus the
framework's fixed overhead (hardware file).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from pathlib import Path


from nest.costs.layers import ALL_MODES, layer_table
from nest.costs.memory import lazy_gradient_peak, with_overheads
from nest.costs.pipeline import (DeviceTimes, batch_time_s, chunks_of, device_group,
                                 interleaved_busy, interleaved_order,
                                 interleaved_peak_activations, links, overlaps_p2p,
                                 simulate_times, stash)
from nest.costs.stage import Options, buckets, stage_cost
from nest.common.errors import PlanError
from nest.problem.plan import Plan, check_structure
from nest.problem.problem import Problem, make_problem, with_mbs  # noqa: F401  (re-exported)
from nest.spec.settings import TrainingSettings, load_training
from nest.common.atomic_io import write_text_atomic
from nest.spec.catalog import validate

SCHEMA = "nest.evaluation/v1"


@dataclass
class StageResult:
    index: int
    first_layer: int
    last_layer: int
    time_per_microbatch_s: float
    peak_memory_bytes: float
    memory_bytes: dict[str, float]
    breakdown_s: dict[str, float]
    sync_s: float
    sync_breakdown_s: dict[str, float]
    optimizer_s: float
    fwd_s: float = 0.0  # forward part of time_per_microbatch_s (compute + forward collectives)
    send_fwd_s: float = 0.0  # pipeline transfers (also part of time_per_microbatch_s)
    send_bwd_s: float = 0.0
    recompute_s: float = 0.0  # recomputed forward inside the backward (before any gradient)
    num_params: float = 0.0  # parameters per device (before ZeRO sharding)
    # the part of sync_s that is ZeRO-1/2's all-gather of the updated weights (after the
    # optimizer step; its exposed part under param_gather_overlap): it cannot overlap the backward
    gather_s: float = 0.0

    @property
    def bwd_s(self) -> float:
        return self.time_per_microbatch_s - self.fwd_s - self.send_fwd_s - self.send_bwd_s


@dataclass
class Evaluation:
    plan: Plan
    feasible: bool
    reason: str
    time_per_batch_s: float | None
    throughput_samples_per_s: float | None
    mfu: float | None
    stages: list[StageResult]
    breakdown_s: dict[str, float] = field(default_factory=dict)
    pipeline_time: str = "paper"  # the form that priced time_per_batch_s
    dp_overlap: str = "none"
    time_per_batch_simulated_s: float | None = None  # nest.costs.simulate, when asked (`simulated`)
    # MFU with causal attention counted as the whole score square (Korthikanti et al. 2022's
    # model FLOPs, NeMo 24.07's convention); `mfu` counts it as half (README, "FLOPs and MFU")
    mfu_full_attention: float | None = None

    def to_dict(self) -> dict:
        p = self.plan
        return {
            "schema": SCHEMA, "planner": p.planner, "model": p.model, "cluster": p.cluster,
            "num_devices": p.num_devices, "mbs": p.mbs, "global_batch": p.global_batch,
            "feasible": self.feasible, "reason": self.reason,
            "time_per_batch_s": self.time_per_batch_s,
            "throughput_samples_per_s": self.throughput_samples_per_s, "mfu": self.mfu,
            "mfu_full_attention": self.mfu_full_attention,
            "pipeline_time": self.pipeline_time, "dp_overlap": self.dp_overlap,
            "time_per_batch_simulated_s": self.time_per_batch_simulated_s,
            "breakdown_s": self.breakdown_s,
            "stages": [{"index": s.index, "first_layer": s.first_layer,
                        "last_layer": s.last_layer,
                        "time_per_microbatch_s": s.time_per_microbatch_s,
                        "peak_memory_bytes": s.peak_memory_bytes, "memory_bytes": s.memory_bytes,
                        "breakdown_s": s.breakdown_s} for s in self.stages],
        }

    def write(self, path: str | Path) -> None:
        d = self.to_dict()
        validate(d, "evaluation", str(path))
        write_text_atomic(path, json.dumps(d, indent=1, sort_keys=True) + "\n")


# --------------------------------------------------------------------------------------------
# The evaluator
# --------------------------------------------------------------------------------------------


def evaluate(plan: Plan, problem: Problem, simulated: bool = False) -> Evaluation:
    """Score `plan`. The pipeline is priced by the training settings' `pipeline_time` form and
    the gradient sync by `dp_overlap` (nest.costs.pipeline.batch_time_s); with `simulated`
    the discrete-event simulation's time per batch is recorded as well."""
    g, cl, tr = problem.graph, problem.cluster, problem.training
    check_structure(plan, g.num_layers, cl.max_devices)
    if plan.num_devices != cl.num_devices:
        raise PlanError(f"plan: key 'num_devices': {plan.num_devices}, but the problem's cluster "
                        f"has {cl.num_devices}")
    if plan.mbs != g.mbs:
        raise PlanError(f"plan: key 'mbs': {plan.mbs}, but the layer graph was built for "
                        f"mbs={g.mbs}")
    problem = problem.with_variants([plan.stage_variant(j) for j in range(len(plan.stages))],
                                    where="plan")
    m = problem.num_microbatches(plan.dp, plan.ep)
    if plan.num_microbatches != m:
        raise PlanError(f"plan: key 'num_microbatches': {plan.num_microbatches}, expected "
                        f"ceil(global_batch / (mbs * dp * ep)) = {m}")
    if plan.global_batch != tr.global_batch:
        raise PlanError(f"plan: key 'global_batch': {plan.global_batch}, but the training "
                        f"settings say {tr.global_batch}")

    p, n = plan.pp, len(plan.stages)
    if plan.schedule == "interleaved" and m % p:
        raise PlanError(f"plan: key 'num_microbatches': {m} must be a multiple of pp={p} for "
                        f"the interleaved schedule (Megatron-LM)")
    v = plan.virtual_stages if plan.schedule == "interleaved" else 1
    held = [stash(p, device_group(j, p), m, plan.schedule, v) for j in range(n)]
    results = [_stage(plan, problem, j, held[j]) for j in range(n)]
    if plan.schedule == "interleaved":
        results = _per_device(results, p, problem.cluster.hardware, m, held, tr.grad_buffer)
    dt = device_times(results[:p], tr)
    pipe, total, sim = batch_time_s(dt, plan.schedule, tr, m, v, simulated)
    # each device's busy time per micro-batch: t, or with overlap_p2p_comm its sends' exposed part
    p2p = overlaps_p2p(tr, plan.schedule, v)
    busy = interleaved_busy(dt.t, dt.send_fwd, dt.send_bwd, m, v, p2p)
    hbm = cl.hardware.hbm_bytes
    over = [s for s in results if s.peak_memory_bytes > hbm]
    if over:  # interleaved: results[:p] are the devices' totals (the chunks repeat their peak)
        s = max(over, key=lambda s: (s.peak_memory_bytes, -s.index))
        parts = ", ".join(f"{k} {v / 1e9:.2f}" for k, v in s.memory_bytes.items())
        reason = (f"out of memory: {stage_label(plan, s.index)} needs "
                  f"{s.peak_memory_bytes / 1e9:.2f} GB > {hbm / 1e9:.2f} GB HBM "
                  f"({parts} GB)")
    else:
        reason = ""
    bott = max(results[:p], key=lambda s: busy[s.index])
    t_max = float(busy[bott.index])
    # the bottleneck stage's m micro-batches, the rest of the pipeline time is bubble: the
    # breakdown adds up to the total (overlap_p2p_comm: its sends' exposed share)
    sends = bott.send_fwd_s + bott.send_bwd_s
    share = (t_max - (bott.time_per_microbatch_s - sends)) / sends if p2p and sends else 1.0
    breakdown = {f"stage{bott.index}.{k}": x * m * (share if k.startswith("p2p_") else 1.0)
                 for k, x in bott.breakdown_s.items()}
    breakdown["pipeline_bubble"] = pipe - m * t_max
    tail = max(results[:p], key=lambda s: s.sync_s + s.optimizer_s)
    if tr.dp_overlap == "none":  # the slowest stage's sync and optimizer step, after the flush
        breakdown.update({f"dp_sync.{k}": x for k, x in tail.sync_breakdown_s.items()})
        breakdown["optimizer_step"] = tail.optimizer_s
    else:  # what is left of sync + step after the last backward (nest.costs.pipeline.tail_s)
        breakdown["dp_sync_and_optimizer.exposed"] = total - pipe
    split = plan.mbs * plan.dp * plan.ep
    if tr.global_batch % split:  # nest.problem.space.splits_batch: never count samples not processed
        reason = "; ".join(x for x in (
            f"global batch {tr.global_batch} is not a multiple of mbs x dp x ep = {split}: "
            f"{m} micro-batches would process {m * split} samples per batch, not "
            f"{tr.global_batch} (choose dp so that mbs x dp x ep divides the global batch)",
            reason) if x)
    used = plan.devices_used
    mfu, mfu_full = (g.model_flops_per_sample(full) * tr.global_batch
                     / (total * used * cl.hardware.peak_flops_per_s) for full in (False, True))
    ok = not over and not tr.global_batch % split
    return Evaluation(plan, ok, reason, total, tr.global_batch / total, mfu, results, breakdown,
                      tr.pipeline_time, tr.dp_overlap, sim.makespan_s if sim else None, mfu_full)


def device_times(stages: list[StageResult], tr: TrainingSettings) -> DeviceTimes:
    """The per-device times nest.costs.pipeline prices a batch from (`stages`: the evaluator's
    per-device results, the first p of them)."""
    return DeviceTimes([s.time_per_microbatch_s for s in stages], [s.fwd_s for s in stages],
                       [s.bwd_s for s in stages], [s.send_fwd_s for s in stages],
                       [s.send_bwd_s for s in stages], [s.sync_s for s in stages],
                       [s.optimizer_s for s in stages], [s.gather_s for s in stages],
                       [s.recompute_s for s in stages],
                       [int(buckets(s.num_params, tr)) for s in stages])


def simulate_stages(plan: Plan, stages: list[StageResult], tr: TrainingSettings):
    """Discrete-event simulation (nest.costs.simulate) of a plan's schedule with the evaluator's
    per-device forward / backward / transfer times, gradient sync (per tr.dp_overlap) and
    optimizer step: its makespan is the simulated time per batch."""
    v = plan.virtual_stages if plan.schedule == "interleaved" else 1
    return simulate_times(device_times(stages[:plan.pp], tr), plan.schedule,
                          plan.num_microbatches, v, tr.dp_overlap,
                          overlaps_p2p(tr, plan.schedule, v))


def device_chunks(plan: Plan, j: int) -> list[tuple[int, int]]:
    """The layer ranges that pipeline position j's devices hold: its own stage, or under the
    interleaved schedule every chunk j mod p, j mod p + p, ... (p = plan.pp)."""
    if plan.schedule != "interleaved":
        st = plan.stages[j]
        return [(st.first_layer, st.last_layer)]
    return [(plan.stages[c].first_layer, plan.stages[c].last_layer)
            for c in chunks_of(device_group(j, plan.pp), plan.pp, len(plan.stages))]


def stage_label(plan: Plan, j: int) -> str:
    """How messages name result j: "stage 3 (layers 10-19)", or for an interleaved plan the
    device group with every chunk's range and its times and memory as device totals."""
    ch = device_chunks(plan, j)
    if plan.schedule != "interleaved":
        return f"stage {j} (layers {ch[0][0]}-{ch[0][1]})"
    ranges = ", ".join(f"{a}-{b}" for a, b in ch)
    return (f"pipeline device group {j % plan.pp} ({len(ch)} chunks: layers {ranges}; "
            f"totals over its chunks)")


def _per_device(chunks: list[StageResult], p: int, hw, m: int, held: list[float],
                grad_buffer: str = "persistent") -> list[StageResult]:
    """Interleaved 1F1B: device group d runs chunks d, d + p, ...; its time per micro-batch, sync,
    optimizer step and memory are the sums over its chunks (working set and the framework's
    overhead once; activations as the schedule holds them, chunk by chunk:
    nest.costs.pipeline.interleaved_peak_activations). The first p results become the devices'
    totals; every chunk reports its device's peak memory."""
    out = list(chunks)
    for d in range(p):
        mine = [chunks[k] for k in chunks_of(d, p, len(chunks))]
        mem = device_memory([c.memory_bytes for c in mine], p, m, d, held[d], hw, grad_buffer)
        bd: dict[str, float] = {}
        sb: dict[str, float] = {}
        for c in mine:
            for k, x in c.breakdown_s.items():
                bd[k] = bd.get(k, 0.0) + x
            for k, x in c.sync_breakdown_s.items():
                sb[k] = sb.get(k, 0.0) + x
        dev = StageResult(d, mine[0].first_layer, mine[-1].last_layer,
                          sum(c.time_per_microbatch_s for c in mine), sum(mem.values()), mem, bd,
                          sum(c.sync_s for c in mine), sb, sum(c.optimizer_s for c in mine),
                          sum(c.fwd_s for c in mine), sum(c.send_fwd_s for c in mine),
                          sum(c.send_bwd_s for c in mine), sum(c.recompute_s for c in mine),
                          sum(c.num_params for c in mine), sum(c.gather_s for c in mine))
        out[d] = dev
        for k in chunks_of(d, p, len(chunks))[1:]:
            out[k] = replace(chunks[k], peak_memory_bytes=dev.peak_memory_bytes)
    return out


def device_memory(mems: list[dict], p: int, m: int, d: int, held: float, hw,
                  grad_buffer: str = "persistent") -> dict:
    """Interleaved 1F1B: device group d's memory by part from its chunks' records (`mems`, in
    chunk order, each stashing `held` micro-batches): the sums over its chunks, the working set
    and the framework's overhead once, the activations as the schedule holds them
    (nest.costs.pipeline.interleaved_peak_activations). grad_buffer "lazy": activations and
    gradients as held at the peak of their sum, each chunk's gradients created by its first
    backward (nest.costs.memory.lazy_gradient_peak)."""
    per_chunk = ("fragmentation", "framework_overhead", "working")  # recomputed or once
    mem = {k: sum(c.get(k, 0.0) for c in mems) for k in mems[0] if k not in per_chunk}
    mem["working"] = max(c["working"] for c in mems)
    act_C = [c["activations"] / held for c in mems]
    if grad_buffer == "lazy":
        mem["activations"], mem["gradients"] = lazy_gradient_peak(
            interleaved_order(p, m, len(mems), d), act_C, [c["gradients"] for c in mems])
    else:
        mem["activations"] = interleaved_peak_activations(act_C, p, m, d)
    return with_overheads(mem, hw)


def _stage(plan: Plan, problem: Problem, j: int, num_stashed: float) -> StageResult:
    """Stage j priced as one cell of the stage kernel (nest.costs.stage) with its own knobs."""
    st = plan.stages[j]
    lt = layer_table(problem, plan.stage_variant(j), ALL_MODES)
    opts = Options((st.zero_stage,), (st.recompute,))
    c = stage_cost(problem, lt, st.device_ids, plan.stage_dp(j), opts, num_stashed,
                   cell=(st.first_layer, st.last_layer), detail=True,
                   **links([s.device_ids for s in plan.stages], j))
    return stage_result(c, j, st.first_layer, st.last_layer)


def stage_result(c, j: int, first_layer: int, last_layer: int) -> StageResult:
    """The evaluator's record of stage j from a one-cell, one-option stage kernel result with
    its breakdown (nest.costs.stage.stage_cost(..., detail=True))."""
    x = c.detail
    return StageResult(j, first_layer, last_layer, float(c.t[0, 0]), float(c.mem[0, 0]),
                       x["memory_bytes"], x["breakdown_s"], float(sum(x["sync_breakdown_s"]
                                                                      .values())),
                       x["sync_breakdown_s"], x["optimizer_s"], x["fwd_s"], x["send_fwd_s"],
                       x["send_bwd_s"], x["recompute_s"], x["num_params"], x["gather_s"])


def simulate_plan(ev: Evaluation, training: TrainingSettings | None = None):
    """Discrete-event simulation of an evaluated plan's schedule (nest.costs.simulate): a per-device
    timeline (see `simulate_stages`; the training settings default to config/training.yaml)."""
    return simulate_stages(ev.plan, ev.stages, training or load_training())
