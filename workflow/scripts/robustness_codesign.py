"""Snakemake adapter: the co-design sweep (its `robustness.codesign_num_devices` cells) under
every perturbed cost model -> one CSV each (nest.experiments.decomposition.codesign_sweep; points cached per
perturbation beside its CSV)."""
import os

from _job import start

from nest.experiments.decomposition import codesign_sweep, digest, write_csv
from nest.graph.layer_graph import LayerGraph
from nest.spec.settings import CostScale, load_training

sm = snakemake  # noqa: F821 - injected by Snakemake
start(sm)
cfg = dict(sm.params.cfg)
inputs = [sm.input[k] for k in ("graph", "cluster", "hardware", "registry", "space", "training")]
graph = LayerGraph.read(sm.input.graph)
for (c, m), out in zip(sm.params.scales, sm.output):
    training = load_training(sm.input.training).with_(cost_scale=CostScale(c, m))
    df = codesign_sweep(cfg["model"], cfg["cluster"], sm.params.num_devices,
                        cfg["inter_node_bandwidth_GBps"], cfg["oversubscription"],
                        os.path.splitext(out)[0], inputs_digest=digest(inputs, cfg), graph=graph,
                        planner=cfg.get("planner", "nest"),
                        flat_planner=cfg.get("flat_planner", "nest_flat_network"),
                        training=training, log=lambda s: print(s, flush=True))
    write_csv(df, out)
    print(df.to_string())
