"""Plan -> runnable Megatron-LM arguments and the rank placement that realises the plan's devices.

Checked against Megatron-LM itself (NVIDIA/Megatron-LM d98e8a64, 2026-08): its parse_args +
validate_args + TransformerConfig accept every export (scripts/check_megatron_args.py), and the
rank maps agree with megatron-core's RankGenerator (tests/test_export.py).

What maps directly (Megatron-LM / Megatron-Core argument names):
    tp, sp, cp, ep             --tensor-model-parallel-size, --sequence-parallel (tp > 1 only;
                               Megatron drops it at tp 1), --context-parallel-size,
                               --expert-model-parallel-size
    pp, interleaving, cuts     Megatron's default split (blocks divisible by pp x v, spread evenly,
                               the embedding first and the head last): --num-virtual-stages-per-
                               pipeline-rank v when v > 1, nothing else. Any other split,
                               including blocks not divisible by pp x v (which Megatron rejects
                               without a layout): --pipeline-model-parallel-layout ALONE (it fixes
                               v; Megatron rejects it beside the virtual-stage flags), one
                               '|'-separated chunk per (virtual) stage in model order, E =
                               embedding, t*k = k transformer blocks, L = final norm + LM head +
                               loss; chunks are dealt round-robin to the pipeline ranks, as ours
    recompute (all stages)     selective: --recompute-granularity selective (Korthikanti et al.
                               2022: the core attention); full: --recompute-granularity full
                               --recompute-method uniform --recompute-num-layers 1
    overlap (training)         dp_overlap bucketed: --overlap-grad-reduce --ddp-bucket-size
                               dp_bucket_params; param_gather_overlap: --overlap-param-gather
                               (Megatron asserts both it and a sharded optimizer; without
                               bucketed sync it is left out with a warning); tp_comm_overlap
                               with sequence parallelism: --tp-comm-overlap (tp_overlap_*
                               other than TE's defaults: a warning); an interleaved plan
                               priced without overlap_p2p_comm: --no-overlap-p2p-communication
                               (Megatron-LM's default overlaps the sends). dp_overlap none
                               (the paper's sync after the flush) and stage have no flag:
                               Megatron's default reduces per rank after its last backward
    ZeRO (all stages)          1: --use-distributed-optimizer; 2 / 3: Megatron-FSDP,
                               --use-megatron-fsdp --use-distributed-optimizer (FSDP v1 runs on
                               it) --data-parallel-sharding-strategy optim_grads / optim_grads_params
                               --ckpt-format fsdp_dtensor (asserted by validate_args; the 2025
                               --use-custom-fsdp is gone)
    batch                      --micro-batch-size, --global-batch-size (Megatron's data-parallel
                               size is dp x ep: experts parallelise inside the data-parallel ranks;
                               a batch it does not divide is rounded up to the micro-batches the
                               evaluator prices, with a warning: validate_args asserts it)
    model                      every argument that changes the numerics, from the model spec:
                               sizes, GQA groups, LayerNorm / RMSNorm and its epsilon, learned or
                               rotary positions and the rotary base (Llama-3: 500000), SwiGLU,
                               biases, tied / untied output, dropout, experts / top-k (alltoall
                               dispatcher, what the evaluator prices), BERT without its binary
                               head; precision: nest.spec.precision
    environment, launch        nest.interfaces.export_launch: CUDA_DEVICE_MAX_CONNECTIONS=1 where Megatron
                               asserts it (tp or cp > 1 without FSDP), unset under Megatron-FSDP;
                               torchrun agents starting exactly the plan's ranks; an sbatch file
Entry points (Megatron-LM's tree): pretrain_gpt.py; BERT examples/bert/pretrain_bert.py.
Rank order (nest.problem.placement): Megatron-LM's CLI builds its groups in the order tp-cp-ep-dp-pp (tp
fastest, our replica_major) or, with --use-tp-pp-dp-mapping, tp-cp-ep-pp-dp (our stage_major);
megatron/training/initialize.py passes no other order. Its expert groups come from a second
RankGenerator on a separate (expert-tp, ep, expert-dp, pp) grid (cp removed, same order), so an
order counts only where both grids build exactly the groups we price (nest.problem.placement.expressible:
stage_major with ep > 1 and pp > 1 is rejected unless cp == ep). With cp > 1 and ep > 1 no CLI
order does (the expert grid folds ep over the cp ranks): such a plan is re-scored as the fastest
feasible runnable projection on the same devices: ep 1 (experts replicated, dp x ep), cp folded
into tp (tp x cp), or cp 1 (dp x cp), each on the CLI orders; a warning names the choice and both
times, and a PlanError lists every candidate's reason if none fits. The launch order is chosen:
    1. a CLI order whose rank map is the identity (the plan's placement is that order);
    2. a CLI order whose rank map is launchable: torchrun gives each agent (node) one block of
       consecutive ranks (nest.interfaces.export_launch: agents may run different numbers of processes), so
       every cluster node must hold one block (which node an agent runs on is --node-rank's
       choice, which device a rank gets CUDA_VISIBLE_DEVICES'; nothing else can move);
    3. otherwise the plan is projected onto the CLI order with the shortest time per batch
       (a warning reports both times).
Rank r runs on the device the plan gives that rank's coordinates: the rank map lists, per rank,
its coordinates and its device (node = id // devices per node).

What Megatron cannot express is projected and re-scored, never hidden: stage-wise recomputation or
ZeRO stages become the strongest mode any stage uses (it needs no more memory), GPipe becomes 1F1B,
heterogeneous stages become one uniform variant (below), cp > 1 with ep > 1 a runnable projection
(above), an unlaunchable placement the best CLI order; each projection is a warning, and the projected plan's time per batch under the
shared evaluator is reported beside the original's.

Heterogeneous stages (a stage with its own tp / sp / ep / cp, nest.problem.plan.Stage): Megatron-LM runs
one set of tensor / sequence / expert / context-parallel degrees for the whole model. "Nearest
runnable plan", the decision: the plan with the same cuts, schedule, chunks, micro-batch size and
micro-batch streams (dp x ep, so the same number of micro-batches per pipeline), the per-stage
ZeRO / recomputation projected as above, and ONE of the plan's own stage variants u on every stage
(data parallelism dp_u = dp x ep / ep_u), on no more devices than the plan uses. Candidates: every
distinct stage variant u, each on
    (a) the plan's own device ids, where every stage of the plan has dp_u x width_u devices (then
        no device moves; only the meaning of the inner ranks changes), and
    (b) the regular placements (rank = device id) of the plan's placement name, if it is a rank
        order or legacy name, and of every order the launcher expresses for u's degrees
        (launch_candidates), each device layout once.
Each candidate is resolved to a launch order exactly as any plan is (steps 1-3 above) and scored by
nest.problem.evaluate.evaluate; the export keeps the fastest one that fits in memory (ties: the stage-0
variant, then the stage order of first use, then (a) before (b)). A warning names the variants,
the chosen one and both times per batch. If no candidate fits (or can be scored), the export
raises a PlanError naming the plan and every candidate's reason: there is then no uniform plan
of the same shape to run.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from nest.common.errors import PlanError
from nest.interfaces.export_model import model_args as _model_args
from nest.interfaces.export_model import windowed
from nest.interfaces.export_launch import (
    DATA_ARGS,
    TRAIN_ARGS,
    check_name,
    check_text,
    comment,
    launch_env,
    node_runs,
    slurm_script,
    torchrun_script,
)
from nest.problem.evaluate import Problem, evaluate
from nest.graph.layer_graph import Variant
from nest.problem.placement import (
    DEFAULT_ORDER,
    canonical_order,
    cli_orders,
    harness_groups,
    interleaves,
    is_order,
    launch_order,
    launcher_orders,
    megatron_groups,
    runs_context_parallel,
    stage_device_ids,
)
from nest.problem.plan import Plan
from nest.problem.plan_spec import block_cuts
from nest.spec.precision import precision_args

RECOMPUTE_ORDER = ("none", "selective", "full")


@dataclass
class MegatronExport:
    plan: Plan  # the plan the arguments run (the input, or its projection)
    args: list[str]  # the plan's arguments (parallelism, schedule, memory, model, precision)
    script: str  # pretrain_gpt.py | examples/bert/pretrain_bert.py (Megatron-LM's tree)
    world_size: int
    devices_per_node: int
    rank_map: list[dict]  # rank, node, local_rank, device, pp, dp, ep, cp, tp
    warnings: list[str] = field(default_factory=list)
    time_per_batch_s: float | None = None  # the exported plan's, shared evaluator
    original_time_per_batch_s: float | None = None
    order: str = DEFAULT_ORDER  # the rank order Megatron builds its groups in
    env: dict[str, str] = field(default_factory=dict)  # nest.interfaces.export_launch.launch_env
    unset_env: tuple[str, ...] = ()  # variables the launch must clear (Megatron-FSDP)
    # each device id's name in the cluster's network description (a graph node, a torus
    # coordinate; ClusterSpec.device_names), written beside the rank map's device ids
    device_names: tuple[str, ...] = ()
    # the model's name (ModelSpec.name) for the job name: a model given by path is named by its
    # file, not its path (a hub snapshot folder's path ran past the 64-character job name)
    model_name: str = ""

    def command(self) -> str:
        """launch.sh's body: environment, then torchrun starting exactly the rank map's ranks
        (nest.interfaces.export_launch)."""
        return torchrun_script(self.args, self.script, self.env, self.rank_map,
                               self.devices_per_node, unset=self.unset_env)

    def run_args(self) -> list[str]:
        """The full argument list of one process: the plan's, then the default data / training
        arguments launch.sh passes unless DATA_ARGS / TRAIN_ARGS are set."""
        return [*self.args, *DATA_ARGS, *TRAIN_ARGS]

    @property
    def num_agents(self) -> int:
        """torchrun agents (one per cluster node the ranks use)."""
        return len(node_runs(self.rank_map))

    def slurm(self) -> str:
        return slurm_script(self.num_agents, self.devices_per_node,
                            f"nest-{self.model_name or self.plan.model}-{self.world_size}")

    def identity_placement(self) -> bool:
        return all(r["device"] == r["rank"] for r in self.rank_map)

    def files(self) -> dict[str, str]:
        """The exported folder's files: launch.sh, slurm.sbatch, args.txt, rank_map.csv. User
        text reaches launch.sh's comments only through export_launch.comment."""
        import csv
        import io

        p = self.plan
        header = [comment(f"{p.planner}: {p.model} on {p.cluster}, exported by `nest export`"),
                  *[comment(f"warning: {w}") for w in self.warnings], "set -euo pipefail"]
        buf = io.StringIO()
        rows = self.rank_map
        if self.device_names:  # which graph node / torus chip each device id is
            rows = [{**r, "device_name": self.device_names[r["device"]]} for r in rows]
        w = csv.DictWriter(buf, fieldnames=list(rows[0]), lineterminator="\n")
        w.writeheader()
        w.writerows(rows)
        return {"launch.sh": "\n".join(["#!/usr/bin/env bash", *header, self.command()]) + "\n",
                "slurm.sbatch": self.slurm(),  # srun: one launch.sh per node
                "args.txt": "\n".join(check_text(x, "argument") for x in self.args) + "\n",
                "rank_map.csv": buf.getvalue()}


def layout_string(plan: Plan, num_layers: int, mtp: int = 0) -> str:
    """Megatron-Core's --pipeline-model-parallel-layout for the plan's chunks in model order
    (`mtp` multi-token-prediction modules "m" just before the loss: the head layer prices them)."""
    chunks = []
    for st in plan.stages:
        blocks = sum(1 for i in range(st.first_layer, st.last_layer + 1) if 0 < i < num_layers - 1)
        s = "E" if st.first_layer == 0 else ""
        s += f"t*{blocks}" if blocks > 1 else ("t" if blocks == 1 else "")
        s += "m" * mtp + "L" if st.last_layer == num_layers - 1 else ""
        chunks.append(s)
    return "|".join(chunks)


def megatron_rank_coords(rank: int, tp: int, cp: int, ep: int, dp: int, pp: int,
                         order: str) -> dict:
    """Coordinates of a rank in Megatron's order (fastest first), e.g. 'tp-cp-ep-dp-pp'."""
    sizes = {"tp": tp, "cp": cp, "ep": ep, "dp": dp, "pp": pp}
    out, r = {}, rank
    for name in order.split("-"):
        out[name] = r % sizes[name]
        r //= sizes[name]
    return out


def _project(plan: Plan, warnings: list[str]) -> Plan:
    stages = list(plan.stages)
    recs = {s.recompute for s in stages}
    if len(recs) > 1:
        strongest = max(recs, key=RECOMPUTE_ORDER.index)
        warnings.append(f"stages use recomputation modes {sorted(recs)}; Megatron-LM applies one "
                        f"mode to all stages: exported '{strongest}' everywhere")
        stages = [replace(s, recompute=strongest) for s in stages]
    zeros = {s.zero_stage for s in stages}
    if len(zeros) > 1:
        z = max(zeros)
        warnings.append(f"stages use ZeRO stages {sorted(zeros)}; Megatron-LM shards all stages "
                        f"alike: exported ZeRO-{z} everywhere")
        stages = [replace(s, zero_stage=z) for s in stages]
    out = plan.with_(stages=tuple(stages))
    if plan.schedule == "gpipe":
        warnings.append("Megatron-LM runs 1F1B, not GPipe: exported as 1F1B")
        out = out.with_(schedule="1f1b")
    return out


def _uniform(plan: Plan, u: Variant, ids: list[tuple[int, ...]], placement: str) -> Plan:
    """`plan` with variant u on every stage, stage j (chunk j of an interleaved plan) on ids[j % pp]
    (the same dp x ep micro-batch streams: dp = dp x ep / ep_u)."""
    d = plan.dp * plan.ep // u.ep
    stages = tuple(replace(s, tp=None, sp=None, ep=None, cp=None, num_devices=d * u.width,
                           device_ids=tuple(ids[j % plan.pp])) for j, s in enumerate(plan.stages))
    return plan.with_(tp=u.tp, sp=u.sp, ep=u.ep, cp=u.cp, dp=d, stages=stages,
                      placement=placement)


def uniform_candidates(plan: Plan) -> list[tuple[str, Plan]]:
    """The uniform plans a heterogeneous `plan` may be exported as (module docstring: (a), (b)),
    in preference order, each with a short description."""
    p = plan.pp
    variants = list(dict.fromkeys(plan.stage_variant(j) for j in range(len(plan.stages))))
    own = [tuple(s.device_ids) for s in plan.stages[:p]]
    out = []
    for u in variants:
        d = plan.dp * plan.ep // u.ep
        n = d * u.width
        if n * p > plan.devices_used:
            continue  # more devices than the plan uses: not a projection of it
        names = [plan.placement] if is_order(plan.placement) else []
        names += _launch_orders(u.tp, u.cp, u.ep, d, p)[0]
        regular = {}
        for o in names:
            regular.setdefault(tuple(stage_device_ids(p, d, u.tp, u.cp, u.ep, o)), o)
        layouts: dict[tuple, str] = {}
        if all(len(ids) == n for ids in own):
            layouts[tuple(own)] = regular.get(tuple(own), "custom")
        for ids, o in regular.items():
            layouts.setdefault(ids, o)
        for ids, name in layouts.items():
            where = f"{name} ({canonical_order(name)})" if name != "custom" else ""
            if ids == tuple(own):
                where = "the plan's devices" + (f", {where}" if where else "")
            out.append((f"{u.key} on {where}", _uniform(plan, u, list(ids), name)))
    return out


def _score(candidates, problem: Problem, per_node: int, failed: list[str], errors: tuple):
    """[(time per batch, index, what, plan)] of the feasible candidates [(what, plan)], each
    resolved to its launch order and scored by the shared evaluator; the reason of every other
    one (an infeasible evaluation or one of `errors`) is appended to `failed`."""
    scored = []
    for what, q in candidates:
        try:
            r, _, _ = resolve_order(q, problem, per_node, [])
            ev = evaluate(r, problem)
        except errors as e:
            failed.append(f"{what}: {e}")
            continue
        if ev.feasible:
            scored.append((ev.time_per_batch_s, len(scored), what, q))
        else:
            failed.append(f"{what}: {ev.reason}")
    return scored


def _project_variants(plan: Plan, problem: Problem, per_node: int, original_s: float,
                      warnings: list[str]) -> Plan:
    """A heterogeneous plan -> the fastest feasible uniform candidate (module docstring)."""
    variants = {plan.stage_variant(j) for j in range(len(plan.stages))}
    keys = sorted(u.key for u in variants)
    who = f"plan '{plan.planner}' for {plan.model} on {plan.cluster}"
    failed: list[str] = []
    for u in sorted(variants, key=lambda u: u.key):
        n = plan.pp * plan.dp * plan.ep // u.ep * u.width
        if n > plan.devices_used:
            failed.append(f"{u.key} on every stage needs {n} devices, the plan uses "
                          f"{plan.devices_used}")
    scored = _score(uniform_candidates(plan), problem, per_node, failed, (PlanError,))
    if not scored:
        why = "; ".join(failed)
        raise PlanError(f"{who}: stages use variants {', '.join(keys)}, but Megatron-LM runs one "
                        f"set of tensor / sequence / expert / context-parallel degrees for the "
                        f"whole model, and no uniform projection (one of these variants on every "
                        f"stage, same cuts and micro-batch streams, no more devices) fits: {why}")
    t, _, what, q = min(scored)
    warnings.append(f"stages use variants {', '.join(keys)}; Megatron-LM runs one set of tensor / "
                    f"sequence / expert / context-parallel degrees for the whole model: exported "
                    f"{what} on every stage (dp {q.dp}, {q.devices_used} devices), the fastest "
                    f"feasible of {len(scored) + len(failed)} uniform projections: {t:.4f} s per "
                    f"batch vs {original_s:.4f} s planned"
                    + (f" (not runnable: {'; '.join(failed)})" if failed else ""))
    return q


def launch_candidates(plan: Plan) -> tuple[list[str], bool]:
    """Orders the export may launch `plan` with, preferred first, and whether Megatron-LM's CLI
    expresses them (else they need megatron-core's `order` argument)."""
    return _launch_orders(plan.tp, plan.cp, plan.ep, plan.dp, plan.pp)


def _launch_orders(tp: int, cp: int, ep: int, dp: int, pp: int) -> tuple[list[str], bool]:
    deg = (tp, cp, ep, dp, pp)
    cli = cli_orders(*deg)
    return (cli, True) if cli else (list(launcher_orders(*deg)), False)


def _with_order(plan: Plan, order: str) -> Plan:
    ids = stage_device_ids(plan.pp, plan.dp, plan.tp, plan.cp, plan.ep, order)
    return plan.with_(placement=order, stages=tuple(replace(s, device_ids=ids[j % plan.pp])
                                                    for j, s in enumerate(plan.stages)))


def resolve_order(plan: Plan, problem: Problem, per_node: int,
                   warnings: list[str]) -> tuple[Plan, str, list[dict]]:
    """(plan to export, launch order, rank map): module docstring, steps 1-3."""
    cands, cli = launch_candidates(plan)
    if not cli:
        raise PlanError(f"cp = {plan.cp} and ep = {plan.ep} both > 1: Megatron-LM's CLI orders "
                        f"build expert groups on a separate (expert-tp, ep, expert-dp, pp) grid "
                        f"that folds ep over the cp ranks, which is not this plan's groups")
    ids = [s.device_ids for s in plan.stages[:plan.pp]]
    chosen = launch_order(ids, plan.tp, plan.cp, plan.ep, plan.dp, plan.pp, per_node)
    out = plan
    if chosen is None:
        scored = [(evaluate(q, problem).time_per_batch_s, o, q)
                  for o in cands for q in [_with_order(plan, o)]]
        _, chosen, out = min(scored, key=lambda x: x[0])
        warnings.append(f"placement '{plan.placement}' is not launchable (torchrun gives each "
                        f"node one block of consecutive ranks; only devices within a node can be "
                        f"pinned): exported as {chosen}, the Megatron-LM order with the shortest "
                        f"time per batch")
    return out, chosen, _rank_map(out, chosen, per_node)


def _rank_map(plan: Plan, order: str, devices_per_node: int) -> list[dict]:
    """Megatron rank -> the plan's device with the same coordinates."""
    t, c, e, d, p = plan.tp, plan.cp, plan.ep, plan.dp, plan.pp
    out = []
    for rank in range(p * d * e * c * t):
        k = megatron_rank_coords(rank, t, c, e, d, p, order)
        inner = (k["ep"] * c + k["cp"]) * t + k["tp"]  # nest.problem.evaluate.inner_groups
        dev = plan.stages[k["pp"]].device_ids[k["dp"] * plan.width + inner]
        out.append({"rank": rank, "node": dev // devices_per_node,
                    "local_rank": dev % devices_per_node, "device": dev, **k})
    return out


def _fold_candidates(plan: Plan) -> list[tuple[str, Plan]]:
    """Plans Megatron-LM's CLI can run for a plan with cp > 1 and ep > 1 (module docstring):
    (a) experts replicated (ep 1, dp x ep), (b) cp folded into tp (tp x cp), both on the same
    devices and micro-batch streams, and (c) cp 1 with dp x cp (same devices, cp x the streams),
    each on the regular placement of every CLI order."""
    t, c, e, d, p = plan.tp, plan.cp, plan.ep, plan.dp, plan.pp
    out = []
    for what, u, dd in ((f"ep 1 (experts replicated, dp {d * e})", Variant(t, plan.sp, 1, c),
                         d * e),
                        (f"cp folded into tp (tp {t * c})", Variant(t * c, plan.sp, e, 1), d),
                        (f"cp 1 (dp {d * c})", Variant(t, plan.sp, e, 1), d * c)):
        n = dd * u.width
        streams = dd * u.ep
        base = plan.with_(tp=u.tp, sp=u.sp and u.tp > 1, ep=u.ep, cp=u.cp, dp=dd,
                          num_microbatches=-(-plan.global_batch // (plan.mbs * streams)),
                          stages=tuple(replace(s, tp=None, sp=None, ep=None, cp=None,
                                               num_devices=n) for s in plan.stages))
        for o in _launch_orders(u.tp, u.cp, u.ep, dd, p)[0]:
            out.append((f"{what}, {o}", _with_order(base, o)))
    return out


def _project_folding(plan: Plan, problem: Problem, per_node: int, original_s: float,
                     warnings: list[str]) -> Plan:
    """cp > 1 and ep > 1 -> the fastest feasible of _fold_candidates (or a PlanError)."""
    failed: list[str] = []
    scored = _score(_fold_candidates(plan), problem, per_node, failed, (PlanError, ValueError))
    who = f"plan '{plan.planner}' for {plan.model} on {plan.cluster}"
    why = (f"cp = {plan.cp} and ep = {plan.ep} both > 1: Megatron-LM builds its expert groups "
           f"on a separate (expert-tp, ep, expert-dp, pp) grid in the order its CLI fixes "
           f"(tp-cp-ep-dp-pp or tp-cp-ep-pp-dp, megatron/training/initialize.py), which folds ep "
           f"over the cp ranks instead of the plan's separate ep groups")
    if not scored:
        raise PlanError(f"{who}: {why}; no runnable projection fits: {'; '.join(failed)}")
    t, _, what, q = min(scored)
    warnings.append(f"{why}: exported {what}, the fastest feasible of {len(scored) + len(failed)}"
                    f" runnable projections: {t:.4f} s per batch vs {original_s:.4f} s planned")
    return q


def _pipeline_args(out: Plan, num_blocks: int, num_layers: int, mtp: int = 0) -> list[str]:
    """Interleaving and the split: Megatron's default (num_blocks divisible by pp x v, blocks
    spread evenly) needs no layout; any other split is a --pipeline-model-parallel-layout, which
    also fixes v (Megatron rejects it beside --num-virtual-stages-per-pipeline-rank)."""
    v = out.virtual_stages if out.schedule == "interleaved" else 1
    chunks = out.pp * v
    cuts = [(s.first_layer, s.last_layer) for s in out.stages]
    if chunks > 1 and (num_blocks % chunks or cuts != block_cuts(num_blocks, chunks)):
        return ["--pipeline-model-parallel-layout", layout_string(out, num_layers, mtp)]
    return ["--num-virtual-stages-per-pipeline-rank", str(v)] if v > 1 else []


def _memory_args(out: Plan) -> list[str]:
    a = []
    rec = out.stages[0].recompute
    if rec == "selective":
        a += ["--recompute-granularity", "selective"]
    elif rec == "full":
        a += ["--recompute-granularity", "full", "--recompute-method", "uniform",
              "--recompute-num-layers", "1"]
    z = out.stages[0].zero_stage
    if z == 1:
        a.append("--use-distributed-optimizer")
    elif z in (2, 3):  # Megatron-FSDP (v1 runs on the distributed optimizer; its own checkpoints)
        a += ["--use-megatron-fsdp", "--use-distributed-optimizer",
              "--data-parallel-sharding-strategy", "optim_grads" if z == 2 else "optim_grads_params",
              "--ckpt-format", "fsdp_dtensor"]
    return a


def _overlap_args(out: Plan, tr, warnings: list[str]) -> list[str]:
    """The overlap the plan was priced with, as Megatron-LM's flags (module docstring)."""
    a = []
    if tr.dp_overlap == "bucketed":
        a += ["--overlap-grad-reduce", "--ddp-bucket-size", str(tr.dp_bucket_params)]
    if tr.param_gather_overlap and out.stages[0].zero_stage in (1, 2, 3):
        if tr.dp_overlap == "bucketed":
            a.append("--overlap-param-gather")
        else:
            warnings.append("param_gather_overlap was priced with dp_overlap: "
                            f"{tr.dp_overlap}; Megatron-LM runs --overlap-param-gather only with "
                            "--overlap-grad-reduce (dp_overlap: bucketed): not exported")
    if out.schedule == "interleaved" and out.virtual_stages > 1 and not tr.overlap_p2p_comm:
        # Megatron-LM overlaps the interleaved sends by default (--no-overlap-p2p-communication
        # is store_false on overlap_p2p_comm): priced blocking, run blocking
        a.append("--no-overlap-p2p-communication")
    if tr.tp_comm_overlap and out.sp and out.tp > 1:
        a.append("--tp-comm-overlap")
        ub = ("tp_overlap_rs", "tp_overlap_splits", "tp_overlap_attn_sms", "tp_overlap_mlp_sms",
              "tp_overlap_bulk_sms")
        te = type(tr)()  # the defaults: Transformer Engine's own userbuffers config
        diff = {k: getattr(tr, k) for k in ub if getattr(tr, k) != getattr(te, k)}
        if diff:
            warnings.append(f"tp_comm_overlap was priced with {diff}; --tp-comm-overlap alone runs "
                            "Transformer Engine's default userbuffers config: pass the priced one "
                            "with --tp-comm-overlap-cfg (proj_fprop / fc2_fprop method, num_splits, "
                            "num_sm; the bulk overlaps' set_sm_margin)")
    return a


def _cp_comm_args(m, warnings: list[str]) -> list[str]:
    """--cp-comm-type where Transformer Engine refuses context parallelism's default ring (p2p;
    transformer_engine/pytorch/attention/dot_product_attention/context_parallel.py,
    attn_forward_func_with_cp): a sliding window runs only with all_gather or a2a; a learnable
    softmax (gpt-oss's sinks) only with a2a. all_gather is the form priced (an all-gather of the
    sequence's K and V per layer, nest.graph.closed_form; docs/modeling.md, "Context
    parallelism"); a2a exchanges heads instead, so it comes with a warning."""
    if m.attention_sinks:
        warnings.append(f"{m.name}: Transformer Engine runs a learnable softmax (attention sinks) "
                        f"under context parallelism only with --cp-comm-type a2a, exported; the "
                        f"plan priced the K/V all-gather")
        return ["--cp-comm-type", "a2a"]
    return ["--cp-comm-type", "all_gather"] if windowed(m) else []


def check_plan_text(plan: Plan, model_name: str) -> None:
    """The plan's strings that reach the exported scripts (export_launch.check_text): the
    planner is a registry name, the model and cluster a catalog name or a path; SpecError naming
    the key otherwise."""
    check_name(plan.planner, "planner")
    check_text(plan.model, "model")
    check_text(plan.cluster, "cluster")
    check_text(model_name, "model name")


# The most accelerators one host (server, compute tray) holds in the systems the catalog ships
# (DGX / HGX: 8); a first network level above it is a scale-up domain, not a host.
MAX_USUAL_HOST = 8


def to_megatron(plan: Plan, problem: Problem) -> MegatronExport:
    m, g = problem.model, problem.graph
    check_plan_text(plan, m.name)
    warnings: list[str] = []
    original = evaluate(plan, problem)
    out = _project(plan, warnings)
    hw_per_node = problem.cluster.node_size  # hosts, not the first network level
    # a torus's first level is a pair of chips on one link, never a host (a TPU v4 host has 4)
    if not problem.cluster.devices_per_node and (hw_per_node > MAX_USUAL_HOST
                                                 or problem.cluster.network == "torus"):
        warnings.append(f"cluster '{problem.cluster.name}' states no devices_per_node: hosts are "
                        f"taken as its first network level, {hw_per_node} devices each (the "
                        f"sbatch and the rank placement); set the cluster file's key "
                        f"'devices_per_node' to the GPUs of one server or tray")
    if out.heterogeneous:
        out = _project_variants(out, problem, hw_per_node, original.time_per_batch_s, warnings)
    if out.cp > 1 and out.ep > 1:
        out = _project_folding(out, problem, hw_per_node, original.time_per_batch_s, warnings)
    out, order, ranks = resolve_order(out, problem, hw_per_node, warnings)
    projected = out != plan
    ev = evaluate(out, problem) if projected else original
    if projected:
        warnings.append(f"time per batch under the shared evaluator: {ev.time_per_batch_s:.4f} s "
                        f"exported vs {original.time_per_batch_s:.4f} s planned")
    tr, attention, why = problem.training, problem.attention, []
    if (out.schedule == "interleaved" and out.virtual_stages > 1
            and not interleaves(out.pp, tr.overlap_p2p_comm)):
        # Megatron-LM's validate_args (placement.interleaves): with pp 2 it interleaves only
        # with overlapped sends
        tr = tr.with_(overlap_p2p_comm=True)
        why.append("Megatron-LM interleaves pp 2 only with overlapped pipeline sends "
                   "(validate_args): exported with them (overlap_p2p_comm)")
    if out.cp > 1 and not runs_context_parallel(attention):  # placement.runs_context_parallel
        tr, attention = tr.with_(attention="flash"), "flash"
        why.append("Transformer Engine runs context parallelism only with a fused attention "
                   "kernel: exported with --attention-backend auto, priced as flash attention")
    if why:
        t = evaluate(out, problem.with_training(tr))
        warnings.append(f"{'; '.join(why)}: {t.time_per_batch_s:.4f} s vs "
                        f"{ev.time_per_batch_s:.4f} s as planned")
        ev = t
    L = g.num_layers
    dp_total = out.dp * out.ep
    batch = out.global_batch
    if batch % (out.mbs * dp_total):  # validate_args asserts divisibility
        batch = out.num_microbatches * out.mbs * dp_total
        warnings.append(f"global batch {out.global_batch} is not a multiple of mbs x dp x ep = "
                        f"{out.mbs * dp_total}, which Megatron-LM requires: exported {batch}, "
                        f"the {out.num_microbatches} micro-batches per pipeline the evaluator "
                        f"priced")
    a = ["--tensor-model-parallel-size", str(out.tp),
         "--pipeline-model-parallel-size", str(out.pp)]
    if out.sp and out.tp > 1:
        a.append("--sequence-parallel")
    if out.cp > 1:
        a += ["--context-parallel-size", str(out.cp)]
        a += _cp_comm_args(m, warnings)
    if out.ep > 1:
        a += ["--expert-model-parallel-size", str(out.ep)]
    if m.is_moe and m.linear_bias and out.tp > 1:
        # Megatron-LM: "Bias in Moe is only supported when ETP==1" (TransformerConfig)
        a += ["--expert-tensor-parallel-size", "1"]
        warnings.append(f"{m.name}: Megatron-LM runs biased experts (gpt-oss) unsplit "
                        f"(--expert-tensor-parallel-size 1); the plan priced them split over "
                        f"tp={out.tp}")
    a += _pipeline_args(out, L - 2, L, problem.model.mtp_layers)
    a += _memory_args(out)
    a += _overlap_args(out, tr, warnings)
    if order == "tp-cp-ep-pp-dp":
        a.append("--use-tp-pp-dp-mapping")
    a += ["--micro-batch-size", str(out.mbs), "--global-batch-size", str(batch)]
    a += _model_args(m, warnings)
    if m.is_moe and problem.training.moe_dispatcher == "hybridep":  # priced as HybridEP
        a[a.index("--moe-token-dispatcher-type") + 1] = "flex"
        a += ["--moe-flex-dispatcher-backend", "hybridep"]
    a += [*precision_args(problem.training), "--vocab-size", str(m.vocab_size)]  # nest.spec.precision
    # the attention kernel the plan was priced with (nest.graph.attention): Megatron's unfused
    # core, or a fused one (Transformer Engine picks cuDNN / flash: "auto")
    a += ["--attention-backend", "unfused" if attention == "unfused" else "auto"]
    fsdp = "--use-megatron-fsdp" in a
    exp = MegatronExport(
        out, a, "examples/bert/pretrain_bert.py" if m.family == "bert" else "pretrain_gpt.py",
        len(ranks), hw_per_node, ranks, warnings, ev.time_per_batch_s,
        original.time_per_batch_s, order, env=launch_env(out.tp, out.cp, fsdp),
        unset_env=("CUDA_DEVICE_MAX_CONNECTIONS",) if fsdp else (),
        device_names=problem.cluster.device_names, model_name=m.name)
    check_against_plan(exp)  # an internal invariant: Megatron's groups are the ones we priced
    return exp


def _groups_of(ranks: list[dict], vary: tuple[str, ...]) -> set[frozenset[int]]:
    """Device sets that differ only in the coordinates `vary` (for checks)."""
    keys = [k for k in ("pp", "dp", "ep", "cp", "tp") if k not in vary]
    out: dict[tuple, set[int]] = {}
    for r in ranks:
        out.setdefault(tuple(r[k] for k in keys), set()).add(r["device"])
    return {frozenset(s) for s in out.values()}


# group kind (nest.problem.placement.harness_groups) -> the rank-map coordinates its groups vary
RANK_MAP_KINDS = {"tp": ("tp",), "cp": ("cp",), "ep": ("ep",), "pp": ("pp",),
                  "dp": ("dp", "ep"), "dp_cp": ("dp", "ep", "cp"), "expert_dp": ("dp", "cp")}


def check_against_plan(exp: MegatronExport) -> None:
    """Every group kind is the plan's: the tp, cp, ep, dp (ours, and Megatron's dp x ep), pp and
    gradient groups of the rank map's coordinates, and the groups megatron-core builds for the
    launch order (nest.problem.placement.megatron_groups) mapped through the rank map, equal the groups
    the evaluator prices from the stages' device ids (nest.problem.evaluate.inner_groups); raise if not."""
    plan = exp.plan
    assert not plan.heterogeneous, "Megatron-LM runs one variant on every stage"
    dev = {r["rank"]: r["device"] for r in exp.rank_map}
    assert len(set(dev.values())) == len(exp.rank_map), "a device used twice"
    stages = [s.device_ids for s in plan.stages[:plan.pp]]
    for j in range(plan.pp):
        assert {r["device"] for r in exp.rank_map if r["pp"] == j} == set(stages[j]), f"stage {j}"
    ours = harness_groups(stages, plan.tp, plan.cp, plan.ep, plan.dp)
    for kind, vary in RANK_MAP_KINDS.items():
        assert _groups_of(exp.rank_map, vary) == ours[kind], f"{kind} groups of the rank map"
        if kind == "dp":  # our own data-parallel coordinate alone
            assert _groups_of(exp.rank_map, ("dp",)) == ours["dp_ours"], "dp groups (ours)"
    meg = megatron_groups(plan.tp, plan.cp, plan.ep, plan.dp, plan.pp, exp.order)
    for kind, groups in meg.items():
        assert {frozenset(dev[r] for r in g) for g in groups} == ours[kind], (
            f"megatron-core's {kind} groups for order {exp.order}")
