"""``python -m nest.profiling.sustained``: sustained kernel throughput -> profiles/<hw>/sustained_*.

What the operator profiles (nest.profiling.gpu_run) cannot see: they time one call at a time
with the L2 cache flushed in between, short bursts at whatever clock the card boosts to, while a
training run issues kernels back to back for hours at its power limit. This module runs each
test as a back-to-back chain after a warm-up chain (both fixed call counts, never wall-clock),
one pair of CUDA events around the whole timed chain, no L2 flush, and records the card's SM
clock, power and temperature before and after (nvidia-smi):

* ``gemm``: bf16 GEMMs of transformer shapes (Llama-3-70B / 405B linear layers at tp 4 / 8,
  8192 tokens) and a square one;
* ``attention``: causal scaled_dot_product_attention forward + backward (PyTorch's default
  backend on the card: cuDNN on H100), GQA shapes of Llama-3-70B at tp 4 and 8K tokens;
* ``fp8``: Transformer Engine's te.Linear forward + backward under fp8_autocast, delayed and
  (where the installed TE has it) current scaling, the same shapes as ``gemm``; recorded as
  not importable otherwise;
* ``wgrad``: the weight-gradient GEMM accumulated into an FP32 main gradient (Megatron-LM's
  gradient_accumulation_fusion: out = out + dY^T X in FP32) against a bf16 wgrad GEMM plus a
  separate FP32 add, and the bare bf16 wgrad GEMM.

Writes ``sustained.csv`` (one row per test and shape: calls, seconds per call, TFLOP/s) and
``sustained_meta.json`` (``nest.sustained_meta/v1``: device, driver, torch / CUDA / TE versions,
date, method, GPU state before and after each test) into ``<out>/<hardware>/``. ``--tiny`` (and
any run without a GPU) uses CPU-sized shapes to check the code path.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import time

import torch

from .timing import device_meta, gpu_state, hardware_name, pick_device

SCHEMA = "nest.sustained_meta/v1"
COLUMNS = ("test", "name", "m", "n", "k", "heads", "kv_heads", "head_dim", "seq", "variant",
           "calls", "seconds_per_call", "tflops", "error")
# (name, m, n, k): Y[m, n] = X[m, k] W[k, n]; 8192 tokens (mbs 1 x 8K or mbs 2 x 4K)
GEMMS = (("llama70b_qkv_tp4", 8192, 2560, 8192), ("llama70b_fc1_tp4", 8192, 14336, 8192),
         ("llama70b_fc2_tp4", 8192, 8192, 7168), ("llama405b_fc1_tp8", 8192, 13312, 16384),
         ("square_8192", 8192, 8192, 8192))
TINY_GEMMS = (("tiny", 64, 96, 128),)
# (name, batch, heads, kv_heads, head_dim, seq)
ATTENTION = (("llama70b_tp4_8k", 1, 16, 2, 128, 8192), ("llama70b_tp4_4k_b2", 2, 16, 2, 128,
                                                          4096))
TINY_ATTENTION = (("tiny", 1, 4, 2, 16, 64),)
CALLS = {"gpu": (50, 200), "tiny": (2, 5)}  # (warm-up calls, timed calls) per test


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def chain_seconds(fn, calls: int, warmup: int, device: str) -> float:
    """Seconds per call of `calls` back-to-back calls after `warmup` untimed ones."""
    for _ in range(warmup):
        fn()
    _sync(device)
    if device == "cuda":
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(calls):
            fn()
        end.record()
        torch.cuda.synchronize()
        return start.elapsed_time(end) / 1e3 / calls
    t = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - t) / calls


def _row(test, name, **kw) -> dict:
    r = dict.fromkeys(COLUMNS, "")
    r.update(test=test, name=name, **kw)
    return r


def gemm_rows(device, dtype, shapes, warmup, calls):
    out = []
    for name, m, n, k in shapes:
        x = torch.randn(m, k, device=device, dtype=dtype)
        w = torch.randn(k, n, device=device, dtype=dtype)
        s = chain_seconds(lambda x=x, w=w: x @ w, calls, warmup, device)
        out.append(_row("gemm", name, m=m, n=n, k=k, variant=str(dtype).split(".")[-1],
                        calls=calls, seconds_per_call=s, tflops=2 * m * n * k / s / 1e12))
    return out


def attention_rows(device, dtype, shapes, warmup, calls):
    import torch.nn.functional as F

    out = []
    for name, b, h, kvh, d, s in shapes:
        q = torch.randn(b, h, s, d, device=device, dtype=dtype, requires_grad=True)
        kv = [torch.randn(b, kvh, s, d, device=device, dtype=dtype).repeat_interleave(
            h // kvh, dim=1).requires_grad_() for _ in range(2)]
        dout = torch.randn(b, h, s, d, device=device, dtype=dtype)

        def step(q=q, kv=kv, dout=dout):
            o = F.scaled_dot_product_attention(q, kv[0], kv[1], is_causal=True)
            o.backward(dout)

        sec = chain_seconds(step, calls, warmup, device)
        flops = 3 * 2 * 2 * b * h * s * s * d / 2  # fwd + 2x bwd, QK^T and AV, causal half
        out.append(_row("attention", name, heads=h, kv_heads=kvh, head_dim=d, seq=s,
                        variant="sdpa_default_causal_fwd_bwd", calls=calls,
                        seconds_per_call=sec, tflops=flops / sec / 1e12))
    return out


def fp8_rows(device, shapes, warmup, calls, meta):
    try:
        import transformer_engine.pytorch as te
        from transformer_engine.common import recipe
    except Exception as e:  # noqa: BLE001 (absent or broken TE is a recorded fact)
        meta["transformer_engine"] = f"not importable: {type(e).__name__}: {e}"
        return [_row("fp8", "-", error=meta["transformer_engine"])]
    meta["transformer_engine"] = getattr(te, "__version__", "unknown")
    recipes = {"delayed": recipe.DelayedScaling()}
    if hasattr(recipe, "Float8CurrentScaling"):
        recipes["current"] = recipe.Float8CurrentScaling()
    out = []
    for name, m, n, k in shapes:
        lin = te.Linear(k, n, bias=False, params_dtype=torch.bfloat16, device=device)
        x = torch.randn(m, k, device=device, dtype=torch.bfloat16, requires_grad=True)
        dy = torch.randn(m, n, device=device, dtype=torch.bfloat16)
        for rname, rc in recipes.items():
            def step(lin=lin, x=x, dy=dy, rc=rc):
                with te.fp8_autocast(enabled=True, fp8_recipe=rc):
                    y = lin(x)
                y.backward(dy)

            try:
                s = chain_seconds(step, calls, warmup, device)
                out.append(_row("fp8", name, m=m, n=n, k=k, variant=f"te_linear_{rname}_fwd_bwd",
                                calls=calls, seconds_per_call=s,
                                tflops=3 * 2 * m * n * k / s / 1e12))
            except Exception as e:  # noqa: BLE001
                out.append(_row("fp8", name, m=m, n=n, k=k, variant=rname,
                                error=f"{type(e).__name__}: {e}"))
    return out


def wgrad_rows(device, dtype, shapes, warmup, calls):
    out = []
    for name, m, n, k in shapes:
        x = torch.randn(m, k, device=device, dtype=dtype)
        dy = torch.randn(m, n, device=device, dtype=dtype)
        main_grad = torch.zeros(k, n, device=device, dtype=torch.float32)
        variants = {"bf16_wgrad_then_fp32_add": lambda g=main_grad, x=x, dy=dy: g.add_(x.t() @ dy),
                    "bf16_wgrad_only": lambda x=x, dy=dy: x.t() @ dy}
        if _has_out_dtype():  # FP32 accumulation in the GEMM (beta = 1), as
            # gradient_accumulation_fusion asks of cuBLAS; needs torch.addmm(out_dtype=)
            variants["fused_fp32_accumulate"] = lambda g=main_grad, x=x, dy=dy: torch.addmm(
                g, x.t(), dy, out_dtype=torch.float32)
        else:
            out.append(_row("wgrad", name, variant="fused_fp32_accumulate",
                            error="torch.addmm has no out_dtype in this torch"))
        for vname, fn in variants.items():
            try:
                s = chain_seconds(fn, calls, warmup, device)
            except Exception as e:  # noqa: BLE001 (a dtype combination the build lacks)
                out.append(_row("wgrad", name, variant=vname, error=f"{type(e).__name__}: {e}"))
                continue
            out.append(_row("wgrad", name, m=k, n=n, k=m, variant=vname, calls=calls,
                            seconds_per_call=s, tflops=2 * m * n * k / s / 1e12))
    return out


def _has_out_dtype() -> bool:
    import inspect

    try:
        return "out_dtype" in inspect.signature(torch.addmm).parameters
    except (TypeError, ValueError):
        return False


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m nest.profiling.sustained",
                                description=__doc__.splitlines()[0])
    p.add_argument("--out", default="profiles", help="parent folder (default: profiles)")
    p.add_argument("--tiny", action="store_true", help="CPU-sized shapes (default without GPU)")
    p.add_argument("--tests", default="gemm,attention,fp8,wgrad",
                   help="comma-separated subset of gemm,attention,fp8,wgrad")
    a = p.parse_args(argv)
    device = pick_device()
    tiny = a.tiny or device != "cuda"
    warmup, calls = CALLS["tiny" if tiny else "gpu"]
    meta = device_meta(device)
    hw = hardware_name(meta["device_name"]) if device == "cuda" else "cpu"
    out_dir = os.path.join(a.out, hw)
    os.makedirs(out_dir, exist_ok=True)
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    gemms, attn = (TINY_GEMMS, TINY_ATTENTION) if tiny else (GEMMS, ATTENTION)
    meta.update({"schema": SCHEMA, "hardware": hw, "tiny": tiny, "warmup_calls": warmup,
                 "timed_calls": calls, "argv": list(argv or []),
                 "method": "back-to-back chain of fixed call counts after a warm-up chain, one "
                           "pair of CUDA events around the timed chain, no L2 flush",
                 "states": {}})
    tests = {"gemm": lambda: gemm_rows(device, dtype, gemms, warmup, calls),
             "attention": lambda: attention_rows(device, dtype, attn, warmup, calls),
             "fp8": lambda: fp8_rows(device, gemms, warmup, calls, meta) if device == "cuda"
             else [_row("fp8", "-", error="no CUDA device")],
             "wgrad": lambda: wgrad_rows(device, dtype, gemms, warmup, calls)}
    wanted = a.tests.split(",")
    bad = sorted(set(wanted) - set(tests))
    if bad:
        p.error(f"--tests: unknown {bad}; expected some of {sorted(tests)}")
    rows = []
    t0 = time.monotonic()
    for name in wanted:
        before = gpu_state() if device == "cuda" else None
        try:
            got = tests[name]()
        except Exception as e:  # noqa: BLE001 (one failing test must not lose the others)
            got = [_row(name, "-", error=f"{type(e).__name__}: {e}")]
        rows += got
        meta["states"][name] = {"before": before,
                                "after": gpu_state() if device == "cuda" else None}
        print(f"[{time.monotonic() - t0:6.1f} s] {name}: {len(got)} rows", flush=True)
        with open(os.path.join(out_dir, "sustained.csv"), "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=COLUMNS)
            w.writeheader()
            w.writerows(rows)
    meta["elapsed_s"] = time.monotonic() - t0
    with open(os.path.join(out_dir, "sustained_meta.json"), "w") as f:
        json.dump(meta, f, indent=2, default=str)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
