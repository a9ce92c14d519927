"""Snakemake adapter: model YAML -> layer graph JSON."""
import sys

from nest.graph.closed_form import build_layer_graph
from nest.specs import load_model

sm = snakemake  # noqa: F821 - injected by Snakemake
sys.stderr = sys.stdout = open(sm.log[0], "w")
graph = build_layer_graph(load_model(sm.input.model), sm.params.mbs)
graph.write(sm.output[0])
print(f"{graph.model}: {graph.num_layers} layers, {len(graph.variants)} variants")
