"""Snakemake adapter: measured blocks (profiles/) x memory model -> Table 6 (CSV + Markdown)."""
from pathlib import Path

from _job import start, write_text

from nest.graph.layer_graph import LayerGraph
from nest.problem.problem import make_problem
from nest.experiments.tables import memory_table, table6_markdown, write_csv

sm = snakemake  # noqa: F821 - injected by Snakemake
start(sm)
cfg = sm.params.cfg
problems = {}
for path in sm.input.graphs:
    g = LayerGraph.read(path)
    model = Path(path).parent.name
    problems[model] = make_problem(model, cfg["cluster"], 8, g.mbs, graph=g)
df = memory_table(cfg["hardware"], sm.input.blocks, problems)
write_csv(df, sm.output.csv)
write_text(sm.output.md, table6_markdown(df, hardware=cfg["hardware"]))
print(Path(sm.output.md).read_text())
