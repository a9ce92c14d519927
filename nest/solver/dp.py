"""The bottleneck recurrence of the NEST solver: NumPy kernel and the plain-Python reference.

For stage positions j = 0..J-1 and layers 0..L-1, with per-stage option arrays primary[j,b,a,o],
secondary[j,b,a,o] and ok[j,b,a,o] (stage j covers layers a..b with option o), and a cap:
    val[j, b, a]  = min_o { primary[j,b,a,o] : ok[j,b,a,o] and secondary[j,b,a,o] <= cap }
    f[0, b]       = val[0, b, 0]                                     (stage 0 starts at layer 0)
    f[j, b]       = min_{1 <= a <= b} max(f[j-1, a-1], val[j, b, a])
    answer        = f[J-1, L-1]
i.e. the least achievable max over stages of `primary`, among cuts into J contiguous non-empty
stages whose every stage respects memory and keeps `secondary` under the cap. Infeasible cells are
+inf. `bottleneck_reference` is exactly this loop in plain Python; `bottleneck` runs one stage
position per step, every cell b at once (an [L, L] array; the first least a and o, as the loop
keeps them). Only minima and maxima of the inputs: the same floats as the loop, bit for bit.
The kernel was JAX (jit per (L, O)) until 2026-11-27: NumPy runs the same steps as fast on these
sizes (L <= ~130, O <= 12 options: 0.7 vs 1.3 ms a call at J=4, L=82, O=1; 10 vs 7 ms at O=12)
without importing JAX (~0.9 s per process) or compiling each shape (~0.4-0.7 s each, four
per `nest plan`).
"""

from __future__ import annotations

import functools
import math

import numpy as np

INF = float("inf")


@functools.lru_cache(maxsize=64)
def _upper(L: int) -> np.ndarray:
    """[b, a] True where a <= b (a stage's first layer not after its last); read-only."""
    out = np.tril(np.ones((L, L), dtype=bool))
    out.flags.writeable = False
    return out


def _collapse(primary_LLO, secondary_LLO, ok_LLO, cap):
    """(val[b, a], the first option o reaching it) of the module docstring."""
    keep = ok_LLO & (secondary_LLO <= cap) & _upper(primary_LLO.shape[0])[..., None]
    v = np.where(keep, primary_LLO, np.inf)
    if v.shape[-1] == 1:
        return v[..., 0], np.zeros(v.shape[:2], dtype=np.int64)
    return v.min(axis=-1), v.argmin(axis=-1)


def bottleneck(primary_JLLO, secondary_JLLO, ok_JLLO, cap: float):
    """(value, stages) with stages = [(first_layer, last_layer, option)] or None if infeasible."""
    J, L = primary_JLLO.shape[0], primary_JLLO.shape[1]
    P, S, K = primary_JLLO, secondary_JLLO, ok_JLLO
    val, opt = _collapse(P[0], S[0], K[0], cap)
    f = val[:, 0]
    rows = np.arange(L)
    args, opts = [], [opt]
    for j in range(1, J):
        val, opt = _collapse(P[j], S[j], K[j], cap)
        prev = np.concatenate([[np.inf], f[:-1]])  # prev[a] = f[a-1]
        cand = np.maximum(val, prev[None, :])
        arg = cand.argmin(axis=1)  # the first least a per b
        f = cand[rows, arg]
        args.append(arg)
        opts.append(opt)
    value = float(f[L - 1])
    if not math.isfinite(value):
        return value, None
    stages, b = [], L - 1
    for j in range(J - 1, 0, -1):
        a = int(args[j - 1][b])
        stages.append((a, b, int(opts[j][b, a])))
        b = a - 1
    stages.append((0, b, int(opts[0][b, 0])))
    return value, stages[::-1]


def bottleneck_reference(primary, secondary, ok, cap: float):
    """The recurrence of the module docstring in plain Python loops (for tests)."""
    J, L, O = len(primary), len(primary[0]), len(primary[0][0][0])

    def val(j, b, a):
        best, arg = INF, 0
        if a > b:
            return best, arg
        for o in range(O):
            if ok[j][b][a][o] and secondary[j][b][a][o] <= cap and primary[j][b][a][o] < best:
                best, arg = primary[j][b][a][o], o
        return best, arg

    f = [[INF] * L for _ in range(J)]
    choice = [[None] * L for _ in range(J)]
    for b in range(L):
        f[0][b], o = val(0, b, 0)
        choice[0][b] = (0, o)
    for j in range(1, J):
        for b in range(L):
            for a in range(1, b + 1):
                v, o = val(j, b, a)
                c = max(f[j - 1][a - 1], v)
                if c < f[j][b]:
                    f[j][b], choice[j][b] = c, (a, o)
    value = f[J - 1][L - 1]
    if not math.isfinite(value):
        return value, None
    stages, b = [], L - 1
    for j in range(J - 1, -1, -1):
        a, o = choice[j][b]
        stages.append((a, b, o))
        b = a - 1
    return value, stages[::-1]


def lower_bounds(cost_LL: np.ndarray, max_stages: int) -> np.ndarray:
    """X_lb[p] = min over cuts into p stages of the max stage cost (no options, no memory):
    a lower bound on the bottleneck stage time for every p (index 0 unused)."""
    L = cost_LL.shape[0]
    cost = np.where(np.tril(np.ones((L, L), dtype=bool)), cost_LL, np.inf)
    out = np.full(max_stages + 1, np.inf)
    f = cost[:, 0].copy()
    out[1] = f[L - 1]
    for p in range(2, max_stages + 1):
        prev = np.concatenate([[np.inf], f[:-1]])
        f = np.min(np.maximum(cost, prev[None, :]), axis=1)
        out[p] = f[L - 1]
    return out
