"""Snakemake adapter: one Table 7 point -> NEST (with the variant's overrides) on the problem
with reduced HBM -> one JSON record."""
from _job import start

from nest.graph.layer_graph import LayerGraph
from nest.experiments.tables import ablation_point, reduced_problem, write_point

sm = snakemake  # noqa: F821 - injected by Snakemake
start(sm)
cfg, model, variant = sm.params.cfg, sm.wildcards.model, sm.wildcards.variant
pt = cfg["points"][model]
if variant not in pt["variants"]:
    raise SystemExit(f"config: tables.table7.points.{model}: no variant '{variant}'")
graph = LayerGraph.read(sm.input.graph)
problem = reduced_problem(model, cfg["cluster"], pt["num_devices"], pt["hbm_GB"] * 1e9,
                          framework_overhead=cfg.get("framework_overhead", True), graph=graph)
rec = ablation_point(problem, cfg["variants"][variant], planner=cfg.get("planner", "nest"),
                     variant=variant)
write_point(rec, sm.output[0])
print(f"{model} {variant}: {rec['status']} in {rec['solve_time_s']:.2f} s "
      f"{rec['strategy']} {rec['reason']}")
