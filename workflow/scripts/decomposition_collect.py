"""Snakemake adapter: evaluations + plans of NEST and its ablations -> results/decomposition.csv."""
import sys

from nest.results import collect, write_csv

sm = snakemake  # noqa: F821 - injected by Snakemake
sys.stderr = sys.stdout = open(sm.log[0], "w")
df = collect(list(zip(sm.input.evaluations, sm.input.plans)))
write_csv(df, sm.output[0])
print(df.to_string())
