"""The tight pipeline objective, optimised exactly: DAPPLE's form + max_j u_j (nest.costs.pipeline).

The paper's form charges every stage the slowest stage's time during fill and drain; for unequal
stages it is up to 17.5% above the simulated 1F1B schedule. The DAPPLE form (Fan et al. 2021,
section 3.2; nest.costs.pipeline.dapple) charges fill and drain
with each stage's own time: the critical path through the bottleneck stage, the path family's
dominant member (nest.costs.pipeline.critical_path_1f1b) and equal to the paper's form for equal stages. Training setting
`pipeline_time: dapple` prices plans so (nest.problem.evaluate) and the solver optimises it exactly here.

For one candidate (variant, p, d, placement), with t[j, b, a, o], u[j, b, a, o] and ok[j, b, a, o]
the stage kernel's arrays (nest.solver.arrays):

* S(tau, c) = min over cuts of sum_j t_j with every stage cell t <= tau, u <= c and ok: a min-sum
  dynamic program over stage positions (`min_sum`), exact;
* g(c) = min over plans with max u <= c of sum t + (m - 1) max t = min over tau of
  S(tau, c) + (m - 1) tau, tau running over the distinct admissible stage times upwards from the
  bottleneck optimum X(c) (the least achievable max t, nest.solver.dp.bottleneck) and stopping
  once (m - 1) tau + S(inf, c) >= the best found: no larger tau can win, since S(tau, c) >=
  S(inf, c);
* T = min over caps c of g(c) + U(c), U(c) the max u of g(c)'s plan: the caps walk downwards,
  each just below the last plan's max u (a plan with max u >= U(c) costs at least g(c) + U(c)),
  until nothing fits or g(c) + min max u cannot beat the best (epsilon-constraint method, as
  nest.solver for the paper's form).
"""

from __future__ import annotations

import math

import numpy as np

from nest.costs.pipeline import dapple
from nest.solver.dp import bottleneck

INF = float("inf")
FORM = "dapple"  # the training settings' pipeline_time this module optimises


def min_sum(t_JLLO, u_JLLO, ok_JLLO, t_cap: float, u_cap: float):
    """(S, stages): the least sum over J contiguous non-empty stages of t, every stage cell with
    t <= t_cap, u <= u_cap and ok; stages = [(first, last, option)] or None if none fits."""
    J, L = t_JLLO.shape[0], t_JLLO.shape[1]
    tril = np.tril(np.ones((L, L), dtype=bool))[None, :, :, None]
    v = np.where(ok_JLLO & (t_JLLO <= t_cap) & (u_JLLO <= u_cap) & tril, t_JLLO, INF)
    val_JLL, opt_JLL = v.min(axis=-1), v.argmin(axis=-1)
    f = val_JLL[0][:, 0].copy()  # stage 0 covers layers 0..b
    args = []
    for j in range(1, J):
        prev = np.concatenate([[INF], f[:-1]])  # prev[a] = f[a - 1]
        cand = val_JLL[j] + prev[None, :]
        a = np.argmin(cand, axis=1)
        f = cand[np.arange(L), a]
        args.append(a)
    value = float(f[L - 1])
    if not math.isfinite(value):
        return value, None
    stages, b = [], L - 1
    for j in range(J - 1, 0, -1):
        a = int(args[j - 1][b])
        stages.append((a, b, int(opt_JLL[j, b, a])))
        b = a - 1
    stages.append((0, b, int(opt_JLL[0, b, 0])))
    return value, stages[::-1]


def _stage_values(x_JLLO, stages) -> list[float]:
    return [float(x_JLLO[j, b, a, o]) for j, (a, b, o) in enumerate(stages)]


def best_for_cap(t, u, ok, m: int, u_cap: float, bound: float = INF):
    """g(c) of the module docstring: (value, stages) minimising sum t + (m - 1) max t over plans
    with max u <= u_cap, or (inf, None) if none fits or none is below `bound`."""
    X, _ = bottleneck(t, u, ok, u_cap)
    if not math.isfinite(X):
        return INF, None
    s_lb, _ = min_sum(t, u, ok, INF, u_cap)
    admissible = ok & (u <= u_cap)
    taus = np.unique(t[admissible & (t >= X)])
    best, best_stages = bound, None
    for tau in taus:
        if dapple(s_lb, tau, m) >= best:
            break
        S, stages = min_sum(t, u, ok, float(tau), u_cap)
        if stages is None:
            continue
        value = dapple(S, max(_stage_values(t, stages)), m)
        if value < best:
            best, best_stages = value, stages
    return (best, best_stages) if best_stages is not None else (INF, None)


def solve_fixed_tight(t, u, ok, m: int, best_T: float = INF):
    """Exact min of sum t + (m - 1) max t + max u for one candidate; (T, stages) or None if
    nothing fits below best_T (the arrays as nest.solver.solve_fixed takes them)."""
    u_min, _ = bottleneck(u, t, ok, INF)  # the least achievable max u: a floor for every cap
    if not math.isfinite(u_min):
        return None
    cap, best = INF, None
    while True:
        g, stages = best_for_cap(t, u, ok, m, cap, best_T - u_min)
        if stages is None:
            break
        U = max(_stage_values(u, stages))
        if g + U < best_T:
            best_T, best = g + U, stages
        cap = float(np.nextafter(U, -np.inf))
        if cap < u_min:
            break
    return None if best is None else (best_T, best)
