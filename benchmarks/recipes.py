"""Public training recipes vs `nest plan` under the same settings, by the shared evaluator.

For each recipe (a compact plan file of examples/, with the run's settings: global batch,
gradient-reduce precision, the recipe's overlaps) the script prints the recipe's time per batch,
the plan `nest plan` returns (its default, launchable space, 5% memory headroom, micro-batch
searched among 1, 2) with its time, whether `nest export` launches it as priced (no projection),
and the planning time (graph + solve; the machine's load included). Issue 25's first "done when":
NEST at least as fast as every recipe.

    python benchmarks/recipes.py [--only NAME]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OVERLAPS = {"dp_overlap": "bucketed", "param_gather_overlap": True, "tp_comm_overlap": True}
# the interleaved pipeline's sends under compute: Megatron-Bridge's CommOverlapConfig and NeMo's
# MegatronCommOverlapCallback set overlap_p2p_comm for pp > 1 and vp > 1, and so do the NeMo
# Framework Launcher's gpt3/175b.yaml and mixtral/mixtral_8x7b.yaml (docs/modeling.md, "Pipeline
# sends under compute"); it acts on interleaved plans only, the recipe's and NEST's alike
P2P = {"overlap_p2p_comm": True}
BF16_REDUCE = {"precision": {"grad_reduce": "bf16"}}

# name -> (plan file, devices, the run's settings (training.yaml keys), plan-file overrides)
RECIPES = {
    # Megatron-Bridge llama3_70b 64-GPU recipe at the global batch 128
    "llama3_70b_64": ("examples/llama3_70b_h100_bf16_bridge.yaml", 64,
                      {"global_batch": 128, **OVERLAPS, **P2P, **BF16_REDUCE}, {}),
    # a hand-made interleaved plan at 256 GPUs (TP 4 CP 2 PP 4 VP 5, DP 8)
    "llama3_70b_256": ("examples/llama3_70b_h100_bf16_bridge.yaml", 256,
                       {"global_batch": 128, **OVERLAPS, **P2P, **BF16_REDUCE}, {"dp": 8}),
    "llama3_8b_8": ("examples/llama3_8b_h100_bf16_bridge.yaml", 8,
                    {**OVERLAPS, **BF16_REDUCE}, {}),
    "gpt3_175b_128": ("examples/gpt3_175b_h100_nemo.yaml", 128,
                      {**OVERLAPS, **P2P, **BF16_REDUCE}, {}),
    "mixtral_8x7b_64": ("examples/mixtral_8x7b_h100_nemo.yaml", 64,
                        {"dp_overlap": "bucketed", "param_gather_overlap": True, **BF16_REDUCE},
                        {}),
    # NeMo 2.0 pretraining recipes (NVIDIA/NeMo nemo/collections/llm/recipes/): each plan file
    # states the recipe's own settings and cites its source
    "qwen25_72b_32": ("examples/qwen25_72b_h100_nemo.yaml", 32, {}, {}),
    "mixtral_8x22b_128": ("examples/mixtral_8x22b_h100_nemo.yaml", 128, {}, {}),
    "llama31_8b_8": ("examples/llama31_8b_h100_nemo.yaml", 8, {}, {}),
}


def shape(plan) -> str:
    v = f" vp{plan.virtual_stages}" if plan.schedule == "interleaved" else ""
    st = plan.stages[0]
    return (f"tp{plan.tp}{'+sp' if plan.sp else ''} cp{plan.cp} ep{plan.ep} pp{plan.pp}{v} "
            f"dp{plan.dp} mbs{plan.mbs} z{st.zero_stage} {st.recompute}")


def run(name: str) -> dict:
    import yaml

    from nest.interfaces.cli_run import planning_problem
    from nest.problem.evaluate import evaluate, make_problem
    from nest.interfaces.export import to_megatron
    from nest.problem.plan_spec import load_plan
    from nest.planners.registry import run_planner

    path, n, settings, over = RECIPES[name]
    spec = yaml.safe_load((ROOT / path).read_text())
    spec.update(num_devices=n, **over)
    tmp = Path(tempfile.mkdtemp()) / f"recipe_{name}.yaml"
    spec["model"] = str((ROOT / path).parent / spec["model"]) if "/" in spec["model"] \
        else spec["model"]
    tmp.write_text(yaml.safe_dump(spec))
    recipe, pr = load_plan(tmp, overrides=settings)
    ev_r = evaluate(recipe, pr)
    t0 = time.perf_counter()
    prob = make_problem(spec["model"], spec["cluster"], n, 1, pr.training,
                        seq_len=spec.get("seq_len"))
    out = run_planner("nest", planning_problem(prob), {"launchable": True, "mbs_options": [1, 2]})
    plan_s = time.perf_counter() - t0
    real = prob.with_mbs(out.plan.mbs)
    ev_n = evaluate(out.plan, real)
    exp = to_megatron(out.plan, real)
    as_priced = abs(exp.time_per_batch_s - ev_n.time_per_batch_s) <= 1e-9 * ev_n.time_per_batch_s
    return {"name": name, "devices": n, "recipe": shape(recipe),
            "recipe_s": ev_r.time_per_batch_s, "recipe_fits": ev_r.feasible,
            "nest": shape(out.plan), "nest_s": ev_n.time_per_batch_s,
            "export": "as priced" if as_priced and not exp.warnings else
                      "; ".join(exp.warnings) or "projected", "plan_s": plan_s}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", choices=sorted(RECIPES))
    a = ap.parse_args(argv)
    names = [a.only] if a.only else list(RECIPES)
    print(f"{'recipe':16s} {'N':>5s}  {'recipe plan':34s} {'recipe s':>9s}  {'NEST plan':34s} "
          f"{'NEST s':>9s} {'gain':>7s}  {'plan s':>6s}  export")
    for name in names:
        r = run(name)
        gain = f"{r['recipe_s'] / r['nest_s'] - 1:+.1%}"
        rs = f"{r['recipe_s']:.3f}" + ("" if r["recipe_fits"] else " OOM")
        print(f"{name:16s} {r['devices']:5d}  {r['recipe']:34s} {rs:>9s}  {r['nest']:34s} "
              f"{r['nest_s']:9.3f} {gain:>7s}  {r['plan_s']:6.1f}  {r['export']}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
