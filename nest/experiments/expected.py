"""Expected results: the CSVs of a reference run, committed, and a byte-level comparison.

A run's CSVs hold one machine-dependent column, `solve_time_s` (wall-clock); `machine_free`
drops it (and any column named in MACHINE_COLUMNS), so the rest must match the committed
expectation byte for byte on any machine and under any load. `snakemake -j8 expected` rewrites
results/expected/ from the current run; tests/test_expected.py reruns the tiny config and
compares it with tests/expected/tiny/.
"""

from __future__ import annotations

import difflib
from pathlib import Path

import pandas as pd

MACHINE_COLUMNS = ("solve_time_s", "peak_rss_mb", "machine_dependent")


def machine_free(csv: str | Path) -> str:
    """The CSV's text without its machine-dependent columns (floats kept as written)."""
    df = pd.read_csv(csv, dtype=str, keep_default_na=False)
    df = df.drop(columns=[c for c in MACHINE_COLUMNS if c in df.columns])
    return df.to_csv(index=False, lineterminator="\n")


def write_expected(csvs: list[str | Path], out_dir: str | Path) -> list[Path]:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for c in csvs:
        dst = out / Path(c).name
        dst.write_text(machine_free(c))
        written.append(dst)
    return written


def differences(csv: str | Path, expected: str | Path, context: int = 1) -> str:
    """'' when the run's CSV matches its expectation, else a unified diff."""
    got, want = machine_free(csv), Path(expected).read_text()
    if got == want:
        return ""
    return "".join(difflib.unified_diff(want.splitlines(True), got.splitlines(True),
                                        str(expected), str(csv), n=context))
