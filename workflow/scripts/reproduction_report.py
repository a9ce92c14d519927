"""Snakemake adapter: every experiment's outputs -> results/REPRODUCTION.md."""
from _job import start

from nest.reproduction import write

sm = snakemake  # noqa: F821 - injected by Snakemake
start(sm)
csvs = dict(zip(sm.params.figures, sm.input.csvs))
md = sorted(str(p) for p in sm.input.extra if str(p).endswith(".md"))
csv = sorted(str(p) for p in sm.input.extra if str(p).endswith(".csv"))
write(csvs, sm.input.claims, md, sm.output[0], csv)
print(open(sm.output[0]).read())
