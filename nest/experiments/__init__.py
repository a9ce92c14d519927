"""Experiments: points, results CSVs, the paper's tables, the gain decomposition, robustness, search time."""
