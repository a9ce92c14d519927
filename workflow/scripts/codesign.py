"""Snakemake adapter: the network co-design sweep -> results/codesign.csv, .md and figure
(nest.experiments.decomposition.codesign_sweep; points cached under results/codesign/, so a rerun resumes)."""

from _job import start, write_text

from nest.experiments.decomposition import codesign_markdown, codesign_sweep, digest, plot_codesign, write_csv
from nest.graph.layer_graph import LayerGraph

sm = snakemake  # noqa: F821 - injected by Snakemake
start(sm)
cfg = dict(sm.params.cfg)
planner, flat = cfg.get("planner", "nest"), cfg.get("flat_planner", "nest_flat_network")
inputs = [sm.input[k] for k in ("graph", "cluster", "hardware", "registry", "space", "training")]
df = codesign_sweep(cfg["model"], cfg["cluster"], cfg["num_devices"],
                    cfg["inter_node_bandwidth_GBps"], cfg["oversubscription"], sm.params.cache,
                    inputs_digest=digest(inputs, cfg), graph=LayerGraph.read(sm.input.graph),
                    planner=planner, flat_planner=flat, log=lambda s: print(s, flush=True))
write_csv(df, sm.output.csv)
write_text(sm.output.md, codesign_markdown(df))
plot_codesign(df, sm.output.png, sm.output.pdf)
print(df.to_string())
