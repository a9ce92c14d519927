"""Model specs for the layer-graph tests: a published config.json under tests/fixtures/hf/ (by
file name, optionally at a training sequence length) or a catalog name, warnings silenced."""

from __future__ import annotations

import warnings
from pathlib import Path

from nest.spec.catalog import load_model

HF = Path(__file__).parent / "fixtures" / "hf"


def load(name: str, seq: int | None = None):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return load_model(str(HF / name), seq_len=seq) if name.endswith(".json") \
            else load_model(name)
