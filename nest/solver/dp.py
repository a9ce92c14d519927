"""The bottleneck recurrence of the NEST solver: JAX kernel and the plain-Python reference.

For stage positions j = 0..J-1 and layers 0..L-1, with per-stage option arrays primary[j,b,a,o],
secondary[j,b,a,o] and ok[j,b,a,o] (stage j covers layers a..b with option o), and a cap:
    val[j, b, a]  = min_o { primary[j,b,a,o] : ok[j,b,a,o] and secondary[j,b,a,o] <= cap }
    f[0, b]       = val[0, b, 0]                                     (stage 0 starts at layer 0)
    f[j, b]       = min_{1 <= a <= b} max(f[j-1, a-1], val[j, b, a])
    answer        = f[J-1, L-1]
i.e. the least achievable max over stages of `primary`, among cuts into J contiguous non-empty
stages whose every stage respects memory and keeps `secondary` under the cap. Infeasible cells are
+inf. `bottleneck_reference` is exactly this loop in plain Python; `bottleneck` runs it with a
jitted JAX step (one cell b as a pure function, vmapped over b), once compiled per (L, O).
The stage loop stays in Python rather than lax.scan: a scan compiles once per J as well (~1 s
each, and J takes every value up to L) and ran no faster on 2 CPU cores (J=8, L=82, O=12:
5.2 ms per call looped vs 9.5 ms scanned; J=16, L=98: 27 vs 33 ms).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np

# Ties and exactness need float64 like the evaluator: `bottleneck` runs its kernel inside
# jax.enable_x64(True), scoped, so importing the solver changes no global JAX setting.

INF = float("inf")


def _collapse(primary_LLO, secondary_LLO, ok_LLO, cap):
    L = primary_LLO.shape[0]
    nonempty_LL1 = jnp.tril(jnp.ones((L, L), dtype=bool))[..., None]  # a <= b
    v = jnp.where(ok_LLO & (secondary_LLO <= cap) & nonempty_LL1, primary_LLO, jnp.inf)
    return jnp.min(v, axis=-1), jnp.argmin(v, axis=-1)


def _cell(val_a, prev_a):
    """One cell b: min over the first layer a of max(f[a-1], val[b, a])."""
    cand = jnp.maximum(val_a, prev_a)
    a = jnp.argmin(cand)
    return cand[a], a


@jax.jit
def _first(primary_LLO, secondary_LLO, ok_LLO, cap):
    val_LL, opt_LL = _collapse(primary_LLO, secondary_LLO, ok_LLO, cap)
    return val_LL[:, 0], opt_LL


@jax.jit
def _step(f_L, primary_LLO, secondary_LLO, ok_LLO, cap):
    val_LL, opt_LL = _collapse(primary_LLO, secondary_LLO, ok_LLO, cap)
    prev_L = jnp.concatenate([jnp.full((1,), jnp.inf), f_L[:-1]])  # prev[a] = f[a-1]
    best_L, arg_L = jax.vmap(_cell, in_axes=(0, None))(val_LL, prev_L)
    return best_L, arg_L, opt_LL


def bottleneck(primary_JLLO, secondary_JLLO, ok_JLLO, cap: float):
    """(value, stages) with stages = [(first_layer, last_layer, option)] or None if infeasible."""
    J, L = primary_JLLO.shape[0], primary_JLLO.shape[1]
    P, S, K = primary_JLLO, secondary_JLLO, ok_JLLO
    with jax.enable_x64(True):
        f, opt = _first(P[0], S[0], K[0], cap)
        args, opts = [], [opt]
        for j in range(1, J):
            f, arg, opt = _step(f, P[j], S[j], K[j], cap)
            args.append(arg)
            opts.append(opt)
        value = float(np.asarray(f)[L - 1])  # on the host: no jitted slice to compile
        if not math.isfinite(value):
            return value, None
        args_np = [np.asarray(a) for a in args]
        opts_np = [np.asarray(o) for o in opts]
    stages, b = [], L - 1
    for j in range(J - 1, 0, -1):
        a = int(args_np[j - 1][b])
        stages.append((a, b, int(opts_np[j][b, a])))
        b = a - 1
    stages.append((0, b, int(opts_np[0][b, 0])))
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


def lower_bounds_per_column(cost_LLR: np.ndarray, max_stages: int) -> np.ndarray:
    """`lower_bounds` of each cost_LLR[:, :, r] at once: [max_stages + 1, R] (min and max are
    exact, so each column is the float lower_bounds gives that column alone).
    f_p[b] = min over a of max(cost[b, a], f_{p-1}[a - 1]): f_{p-1} is inf below layer p - 2
    and a cell a > b is none, so only b, a >= p - 1 can be finite; the rest stay inf (leaving
    out entries that are inf under max does not change a min)."""
    L = cost_LLR.shape[0]
    cost = np.where(np.tril(np.ones((L, L), dtype=bool))[..., None], cost_LLR, np.inf)
    out = np.full((max_stages + 1, cost.shape[2]), np.inf)
    f = cost[:, 0].copy()
    out[1] = f[L - 1]
    for p in range(2, min(max_stages, L) + 1):
        k = p - 1
        g = np.full_like(f, np.inf)
        g[k:] = np.minimum.reduce(np.maximum(cost[k:, k:], f[k - 1:L - 1][None]), axis=1)
        f = g
        out[p] = f[L - 1]
    return out


def lower_bounds(cost_LL: np.ndarray, max_stages: int) -> np.ndarray:
    """X_lb[p] = min over cuts into p stages of the max stage cost (no options, no memory):
    a lower bound on the bottleneck stage time for every p (index 0 unused). The one column of
    `lower_bounds_per_column`."""
    return lower_bounds_per_column(np.asarray(cost_LL)[:, :, None], max_stages)[:, 0]
