"""Operator shapes -> measured forward/backward times, one CSV per op family.

CSV columns (all families): ``op``, the family's shape columns (``shapes.FAMILY_FIELDS``), then
``MEASURE_COLUMNS``. Times are medians in seconds; ``*_flops`` are analytic model FLOPs (a
multiply-add counts 2; attention backward counted as 2x forward, i.e. without flash's recompute);
``*_bytes`` are the analytic minimum device-memory traffic (each input read once, each output
written once); ``*_flops_per_s`` and ``*_bytes_per_s`` are those divided by the measured time.
Backward times are for the backward alone (the forward graph is kept and
``torch.autograd.grad(..., retain_graph=True)`` is timed; for matmuls the two backward GEMMs are
timed directly: ``dX = dY @ W`` and ``dW = dY^T @ X``).

Attention is timed twice over the same shapes: ``attention.csv`` with the flash backend forced
(where it accepts the shape) and ``attention_default.csv`` with no backend forced, i.e. whatever
``scaled_dot_product_attention`` picks by itself, as a training script calling it plainly gets
(on H100 with torch 2.11: cuDNN attention). The ``backend`` column of the default table names the
implementation PyTorch dispatched to (``default:cudnn``, ``default:flash``, ...), read from the
aten ops one forward call ran (``sdpa_impl``); the backward is that op's own autograd node, and a
backward call found running another implementation would be appended as ``/bwd:<impl>``.
"""

from __future__ import annotations

import csv
import math
import os
import time
import warnings
from contextlib import nullcontext

import torch
import torch.nn.functional as F

from .shapes import FAMILY_FIELDS
from .timing import Timer, pick_device

MEASURE_COLUMNS = (
    "dtype",
    "fwd_time_s",
    "bwd_time_s",
    "bwd_dgrad_time_s",
    "bwd_wgrad_time_s",
    "fwd_flops",
    "bwd_flops",
    "fwd_bytes",
    "bwd_bytes",
    "fwd_flops_per_s",
    "bwd_flops_per_s",
    "fwd_bytes_per_s",
    "bwd_bytes_per_s",
    "num_repeats",
    "backend",
    "tags",
    "error",
)
FAMILY_ORDER = ("matmul", "attention", "moe", "norm", "elementwise", "cross_entropy", "embedding")
# Extra tables over one family's shapes, timed another way: table -> shape family.
# attention_default: SDPA with PyTorch's own backend choice (module docstring).
# attention_unfused: Megatron-LM's CoreAttention of 2021-22 (scores materialised, Korthikanti
# et al. 2022, section 4.1), the implementation the A100-era published runs used.
# matmul_fp8: the same GEMM shapes in FP8 through torch._scaled_mm (Transformer Engine's
# hybrid recipe: E4M3 activations and weights forward, E5M2 gradients backward).
TABLE_FAMILY = {"attention_default": "attention", "attention_unfused": "attention",
                "matmul_fp8": "matmul"}
# Megatron-LM's attention dropout (--attention-dropout default 0.1), used by attention_unfused.
UNFUSED_ATTENTION_DROPOUT = 0.1
# Tables in the order profile_operators writes them (each family's extra tables right after it).
TABLE_ORDER = tuple(
    t for f in FAMILY_ORDER for t in (f, *(x for x, y in TABLE_FAMILY.items() if y == f))
)

# Analytic FLOPs per element for the memory-bound ops (forward, backward): rough operation counts
# of the reference formulas; these ops are bandwidth-bound, so the byte counts matter more.
_ELEM_FLOPS = {
    "layernorm": (8, 16),
    "rmsnorm": (5, 10),
    "gelu": (8, 12),
    "silu": (4, 8),
    "swiglu": (5, 10),
    "softmax": (5, 4),
}


def columns(family: str) -> list[str]:
    """CSV header of one family's table (or of an extra table, ``TABLE_FAMILY``)."""
    return ["op", *FAMILY_FIELDS[TABLE_FAMILY.get(family, family)], *MEASURE_COLUMNS]


def _randn(*shape, device, dtype, grad=False):
    x = torch.randn(*shape, device=device, dtype=torch.float32).to(dtype)
    return x.requires_grad_(grad)


def _bwd(out, inputs, grad_out=None):
    return lambda: torch.autograd.grad(out, inputs, grad_out, retain_graph=True)


# ---------------------------------------------------------------- per-family benchmarks
def bench_matmul(s, timer, device, dtype):
    m, n, k = s["m"], s["n"], s["k"]
    x = _randn(m, k, device=device, dtype=dtype)
    w = _randn(n, k, device=device, dtype=dtype)
    dy = _randn(m, n, device=device, dtype=dtype)
    t_f, reps = timer(lambda: F.linear(x, w))
    t_dg, _ = timer(lambda: torch.matmul(dy, w))
    t_wg, _ = timer(lambda: torch.matmul(dy.t(), x))
    e = torch.tensor([], dtype=dtype).element_size()
    return _gemm_row(m, n, k, t_f, t_dg, t_wg, reps, e * (m * k + n * k + m * n),
                     "torch.nn.functional.linear / torch.matmul")


def _gemm_row(m, n, k, t_f, t_dg, t_wg, reps, gemm_bytes, backend, **extra):
    """One GEMM shape's row: forward Y = X W^T, backward dgrad + wgrad (2 x the FLOPs and the
    bytes of the forward)."""
    return {
        "fwd_time_s": t_f,
        "bwd_time_s": t_dg + t_wg,
        "bwd_dgrad_time_s": t_dg,
        "bwd_wgrad_time_s": t_wg,
        "fwd_flops": 2 * m * n * k,
        "bwd_flops": 4 * m * n * k,
        "fwd_bytes": gemm_bytes,
        "bwd_bytes": 2 * gemm_bytes,
        "num_repeats": reps,
        "backend": backend,
        **extra,
    }


def bench_moe(s, timer, device, dtype):
    ne, m, n, k = s["experts"], s["m"], s["n"], s["k"]
    x = _randn(ne, m, k, device=device, dtype=dtype)
    w = _randn(ne, n, k, device=device, dtype=dtype)
    dy = _randn(ne, m, n, device=device, dtype=dtype)
    t_f, reps = timer(lambda: torch.bmm(x, w.transpose(1, 2)))
    t_dg, _ = timer(lambda: torch.bmm(dy, w))
    t_wg, _ = timer(lambda: torch.bmm(dy.transpose(1, 2), x))
    e = torch.tensor([], dtype=dtype).element_size()
    gemm_bytes = e * ne * (m * k + n * k + m * n)
    return {
        "fwd_time_s": t_f,
        "bwd_time_s": t_dg + t_wg,
        "bwd_dgrad_time_s": t_dg,
        "bwd_wgrad_time_s": t_wg,
        "fwd_flops": 2 * ne * m * n * k,
        "bwd_flops": 4 * ne * m * n * k,
        "fwd_bytes": gemm_bytes,
        "bwd_bytes": 2 * gemm_bytes,
        "num_repeats": reps,
        "backend": "torch.bmm (experts batched, equal tokens per expert)",
    }


def _sdpa_variants(device, backend="flash"):
    """(label, context factory, kv mode) to try in order.

    backend "flash": the flash kernel forced first on CUDA, then PyTorch's choice; "default":
    PyTorch's choice only (no backend forced), GQA through ``enable_gqa`` first as the measured
    blocks call it (nest.profiling.blocks), expanded K/V where that is refused.
    """
    variants = []
    if device == "cuda" and backend == "flash":
        try:
            from torch.nn.attention import SDPBackend, sdpa_kernel

            flash = lambda: sdpa_kernel([SDPBackend.FLASH_ATTENTION])
            variants += [("flash", flash, "gqa"), ("flash", flash, "expand")]
        except ImportError:
            pass
    label = "default" if backend == "default" else "auto"
    variants += [(label, nullcontext, "gqa"), (label, nullcontext, "expand")]
    return variants


# aten op-name keywords -> SDPA implementation (forward and backward ops both carry them:
# aten._scaled_dot_product_cudnn_attention(_backward), aten._flash_attention_backward,
# aten._scaled_dot_product_flash_attention_for_cpu, aten._efficient_attention_backward, ...)
_SDPA_IMPLS = ("cudnn", "flash", "efficient", "math", "overrideable")


class _OpNames:
    """Records the aten op names run under it (a ``TorchDispatchMode``, below autograd, so the
    backward's ops are seen too: the autograd engine carries the mode into its threads)."""

    def __init__(self):
        from torch.utils._python_dispatch import TorchDispatchMode

        names = self.names = set()

        class _Mode(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                names.add(str(func))
                return func(*args, **(kwargs or {}))

        self.mode = _Mode()


def sdpa_impl(fn) -> str:
    """The SDPA implementation(s) ``fn()`` dispatched to, from the aten op names it ran
    (``aten._scaled_dot_product_cudnn_attention.default``, ...); "" when none is recognised (the
    math path's backward has no SDPA op of its own) or the names cannot be read."""
    try:
        rec = _OpNames()
        with rec.mode:
            fn()
        names = rec.names
    except Exception:  # noqa: BLE001 - a label only; never fail a measurement over it
        return ""
    found = set()
    for n in names:
        if n.startswith(("aten._", "aten::_")) and "attention" in n:
            found.update(k for k in _SDPA_IMPLS if k in n)
    if "flash" in found and len(found) > 1:  # e.g. the CPU flash kernel under a math wrapper
        found.discard("math")
    return "+".join(sorted(found))


def bench_attention(s, timer, device, dtype, backend="flash"):
    b, sq, skv, a, kv, d = s["b"], s["s_q"], s["s_kv"], s["heads"], s["kv_heads"], s["head_dim"]
    causal = bool(s["causal"])
    q = _randn(b, a, sq, d, device=device, dtype=dtype, grad=True)
    k = _randn(b, kv, skv, d, device=device, dtype=dtype, grad=True)
    v = _randn(b, kv, skv, d, device=device, dtype=dtype, grad=True)
    rep = a // kv
    last_err = None
    for label, ctx, kv_mode in _sdpa_variants(device, backend):
        if kv_mode == "gqa" and rep == 1:
            kw = {}
        elif kv_mode == "gqa":
            kw = {"enable_gqa": True}
        else:
            if rep == 1:
                continue
            kw = {}

        def fwd(kw=kw, kv_mode=kv_mode):
            kk, vv = (
                (k, v)
                if kv_mode == "gqa"
                else (k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1))
            )
            return F.scaled_dot_product_attention(q, kk, vv, is_causal=causal, **kw)

        try:
            with ctx(), warnings.catch_warnings():
                warnings.simplefilter("ignore")  # refused backends warn before raising
                out = fwd()
                t_f, reps = timer(fwd)
            go = torch.randn_like(out)
            bwd = _bwd(out, (q, k, v), go)
            t_b, _ = timer(bwd)
            if backend == "default":  # which implementation PyTorch picked, both directions
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    impl_f, impl_b = sdpa_impl(fwd), sdpa_impl(bwd)
                label = "default:" + (impl_f or "?")
                if impl_b and impl_b != impl_f:
                    label += "/bwd:" + impl_b
            backend_name = label + ("" if kv_mode == "gqa" or rep == 1 else "+expand_kv")
            if rep > 1 and kv_mode == "gqa":
                backend_name += "+enable_gqa"
            break
        except RuntimeError as exc:  # backend refused the shape: try the next
            if "out of memory" in str(exc).lower():
                raise
            last_err = exc
            continue
    else:
        raise RuntimeError(f"no SDPA backend ran: {last_err}")
    e = torch.tensor([], dtype=dtype).element_size()
    frac = 0.5 if causal else 1.0  # causal mask skips about half the score matrix
    fwd_flops = int(4 * b * a * sq * skv * d * frac)  # QK^T and PV
    q_el, kv_el = b * sq * a * d, b * skv * kv * d
    return {
        "fwd_time_s": t_f,
        "bwd_time_s": t_b,
        "fwd_flops": fwd_flops,
        "bwd_flops": 2 * fwd_flops,
        "fwd_bytes": e * (2 * q_el + 2 * kv_el),  # read q, k, v; write o
        "bwd_bytes": e * (4 * q_el + 4 * kv_el),  # read q,k,v,o,do; write dq,dk,dv
        "num_repeats": reps,
        "backend": backend_name,
    }


def bench_attention_default(s, timer, device, dtype):
    """SDPA with no backend forced: the implementation PyTorch itself picks (attention_default)."""
    return bench_attention(s, timer, device, dtype, backend="default")


def bench_attention_unfused(s, timer, device, dtype):
    """Megatron-LM's unfused CoreAttention: per (batch x head) ``baddbmm`` of Q K^T scaled by
    1/sqrt(d), the causal mask (``masked_fill``), softmax, dropout (p = 0.1), ``bmm`` with V.
    K/V heads are expanded for GQA as Megatron did. Eager PyTorch: the mask, softmax and dropout
    run as separate kernels (Megatron fused scale + mask + softmax into one; the s x s traffic of
    the GEMMs and of dropout is the same)."""
    b, sq, skv, a, kv, d = s["b"], s["s_q"], s["s_kv"], s["heads"], s["kv_heads"], s["head_dim"]
    causal = bool(s["causal"])
    q = _randn(b * a, sq, d, device=device, dtype=dtype, grad=True)
    k = _randn(b * kv, skv, d, device=device, dtype=dtype, grad=True)
    v = _randn(b * kv, skv, d, device=device, dtype=dtype, grad=True)
    rep = a // kv
    mask = (torch.ones(sq, skv, device=device, dtype=torch.bool).triu(1 + skv - sq)
            if causal else None)
    scale = 1.0 / math.sqrt(d)

    def fwd():
        kk = k if rep == 1 else k.view(b, kv, skv, d).repeat_interleave(rep, 1).view(b * a, skv, d)
        vv = v if rep == 1 else v.view(b, kv, skv, d).repeat_interleave(rep, 1).view(b * a, skv, d)
        scores = torch.baddbmm(torch.empty(b * a, sq, skv, device=device, dtype=dtype), q,
                               kk.transpose(1, 2), beta=0.0, alpha=scale)
        if mask is not None:
            scores = scores.masked_fill(mask, float("-inf"))
        probs = torch.softmax(scores, dim=-1)
        probs = F.dropout(probs, p=UNFUSED_ATTENTION_DROPOUT, training=True)
        return torch.bmm(probs, vv)

    out = fwd()
    t_f, reps = timer(fwd)
    go = torch.randn_like(out)
    t_b, _ = timer(_bwd(out, (q, k, v), go))
    e = torch.tensor([], dtype=dtype).element_size()
    fwd_flops = int(4 * b * a * sq * skv * d)  # both GEMMs run over the whole s x s square
    q_el, kv_el, ss = b * sq * a * d, b * skv * kv * d, b * a * sq * skv
    return {
        "fwd_time_s": t_f,
        "bwd_time_s": t_b,
        "fwd_flops": fwd_flops,
        "bwd_flops": 2 * fwd_flops,
        # Q, K, V in, O out; scores written + read by softmax, probabilities written, dropout
        # reads them and writes its output and mask (1 B), the second GEMM reads the output
        "fwd_bytes": e * (2 * q_el + 2 * kv_el) + e * ss * 5 + ss,
        "bwd_bytes": 2 * (e * (2 * q_el + 2 * kv_el) + e * ss * 5 + ss),
        "num_repeats": reps,
        "backend": f"unfused eager: baddbmm, masked_fill, softmax, dropout "
                   f"{UNFUSED_ATTENTION_DROPOUT}, bmm",
    }


def bench_matmul_fp8(s, timer, device, dtype):
    """The matmul shapes in FP8 (torch._scaled_mm, per-tensor scales, BF16 output): forward
    E4M3 x E4M3, dgrad E5M2 gradient x E4M3 weight, wgrad E5M2 x E4M3 (Transformer Engine's
    HYBRID format). The casts to FP8 are not timed (Transformer Engine fuses them into the
    preceding kernels where it can); n, k, m must be multiples of 16."""
    if not hasattr(torch, "_scaled_mm") or not hasattr(torch, "float8_e4m3fn"):
        raise RuntimeError("this torch has no FP8 GEMM (torch._scaled_mm)")
    m, n, k = s["m"], s["n"], s["k"]
    if m % 16 or n % 16 or k % 16:
        raise ValueError(f"FP8 GEMM needs multiples of 16, got m={m} n={n} k={k}")
    e4, e5 = torch.float8_e4m3fn, torch.float8_e5m2
    one = torch.ones((), device=device, dtype=torch.float32)
    x = _randn(m, k, device=device, dtype=torch.bfloat16).to(e4)
    w = _randn(n, k, device=device, dtype=torch.bfloat16).to(e4)
    dy = _randn(m, n, device=device, dtype=torch.bfloat16).to(e5)
    # _scaled_mm wants the first operand row-major and the second column-major
    w_t = w.t()  # [k, n], column-major view of the row-major weight
    w_kn_cm = w.t().contiguous().t()  # [n, k] column-major for dgrad: dy [m, n] @ w [n, k]
    x_cm = x.t().contiguous().t()  # [m, k] column-major for wgrad: dy^T [n, m] @ x [m, k]
    dy_t = dy.t().contiguous()  # [n, m] row-major
    mm = lambda a_, b_: torch._scaled_mm(a_, b_, scale_a=one, scale_b=one,
                                         out_dtype=torch.bfloat16)
    t_f, reps = timer(lambda: mm(x, w_t))
    t_dg, _ = timer(lambda: mm(dy, w_kn_cm))
    t_wg, _ = timer(lambda: mm(dy_t, x_cm))
    return _gemm_row(m, n, k, t_f, t_dg, t_wg, reps,
                     m * k + n * k + 2 * m * n,  # FP8 inputs, BF16 output
                     "torch._scaled_mm e4m3 x e4m3 fwd, e5m2 x e4m3 bwd, per-tensor scale, "
                     "bf16 out", dtype="float8_e4m3fn")


def _elementwise_common(op, rows, cols, n_in, t_f, t_b, reps, e, backend):
    ff, fb = _ELEM_FLOPS[op]
    el = rows * cols
    return {
        "fwd_time_s": t_f,
        "bwd_time_s": t_b,
        "fwd_flops": ff * el,
        "bwd_flops": fb * el,
        "fwd_bytes": e * el * (n_in + 1),  # read inputs, write output
        "bwd_bytes": e * el * (2 * n_in + 1),  # read inputs + dy, write dinputs
        "num_repeats": reps,
        "backend": backend,
    }


def bench_norm(s, timer, device, dtype):
    op, rows, cols = s["op"], s["rows"], s["cols"]
    x = _randn(rows, cols, device=device, dtype=dtype, grad=True)
    w = _randn(cols, device=device, dtype=dtype, grad=True)
    if op == "layernorm":
        bias = _randn(cols, device=device, dtype=dtype, grad=True)
        fwd = lambda: F.layer_norm(x, (cols,), w, bias)
        params, backend = (x, w, bias), "torch.nn.functional.layer_norm"
    elif op == "rmsnorm":
        if hasattr(F, "rms_norm"):
            fwd = lambda: F.rms_norm(x, (cols,), w, eps=1e-5)
            backend = "torch.nn.functional.rms_norm"
        else:  # pragma: no cover - torch < 2.4
            fwd = lambda: (
                x * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + 1e-5).to(x.dtype) * w
            )
            backend = "unfused rms_norm"
        params = (x, w)
    else:
        raise ValueError(f"unknown norm {op!r}")
    t_f, reps = timer(fwd)
    out = fwd()
    t_b, _ = timer(_bwd(out, params, torch.randn_like(out)))
    e = torch.tensor([], dtype=dtype).element_size()
    return _elementwise_common(op, rows, cols, 1, t_f, t_b, reps, e, backend)


def bench_elementwise(s, timer, device, dtype):
    op, rows, cols = s["op"], s["rows"], s["cols"]
    x = _randn(rows, cols, device=device, dtype=dtype, grad=True)
    inputs = (x,)
    if op == "gelu":
        fwd = lambda: F.gelu(x, approximate="tanh")
    elif op == "silu":
        fwd = lambda: F.silu(x)
    elif op == "swiglu":
        u = _randn(rows, cols, device=device, dtype=dtype, grad=True)
        inputs = (x, u)
        fwd = lambda: F.silu(x) * u
    elif op == "softmax":
        fwd = lambda: torch.softmax(x, dim=-1)
    else:
        raise ValueError(f"unknown elementwise op {op!r}")
    t_f, reps = timer(fwd)
    out = fwd()
    t_b, _ = timer(_bwd(out, inputs, torch.randn_like(out)))
    e = torch.tensor([], dtype=dtype).element_size()
    return _elementwise_common(op, rows, cols, len(inputs), t_f, t_b, reps, e, "torch eager")


def bench_embedding(s, timer, device, dtype):
    tokens, vocab, hidden = s["tokens"], s["vocab"], s["hidden"]
    w = _randn(vocab, hidden, device=device, dtype=dtype, grad=True)
    idx = torch.randint(0, vocab, (tokens,), device=device)
    fwd = lambda: F.embedding(idx, w)
    t_f, reps = timer(fwd)
    out = fwd()
    t_b, _ = timer(_bwd(out, (w,), torch.randn_like(out)))
    e = torch.tensor([], dtype=dtype).element_size()
    return {
        "fwd_time_s": t_f,
        "bwd_time_s": t_b,
        "fwd_flops": 0,
        "bwd_flops": tokens * hidden,
        "fwd_bytes": 2 * e * tokens * hidden + 8 * tokens,
        # dense weight gradient written once, dy read, rows accumulated
        "bwd_bytes": e * vocab * hidden + 2 * e * tokens * hidden + 8 * tokens,
        "num_repeats": reps,
        "backend": "torch.nn.functional.embedding (dense grad)",
    }


def bench_cross_entropy(s, timer, device, dtype):
    tokens, vocab = s["tokens"], s["vocab"]
    logits = _randn(tokens, vocab, device=device, dtype=dtype, grad=True)
    target = torch.randint(0, vocab, (tokens,), device=device)
    fwd = lambda: F.cross_entropy(logits.float(), target)
    t_f, reps = timer(fwd)
    loss = fwd()
    t_b, _ = timer(_bwd(loss, (logits,)))
    e = torch.tensor([], dtype=dtype).element_size()
    el = tokens * vocab
    return {
        "fwd_time_s": t_f,
        "bwd_time_s": t_b,
        "fwd_flops": 5 * el,
        "bwd_flops": 3 * el,
        "fwd_bytes": e * el + 8 * tokens,
        "bwd_bytes": 2 * e * el + 8 * tokens,
        "num_repeats": reps,
        "backend": "cross_entropy on fp32 upcast of bf16 logits",
    }


BENCH = {
    "matmul": bench_matmul,
    "moe": bench_moe,
    "attention": bench_attention,
    "attention_default": bench_attention_default,
    "attention_unfused": bench_attention_unfused,
    "matmul_fp8": bench_matmul_fp8,
    "norm": bench_norm,
    "elementwise": bench_elementwise,
    "embedding": bench_embedding,
    "cross_entropy": bench_cross_entropy,
}


def _shape_priority(s):
    # shapes a model really runs (tagged with mbs) before pure interpolation-grid points
    grid_only = all(t.endswith(":grid") for t in s["tags"])
    return (grid_only,)


def profile_operators(
    shapes,
    out_dir,
    *,
    device=None,
    dtype=torch.bfloat16,
    timer=None,
    families=None,
    deadline=None,
    progress=print,
) -> dict:
    """Time every shape and write ``<out_dir>/<family>.csv`` (rows flushed as they come).

    families: the tables to write (family names and ``TABLE_FAMILY`` extras, e.g.
    ``{"attention_default"}``); None: all of ``TABLE_ORDER``.
    deadline: ``time.monotonic()`` value after which the remaining shapes are skipped.
    Returns {table: {"path", "rows", "skipped", "errors"}}.
    """
    device = device or pick_device()
    timer = timer or Timer(device)
    os.makedirs(out_dir, exist_ok=True)
    dtype_name = str(dtype).replace("torch.", "")
    summary = {}
    for family in TABLE_ORDER:  # a family's table, or an extra table over its shapes
        if families is not None and family not in families:
            continue
        shape_family = TABLE_FAMILY.get(family, family)
        fam_shapes = sorted(
            (s for s in shapes if s["family"] == shape_family), key=_shape_priority
        )
        if not fam_shapes:
            continue
        path = os.path.join(out_dir, f"{family}.csv")
        info = summary[family] = {"path": path, "rows": 0, "skipped": 0, "errors": 0}
        t_fam = time.monotonic()
        with open(path, "w", newline="") as fh:
            writer = csv.DictWriter(fh, fieldnames=columns(family), extrasaction="ignore")
            writer.writeheader()
            for s in fam_shapes:
                if deadline is not None and time.monotonic() > deadline:
                    info["skipped"] += 1
                    continue
                row = {c: s[c] for c in FAMILY_FIELDS[shape_family]}
                row.update(op=s["op"], dtype=dtype_name, tags=";".join(s["tags"]), error="")
                try:
                    res = BENCH[family](s, timer, device, dtype)
                except (RuntimeError, ValueError) as exc:  # OOM or refused shape: keep going
                    info["errors"] += 1
                    row["error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
                    res = {}
                finally:
                    if device == "cuda":
                        torch.cuda.empty_cache()
                row.update(res)
                for ph in ("fwd", "bwd"):
                    t = res.get(f"{ph}_time_s")
                    if t:
                        row[f"{ph}_flops_per_s"] = res[f"{ph}_flops"] / t
                        row[f"{ph}_bytes_per_s"] = res[f"{ph}_bytes"] / t
                writer.writerow({k: _fmt(v) for k, v in row.items()})
                fh.flush()
                info["rows"] += 1
        progress(
            f"[profile] {family}: {info['rows']} shapes in {time.monotonic() - t_fam:.1f} s"
            + (f", {info['skipped']} skipped (time budget)" if info["skipped"] else "")
            + (f", {info['errors']} errors" if info["errors"] else "")
        )
    return summary


def _fmt(v):
    if isinstance(v, float):
        return "" if math.isnan(v) else f"{v:.6g}"
    return v
