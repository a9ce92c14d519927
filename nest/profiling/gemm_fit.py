"""Fit the roofline's GEMM size curve to measured GEMM times (one procedure for every card).

nest.costs.roofline.gemm_time prices one GEMM of F = 2 m n k FLOPs as
    max(F / (peak x e_max x F / (F + F_half)), operand bytes / (HBM x memory_efficiency)) + overhead.
`fit_matmul_curve` finds (e_max, F_half) by least squares on log time over measured GEMMs, with
every other term (peak, HBM bandwidth, memory efficiency, kernel overhead) taken from the hardware
file as it is. Two kinds of measurements feed it:

* our own profiles (`profile_gemms`: profiles/<hw>/matmul.csv, the aligned rows, each row's
  forward, dgrad and wgrad GEMM on its own shape, as nest.costs.roofline.matmul_times prices them);
* published per-shape GEMM benchmarks of a card we cannot profile (`published_gemms`:
  profiles/<hw>/published_gemm.csv; its README gives each row's source).

A published row may carry `fixed_us`: the fixed per-call time of the source's timing method
(e.g. wall-clock around launch + synchronize), used in place of the hardware's kernel overhead
for that row, so that a timing artefact of the benchmark does not move the kernel curve.
"""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from nest.costs.roofline import gemm_time
from nest.spec.catalog import HardwareSpec

ALIGN = 8  # shapes with m, n or k not a multiple of 8 run other (slow) kernels: left out


@dataclass(frozen=True)
class GemmPoint:
    """One measured GEMM kernel: Y[m, n] = X[m, k] W[k, n] (x batch), `time_s` per call."""

    m: int
    n: int
    k: int
    time_s: float
    batch: int = 1
    fixed_s: float | None = None  # the timing method's fixed cost; None: the hardware's overhead
    source: str = ""

    @property
    def flops(self) -> float:
        return 2.0 * self.m * self.n * self.k * self.batch


@dataclass(frozen=True)
class CurveFit:
    matmul_efficiency: float
    half_efficiency_flops: float
    n: int
    median_abs_error: float  # median |predicted / measured - 1|
    max_abs_error: float
    total_time_error: float  # sum predicted / sum measured - 1
    errors: tuple[float, ...] = field(repr=False, default=())


def _arrays(points: list[GemmPoint], hw: HardwareSpec):
    """(m, n, k, batch, fixed, measured) as arrays [points]."""
    m = np.array([p.m for p in points], float)
    n = np.array([p.n for p in points], float)
    k = np.array([p.k for p in points], float)
    b = np.array([p.batch for p in points], float)
    fixed = np.array([hw.kernel_overhead_s if p.fixed_s is None else p.fixed_s for p in points])
    meas = np.array([p.time_s for p in points], float)
    return m, n, k, b, fixed, meas


def _model(arrays, hw: HardwareSpec, e_max, f_half):
    """nest.costs.roofline.gemm_time itself on every point, for one or many (e_max, F_half)
    (leading axes of e_max / f_half, points last)."""
    m, n, k, b, fixed, _ = arrays
    e = np.asarray(e_max, float)[..., None]
    fh = np.asarray(f_half, float)[..., None]
    return gemm_time(hw, m, n, k, b, efficiency=e, half_flops=fh, overhead=fixed)


def model_times(points: list[GemmPoint], hw: HardwareSpec, e_max: float | None = None,
                f_half: float | None = None) -> np.ndarray:
    """Predicted seconds of each point under the curve (default: the hardware file's own)."""
    e = hw.matmul_efficiency if e_max is None else e_max
    fh = hw.matmul_half_efficiency_flops if f_half is None else f_half
    return _model(_arrays(points, hw), hw, e, fh)


def curve_errors(points: list[GemmPoint], hw: HardwareSpec, e_max: float | None = None,
                 f_half: float | None = None) -> np.ndarray:
    """predicted / measured - 1 per point."""
    meas = np.array([p.time_s for p in points], float)
    return model_times(points, hw, e_max, f_half) / meas - 1.0


def _sse(arrays, hw: HardwareSpec, e, fh):
    r = np.log(_model(arrays, hw, e, fh)) - np.log(arrays[-1])
    return np.sum(r * r, axis=-1)


def fit_matmul_curve(points: list[GemmPoint], hw: HardwareSpec) -> CurveFit:
    """Least squares on log time of (e_max, F_half) over `points`, the other roofline terms from
    `hw`. A grid (e_max 0.30-1.00 by 0.005; F_half 1 MFLOP-1 TFLOP, 40 per decade) then
    Nelder-Mead from its best point; deterministic."""
    from scipy.optimize import minimize

    if len(points) < 2:
        raise ValueError("fit_matmul_curve: need at least two measured GEMMs")
    arr = _arrays(points, hw)
    es = np.arange(0.30, 1.0 + 1e-9, 0.005)
    fhs = 10.0 ** np.arange(6.0, 12.0 + 1e-9, 1.0 / 40)
    E, FH = np.meshgrid(es, fhs, indexing="ij")
    sse = _sse(arr, hw, E.ravel(), FH.ravel())
    i = int(np.argmin(sse))
    x0 = np.array([math.log(E.ravel()[i]), math.log(FH.ravel()[i])])

    def f(x):
        e = min(math.exp(x[0]), 1.0)
        return float(_sse(arr, hw, e, math.exp(x[1])))

    res = minimize(f, x0, method="Nelder-Mead",
                   options={"xatol": 1e-7, "fatol": 1e-12, "maxiter": 4000})
    e_max, f_half = min(math.exp(res.x[0]), 1.0), math.exp(res.x[1])
    err = curve_errors(points, hw, e_max, f_half)
    pred = model_times(points, hw, e_max, f_half)
    return CurveFit(
        matmul_efficiency=e_max,
        half_efficiency_flops=f_half,
        n=len(points),
        median_abs_error=float(np.median(np.abs(err))),
        max_abs_error=float(np.max(np.abs(err))),
        total_time_error=float(pred.sum() / arr[-1].sum() - 1.0),
        errors=tuple(float(x) for x in err),
    )


def published_gemms(path: str | Path) -> list[GemmPoint]:
    """profiles/<hw>/published_gemm.csv -> points. Columns: m, n, k, batch, dtype, time_ms,
    tflops, fixed_us (blank: the hardware's kernel overhead), source; '#' lines are comments.
    time_ms is used where given, else the time implied by tflops."""
    lines = [ln for ln in Path(path).read_text().splitlines() if ln and not ln.startswith("#")]
    out = []
    for r in csv.DictReader(lines):
        m, n, k = int(r["m"]), int(r["n"]), int(r["k"])
        b = int(r.get("batch") or 1)
        if r.get("time_ms"):
            t = float(r["time_ms"]) * 1e-3
        else:
            t = 2.0 * m * n * k * b / (float(r["tflops"]) * 1e12)
        fixed = float(r["fixed_us"]) * 1e-6 if r.get("fixed_us") else None
        out.append(GemmPoint(m, n, k, t, b, fixed, r.get("source", "")))
    return out


def profile_gemms(path: str | Path, aligned_only: bool = True) -> list[GemmPoint]:
    """profiles/<hw>/matmul.csv -> three points a row (forward (m, n, k), dgrad (m, k, n), wgrad
    (n, k, m), as nest.costs.roofline.matmul_times prices them); unaligned rows left out."""
    out = []
    with open(path) as fh:
        for r in csv.DictReader(fh):
            if r.get("error"):
                continue
            m, n, k = int(r["m"]), int(r["n"]), int(r["k"])
            if aligned_only and (m % ALIGN or n % ALIGN or k % ALIGN):
                continue
            out.append(GemmPoint(m, n, k, float(r["fwd_time_s"]), source="fwd"))
            out.append(GemmPoint(m, k, n, float(r["bwd_dgrad_time_s"]), source="dgrad"))
            out.append(GemmPoint(n, k, m, float(r["bwd_wgrad_time_s"]), source="wgrad"))
    return out
