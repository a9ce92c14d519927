"""Plan -> runnable Megatron-LM arguments and the rank placement that realises the plan's devices.

What maps directly (Megatron-LM / Megatron-Core argument names):
    tp, sp, cp, ep             --tensor-model-parallel-size, --sequence-parallel,
                               --context-parallel-size, --expert-model-parallel-size
    pp, interleaving           --pipeline-model-parallel-size, --num-virtual-stages-per-pipeline-rank
    cuts                       nothing when the blocks are spread evenly with the embedding first and
                               the head last (Megatron's default split); otherwise
                               --pipeline-model-parallel-layout, one '|'-separated chunk per
                               (virtual) stage in model order, E = embedding, t*k = k transformer
                               blocks, L = final norm + LM head + loss; chunks are dealt round-robin
                               to the pipeline ranks, as our interleaved chunks are
    recompute (all stages)     selective: --recompute-granularity selective (Korthikanti et al.
                               2022: the core attention); full: --recompute-granularity full
                               --recompute-method uniform --recompute-num-layers 1
    ZeRO (all stages)          1: --use-distributed-optimizer; 2 / 3: Megatron-Core's FSDP,
                               --use-custom-fsdp --data-parallel-sharding-strategy optim_grads /
                               optim_grads_params (newer releases name it --use-megatron-fsdp)
    batch                      --micro-batch-size, --global-batch-size (Megatron's data-parallel
                               size is dp x ep: experts parallelise inside the data-parallel ranks)
Rank order: Megatron builds its groups from ranks in the order tp-cp-ep-dp-pp (tp fastest), our
replica_major placement; --use-tp-pp-dp-mapping gives tp-cp-ep-pp-dp, our stage_major (Megatron
allows it only without ep / cp). Rank r runs on the device the plan gives that rank's coordinates:
the rank map lists, per rank, its coordinates and its device (node = id // devices per node), so a
launcher can pin it; for regular placements it is the identity.

What Megatron cannot express is projected and re-scored, never hidden: stage-wise recomputation or
ZeRO stages become the strongest mode any stage uses (it needs no more memory), GPipe becomes 1F1B,
stage_major with ep or cp becomes replica_major; each projection is a warning, and the projected
plan's time per batch under the shared evaluator is reported beside the original's.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from nest.evaluate import Problem, evaluate
from nest.plan import Plan, place
from nest.plan_spec import block_cuts

RECOMPUTE_ORDER = ("none", "selective", "full")


@dataclass
class MegatronExport:
    plan: Plan  # the plan the arguments run (the input, or its projection)
    args: list[str]
    script: str  # pretrain_gpt.py | pretrain_bert.py
    world_size: int
    devices_per_node: int
    rank_map: list[dict]  # rank, node, local_rank, device, pp, dp, ep, cp, tp
    warnings: list[str] = field(default_factory=list)
    time_per_batch_s: float | None = None  # the exported plan's, shared evaluator
    original_time_per_batch_s: float | None = None

    def command(self) -> str:
        nodes = -(-self.world_size // self.devices_per_node)
        per_node = min(self.world_size, self.devices_per_node)
        lines = [f"torchrun --nnodes {nodes} --nproc-per-node {per_node} "
                 f"--node-rank $NODE_RANK --master-addr $MASTER_ADDR --master-port 6000 \\",
                 f"    {self.script} \\"]
        pairs = []
        i = 0
        while i < len(self.args):
            a = self.args[i]
            if i + 1 < len(self.args) and not self.args[i + 1].startswith("--"):
                pairs.append(f"{a} {_quote(self.args[i + 1])}")
                i += 2
            else:
                pairs.append(a)
                i += 1
        lines += [f"    {p} \\" for p in pairs]
        lines[-1] = lines[-1].rstrip(" \\")
        return "\n".join(lines)

    def identity_placement(self) -> bool:
        return all(r["device"] == r["rank"] for r in self.rank_map)


def _quote(s: str) -> str:
    return f"'{s}'" if any(c in s for c in "|*()") else s


def layout_string(plan: Plan, num_layers: int) -> str:
    """Megatron-Core's --pipeline-model-parallel-layout for the plan's chunks in model order."""
    chunks = []
    for st in plan.stages:
        blocks = sum(1 for i in range(st.first_layer, st.last_layer + 1) if 0 < i < num_layers - 1)
        s = "E" if st.first_layer == 0 else ""
        s += f"t*{blocks}" if blocks > 1 else ("t" if blocks == 1 else "")
        s += "L" if st.last_layer == num_layers - 1 else ""
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
    if plan.placement == "stage_major" and (plan.ep > 1 or plan.cp > 1):
        warnings.append("--use-tp-pp-dp-mapping (stage_major) does not combine with expert or "
                        "context parallelism in Megatron-LM: exported replica_major")
        ids = place(plan.pp, plan.dp, plan.width, "replica_major")
        out = out.with_(placement="replica_major",
                        stages=tuple(replace(s, device_ids=ids[j % plan.pp])
                                     for j, s in enumerate(out.stages)))
    return out


def _rank_map(plan: Plan, order: str, devices_per_node: int) -> list[dict]:
    """Megatron rank -> the plan's device with the same coordinates."""
    t, c, e, d, p = plan.tp, plan.cp, plan.ep, plan.dp, plan.pp
    out = []
    for rank in range(p * d * e * c * t):
        k = megatron_rank_coords(rank, t, c, e, d, p, order)
        inner = (k["ep"] * c + k["cp"]) * t + k["tp"]  # nest.evaluate.inner_groups
        dev = plan.stages[k["pp"]].device_ids[k["dp"] * plan.width + inner]
        out.append({"rank": rank, "node": dev // devices_per_node,
                    "local_rank": dev % devices_per_node, "device": dev, **k})
    return out


def to_megatron(plan: Plan, problem: Problem) -> MegatronExport:
    m, g = problem.model, problem.graph
    warnings: list[str] = []
    original = evaluate(plan, problem)
    out = _project(plan, warnings)
    projected = bool(warnings)
    ev = evaluate(out, problem) if projected else original
    if projected:
        warnings.append(f"time per batch under the shared evaluator: {ev.time_per_batch_s:.4f} s "
                        f"exported vs {original.time_per_batch_s:.4f} s planned")
    L = g.num_layers
    dp_total = out.dp * out.ep
    if out.global_batch % (out.mbs * dp_total):
        warnings.append(f"global batch {out.global_batch} is not a multiple of mbs x dp x ep = "
                        f"{out.mbs * dp_total}: Megatron-LM requires it (the evaluator rounds "
                        f"the micro-batches up to {out.num_microbatches})")
    a = ["--tensor-model-parallel-size", str(out.tp),
         "--pipeline-model-parallel-size", str(out.pp)]
    if out.sp:
        a.append("--sequence-parallel")
    if out.cp > 1:
        a += ["--context-parallel-size", str(out.cp)]
    if out.ep > 1:
        a += ["--expert-model-parallel-size", str(out.ep)]
    v = out.virtual_stages if out.schedule == "interleaved" else 1
    if v > 1:
        a += ["--num-virtual-stages-per-pipeline-rank", str(v)]
    cuts = [(s.first_layer, s.last_layer) for s in out.stages]
    if out.pp * v > 1 and cuts != block_cuts(L - 2, out.pp * v):
        a += ["--pipeline-model-parallel-layout", layout_string(out, L)]
    rec = out.stages[0].recompute
    if rec == "selective":
        a += ["--recompute-granularity", "selective"]
    elif rec == "full":
        a += ["--recompute-granularity", "full", "--recompute-method", "uniform",
              "--recompute-num-layers", "1"]
    z = out.stages[0].zero_stage
    if z == 1:
        a.append("--use-distributed-optimizer")
    elif z in (2, 3):
        a += ["--use-custom-fsdp", "--data-parallel-sharding-strategy",
              "optim_grads" if z == 2 else "optim_grads_params"]
    order = "tp-cp-ep-dp-pp"
    if out.placement == "stage_major":
        a.append("--use-tp-pp-dp-mapping")
        order = "tp-cp-ep-pp-dp"
    a += ["--micro-batch-size", str(out.mbs), "--global-batch-size", str(out.global_batch)]
    # the model (Megatron-LM's GPT / BERT arguments)
    a += ["--num-layers", str(m.num_layers), "--hidden-size", str(m.hidden_size),
          "--ffn-hidden-size", str(m.ffn_hidden_size), "--num-attention-heads", str(m.num_heads),
          "--seq-length", str(m.seq_len), "--max-position-embeddings", str(m.seq_len)]
    if m.num_kv_heads != m.num_heads:
        a += ["--group-query-attention", "--num-query-groups", str(m.num_kv_heads)]
    if m.norm == "rmsnorm":
        a += ["--normalization", "RMSNorm", "--position-embedding-type", "rope",
              "--disable-bias-linear"]
    if m.ffn_type == "swiglu":
        a.append("--swiglu")
    if m.is_moe:
        a += ["--num-experts", str(m.num_experts), "--moe-router-topk", str(m.top_k)]
    if not m.tied_embeddings:
        a.append("--untie-embeddings-and-output-weights")
    if not m.has_dropout:
        a += ["--attention-dropout", "0", "--hidden-dropout", "0"]
    a += ["--bf16", "--vocab-size", str(m.vocab_size)]
    hw_per_node = problem.cluster.levels[0].devices_per_group
    ranks = _rank_map(out, order, hw_per_node)
    exp = MegatronExport(out, a, "pretrain_bert.py" if m.family == "bert" else "pretrain_gpt.py",
                         len(ranks), hw_per_node, ranks, warnings, ev.time_per_batch_s,
                         original.time_per_batch_s)
    check_against_plan(exp)  # an internal invariant: Megatron's groups are the ones we priced
    return exp


def _groups_of(ranks: list[dict], vary: str) -> set[frozenset[int]]:
    """Device sets that differ only in coordinate `vary` (for checks)."""
    keys = [k for k in ("pp", "dp", "ep", "cp", "tp") if k != vary]
    out = {}
    for r in ranks:
        out.setdefault(tuple(r[k] for k in keys), set()).add(r["device"])
    return {frozenset(s) for s in out.values()}


def check_against_plan(exp: MegatronExport) -> None:
    """Megatron's pipeline stages and tensor-parallel groups, built from the rank map, are the
    plan's stage device sets and its tp groups (nest.evaluate.inner_groups); raise if not."""
    from nest.evaluate import inner_groups

    plan = exp.plan
    stages = {}
    for r in exp.rank_map:
        stages.setdefault(r["pp"], set()).add(r["device"])
    for j in range(plan.pp):
        assert stages[j] == set(plan.stages[j].device_ids), f"stage {j}"
    tp = {frozenset(row.tolist()) for j in range(plan.pp)
          for row in inner_groups(plan.stages[j].device_ids, plan.tp, plan.cp, plan.ep,
                                  plan.dp)["tp"]}
    assert _groups_of(exp.rank_map, "tp") == tp, "tensor-parallel groups"
    assert len({r["device"] for r in exp.rank_map}) == len(exp.rank_map), "a device used twice"


