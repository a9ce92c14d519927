"""Snakemake adapter: model YAML -> layer graph JSON."""
import sys

from nest.graph import build_graph
from nest.settings import load_training
from nest.specs import load_model

sm = snakemake  # noqa: F821 - injected by Snakemake
sys.stderr = sys.stdout = open(sm.log[0], "w")
source = load_training(sm.input.training).graph_source
graph = build_graph(load_model(sm.input.model), sm.params.mbs, source)
graph.write(sm.output[0])
print(f"{graph.model}: {graph.num_layers} layers, {len(graph.variants)} variants ({source})")
