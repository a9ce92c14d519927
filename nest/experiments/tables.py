"""The paper's tables (2, 6, 7), Figure 2 and section 5.3's communication share, beside the paper.

Each experiment reads what the pipeline already makes (plan and evaluation JSONs, the measured
H100 blocks) or runs one planner point at a time, and writes a CSV (floats at 9 significant digits,
"\\n" line ends: the same inputs give the same bytes, except wall-clock `solve_time_s`) and a
Markdown page with the paper's numbers (config/paper/claims.yaml) beside ours.

* Table 2 (`strategy_row`, `table2`): the strategy {p, d, t, s, e, c} each planner picks at 512
  devices on the fat tree, its placement, ZeRO stage, recomputation and layers per stage
  (run-length encoded, as nest.experiments.results.runs), beside the paper's Table 2. Our `s` is the paper's
  sequence-parallel degree: t when sequence parallelism is on, else 1 (the paper writes
  {16, 8, 4, 4} for NEST's GPT-3 with SP and {32, 4, 4, 1} for Megatron's without).
* Table 6 (`memory_table`): per-device peak memory of one transformer block trained at
  micro-batch 1 (the configuration the committed H100 measurements profiles/h100_sxm/blocks.json
  ran), predicted by the evaluator's memory terms (nest.fidelity.block_validation.predict_block) and as a pipeline
  stage the planners budget (the stage kernel, with fragmentation and framework overhead), beside
  the measurement and the paper's Table 6 (Alpa's compiled executables vs NEST's estimates; the
  paper does not say which configuration they are for).
* Table 7 (`reduced_problem`, `ablation_point`, `table7`): NEST with and without ZeRO on problems
  whose HBM is cut to the paper's capacity (appendix C.3).
* Figure 2 and section 5.3 (`comm_breakdown`, `figure2`, `comm_share`): the share of the time per
  batch spent in communication, from the evaluator's breakdown (`term_category`).

What "communication share" means here. The evaluator's breakdown (nest.problem.evaluate) adds up to the
time per batch T: the bottleneck stage's terms times m micro-batches, the pipeline bubble, then the
data-parallel sync terms and the optimizer step after the flush. The evaluator models no overlap
of communication with compute (training settings dp_overlap: none, the default), so every
communication term in it is exposed, on the critical path. Then
    comm_share               = (sum of the communication terms) / T
with the bubble counted as a category of its own (idle time, neither compute nor communication);
    comm_share_critical_path = (stage communication x (1 + bubble / stage terms) + sync terms) / T
attributes the bubble too: the paper's schedule form prices the pipeline as m + p - 1 slots of the
bottleneck stage's micro-batch, each with the same compute / communication mix, so the bubble's
(p - 1) slots carry the same communication fraction. Communication terms: the variant's
collectives (tp_*, cp_*, ep_*, and their re-run under full recomputation), ZeRO's per-micro-batch
collectives, pipeline point-to-point sends, and the data-parallel sync (including the tied
embedding's all-reduce). Compute: forward, backward, recomputed forward; the optimizer step
(HBM-bound) is its own category.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pandas as pd

from nest.problem.plan import read_json  # noqa: F401 - the table scripts read plans through it
from nest.experiments.results import NO_PLAN_SCHEMA, runs
from nest.experiments.results import write_frame as write_csv  # noqa: F401 - the pipeline's CSV writer
from nest.spec.catalog import config_dir, read_yaml

GB = 1e9

# ---------------------------------------------------------------------------------------------
# Breakdown terms -> categories
# ---------------------------------------------------------------------------------------------

# category order of the figure and the CSV columns; COMM_CATEGORIES are communication
CATEGORIES = ("compute", "recompute", "tp", "cp", "ep", "zero", "p2p", "dp_sync", "bubble",
              "optimizer")
COMM_CATEGORIES = ("tp", "cp", "ep", "zero", "p2p", "dp_sync")
CATEGORY_LABELS = {
    "compute": "compute (fwd + bwd)", "recompute": "recomputed forward",
    "tp": "tensor-parallel collectives", "cp": "context-parallel collectives",
    "ep": "expert all-to-all", "zero": "ZeRO per micro-batch", "p2p": "pipeline send/recv",
    "dp_sync": "data-parallel gradient sync", "bubble": "pipeline bubble (idle)",
    "optimizer": "optimizer step",
}
CATEGORY_COLORS = {
    "compute": "#4c72b0", "recompute": "#8fa8d0", "tp": "#dd8452", "cp": "#f2b880",
    "ep": "#c44e52", "zero": "#937860", "p2p": "#da8bc3", "dp_sync": "#6a3d9a",
    "bubble": "#cccccc", "optimizer": "#55a868",
}
_GROUPS = ("tp", "cp", "ep")


def term_category(key: str) -> str:
    """The category of one key of an evaluation's breakdown_s (nest.problem.evaluate): 'stage<j>.<term>'
    for the bottleneck stage's terms (times m), 'pipeline_bubble', 'dp_sync.<term>',
    'optimizer_step', or 'dp_sync_and_optimizer.exposed' (dp_overlap other than none: the exposed
    rest of sync + step, counted as data-parallel sync). An unknown key raises ValueError, so a
    new term is never silently mis-counted."""
    if key == "pipeline_bubble":
        return "bubble"
    if key == "optimizer_step":
        return "optimizer"
    if key.startswith("dp_sync.") or key == "dp_sync_and_optimizer.exposed":
        return "dp_sync"
    head, dot, term = key.partition(".")
    if not (dot and head.startswith("stage") and head[5:].isdigit()):
        raise ValueError(f"breakdown key '{key}': not a known evaluator term")
    if term in ("compute_fwd", "compute_bwd"):
        return "compute"
    if term == "recompute":
        return "recompute"
    if term in ("p2p_fwd", "p2p_bwd"):
        return "p2p"
    if term.startswith(("zero_reduce_scatter", "zero3_all_gather")):
        return "zero"
    name = term.removeprefix("recompute_")  # a collective re-run by full recomputation
    group = name.partition("_")[0]
    if group in _GROUPS and "." in name:
        return group
    raise ValueError(f"breakdown key '{key}': not a known evaluator term")


def term_level(key: str) -> str:
    """The network level a communication term names (its last '.'-suffix: node, leaf, ...);
    'p2p' for pipeline sends, which the breakdown does not split by level; '' otherwise."""
    cat = term_category(key)
    if cat == "p2p":
        return "p2p"
    if cat not in COMM_CATEGORIES or key == "dp_sync_and_optimizer.exposed":
        return ""
    if key.endswith("tied_embedding_all_reduce"):
        return "tied_embedding"
    return key.rsplit(".", 1)[1]


def comm_breakdown(evaluation: dict) -> dict:
    """An evaluation (JSON dict) -> seconds per category, the communication share (module
    docstring) and the communication seconds per network level. The categories add up to the
    time per batch."""
    bd = evaluation.get("breakdown_s") or {}
    total = evaluation.get("time_per_batch_s")
    cat = {c: 0.0 for c in CATEGORIES}
    stage = {c: 0.0 for c in CATEGORIES}
    levels: dict[str, float] = {}
    for k, x in bd.items():
        c = term_category(k)
        cat[c] += x
        if k.startswith("stage"):
            stage[c] += x
        lvl = term_level(k)
        if lvl:
            levels[lvl] = levels.get(lvl, 0.0) + x
    comm = sum(cat[c] for c in COMM_CATEGORIES)
    stage_total = sum(stage.values())
    stage_comm = sum(stage[c] for c in COMM_CATEGORIES)
    scale = 1.0 + cat["bubble"] / stage_total if stage_total else 1.0
    crit = stage_comm * scale + (comm - stage_comm)
    out = {f"{c}_s": cat[c] for c in CATEGORIES}
    out.update(
        time_per_batch_s=total, comm_s=comm,
        comm_share=comm / total if total else None,
        comm_critical_path_s=crit,
        comm_share_critical_path=crit / total if total else None,
        comm_by_level=";".join(f"{k}:{v:.6g}" for k, v in sorted(levels.items())),
    )
    return out


def comm_share(evaluation) -> float | None:
    """The communication share (`comm_breakdown`) of a feasible nest.problem.evaluate.Evaluation;
    None for no evaluation or an infeasible one."""
    if evaluation is None or not evaluation.feasible:
        return None
    return comm_breakdown({"breakdown_s": evaluation.breakdown_s,
                           "time_per_batch_s": evaluation.time_per_batch_s})["comm_share"]


# ---------------------------------------------------------------------------------------------
# Plans -> strategy columns
# ---------------------------------------------------------------------------------------------


def _stage_variant(plan: dict, s: dict) -> dict:
    return {k: plan[k] if s.get(k) is None else s[k] for k in ("tp", "sp", "ep", "cp")}


def strategy(plan: dict) -> dict:
    """The paper's {p, d, t, s, e, c} of a plan JSON (nest.plan/v1) plus its per-stage knobs.
    s is the sequence-parallel degree (t with SP, else 1); heterogeneous stages report the
    plan-level variant in t/s/e/c and each stage's in `stage_variants` (run-length encoded)."""
    st = plan["stages"]
    variants = [_stage_variant(plan, s) for s in st]
    keys = [f"t{v['tp']}{'s' if v['sp'] else ''}e{v['ep']}c{v['cp']}" for v in variants]
    dp_of = [plan["dp"] * plan["ep"] // v["ep"] for v in variants]
    zero_deg = []
    for s, v, d in zip(st, variants, dp_of):  # ZeRO shards dense states over d * ep * cp ranks
        zero_deg.append(d * v["ep"] * v["cp"] if s.get("zero_stage", 0) else 1)
    return {
        "p": plan["pp"], "d": plan["dp"], "t": plan["tp"],
        "s": plan["tp"] if plan["sp"] else 1, "e": plan["ep"], "c": plan["cp"],
        "devices_used": sum(s["num_devices"] for s in st[:plan["pp"]]),
        "placement": plan.get("placement"),
        "layers": runs(s["last_layer"] - s["first_layer"] + 1 for s in st),
        "zero": runs(s.get("zero_stage", 0) for s in st),
        "zero_degree": runs(zero_deg),
        "recompute": runs(s.get("recompute", "none") for s in st),
        "stage_variants": runs(keys) if len(set(keys)) > 1 else "",
    }


def strategy_text(r: dict, moe: bool) -> str:
    """{p, d, t, s} (dense) or {p, d, t, s, e, c} (expert-parallel), as the paper writes it."""
    keys = ("p", "d", "t", "s", "e", "c") if moe else ("p", "d", "t", "s")
    return "{" + ", ".join("-" if r.get(k) is None or _isnan(r.get(k)) else str(int(r[k]))
                           for k in keys) + "}"


def _isnan(x) -> bool:
    return isinstance(x, float) and math.isnan(x)


def claims() -> dict:
    return read_yaml(config_dir() / "paper" / "claims.yaml")


# ---------------------------------------------------------------------------------------------
# Table 2
# ---------------------------------------------------------------------------------------------

# our planner -> the paper's Table 2 column (claims.yaml table2.strategies keys)
PAPER_COLUMN = {"manual": "manual", "paper_manual": "manual", "mcmc": "mcmc",
                "paper_mcmc": "mcmc", "phaze": "phaze", "paper_phaze": "phaze",
                "alpa_e": "alpa_e", "nest": "nest"}
STRATEGY_KEYS = ("p", "d", "t", "s", "e", "c")
TABLE2_COLUMNS = ["model", "planner", "status", "p", "d", "t", "s", "e", "c", "devices_used",
                  "placement", "layers", "zero", "zero_degree", "recompute", "stage_variants",
                  "time_per_batch_s", "strategy", "paper_column", "paper_strategy",
                  "paper_recomputation", "matches_paper", "reason"]


def strategy_row(plan: dict, evaluation: dict | None = None) -> dict:
    """One Table 2 row from a plan JSON (or a no-plan record) and its evaluation (optional)."""
    r = {"model": plan["model"], "planner": plan["planner"]}
    has_plan = plan.get("schema") != NO_PLAN_SCHEMA
    if has_plan:
        r.update(strategy(plan))
        ok = evaluation is None or bool(evaluation.get("feasible"))
        r["status"] = "feasible" if ok else "infeasible"
        r["reason"] = "" if evaluation is None else " ".join(str(evaluation["reason"]).split())
        r["time_per_batch_s"] = (evaluation.get("time_per_batch_s")
                                 if evaluation is not None and ok else None)
    else:
        r.update({k: None for k in STRATEGY_KEYS})
        r.update(status=plan.get("status", "no_plan"), reason=" ".join(plan["reason"].split()),
                 time_per_batch_s=None)
    return r


def _paper_strategy(values, moe: bool) -> dict:
    keys = STRATEGY_KEYS if moe else STRATEGY_KEYS[:4]
    out = dict(zip(keys, values))
    if not moe:
        out.update(e=1, c=1)
    return out


def table2(pairs: list[tuple[dict, dict | None]], paper: dict | None = None) -> pd.DataFrame:
    """Rows of `strategy_row` for (plan, evaluation) pairs, with the paper's strategy beside."""
    paper = claims()["table2"] if paper is None else paper
    rows = []
    for plan, ev in pairs:
        r = strategy_row(plan, ev)
        m = paper["models"].get(r["model"], {})
        moe = bool(m.get("expert_parallel"))
        col = PAPER_COLUMN.get(r["planner"])
        vals = m.get("strategies", {}).get(col) if col else None
        r["strategy"] = strategy_text(r, moe) if r["p"] is not None else ""
        r["paper_column"] = col or ""
        if vals is None:
            r["paper_strategy"], r["matches_paper"] = "", None
        else:
            ps = _paper_strategy(vals, moe)
            r["paper_strategy"] = strategy_text(ps, moe)
            known = [k for k in STRATEGY_KEYS if ps[k] is not None]
            r["matches_paper"] = (r["p"] is not None
                                  and all(int(r[k]) == int(ps[k]) for k in known))
        r["paper_recomputation"] = m.get("recomputation", "") if col == "nest" else ""
        rows.append(r)
    order = {m: i for i, m in enumerate(paper["models"])}
    df = pd.DataFrame(rows, columns=TABLE2_COLUMNS)
    df["_m"] = df.model.map(lambda x: order.get(x, len(order)))
    df["_p"] = df.planner.map(_planner_rank)
    return df.sort_values(["_m", "model", "_p", "planner"], kind="stable").drop(
        columns=["_m", "_p"]).reset_index(drop=True)


def _planner_rank(planner: str) -> int:
    from nest.reports.figures import PLANNER_ORDER

    return PLANNER_ORDER.index(planner) if planner in PLANNER_ORDER else len(PLANNER_ORDER)


def table2_markdown(df: pd.DataFrame, paper: dict | None = None) -> str:
    paper = claims()["table2"] if paper is None else paper
    out = [f"# Table 2: chosen strategies at {paper['num_devices']} devices "
           f"({paper['cluster']})", "",
           f"Paper: {paper['source']}. {paper['format']}", "",
           "Ours: each planner's plan (results/plans/<planner>/<model>/"
           f"{paper['cluster']}/{paper['num_devices']}/mbs1.json), scored by the shared "
           "evaluator. Per-stage columns are run-length encoded from the first stage "
           "(`1*3,0` = three stages at 1, then one at 0); `zero degree` is the number of ranks "
           "ZeRO shards a stage's dense states over (1 without ZeRO); layers count the "
           "embedding and the LM head as layers of their own. paper_* planners are the "
           "artifact's stored plans for the same point.", "",
           "| model | planner | ours {p, d, t, s(, e, c)} | paper | same | devices | placement "
           "| layers per stage | ZeRO | ZeRO degree | recompute | time/batch s |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in df.itertuples():
        same = "" if r.matches_paper is None or _isnan(r.matches_paper) else (
            "yes" if r.matches_paper else "no")
        if r.p is None or _isnan(r.p):
            out.append(f"| {r.model} | {r.planner} | {r.status}: {r.reason} | "
                       f"{r.paper_strategy} | {same} | | | | | | | |")
            continue
        t = "" if r.time_per_batch_s is None or _isnan(r.time_per_batch_s) else (
            f"{r.time_per_batch_s:.4g}")
        status = "" if r.status == "feasible" else f" ({r.status})"
        out.append(f"| {r.model} | {r.planner} | {r.strategy}{status} | {r.paper_strategy} | "
                   f"{same} | {int(r.devices_used)} | {r.placement} | {r.layers} | {r.zero} | "
                   f"{r.zero_degree} | {r.recompute}"
                   f"{' (' + r.paper_recomputation + ' in the paper)' if r.paper_recomputation else ''}"
                   f" | {t} |")
    het = df[df.stage_variants.fillna("") != ""]
    if not het.empty:
        out += ["", "Heterogeneous stages (each stage's own variant, t<tp>[s]e<ep>c<cp>): "
                + "; ".join(f"{r.model} {r.planner}: {r.stage_variants}"
                            for r in het.itertuples()) + "."]
    # agreement per planner: a paper_* row replays the artifact's own plan and agrees by
    # construction, so it never counts toward the planner it replays
    n = df[df.matches_paper.notna()]
    per = [f"{p} {int(g.matches_paper.astype(bool).sum())} of {len(g)}"
           for p, g in n.groupby("planner", sort=False) if not p.startswith("paper_")]
    out += ["", "Same {p, d, t, s(, e, c)} as the paper's column, per planner (rows that have "
            "one; the paper gives only p for Alpa; paper_* rows replay the artifact's plans and "
            "are not counted): " + ", ".join(per) + "."]
    return "\n".join(out) + "\n"


# ---------------------------------------------------------------------------------------------
# Table 6
# ---------------------------------------------------------------------------------------------

TABLE6_COLUMNS = ["model", "seq_len", "params_per_block", "predicted_GB", "predicted_flash_GB",
                  "measured_GB", "error", "error_flash", "stage_budget_GB", "paper_alpa_GB",
                  "paper_nest_GB", "paper_error"]


def block_stage_peak_bytes(problem, layer: int = 1) -> float:
    """The evaluator's peak memory of one layer as a pipeline stage on one device: no ZeRO, no
    recomputation, one stashed micro-batch (the last stage of a 1F1B pipeline), with the
    hardware's allocator fragmentation and framework overhead: what a planner budgets."""
    from nest.costs.layers import layer_table
    from nest.costs.stage import Options, stage_cost
    from nest.graph.layer_graph import Variant

    lt = layer_table(problem, Variant(), ("none",))
    c = stage_cost(problem, lt, (0,), 1, Options((0,), ("none",)), 1, cell=(layer, layer),
                   detail=True)
    return float(sum(c.detail["memory_bytes"].values()))


def memory_table(hardware: str = "h100_sxm", blocks_path: str | Path | None = None,
                 problems: dict | None = None, paper: dict | None = None) -> pd.DataFrame:
    """Predicted vs measured per-device peak memory of one transformer block (micro-batch 1,
    the model's sequence, bf16, mixed-precision Adam: the runs of profiles/<hw>/blocks.json),
    beside the paper's Table 6. `problems` (model -> Problem on this hardware) adds the stage
    budget column (`block_stage_peak_bytes`)."""
    from nest.fidelity.block_validation import validate

    paper = claims()["table6"] if paper is None else paper
    rep = validate(hardware, blocks_path)
    rows = []
    for r in rep["rows"]:
        m = r["model"]
        pm = paper["models"].get(m, {})
        alpa, nest_ = pm.get("alpa_executable_GB"), pm.get("nest_estimate_GB")
        budget = (block_stage_peak_bytes(problems[m]) / GB if problems and m in problems
                  else None)
        rows.append({
            "model": m, "seq_len": r["pred"]["seq_len"], "params_per_block": r["pred"]["params"],
            "predicted_GB": r["pred"]["peak_bytes"] / GB,
            "predicted_flash_GB": r["pred"]["peak_flash_bytes"] / GB,
            "measured_GB": r["meas"]["peak_bytes"] / GB,
            "error": r["err"]["peak_bytes"], "error_flash": r["err"]["peak_flash_bytes"],
            "stage_budget_GB": budget, "paper_alpa_GB": alpa, "paper_nest_GB": nest_,
            "paper_error": nest_ / alpa - 1.0 if alpa and nest_ is not None else None,
        })
    order = {m: i for i, m in enumerate(paper["models"])}
    df = pd.DataFrame(rows, columns=TABLE6_COLUMNS)
    df["_o"] = df.model.map(lambda x: order.get(x, len(order)))
    return df.sort_values(["_o", "model"], kind="stable").drop(columns="_o").reset_index(
        drop=True)


def _f(x, fmt: str = "{:.3g}") -> str:
    return "-" if x is None or _isnan(x) else fmt.format(x)


def table6_markdown(df: pd.DataFrame, paper: dict | None = None,
                    hardware: str = "h100_sxm") -> str:
    paper = claims()["table6"] if paper is None else paper
    pct = "{:+.1%}"
    out = ["# Table 6: per-device peak memory, predicted vs measured", "",
           f"Paper: {paper['source']}: {paper['claim']}", "",
           f"Ours: one transformer block trained on one {hardware} at micro-batch 1 and the "
           "model's sequence length, bf16, mixed-precision Adam (profiles/"
           f"{hardware}/blocks.json, measured with max_memory_allocated above what was "
           "allocated before the block). predicted: the evaluator's memory terms for that run "
           "(nest.fidelity.block_validation.predict_block: 18 B per parameter, the bf16 gradients until the "
           "step, the output gradient, the activations the layer graph saves); flash: the same "
           "with flash attention's accounting (no s x s score tensors, the fp32 log-sum-exp "
           "instead); stage budget: the same block as a one-layer pipeline stage in the "
           "planners' memory model (one stashed micro-batch, the catalog model's dropout masks, "
           "allocator fragmentation and framework overhead). GB = 1e9 bytes. The paper's "
           "numbers are for a configuration it does not state (Alpa's compiled executables vs "
           "NEST's estimates), so only the errors are comparable.", "",
           "| model | seq | params/block | predicted GB | measured GB | error | flash GB | "
           "error (flash) | stage budget GB | paper: Alpa exec. GB | paper: NEST est. GB | "
           "paper error |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in df.itertuples():
        out.append(f"| {r.model} | {r.seq_len} | {r.params_per_block / 1e6:.1f} M | "
                   f"{r.predicted_GB:.3f} | {r.measured_GB:.3f} | {_f(r.error, pct)} | "
                   f"{r.predicted_flash_GB:.3f} | {_f(r.error_flash, pct)} | "
                   f"{_f(r.stage_budget_GB, '{:.3f}')} | {_f(r.paper_alpa_GB)} | "
                   f"{_f(r.paper_nest_GB)} | {_f(r.paper_error, pct)} |")
    both = df.dropna(subset=["paper_error"])
    out += ["", "Mean absolute error: ours "
            f"{df.error.abs().mean():.1%} (flash accounting {df.error_flash.abs().mean():.1%}) "
            f"over {len(df)} blocks; on the paper's {len(both)} models ours "
            f"{both.error.abs().mean():.1%} (flash {both.error_flash.abs().mean():.1%}), "
            f"the paper's {both.paper_error.abs().mean():.1%}."]
    return "\n".join(out) + "\n"


# ---------------------------------------------------------------------------------------------
# Table 7
# ---------------------------------------------------------------------------------------------

POINT_SCHEMA = "nest.table7_point/v1"
TABLE7_COLUMNS = ["model", "variant", "overrides", "cluster", "num_devices", "hbm_GB",
                  "framework_overhead", "status", "feasible", "time_per_batch_s", "p", "d", "t",
                  "s", "e", "c", "devices_used", "placement", "layers", "zero", "zero_degree",
                  "recompute", "max_peak_memory_GB", "solve_time_s", "paper_devices_used",
                  "paper_strategy", "paper_zero", "reason"]


def reduced_problem(model: str, cluster: str, num_devices: int, hbm_bytes: float,
                    framework_overhead: bool = True, graph=None, training=None):
    """make_problem with the hardware's HBM cut to `hbm_bytes`; framework_overhead False also
    zeroes the hardware's fixed framework overhead and allocator fragmentation, so that the
    whole capacity is the memory model's budget (the paper's memory model has neither)."""
    from nest.problem.problem import make_problem

    pr = make_problem(model, cluster, num_devices, graph=graph, training=training,
                      mbs=graph.mbs if graph is not None else 1)
    kw = {"hbm_bytes": float(hbm_bytes)}
    if not framework_overhead:
        kw.update(memory_overhead_bytes=0.0, memory_fragmentation=0.0)
    return pr.with_hardware(**kw)


def ablation_point(problem, overrides: dict | None = None, planner: str = "nest",
                   **meta) -> dict:
    """Run one planner with settings overrides on a (reduced) problem: a JSON-able record with
    status, time, strategy, ZeRO per stage and the plan itself (`meta` is copied in)."""
    from nest.planners.registry import run_planner

    out = run_planner(planner, problem, overrides)
    hw = problem.hardware
    rec = {"schema": POINT_SCHEMA, **meta, "planner": planner,
           "overrides": overrides or {}, "model": problem.model_ref or problem.model.name,
           "cluster": problem.cluster_ref or problem.cluster.name,
           "num_devices": problem.num_devices, "hbm_bytes": hw.hbm_bytes,
           "memory_overhead_bytes": hw.memory_overhead_bytes,
           "memory_fragmentation": hw.memory_fragmentation,
           "status": out.status, "feasible": out.status == "feasible",
           "reason": " ".join(out.reason.split()), "solve_time_s": out.solve_time_s,
           "time_per_batch_s": None, "max_peak_memory_bytes": None, "strategy": None,
           "plan": None}
    if out.plan is not None:
        ev = out.evaluation
        plan = out.plan.to_dict()
        rec.update(plan=plan, strategy=strategy(plan),
                   time_per_batch_s=ev.time_per_batch_s if ev.feasible else None,
                   max_peak_memory_bytes=max(s.peak_memory_bytes for s in ev.stages))
    return rec


def write_point(rec: dict, path: str | Path) -> None:
    from nest.common.atomic_io import write_text_atomic

    write_text_atomic(path, json.dumps(rec, indent=1, sort_keys=True) + "\n")


def table7(records: list[dict], paper: dict | None = None) -> pd.DataFrame:
    paper = claims()["table7"] if paper is None else paper
    rows = []
    for rec in records:
        pm = paper["models"].get(rec["model"], {})
        st = rec.get("strategy") or {}
        r = {k: rec.get(k) for k in ("model", "variant", "cluster", "num_devices", "status",
                                     "feasible", "time_per_batch_s", "solve_time_s")}
        r.update({k: st.get(k) for k in ("p", "d", "t", "s", "e", "c", "devices_used",
                                         "placement", "layers", "zero", "zero_degree",
                                         "recompute")})
        r.update(overrides=json.dumps(rec.get("overrides") or {}, sort_keys=True),
                 hbm_GB=rec["hbm_bytes"] / GB,
                 framework_overhead=bool(rec["memory_overhead_bytes"]
                                         or rec["memory_fragmentation"]),
                 max_peak_memory_GB=(rec["max_peak_memory_bytes"] / GB
                                     if rec.get("max_peak_memory_bytes") is not None else None),
                 paper_devices_used=pm.get("devices_used"),
                 paper_strategy=("{" + ", ".join(str(pm["strategy"][k]) for k in ("p", "d", "t"))
                                 + "}") if pm.get("strategy") else "",
                 paper_zero=(f"embedding: {pm['zero']['embedding']}; other layers: "
                             f"{pm['zero']['other_layers']}") if pm.get("zero") else "",
                 reason=rec.get("reason", ""))
        rows.append(r)
    df = pd.DataFrame(rows, columns=TABLE7_COLUMNS)
    order = {m: i for i, m in enumerate(paper["models"])}
    df["_o"] = df.model.map(lambda x: order.get(x, len(order)))
    return df.sort_values(["_o", "model"], kind="stable").drop(columns="_o").reset_index(
        drop=True)


def table7_markdown(df: pd.DataFrame, paper: dict | None = None) -> str:
    paper = claims()["table7"] if paper is None else paper
    out = ["# Table 7: ZeRO ablation at reduced HBM", "",
           f"Paper: {paper['source']}. {paper['note']}", "",
           "Ours: NEST on the problem with the hardware's HBM cut to the paper's capacity, once "
           "with its whole space and once with the overrides in `variant` (no_zero: "
           "`{\"space\": {\"zero_stages\": [0]}}`; *_tp1: tensor parallelism off, as in the "
           "paper's plans). Strategy {p, d, t}; per-stage columns run-length encoded from the "
           "first stage; `ZeRO degree` = ranks a stage's states are sharded over.", "",
           "| model | HBM | devices | variant | status | time/batch s | ours {p, d, t} | used "
           "| layers per stage | ZeRO | ZeRO degree | recompute | peak GB | paper {p, d, t} "
           "| paper used | paper ZeRO |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in df.itertuples():
        hbm = f"{r.hbm_GB:g} GB" if r.hbm_GB >= 1 else f"{r.hbm_GB * 1e3:g} MB"
        if r.p is None or _isnan(r.p):
            out.append(f"| {r.model} | {hbm} | {r.num_devices} | {r.variant} | {r.status}: "
                       f"{r.reason} | | | | | | | | | {r.paper_strategy} | "
                       f"{_f(r.paper_devices_used, '{:.0f}')} | {r.paper_zero} |")
            continue
        out.append(f"| {r.model} | {hbm} | {r.num_devices} | {r.variant} | {r.status} | "
                   f"{_f(r.time_per_batch_s, '{:.4g}')} | {{{int(r.p)}, {int(r.d)}, {int(r.t)}}} "
                   f"| {int(r.devices_used)} | {r.layers} | {r.zero} | {r.zero_degree} | "
                   f"{r.recompute} | {_f(r.max_peak_memory_GB, '{:.4g}')} | {r.paper_strategy} | "
                   f"{_f(r.paper_devices_used, '{:.0f}')} | {r.paper_zero} |")
    out += ["", f"Paper without ZeRO: {paper['without_zero']}."]
    return "\n".join(out) + "\n"


# ---------------------------------------------------------------------------------------------
# Figure 2 and the section 5.3 communication share
# ---------------------------------------------------------------------------------------------

COMM_COLUMNS = (["model", "cluster", "num_devices", "planner", "status", "p", "d", "t", "s", "e",
                 "c", "placement", "time_per_batch_s"] + [f"{c}_s" for c in CATEGORIES]
                + ["comm_s", "comm_share", "comm_critical_path_s", "comm_share_critical_path",
                   "comm_by_level", "reason"])


def comm_row(plan: dict, evaluation: dict) -> dict:
    """One row: a point's strategy and its time per batch split into categories."""
    r = {k: plan[k] for k in ("model", "cluster", "num_devices", "planner")}
    has_plan = plan.get("schema") != NO_PLAN_SCHEMA
    st = strategy(plan) if has_plan else {}
    r.update({k: st.get(k) for k in ("p", "d", "t", "s", "e", "c", "placement")})
    ok = has_plan and bool(evaluation.get("feasible"))
    r["status"] = ("feasible" if ok else "infeasible") if has_plan else plan.get("status",
                                                                                  "no_plan")
    r["reason"] = " ".join(str(evaluation.get("reason", "")).split())
    if ok:
        r.update(comm_breakdown(evaluation))
    return r


def comm_table(pairs: list[tuple[dict, dict]], models: list[str] | None = None) -> pd.DataFrame:
    """Rows of `comm_row`, models in the order `models` gives (else the paper's panel order),
    then cluster, devices and planner."""
    rows = [comm_row(p, e) for p, e in pairs]
    df = pd.DataFrame(rows, columns=COMM_COLUMNS)
    from nest.reports.figures import model_rank

    rank = ((lambda m: (models.index(m), m) if m in models else (len(models), m)) if models
            else model_rank)
    df["_m"] = df.model.map(rank)
    df["_p"] = df.planner.map(_planner_rank)
    return df.sort_values(["_m", "cluster", "num_devices", "_p", "planner"],
                          kind="stable").drop(columns=["_m", "_p"]).reset_index(drop=True)


def _pct(x) -> str:
    return "-" if x is None or _isnan(x) else f"{100 * x:.1f}%"


def figure2_markdown(df: pd.DataFrame, cfg: dict, paper: dict | None = None) -> str:
    from nest.spec.catalog import load_cluster

    paper = claims().get("figure2", {}) if paper is None else paper
    cl = load_cluster(cfg["cluster"])
    n = cfg["num_devices"]
    where = ("one of" if n in cl.sizes else "not one of")
    out = [f"# Figure 2: communication share on {n} devices of {cfg['cluster']}", "",
           f"Paper: {paper.get('source', '')}: {paper.get('claim', '')}", "",
           f"Ours: {n} is {where} the cluster's sizes {list(cl.sizes)}; every problem is built "
           f"with make_problem(model, '{cfg['cluster']}', {n}) (the plan rule), each planner's "
           "plan scored by the shared evaluator. Shares of the time per batch (module "
           "docstring of nest/experiments/tables.py): `comm` = exposed communication terms / time (the "
           "evaluator overlaps none), bubble apart; `comm, critical path` also attributes the "
           "pipeline bubble by the bottleneck stage's mix. ", "",
           "| model | planner | status | {p, d, t, s, e, c} | placement | time/batch s | compute "
           "| recompute | TP | CP | EP | ZeRO | p2p | DP sync | bubble | optimizer | comm | "
           "comm, critical path |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in df.itertuples():
        if r.status != "feasible":
            out.append(f"| {r.model} | {r.planner} | {r.status}: {r.reason} |" + " |" * 15)
            continue
        T = r.time_per_batch_s
        cells = " | ".join(_pct(getattr(r, f"{c}_s") / T) for c in CATEGORIES)
        out.append(f"| {r.model} | {r.planner} | {r.status} | "
                   f"{strategy_text(r._asdict(), True)} | {r.placement} | {T:.4g} | {cells} | "
                   f"{_pct(r.comm_share)} | {_pct(r.comm_share_critical_path)} |")
    return "\n".join(out) + "\n"


def plot_figure2(df: pd.DataFrame, png: str | Path, pdf: str | Path, title: str = "") -> None:
    """Stacked bars: per model a group, per planner a bar of the time-per-batch shares."""
    import matplotlib

    matplotlib.use("agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    from nest.reports.figures import save_figure

    from nest.reports.figures import FONT

    models = list(dict.fromkeys(df.model))  # the table's order (comm_table)
    planners = sorted(df.planner.unique(), key=_planner_rank)
    fig, ax = plt.subplots(figsize=(7.0, 3.0))
    width = 0.8 / max(1, len(planners))
    xt, xl = [], []
    for i, m in enumerate(models):
        for j, p in enumerate(planners):
            x = i + (j - (len(planners) - 1) / 2) * width
            xt.append(x)
            xl.append(p)
            r = df[(df.model == m) & (df.planner == p)]
            if r.empty:
                continue
            r = r.iloc[0]
            if r.status != "feasible":
                ax.text(x, 0.02, "none" if r.status == "no_plan" else r.status, rotation=90,
                        ha="center", va="bottom", fontsize=FONT - 1, color="#555555")
                continue
            bottom = 0.0
            for c in CATEGORIES:
                h = r[f"{c}_s"] / r.time_per_batch_s
                if h > 0:
                    ax.bar(x, h, width * 0.9, bottom=bottom, color=CATEGORY_COLORS[c],
                           edgecolor="white", linewidth=0.3)
                bottom += h
            ax.text(x, 1.01, f"{100 * r.comm_share:.0f}%", ha="center", va="bottom",
                    fontsize=FONT - 1)
        ax.text(i, -0.30, m, ha="center", va="top", fontsize=FONT,
                transform=ax.get_xaxis_transform())
    ax.set_xticks(xt)
    ax.set_xticklabels(xl, rotation=90, fontsize=FONT - 1)
    ax.set_ylim(0, 1.12)
    ax.set_ylabel("share of time per batch", fontsize=FONT)
    ax.tick_params(axis="y", labelsize=FONT)
    if title:
        ax.set_title(title.replace("$", r"\$"), fontsize=FONT + 1)  # text, not mathtext
    used = [c for c in CATEGORIES if (df.get(f"{c}_s", pd.Series(dtype=float)).fillna(0) > 0)
            .any()]
    ax.legend(handles=[Patch(color=CATEGORY_COLORS[c], label=CATEGORY_LABELS[c])
                       for c in used], fontsize=FONT - 1, loc="upper left",
              bbox_to_anchor=(1.01, 1.0), frameon=False)
    fig.text(0.01, 0.01, "numbers above bars: exposed communication share (bubble apart)",
             fontsize=FONT - 2)
    fig.tight_layout()
    save_figure(fig, png, pdf)


def comm_share_markdown(df: pd.DataFrame, paper: dict | None = None) -> str:
    paper = claims()["comm_share"] if paper is None else paper
    out = [f"# Section 5.3: communication share of {paper['model']}", "",
           f"Paper: {paper['source']}: \"{paper['quote']}\"", "",
           "Ours: NEST's plans of the figures (results/plans/nest/...), scored by the shared "
           "evaluator; shares as in Figure 2 (`comm`: exposed communication terms / time per "
           "batch, bubble apart; `critical path`: the bubble attributed by the bottleneck "
           "stage's mix). Seconds of communication per network level in the last column "
           "(p2p: pipeline sends, not split by level).", "",
           "| cluster | devices | {p, d, t, s, e, c} | time/batch s | EP | TP | CP | ZeRO | p2p "
           "| DP sync | comm | critical path | paper | comm s by level |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    by = paper.get("share", {})
    for r in df.itertuples():
        if r.status != "feasible":
            out.append(f"| {r.cluster} | {r.num_devices} | {r.status}: {r.reason} |" + " |" * 11)
            continue
        T = r.time_per_batch_s
        cells = " | ".join(_pct(getattr(r, f"{c}_s") / T) for c in
                           ("ep", "tp", "cp", "zero", "p2p", "dp_sync"))
        out.append(f"| {r.cluster} | {r.num_devices} | {strategy_text(r._asdict(), True)} | "
                   f"{T:.4g} | {cells} | {_pct(r.comm_share)} | "
                   f"{_pct(r.comm_share_critical_path)} | {_pct(by.get(r.cluster))} | "
                   f"{r.comm_by_level} |")
    ok = df[df.status == "feasible"]
    if not ok.empty:
        g = ok.groupby("cluster", sort=True)
        out += ["", "Per cluster (ours, min-max over the points; paper): " + "; ".join(
            f"{c}: {_pct(x.comm_share.min())}-{_pct(x.comm_share.max())} "
            f"(critical path {_pct(x.comm_share_critical_path.min())}-"
            f"{_pct(x.comm_share_critical_path.max())}), paper {_pct(by.get(c))}"
            for c, x in g) + "."]
    return "\n".join(out) + "\n"
