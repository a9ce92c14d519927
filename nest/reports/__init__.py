"""Reports: the paper's claims, measures on the run's CSVs, REPRODUCTION.md, figures."""
