"""``python -m nest.profiling.gpu_run``: operator profiles + block validation -> profiles/<hw>/.

Writes into ``<out>/<hardware>/``: one CSV per operator family (``operators.columns``),
``blocks.json`` (``nest.block_validation/v1``) and ``meta.json`` (``nest.profile_meta/v1``: card,
driver, torch/CUDA/cuDNN versions, date, timing method, measured copy and GEMM ceilings, files).
The hardware name comes from the device itself (``timing.hardware_name``), so an H200 is never
filed as an H100; without a GPU it is ``cpu`` and tiny shapes are used.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

from . import blocks as _blocks
from . import operators as _ops
from . import shapes as _shapes
from .operators import FAMILY_ORDER, MEASURE_COLUMNS, profile_operators
from .shapes import FAMILY_FIELDS, PAPER_MODELS, TINY_MODELS, merge_shapes, shapes_for_model
from .timing import Timer, device_meta, gpu_state, hardware_name, measure_ceilings, pick_device

# Sweep settings: (tp degrees, m grid, cp degrees, ep degrees, timer settings)
SWEEPS = {
    "full": {
        "tp": (1, 2, 4, 8),
        "m_grid": (512, 1024, 2048, 4096, 8192),
        "cp": (1, 2, 4, 8),
        "ep": (1, 2, 4, 8),
        "timer": {"warmup_s": 0.005, "rep_s": 0.02, "min_reps": 5, "max_reps": 100},
    },
    "quick": {
        "tp": (1, 8),
        "m_grid": (),
        "cp": (1,),
        "ep": (1, 4),
        "timer": {"warmup_s": 0.002, "rep_s": 0.008, "min_reps": 3, "max_reps": 30},
    },
    "tiny": {
        "tp": (1, 2),
        "m_grid": (16, 64),
        "cp": (1, 2),
        "ep": (1, 2),
        "timer": {"warmup_s": 0.0005, "rep_s": 0.002, "min_reps": 3, "max_reps": 8},
    },
}


def build_shapes(models, sweep, mbs_list=(1,)):
    return merge_shapes(
        shapes_for_model(
            d,
            sweep["tp"],
            mbs_list,
            m_grid=sweep["m_grid"],
            cp_degrees=sweep["cp"],
            ep_degrees=sweep["ep"],
        )
        for d in models
    )


def _parser():
    p = argparse.ArgumentParser(prog="nest profile", description=__doc__.splitlines()[0])
    p.add_argument(
        "--hardware",
        help="expected hardware name (checked against the device; the "
        "device's own name wins unless --force-hardware-name)",
    )
    p.add_argument("--force-hardware-name", action="store_true",
                   help="name the profile folder --hardware even if the device reports another")
    p.add_argument("--out", default="profiles", help="parent folder (default: profiles)")
    p.add_argument("--quick", action="store_true", help="fewer shapes and repetitions")
    p.add_argument("--tiny", action="store_true", help="CPU-sized models (default without GPU)")
    p.add_argument("--models", help="comma-separated model names (default: all)")
    p.add_argument("--skip-blocks", action="store_true", help="do not time whole blocks")
    p.add_argument("--skip-operators", action="store_true",
                   help="do not time the operator tables")
    p.add_argument(
        "--tables",
        help="comma-separated operator tables to (re)measure, e.g. attention_unfused,matmul_fp8 "
        "(default: all); the run's metadata then goes to meta_<tables>.json, not meta.json",
    )
    p.add_argument("--block-steps", type=int, default=10,
                   help="timed steps per block (default 10)")
    p.add_argument(
        "--time-budget-s",
        type=float,
        default=330.0,
        help="operator sweep stops starting new shapes after this (default 330)",
    )
    return p


def main(argv=None) -> int:
    args = _parser().parse_args(argv)
    t_start = time.monotonic()
    device = pick_device()
    tiny = args.tiny or device == "cpu"
    say = lambda msg: print(f"[{time.monotonic() - t_start:7.1f} s] {msg}", flush=True)

    meta = device_meta(device)
    detected = hardware_name(meta["device_name"]) if device == "cuda" else "cpu"
    hw = detected
    if args.hardware and args.hardware != detected:
        if args.force_hardware_name:
            hw = args.hardware
            say(f"WARNING: device is {meta['device_name']!r} ({detected}); forced name {hw}")
        else:
            say(
                f"WARNING: --hardware {args.hardware} but the device is "
                f"{meta['device_name']!r}: writing under {detected}"
            )
    out_dir = os.path.join(args.out, hw)
    os.makedirs(out_dir, exist_ok=True)
    say(
        f"device {meta['device_name']} -> {out_dir} (torch {meta['torch']}, cuda {meta['cuda']}, "
        f"driver {meta.get('driver_version')})"
    )

    sweep_name = "tiny" if tiny else ("quick" if args.quick else "full")
    sweep = SWEEPS[sweep_name]
    catalog = TINY_MODELS if tiny else PAPER_MODELS
    if args.models:
        wanted = args.models.split(",")
        unknown = set(wanted) - {d["name"] for d in catalog}
        if unknown:
            raise SystemExit(f"unknown models for this sweep: {sorted(unknown)}")
        catalog = [d for d in catalog if d["name"] in wanted]
    timer = Timer(device, **sweep["timer"])
    meta.update(
        {
            "schema": "nest.profile_meta/v1",
            "hardware": hw,
            "hardware_detected": detected,
            "sweep": sweep_name,
            "sweep_settings": {k: v for k, v in sweep.items()},
            "timing_method": timer.method,
            "dtype": "bfloat16",
            "mbs": [1],
            "models": [d["name"] for d in catalog],
            "argv": list(argv or sys.argv[1:]),
            "gpu_state_start": gpu_state() if device == "cuda" else None,
            "csv_columns": {f: ["op", *FAMILY_FIELDS[f], *MEASURE_COLUMNS] for f in FAMILY_ORDER},
            "conventions": _ops.__doc__.strip() + "\n\n" + _shapes.__doc__.strip(),
        }
    )
    tables = args.tables.split(",") if args.tables else None
    if tables:
        unknown = set(tables) - set(_ops.TABLE_ORDER)
        if unknown:
            raise SystemExit(f"--tables: unknown tables {sorted(unknown)}; "
                             f"expected some of {list(_ops.TABLE_ORDER)}")
    meta_path = os.path.join(out_dir, "meta.json" if not tables else
                             "meta_" + "+".join(tables) + ".json")

    def write_meta():
        meta["elapsed_s"] = time.monotonic() - t_start
        with open(meta_path, "w") as fh:
            json.dump(meta, fh, indent=2, default=str)

    meta["ceilings"] = measure_ceilings(device, timer)
    c = meta["ceilings"]
    say(
        f"ceilings: copy {c['copy_bytes_per_s'] / 1e12:.2f} TB/s, square bf16 GEMM "
        f"n={c['square_gemm_n']} {c['square_gemm_flops_per_s'] / 1e12:.1f} TFLOP/s"
    )
    write_meta()

    if not args.skip_blocks:
        say("block validation")
        res = _blocks.validate_blocks(
            os.path.join(out_dir, "blocks.json"),
            tiny=tiny,
            device=device,
            models=None
            if not args.models or tiny
            else [m for m in _blocks.BLOCK_MODELS if m in args.models.split(",")],
            warmup_steps=2 if tiny else 3,
            num_steps=3 if tiny else args.block_steps,
            progress=say,
        )
        meta["blocks"] = {"file": "blocks.json", "count": len(res["blocks"])}
        write_meta()

    if not args.skip_operators:
        shapes = build_shapes(catalog, sweep)
        counts = {f: sum(s["family"] == f for s in shapes) for f in FAMILY_ORDER}
        say(f"operators: {len(shapes)} shapes {counts}")
        deadline = time.monotonic() + args.time_budget_s
        summary = profile_operators(
            shapes, out_dir, device=device, timer=timer, deadline=deadline, progress=say,
            families=set(tables) if tables else None,
        )
        meta["operators"] = {
            f: {
                "file": os.path.basename(v["path"]),
                "rows": v["rows"],
                "skipped_time_budget": v["skipped"],
                "errors": v["errors"],
            }
            for f, v in summary.items()
        }
        meta["truncated"] = any(v["skipped"] for v in summary.values())
    meta["gpu_state_end"] = gpu_state() if device == "cuda" else None
    write_meta()
    say(f"done: {out_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
