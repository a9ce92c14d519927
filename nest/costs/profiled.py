"""Layer-graph operator x measured profiles (profiles/<hardware>/*.csv) -> operator times.

The GPU path of the cost model (issue 4). Each operator of a layer graph is priced from the
operator measurements `nest profile` wrote (profiles/README.md gives the CSV columns and how
they were measured), interpolated in shape; where no measurement covers the shape the analytical
roofline (nest.costs.roofline.op_times) prices it. Every priced half (forward, backward) records
its source, "profile" or "roofline".

Rules, per operator kind (a layer graph's `Op`):

* matmul (m, n, k), `count` identical instances: the rows of matmul.csv with the same (n, k)
  are a curve in m (the profiler measures every model shape plus m in {512..8192}). Time is
  interpolated linearly in m between measured points (exact at a measured m, monotone between
  two); above the largest measured m it grows at the throughput of the largest (a GEMM with
  m >= 8192 tokens is saturated); below the smallest it is the roofline. An (n, k) that was not
  measured borrows the throughput of the nearest measured (n', k') (log distance) when both
  ratios are within MAX_TRANSFER_RATIO (a fused gate+up GEMM, 2f x h, from the measured f x h
  GEMM): time = t'(m) x n k / (n' k'). Backward = the measured dgrad + wgrad GEMMs.
  Unaligned n or k (not a multiple of ALIGN; only unpadded vocabularies: GPT-3's 50257, BERT's
  30522 and their tensor-parallel shards) is priced as the shape padded up to a multiple of
  PAD, the way Megatron-LM pads the vocabulary (--make-vocab-size-divisible-by 128: 50304,
  30592), so the unaligned rows of matmul.csv are never used: cuBLAS runs other, slow kernels
  there (GPT-3's unpadded LM head measured at 100 TFLOP/s against ~700 for its neighbours),
  which a real run does not pay. Only aligned shapes lend their throughput.
* MoE expert GEMMs (`expert_*` ops, `count` = local experts): moe.csv measures the local
  experts batched (torch.bmm, equal tokens per expert); an exact (experts, m, n, k) row prices
  all `count` instances at once (gate+up = the expert_gate + expert_up rows). Otherwise the
  per-expert GEMM is priced as a dense matmul times `count`.
* attention (b, heads, s_q, s_kv, head_dim): priced from attention_default.csv when the folder
  has it (scaled_dot_product_attention with PyTorch's own backend choice, as training code
  calls it: cuDNN attention on H100, about 2x faster than flash), else from attention.csv (the
  flash backend forced); `ProfileSet.attention_table` says which. The row with the same heads,
  head_dim, causality and local query length s_q (kv heads recovered from the op's bytes,
  nearest measured), scaled by the FLOP ratio (b, and s_kv / s_q under context parallelism,
  where the profiler measured the local s/c x s/c block). Causality is read from the op's FLOPs
  (the closed form counts half the score matrix for causal models).
* memory-bound ops (norms, residual adds, GELU, SwiGLU, embedding lookup, cross-entropy): priced
  by bytes at the achieved bandwidth measured for similar sizes of the same family (log-log
  interpolation of time in bytes; exact at a measured size; above the largest measured size at
  its bandwidth; below the smallest, roofline). Backward rows under AUTOGRAD_FLOOR_S are not
  used: the profiler times small non-GEMM backwards with `torch.autograd.grad` from Python, which
  shows a ~45 us host floor (profiles/README.md, Caveats); those sizes fall back to the roofline
  (bytes / bandwidth), as does every attention backward under the floor.
"""

from __future__ import annotations

import csv
import math
from bisect import bisect_left
from dataclasses import dataclass, replace
from functools import lru_cache
from pathlib import Path

from nest.costs.fp8_quant import fp8_cast_s
from nest.costs.roofline import is_fp8_gemm
from nest.costs.roofline import op_times as roofline_op_times
from nest.common.errors import SpecError
from nest.graph.layer_graph import Op
from nest.spec.catalog import HardwareSpec

BYTES = 2  # bf16, as in the layer graph
# Backward timings of non-GEMM ops below this are host-bound (profiles/README.md, Caveats).
AUTOGRAD_FLOOR_S = 60e-6
# Largest ratio in n or k over which a matmul borrows a measured shape's throughput.
MAX_TRANSFER_RATIO = 2.0
ALIGN = 8  # bf16 GEMMs with n, k multiples of 8 (16 bytes) run the tensor-core fast paths
PAD = 128  # Megatron-LM --make-vocab-size-divisible-by (default 128)
# Attention timed with no SDPA backend forced (nest.profiling.operators); preferred to the
# flash-forced attention.csv when present.
ATTENTION_DEFAULT = "attention_default"
# The attention kernel a run's software used (`attention_kernel`; `for_attention_kernel`):
# "default": SDPA's own backend choice (attention_default.csv; cuDNN attention on H100);
# "flash2": FlashAttention-2 (attention.csv, SDPA's flash backend forced: FA2 kernels);
# "flash1": a FlashAttention-1-generation kernel (FA1 CUDA, or the 2022 Triton FlashAttention
# llm-foundry ran as attn_impl: triton), priced as flash2 time x FA2_OVER_FA1.
ATTENTION_KERNELS = ("default", "flash2", "flash1")
# Dao 2023, "FlashAttention-2: Faster Attention with Better Parallelism and Work Partitioning",
# abstract: "around 2x speedup compared to FlashAttention" (A100; both generations use the same
# Ampere mma instructions, which is also what they run on H100). The Triton kernel of
# flash_attn_triton.py (HazyResearch flash-attention @ eff9fe6, copied into llm-foundry) states
# in its header that its forward + backward is "slightly slower" than the FA1 CUDA kernel.
FA2_OVER_FA1 = 2.0
# Throughput by head dimension (TFLOP/s forward, backward) where the attention table lacks a
# shape's head_dim: Shah et al. 2024, "FlashAttention-3" (arXiv:2407.08608), Figures 5 and 6
# (H100 80GB SXM5, BF16, batch x sequence 16k, hidden 2,048), the bars at sequence 4k: cuDNN
# (our default table's kernel) forward 408 at head dim 64 / 609 at 128, backward 417 / 499;
# FlashAttention-2 (the flash2 / flash1 tables) forward 321 / 368, backward 279 / 310. A shape
# of head dim d is priced from the measured row of head dim d' with the same heads x head_dim,
# sequence and causality, scaled by FLOPs and by TFLOP/s(d') / TFLOP/s(d) per phase (the
# figures' non-causal ratio, applied to causal shapes too: an assumption). `attention`.
HEAD_DIM_TFLOPS = {"default": {64: (408.0, 417.0), 128: (609.0, 499.0)},
                   "flash2": {64: (321.0, 279.0), 128: (368.0, 310.0)}}

# Memory-bound op name -> (profile CSV family, profile ops or None for all, forward and backward
# factors converting the layer graph's bytes into the profile's byte convention, None = not
# comparable: roofline). Both count analytic minimum traffic; they differ only where noted.
_MEMORY_MAP: dict[str, tuple[str, tuple[str, ...] | None, float, float | None]] = {
    "norm1": ("norm", None, 1.0, 1.0),
    "norm2": ("norm", None, 1.0, 1.0),
    "final_norm": ("norm", None, 1.0, 1.0),
    "embedding_norm": ("norm", None, 1.0, 1.0),
    # residual add: one elementwise kernel over hidden-size tensors; the single-kernel
    # elementwise rows (SiLU, GELU) give its bandwidth
    "residual1": ("elementwise", ("silu", "gelu"), 1.0, 1.0),
    "residual2": ("elementwise", ("silu", "gelu"), 1.0, 1.0),
    "embedding_add": ("elementwise", ("silu", "gelu"), 1.0, 1.0),
    "gelu": ("elementwise", ("gelu",), 1.0, 1.0),
    "swiglu": ("elementwise", ("swiglu",), 1.0, 1.0),
    "expert_swiglu": ("elementwise", ("swiglu",), 1.0, 1.0),
    # the unfused attention core's softmax over the scores (nest.graph.attention): the profile's
    # attention-score softmax rows count the same bytes (read + write; backward 3 passes)
    "attn_softmax": ("elementwise", ("softmax",), 1.0, 1.0),
    # the profile's embedding backward writes the dense V x h weight gradient, which the layer
    # graph's bytes do not count: backward by roofline
    "embedding_lookup": ("embedding", None, 1.0, None),
    # layer graph: 3 x T x V elements (read bf16 logits, write fp32 softmax) both ways;
    # profile: 2 bytes x T x V forward, 4 bytes x T x V backward
    "cross_entropy": ("cross_entropy", None, 1.0 / 3.0, 2.0 / 3.0),
}


@dataclass(frozen=True)
class OpTime:
    """Seconds of all `count` instances of one operator, and where each half came from."""

    fwd_s: float
    bwd_s: float
    fwd_source: str  # "profile" | "roofline"
    bwd_source: str

    @property
    def source(self) -> str:
        """'profile' when any half came from a measurement, else 'roofline'."""
        return "profile" if "profile" in (self.fwd_source, self.bwd_source) else "roofline"


# ---------------------------------------------------------------------------------------------
# interpolation helpers
# ---------------------------------------------------------------------------------------------


def _interp(xs: tuple[float, ...], ys: tuple[float, ...], x: float, log: bool) -> float:
    """Piecewise interpolation inside [xs[0], xs[-1]] (xs sorted, unique); linear or log-log."""
    i = bisect_left(xs, x)
    if i < len(xs) and xs[i] == x:
        return ys[i]
    x0, x1, y0, y1 = xs[i - 1], xs[i], ys[i - 1], ys[i]
    if log:
        w = math.log(x / x0) / math.log(x1 / x0)
        return math.exp(math.log(y0) + w * (math.log(y1) - math.log(y0)))
    return y0 + (y1 - y0) * (x - x0) / (x1 - x0)


def _curve(points: list[tuple[float, float]]) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """Sorted unique xs with the mean y of duplicates."""
    acc: dict[float, list[float]] = {}
    for x, y in points:
        acc.setdefault(x, []).append(y)
    xs = tuple(sorted(acc))
    return xs, tuple(sum(acc[x]) / len(acc[x]) for x in xs)


def _f(row: dict, key: str) -> float:
    v = row.get(key, "")
    return float(v) if v not in ("", None) else math.nan


# ---------------------------------------------------------------------------------------------
# the measured set
# ---------------------------------------------------------------------------------------------


MATMUL_FP8 = "matmul_fp8"  # torch._scaled_mm GEMMs (nest.profiling.operators.bench_matmul_fp8)


def _by_nk(rows: list[dict]) -> dict:
    """GEMM rows -> {(n, k): (m grid, forward, backward)}."""
    by_nk: dict[tuple[int, int], list[tuple[float, float, float]]] = {}
    for r in rows:
        by_nk.setdefault((int(r["n"]), int(r["k"])), []).append(
            (float(r["m"]), _f(r, "fwd_time_s"), _f(r, "bwd_time_s")))
    return {nk: (tuple(p[0] for p in sorted(v)), tuple(p[1] for p in sorted(v)),
                 tuple(p[2] for p in sorted(v))) for nk, v in by_nk.items()}


class ProfileSet:
    """The operator CSVs of one profiles/<hardware>/ folder, indexed for lookup."""

    def __init__(self, directory: str | Path):
        self.directory = Path(directory)
        if not (self.directory / "matmul.csv").exists():
            raise SpecError(f"{self.directory}: no operator profile here (matmul.csv missing)")
        rows = {fam: self._read(fam) for fam in
                ("matmul", "moe", "attention", "norm", "elementwise", "embedding",
                 "cross_entropy")}
        # attention: the default-backend table (what a training step runs) when measured
        default_attention = self._read(ATTENTION_DEFAULT)
        if default_attention:
            rows["attention"] = default_attention
        self.attention_table = (ATTENTION_DEFAULT if default_attention else "attention") + ".csv"
        self.attention_kernel = "default"
        # roofline attention efficiency for shapes the attention table does not cover; None:
        # the hardware file's attention_efficiency (fitted to the default table)
        self.attention_efficiency: float | None = None
        # matmul: (n, k) -> (m grid, forward, backward); FP8 GEMMs (matmul_fp8.csv) likewise
        self._matmul = _by_nk(rows["matmul"])
        self._matmul_fp8 = _by_nk(self._read(MATMUL_FP8))
        self._near: dict = {}  # (fp8, n, k) -> the measured (n, k) to transfer from, nearest first
        # moe: (op, experts, m, n, k) -> (forward, backward) of all local experts
        self._moe = {(r["op"], int(r["experts"]), int(r["m"]), int(r["n"]), int(r["k"])):
                     (_f(r, "fwd_time_s"), _f(r, "bwd_time_s")) for r in rows["moe"]}
        self._attention = _attention_rows(rows["attention"], 1.0)
        self._rows = rows
        self._curves: dict[tuple, tuple] = {}

    def _read(self, family: str) -> list[dict]:
        path = self.directory / f"{family}.csv"
        if not path.exists():
            return []
        with path.open(newline="") as fh:
            out = []
            for r in csv.DictReader(fh):
                if r.get("error") or not r.get("fwd_time_s"):
                    continue  # refused or skipped shape
                out.append(r)
            return out

    # ---- matmul -------------------------------------------------------------------------------
    def matmul(self, m: float, n: int, k: int, fp8: bool = False) -> tuple[float, float] | None:
        """(forward, backward) seconds of one GEMM X[m,k] @ W[n,k]^T (FP8: from matmul_fp8.csv),
        or None if not covered."""
        table = self._matmul_fp8 if fp8 else self._matmul
        if n <= 0 or k <= 0 or not table:
            return None
        if n % ALIGN or k % ALIGN:  # an unpadded vocabulary: price the padded GEMM
            n, k = -(-n // PAD) * PAD if n % ALIGN else n, -(-k // PAD) * PAD if k % ALIGN else k
        cands = self._near.get((fp8, n, k))
        if cands is None:  # a function of (n, k) and the table alone: found once per shape
            cands = self._near[fp8, n, k] = self._nearest(table, n, k)
        for n2, k2 in cands:
            ms, fw, bw = table[(n2, k2)]
            if m < ms[0]:
                continue
            scale = (n * k) / (n2 * k2)
            if m > ms[-1]:  # saturated: the throughput of the largest measured m
                r = m / ms[-1]
                return fw[-1] * r * scale, bw[-1] * r * scale
            if len(ms) == 1:
                return fw[0] * scale, bw[0] * scale
            return _interp(ms, fw, m, False) * scale, _interp(ms, bw, m, False) * scale
        return None

    @staticmethod
    def _nearest(table: dict, n: int, k: int) -> list[tuple[int, int]]:
        """The measured (n, k) a GEMM of (n, k) is priced from: itself, else every aligned one
        within MAX_TRANSFER_RATIO in both, nearest (in log n + log k) first."""
        if (n, k) in table:
            return [(n, k)]
        lim = math.log(MAX_TRANSFER_RATIO) + 1e-9
        near = [(abs(math.log(n / n2)) + abs(math.log(k / k2)), n2, k2)
                for n2, k2 in table
                if not (n2 % ALIGN or k2 % ALIGN)
                and abs(math.log(n / n2)) <= lim and abs(math.log(k / k2)) <= lim]
        return [(n2, k2) for _, n2, k2 in sorted(near)]

    def moe(self, op: Op) -> tuple[float, float] | None:
        """(forward, backward) of all `op.count` local experts from an exact moe.csv row."""
        m, n, k = op.shape
        E = op.count
        if op.name == "expert_gate_up":
            keys = [("expert_gate", E, m, n // 2, k), ("expert_up", E, m, n // 2, k)]
            if n % 2:
                return None
        elif op.name == "expert_down":
            keys = [("expert_down", E, m, n, k)]
        else:
            keys = [("expert_up", E, m, n, k)]
        if not all(key in self._moe for key in keys):
            return None
        return (sum(self._moe[key][0] for key in keys), sum(self._moe[key][1] for key in keys))

    # ---- attention ----------------------------------------------------------------------------
    def attention(self, op: Op) -> tuple[float | None, float | None]:
        """(forward, backward) seconds of one attention op; None where not covered."""
        b, heads, s_q, s_kv, hd = op.shape
        full = 4.0 * b * heads * s_q * s_kv * hd
        causal = op.fwd_flops < 0.75 * full
        # layer graph: bytes = 2 x (2 b s_q heads hd + 2 b s_kv kv_heads hd)
        kv = (op.fwd_bytes / BYTES - 2.0 * b * s_q * heads * hd) / (2.0 * b * s_kv * hd)
        cands = [r for r in self._attention
                 if r["heads"] == heads and r["head_dim"] == hd and r["causal"] == causal
                 and r["s_q"] == s_q and r["s_kv"] == s_q]
        speed = HEAD_DIM_TFLOPS["default" if self.attention_kernel == "default" else "flash2"]
        if not cands and hd in speed:  # another head dim of the same width (HEAD_DIM_TFLOPS)
            cands = [r for r in self._attention
                     if r["head_dim"] in speed and r["head_dim"] != hd
                     and r["heads"] * r["head_dim"] == heads * hd and r["causal"] == causal
                     and r["s_q"] == s_q and r["s_kv"] == s_q]
        if not cands:
            return None, None
        r = min(cands, key=lambda r: (abs(r["kv_heads"] * r["head_dim"] - kv * hd),
                                      abs(r["b"] - b), r["b"]))
        scale = op.fwd_flops / r["flops"]  # b and s_kv / s_q (context parallelism)
        f_hd, b_hd = ((1.0, 1.0) if r["head_dim"] == hd else
                      (speed[r["head_dim"]][0] / speed[hd][0], speed[r["head_dim"]][1] / speed[hd][1]))
        bwd = r["bwd"] * scale * b_hd if r["bwd"] >= AUTOGRAD_FLOOR_S else None
        return r["fwd"] * scale * f_hd, bwd

    # ---- memory-bound ops ---------------------------------------------------------------------
    def _memory_curve(self, family: str, ops: tuple[str, ...] | None, phase: str):
        key = (family, ops, phase)
        if key not in self._curves:
            pts = []
            for r in self._rows[family]:
                if ops is not None and r["op"] not in ops:
                    continue
                t, nb = _f(r, f"{phase}_time_s"), _f(r, f"{phase}_bytes")
                if not (t > 0 and nb > 0):
                    continue
                if phase == "bwd" and t < AUTOGRAD_FLOOR_S:
                    continue  # host-bound autograd floor
                pts.append((nb, t))
            self._curves[key] = _curve(pts) if pts else None
        return self._curves[key]

    def memory(self, op: Op) -> tuple[float | None, float | None]:
        """(forward, backward) seconds of one memory-bound op; None where not covered."""
        spec = _MEMORY_MAP.get(op.name)
        if spec is None:
            return None, None
        family, ops, f_fwd, f_bwd = spec
        out: list[float | None] = []
        for phase, nbytes, factor in (("fwd", op.fwd_bytes, f_fwd), ("bwd", op.bwd_bytes, f_bwd)):
            curve = self._memory_curve(family, ops, phase) if factor is not None else None
            if curve is None or nbytes <= 0:
                out.append(None)
                continue
            xs, ts = curve
            x = nbytes * factor
            if x < xs[0]:
                out.append(None)
            elif x > xs[-1]:
                out.append(ts[-1] * x / xs[-1])  # saturated bandwidth of the largest size
            else:
                out.append(_interp(xs, ts, x, True) if len(xs) > 1 else ts[0])
        return out[0], out[1]

    # ---- one operator -------------------------------------------------------------------------
    def price(self, hw: HardwareSpec, op: Op, compute: str = "bf16") -> OpTime:
        """Seconds of all `op.count` instances, from the profile where covered, else roofline;
        under FP8 compute the FP8 GEMMs from matmul_fp8.csv (expert GEMMs per expert)."""
        fwd = bwd = None
        fp8 = is_fp8_gemm(op, compute)
        if op.kind == "matmul":
            pair = self.moe(op) if op.name.startswith("expert_") and not fp8 else None
            if pair is None and len(op.shape) == 3:  # (m, n, k, batch): batched, roofline
                one = self.matmul(op.shape[0], op.shape[1], op.shape[2], fp8)
                pair = None if one is None else (one[0] * op.count, one[1] * op.count)
            if pair is not None:
                fwd, bwd = pair
        elif op.kind == "attention":
            f, b = self.attention(op)
            fwd = None if f is None else f * op.count
            bwd = None if b is None else b * op.count
            if self.attention_efficiency is not None:
                hw = replace(hw, attention_efficiency=self.attention_efficiency)
        else:
            f, b = self.memory(op)
            fwd = None if f is None else f * op.count
            bwd = None if b is None else b * op.count
        rf, rb = (roofline_op_times(hw, op, compute) if fwd is None or bwd is None
                  else (0.0, 0.0))
        return OpTime(rf if fwd is None else fwd, rb if bwd is None else bwd,
                      "roofline" if fwd is None else "profile",
                      "roofline" if bwd is None else "profile")


@lru_cache(maxsize=8)
def _load(directory: str) -> ProfileSet:
    return ProfileSet(directory)


def load_profile(directory: str | Path) -> ProfileSet:
    """The (cached) ProfileSet of one profiles/<hardware>/ folder."""
    return _load(str(Path(directory).resolve()))


def _attention_rows(rows: list[dict], factor: float) -> list[dict]:
    return [{"b": int(r["b"]), "s_q": int(r["s_q"]), "s_kv": int(r["s_kv"]),
             "heads": int(r["heads"]), "kv_heads": int(r["kv_heads"]),
             "head_dim": int(r["head_dim"]), "causal": bool(int(r["causal"])),
             "fwd": _f(r, "fwd_time_s") * factor, "bwd": _f(r, "bwd_time_s") * factor,
             "flops": _f(r, "fwd_flops")} for r in rows]


def kernel_slowdown(default_rows: list[dict], kernel_rows: list[dict]) -> float:
    """Forward + backward time of a kernel's table over the default table's, summed over the
    shapes both measured (same tags): how much slower the kernel runs than the default backend
    the hardware file's attention_efficiency was fitted to."""
    base = {r["tags"]: _f(r, "fwd_time_s") + _f(r, "bwd_time_s") for r in default_rows}
    pairs = [(base[r["tags"]], _f(r, "fwd_time_s") + _f(r, "bwd_time_s"))
             for r in kernel_rows if r["tags"] in base]
    if not pairs:
        raise SpecError("attention kernel tables share no measured shape (tags)")
    return sum(k for _, k in pairs) / sum(d for d, _ in pairs)


@lru_cache(maxsize=8)
def _with_kernel(directory: str, kernel: str, attention_efficiency: float) -> ProfileSet:
    ps = ProfileSet(directory)
    flash = ps._read("attention")
    if not flash:
        raise SpecError(f"{directory}: attention kernel {kernel!r} needs attention.csv "
                        "(the flash backend forced)")
    factor = FA2_OVER_FA1 if kernel == "flash1" else 1.0
    ps._attention = _attention_rows(flash, factor)
    ps.attention_table = "attention.csv" + (f" x {factor:g}" if factor != 1.0 else "")
    ps.attention_kernel = kernel
    default = ps._read(ATTENTION_DEFAULT)
    slow = kernel_slowdown(default, flash) if default else 1.0
    ps.attention_efficiency = attention_efficiency / (slow * factor)
    return ps


def for_attention_kernel(hw: HardwareSpec, kernel: str) -> ProfileSet | None:
    """The hardware's profile with `kernel`'s attention times (ATTENTION_KERNELS): "default" is
    `profile_for(hw)`; "flash2" / "flash1" price attention from attention.csv (x FA2_OVER_FA1
    for flash1), and shapes it does not cover by the roofline at the hardware's
    attention_efficiency over the kernel's measured slowdown (`kernel_slowdown`). None without a
    profile (the roofline has no kernel generations)."""
    if kernel not in ATTENTION_KERNELS:
        raise SpecError(f"attention kernel {kernel!r}: expected one of {ATTENTION_KERNELS}")
    if not hw.profile_dir or kernel == "default":
        return profile_for(hw)
    return _with_kernel(str(Path(hw.profile_dir).resolve()), kernel, hw.attention_efficiency)


def profile_for(hw: HardwareSpec) -> ProfileSet | None:
    """The profile a hardware file names (`profile:` key), or None (roofline only)."""
    return load_profile(hw.profile_dir) if hw.profile_dir else None


def price_op(hw: HardwareSpec, op: Op, profile: ProfileSet | None,
             compute: str = "bf16", fp8_recipe: str = "delayed", tp: int = 1,
             sp: bool = False) -> OpTime:
    """One operator: measured where the profile covers it, else the roofline. Under FP8 compute
    the FP8 GEMMs (nest.spec.precision.FP8_GEMMS) come from the profile's matmul_fp8.csv
    (torch._scaled_mm) where it covers them, else the FP8 roofline, plus Transformer Engine's
    quantization kernels under `fp8_recipe` on a (tp, sp) variant
    (nest.costs.fp8_quant.fp8_cast_s)."""
    if profile is None:
        f, b = roofline_op_times(hw, op, compute)
        out = OpTime(f, b, "roofline", "roofline")
    else:
        out = profile.price(hw, op, compute)
    if is_fp8_gemm(op, compute):
        f, b = fp8_cast_s(hw, op, fp8_recipe, tp, sp)
        out = replace(out, fwd_s=out.fwd_s + f, bwd_s=out.bwd_s + b)
    return out
