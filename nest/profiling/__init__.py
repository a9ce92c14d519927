"""Operator profiles and single-block validation runs on the local device (GPU or CPU)."""

from .blocks import Block, block_num_params, run_block, validate_blocks
from .operators import FAMILY_ORDER, MEASURE_COLUMNS, columns, profile_operators
from .shapes import (
    FAMILY_FIELDS,
    PAPER_MODELS,
    TINY_MODELS,
    merge_shapes,
    model_by_name,
    shapes_for_model,
)
from .timing import Timer, device_meta, hardware_name, pick_device


def main(argv=None) -> int:
    """Entry point for ``nest profile`` (see ``nest.profiling.gpu_run``)."""
    from .gpu_run import main as _main

    return _main(argv)


__all__ = [
    "FAMILY_FIELDS",
    "FAMILY_ORDER",
    "MEASURE_COLUMNS",
    "PAPER_MODELS",
    "TINY_MODELS",
    "Block",
    "Timer",
    "block_num_params",
    "columns",
    "device_meta",
    "hardware_name",
    "main",
    "merge_shapes",
    "model_by_name",
    "pick_device",
    "profile_operators",
    "run_block",
    "shapes_for_model",
    "validate_blocks",
]
