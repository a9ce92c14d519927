"""Run Megatron-LM's own argument checks on `nest export` argument lists (no GPU, no torch.distributed).

For every plan given (a plan JSON from `nest plan -o`, or a compact plan YAML such as examples/*.yaml)
this exports it with nest.interfaces.export.to_megatron and then runs, inside the launch environment the export
writes (its `env`, WORLD_SIZE = its world size, RANK = 0):

    1. megatron.training.arguments.parse_args     argparse with every Megatron-LM argument: an
                                                  unknown or removed flag exits 2
    2. megatron.training.arguments.validate_args  with the entry point's args_defaults (pretrain_gpt.py:
                                                  tokenizer GPT2BPETokenizer; examples/bert/
                                                  pretrain_bert.py: BertWordPieceLowerCase)
    3. core_transformer_config_from_args          the TransformerConfig the model is built from (its
                                                  __post_init__ checks the pipeline layout, heads vs
                                                  tp, experts vs ep, recomputation, ...)
    4. the entry point named by the export exists in the checkout (pretrain_gpt.py, examples/bert/...)

What is stubbed, and why (everything else is Megatron-LM's code as checked out):
    - megatron.training.arguments.get_device_arch_version (reads the CUDA device): returns the
      compute capability major of the plan's accelerator (A100 8, H100 9, V100 7; other hardware 9),
      so the Hopper/Ampere CUDA_DEVICE_MAX_CONNECTIONS assertion runs as it would on that machine.
    - torch.cuda.get_device_capability: the same major, minor 0 (only --moe-grouped-gemm asks).
    - Transformer Engine is assumed installed at a current version, as in NVIDIA's PyTorch
      containers Megatron-LM targets (it cannot be installed without CUDA):
      is_te_min_version -> True in megatron.training.arguments and megatron.core.transformer.
      transformer_config, and rope_utils.fused_apply_rotary_pos_emb (TE's fused RoPE, None
      without TE) -> a placeholder, so the default --apply-rope-fusion is accepted. These are
      checks of the machine, not of the arguments.
    - typing.override on Python < 3.12 (Megatron-LM main targets 3.12): typing_extensions'
      identical no-op decorator.
    - nothing else: `triton` must be importable (Megatron imports it at module level for MoE
      kernels these checks never call; `pip install --target DIR triton` + PYTHONPATH=DIR is enough
      on a CPU-only machine; a stub breaks torch's own triton detection).
    - set_global_variables (tokenizer, timers, loggers) is NOT run: it builds the tokenizer from
      data files and needs torch.distributed; parse_and_validate_args = parse_args + validate_args
      + set_global_variables, so steps 1-2 are its checks.

Usage:
    python scripts/check_megatron_args.py --megatron-lm PATH plan.json examples/*.yaml ...
PATH is a Megatron-LM checkout (git clone https://github.com/NVIDIA/Megatron-LM); MEGATRON_LM in
the environment works too. Prints one line per plan (PASS / FAIL / SKIP and why) and exits 1 if any
export failed. --json FILE writes the per-plan results.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import sys
import traceback
import types
from pathlib import Path

ARCH = {"a100": 8, "h100": 9, "h200": 9, "v100": 7, "b200": 10}  # compute capability major


def _require_triton() -> None:
    try:
        import triton  # noqa: F401
    except ImportError:
        raise SystemExit("Megatron-LM imports triton at module level (MoE kernels): install it, "
                         "e.g. `pip install --target DIR triton` and PYTHONPATH=DIR (it is "
                         "only imported; no kernel runs)") from None


def _arch(hardware_name: str) -> int:
    for k, v in ARCH.items():
        if k in hardware_name.lower():
            return v
    return 9


def load_megatron(path: str) -> types.ModuleType:
    """Import megatron.training.arguments from the checkout at `path` (stubs: module docstring)."""
    root = Path(path).resolve()
    if not (root / "megatron" / "training" / "arguments.py").exists():
        raise SystemExit(f"{root}: not a Megatron-LM checkout (no megatron/training/arguments.py)")
    sys.path.insert(0, str(root))
    for k in [k for k in sys.modules if k == "megatron" or k.startswith("megatron.")]:
        del sys.modules[k]  # an installed megatron-core must not shadow the checkout
    _require_triton()
    import typing

    if not hasattr(typing, "override"):  # Python < 3.12; Megatron-LM main uses typing.override
        from typing_extensions import override

        typing.override = override
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import megatron.training.arguments as A
    assert Path(A.__file__).resolve().is_relative_to(root), A.__file__
    return A


def _assume_transformer_engine(A) -> None:
    import megatron.core.models.common.embeddings.rope_utils as rope
    import megatron.core.transformer.transformer_config as tc

    A.is_te_min_version = tc.is_te_min_version = lambda *a, **k: True
    if rope.fused_apply_rotary_pos_emb is None:
        rope.fused_apply_rotary_pos_emb = lambda *a, **k: None  # never called here


def check_args(A, args: list[str], env: dict[str, str], world_size: int, script: str,
               arch: int) -> tuple[bool, str]:
    """(passed, message): steps 1-3 of the module docstring on one argument list."""
    import torch

    defaults = {"tokenizer_type": "BertWordPieceLowerCase" if "bert" in script
                else "GPT2BPETokenizer"}
    saved_env, saved_argv = dict(os.environ), sys.argv
    os.environ.pop("CUDA_DEVICE_MAX_CONNECTIONS", None)
    os.environ.update(env)
    os.environ.update(WORLD_SIZE=str(world_size), RANK="0")
    sys.argv = [script, *args]
    A.get_device_arch_version = lambda: arch
    _assume_transformer_engine(A)
    torch.cuda.get_device_capability = lambda *a, **k: (arch, 0)
    out = io.StringIO()
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
            ns = A.parse_args()
            ns = A.validate_args(ns, defaults)
            cfg = A.core_transformer_config_from_args(ns)
        vpp = cfg.virtual_pipeline_model_parallel_size
        return True, (f"dp={ns.data_parallel_size} vpp={vpp} layout="
                      f"{'yes' if cfg.pipeline_model_parallel_layout else 'default'}")
    except SystemExit as e:  # argparse: unknown / invalid argument
        lines = [x for x in out.getvalue().splitlines() if "error" in x.lower()]
        return False, f"argparse exit {e.code}: {lines[-1] if lines else out.getvalue()[-300:]}"
    except Exception as e:  # noqa: BLE001 - Megatron's asserts and ValueErrors are the result
        tb = traceback.extract_tb(e.__traceback__)[-1]
        return False, f"{type(e).__name__} at {Path(tb.filename).name}:{tb.lineno}: {e}"
    finally:
        os.environ.clear()
        os.environ.update(saved_env)
        sys.argv = saved_argv


def check_plan(A, root: Path, path: str) -> dict:
    from nest.interfaces.export import to_megatron
    from nest.problem.plan_spec import load_plan

    plan, problem = load_plan(path)
    exp = to_megatron(plan, problem)
    row = {"plan": str(path), "model": plan.model, "cluster": plan.cluster,
           "world_size": exp.world_size, "script": exp.script, "env": exp.env,
           "args": exp.args, "warnings": exp.warnings}
    if not (root / exp.script).exists():
        row.update(passed=False, message=f"entry point {exp.script} not in the checkout")
        return row
    ok, msg = check_args(A, exp.run_args(), exp.env, exp.world_size, exp.script,
                         _arch(problem.cluster.hardware.name))
    row.update(passed=ok, message=msg)
    return row


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("plans", nargs="+", help="plan JSON (nest plan -o) or plan YAML files")
    ap.add_argument("--megatron-lm", default=os.environ.get("MEGATRON_LM"),
                    help="Megatron-LM checkout (default: $MEGATRON_LM)")
    ap.add_argument("--json", help="write the per-plan results here")
    a = ap.parse_args(argv)
    if not a.megatron_lm:
        ap.error("--megatron-lm PATH (or MEGATRON_LM) is required")
    A = load_megatron(a.megatron_lm)
    rows, failed = [], 0
    for p in a.plans:
        try:
            row = check_plan(A, Path(a.megatron_lm), p)
        except Exception as e:  # noqa: BLE001 - an export that cannot be made is a failure
            row = {"plan": p, "passed": False, "message": f"export: {type(e).__name__}: {e}"}
        rows.append(row)
        failed += not row["passed"]
        print(f"{'PASS' if row['passed'] else 'FAIL'}  {p}: {row['message']}", flush=True)
    print(f"{len(rows) - failed}/{len(rows)} exports pass Megatron-LM's parse_args + "
          f"validate_args + TransformerConfig")
    if a.json:
        Path(a.json).write_text(json.dumps(rows, indent=1, default=str))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
