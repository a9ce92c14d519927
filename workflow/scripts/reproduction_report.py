"""Snakemake adapter: every experiment's outputs (+ robustness.csv) -> results/REPRODUCTION.md."""
from _job import start

from nest.reports.reproduction import write

sm = snakemake  # noqa: F821 - injected by Snakemake
start(sm)
files = sorted({str(p) for p in [*sm.input.csvs, *sm.input.extra]})
md = [p for p in files if p.endswith(".md")]
robustness = str(sm.input.robustness[0]) if sm.input.robustness else None
write(files, list(sm.params.experiments), sm.input.claims, sm.output[0], robustness, md)
print(open(sm.output[0]).read())
