"""A compact, hand-written plan (YAML or JSON) -> a full `nest.plan/v1` plan.

A user states the parallel configuration the way Megatron-LM's arguments do and the harness fills
in the layer cuts and the device ids (nest.problem.plan.place):

    model: gpt3_175b            # catalog name or a model YAML
    cluster: dgx_a100
    num_devices: 64
    global_batch: 64            # default: config/training.yaml
    mbs: 1
    tp: 8                       # tensor parallel (with sp: sequence parallel)
    sp: true
    pp: 8                       # pipeline stages (devices groups)
    dp: 1                       # data parallel
    ep: 1                       # expert parallel (MoE), cp: 1 context parallel
    recompute: selective        # none | selective | full, or one per stage
    zero_stage: 0               # 0..3, or one per stage (1 = Megatron's distributed optimizer)
    seq_len: 8192               # optional: the training sequence (a Hugging Face config has none)
    training: {dp_overlap: bucketed, tp_comm_overlap: true}  # optional: any config/training.yaml
                                # key for this run (nest.spec.settings.training_overrides)
    dp_includes_ep: false       # true: dp is Megatron-LM's data-parallel size, expert ranks
                                # included (ours: dp x ep); devices = pp x dp x tp x cp x ep when
                                # false, pp x dp x tp x cp when true
    precision: {grad_reduce: bf16}   # optional: overrides of config/training.yaml's precision
                                # (nest.spec.precision: compute bf16 | fp8, params, grad_reduce,
                                # main_grads, main_params, exp_avg, exp_avg_sq, fp8_recipe ...)
    schedule: 1f1b              # 1f1b | gpipe | interleaved (with virtual_stages: v)
    placement: replica_major    # Megatron's rank order (tp, dp fastest) | stage_major | a rank
                                # order string, fastest first, e.g. tp-ep-dp-cp-pp (nest.problem.placement)
    cuts: [[0, 12], ...]        # optional: first and last layer-graph index per stage (or chunk);
                                # default: transformer blocks spread evenly, embedding first,
                                # head last (Megatron-LM)

A relative model or cluster path is read against the plan file's folder (the folder the user is
in when no such file is there). `nest evaluate FILE` accepts either form; the keys are validated (nest/schemas/plan_spec.json) and
errors name the file and the key.
"""

from __future__ import annotations

import os
from pathlib import Path

from nest.common.errors import PlanError, SpecError
from nest.problem.plan import SCHEMA, Plan, Stage, check_finite, place, read_json
from nest.spec.catalog import read_yaml, validate


def block_cuts(num_blocks: int, chunks: int) -> list[tuple[int, int]]:
    """Layer-graph ranges of `chunks` stages over [embedding, block_0 .. block_{n-1}, head]:
    blocks spread evenly (the first chunks take one more when chunks does not divide them),
    the embedding on the first chunk and the head on the last (Megatron-LM)."""
    base, extra = divmod(num_blocks, chunks)
    return sized_cuts([base + (1 if j < extra else 0) for j in range(chunks)], num_blocks)


def sized_cuts(sizes: list[int], num_blocks: int) -> list[tuple[int, int]]:
    """Layer-graph ranges of chunks holding sizes[j] blocks each, in model order over
    [embedding, block_0 .. block_{n-1}, head]: the embedding on the first chunk, the head on the
    last (a chunk of 0 blocks holds only those)."""
    assert sum(sizes) == num_blocks and len(sizes) >= 1
    cuts, start = [], 1
    for n in sizes:
        cuts.append((start, start + n - 1))
        start += n
    cuts[0] = (0, cuts[0][1])
    cuts[-1] = (cuts[-1][0], num_blocks + 1)
    return cuts


def read_plan_file(path: str | Path) -> dict:
    """The raw mapping of a plan file: JSON (`.json`) or YAML."""
    path = Path(path)
    if path.suffix == ".json":
        return read_json(path)
    try:
        return read_yaml(path)
    except SpecError as e:
        raise PlanError(str(e)) from None


def is_spec(d: dict) -> bool:
    """A compact plan: neither the full plan's schema tag nor its stages."""
    return "stages" not in d and "schema" not in d


def _per_stage(value, n: int, key: str, where: str) -> list:
    if isinstance(value, list):
        if len(value) != n:
            raise PlanError(f"{where}: key '{key}': {len(value)} values, expected one per stage "
                            f"({n})")
        return value
    return [value] * n


def expand(d: dict, problem, where: str) -> Plan:
    """The full plan of spec `d` for `problem` (its model, cluster, devices, mbs, batch)."""
    validate(d, "plan_spec", where)
    g = problem.graph
    tp, pp, dp = d.get("tp", 1), d["pp"], d["dp"]
    ep, cp, sp = d.get("ep", 1), d.get("cp", 1), bool(d.get("sp", False))
    dp = megatron_dp(d, where)
    if pp * dp * tp * cp * ep > d["num_devices"]:
        conv = ("dp_includes_ep: true, so dp counts Megatron-LM's data-parallel ranks, expert "
                "ranks included" if d.get("dp_includes_ep") else
                "dp counts replicas of the whole tp x cp x ep group (write dp_includes_ep: true "
                "to give Megatron-LM's data-parallel size, expert ranks included)")
        raise PlanError(f"{where}: key 'dp': pp x dp x tp x cp x ep = {pp} x {dp} x {tp} x "
                        f"{cp} x {ep} = {pp * dp * tp * cp * ep} devices > num_devices = "
                        f"{d['num_devices']}; {conv}")
    schedule = d.get("schedule", "1f1b")
    v = d.get("virtual_stages", 1) if schedule == "interleaved" else 1
    if schedule != "interleaved" and d.get("virtual_stages", 1) != 1:
        raise PlanError(f"{where}: key 'virtual_stages': needs schedule: interleaved")
    chunks = pp * v
    num_blocks = g.num_layers - 2
    if "cuts" in d:
        cuts = [tuple(c) for c in d["cuts"]]
        if len(cuts) != chunks:
            raise PlanError(f"{where}: key 'cuts': {len(cuts)} ranges, expected pp x "
                            f"virtual_stages = {chunks}")
    else:
        if chunks > num_blocks:
            raise PlanError(f"{where}: key 'pp': {pp} x {v} chunks exceed the model's "
                            f"{num_blocks} transformer blocks")
        cuts = block_cuts(num_blocks, chunks)
    rec = _per_stage(d.get("recompute", "none"), pp, "recompute", where)
    zero = _per_stage(d.get("zero_stage", 0), pp, "zero_stage", where)
    width = tp * ep * cp
    try:
        ids = place(pp, dp, width, d.get("placement", "replica_major"), tp=tp, cp=cp, ep=ep)
    except PlanError as e:
        raise PlanError(f"{where}: key 'placement': {e}") from None
    stages = tuple(Stage(a, b, dp * width, ids[c % pp], zero[c % pp], rec[c % pp])
                   for c, (a, b) in enumerate(cuts))
    return Plan(planner=d.get("planner", "user"), model=d["model"], cluster=d["cluster"],
                num_devices=d["num_devices"], mbs=d.get("mbs", 1),
                global_batch=problem.training.global_batch,
                num_microbatches=problem.num_microbatches(dp, ep), tp=tp, pp=pp, dp=dp, ep=ep,
                cp=cp, sp=sp, stages=stages, placement=d.get("placement", "replica_major"),
                schedule=schedule, virtual_stages=v)


def megatron_dp(d: dict, where: str) -> int:
    """The plan's dp in the harness's convention (replicas of the tp x cp x ep group): `dp`, or
    with dp_includes_ep Megatron-LM's data-parallel size divided by ep."""
    dp, ep = d["dp"], d.get("ep", 1)
    if not d.get("dp_includes_ep"):
        return dp
    width = d.get("tp", 1) * d.get("cp", 1) * dp
    if dp % ep and width % ep == 0:  # Megatron-Core's expert grid (etp, ep, edp, pp) folds ep
        # over the tp / cp ranks too (expert_tensor_parallel_size below tp: MoE parallel folding)
        near = max(k for k in range(1, min(dp, ep) + 1) if dp % k == 0)
        raise PlanError(f"{where}: key 'ep': {ep} spans more than Megatron-LM's data-parallel "
                        f"size dp = {dp} (over tp x cp x dp = {width} ranks: MoE parallel "
                        f"folding, expert tensor parallelism below tp), which the harness does "
                        f"not price: expert ranks lie within the data-parallel ranks here, so ep "
                        f"divides dp (e.g. ep {near})")
    if dp % ep:
        raise PlanError(f"{where}: key 'dp': {dp} with dp_includes_ep: true must be a multiple "
                        f"of ep = {ep} (Megatron-LM's data-parallel size includes the expert "
                        f"ranks)")
    return dp // ep


def resolve_relative(name: str, base: Path) -> str:
    """A model / cluster reference of a plan file: a relative path is read against the file's
    folder (`base`), or as given when no such file is there; catalog names stay names."""
    if not (name.endswith((".yaml", ".yml", ".json")) or "/" in name):
        return name
    p = Path(name)
    if p.is_absolute():
        return name
    here = base / p
    return str(here) if here.exists() or not p.exists() else name


def relative_to_file(name: str, plan_path: str | Path) -> str:
    """The inverse of resolve_relative for a plan about to be written to `plan_path`: a model /
    cluster path relative to the working folder, as the user typed it, becomes relative to the
    plan file's folder; catalog names, absolute paths and paths that name no file stay as they
    are."""
    if not (name.endswith((".yaml", ".yml", ".json")) or "/" in name):
        return name
    p = Path(name)
    if p.is_absolute() or not p.exists():
        return name
    return Path(os.path.relpath(p.resolve(), Path(plan_path).resolve().parent)).as_posix()


def load_plan(path: str | Path, training=None, overrides: dict | None = None):
    """(plan, problem) from a plan file in either form; the problem uses the plan's own global
    batch, micro-batch size, sequence length and training overrides; `overrides` (the command
    line's training flags, nest.spec.settings keys) come last."""
    from nest.spec.settings import load_training, training_overrides

    where = str(path)
    d = read_plan_file(path)
    check_kind(d, where)
    check_finite(d, where)
    tr = training or load_training()
    base = Path(path).parent
    if is_spec(d):
        validate(d, "plan_spec", where)
        d = dict(d, model=resolve_relative(d["model"], base),
                 cluster=resolve_relative(d["cluster"], base))
        tr = training_overrides(tr, d.get("training"), f"{where}: key 'training'")
        tr = tr.with_(global_batch=d.get("global_batch", tr.global_batch))
        tr = tr.with_precision(d.get("precision"), where)
        over = dict(overrides or {})
        seq = over.pop("seq_len", None) or d.get("seq_len")
        tr = training_overrides(tr, over, "command line")
        problem = _problem(where, d["model"], d["cluster"], d["num_devices"], d.get("mbs", 1),
                           tr, seq)
        return expand(d, problem, where), problem
    plan = Plan.from_dict(d, where)
    tr = training_overrides(tr, plan.extra.get("training"), f"{where}: key 'extra.training'")
    # the plan's own global_batch (its num_microbatches count it) over extra.training's copy: an
    # edit of it is read, not silently replaced by the batch the plan was made with
    tr = tr.with_(global_batch=plan.global_batch)
    over = dict(overrides or {})
    seq = over.pop("seq_len", None) or plan.extra.get("seq_len")
    tr = training_overrides(tr, over, "command line")
    if tr.global_batch != plan.global_batch:  # --global-batch on a full plan: its micro-batches
        k = plan.mbs * plan.dp * plan.ep
        m = -(-tr.global_batch // k)
        if plan.schedule == "interleaved" and m % plan.pp:  # named as the user gave it
            raise PlanError(f"{where}: --global-batch {tr.global_batch}: {m} micro-batches of "
                            f"mbs x dp x ep = {k} samples; this plan's interleaved schedule "
                            f"needs a multiple of pp = {plan.pp} (a global batch that is a "
                            f"multiple of {k * plan.pp})")
        plan = plan.with_(global_batch=tr.global_batch, num_microbatches=m)
    return plan, _problem(where, resolve_relative(plan.model, base),
                          resolve_relative(plan.cluster, base), plan.num_devices, plan.mbs, tr,
                          seq)


def _problem(where: str, model, cluster, num_devices, mbs, training, seq_len=None):
    """make_problem for a plan file: an error in the model or cluster it names (or a device
    count the cluster cannot hold) names the plan file first."""
    from nest.problem.evaluate import make_problem

    try:
        return make_problem(model, cluster, num_devices, mbs, training, seq_len=seq_len)
    except SpecError as e:
        raise PlanError(f"{where}: {e}") from None


# what other artifacts a user may hand to `nest evaluate` by mistake
_NOT_PLANS = {"nest.evaluation/v1": "an evaluation (`nest evaluate -o`); its plan is the "
                                    "plan file it was made from",
              "nest.no_plan/v1": "a no-plan record (the planner found no plan: see its "
                                 "'reason')",
              "nest.layer_graph/v1": "a layer graph (`nest graph -o`)",
              "nest.cost_table/v1": "a cost table"}


def check_kind(d: dict, where: str) -> None:
    """A PlanError saying what the file is when it is another artifact than a plan."""
    schema = d.get("schema")
    if schema is None or schema == SCHEMA:
        return
    what = _NOT_PLANS.get(schema) if isinstance(schema, str) else None
    if what:
        raise PlanError(f"{where}: this is {what}, not a plan (schema '{schema}'; expected "
                        f"'{SCHEMA}' or a compact plan YAML)")
    raise PlanError(f"{where}: key 'schema': {schema!r}, expected '{SCHEMA}' (a plan) or no "
                    f"schema key (a compact plan)")
