"""Snakemake adapter: model YAML -> layer graph JSON (at the file name's mbs and seq_len)."""
from _job import model_at, start

from nest.graph import build_graph
from nest.spec.settings import load_training

sm = snakemake  # noqa: F821 - injected by Snakemake
start(sm)
s = sm.params.settings
source = load_training(sm.input.training).graph_source
graph = build_graph(model_at(sm.input.model, s["seq_len"]), s["mbs"], source)
graph.write(sm.output[0])  # atomic (nest.common.atomic_io)
print(f"{graph.model}: {graph.num_layers} layers, {len(graph.variants)} variants ({source}), "
      f"seq_len {graph.seq_len}")
