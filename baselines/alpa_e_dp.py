"""Alpa-E's inter-operator DP value under a cap, vectorised: the same float as
baselines.alpa_e._dp(T_XKIS, units, U, cap, combine)[0] for every cap, in fewer and larger
array operations (the t_max walk prices hundreds of caps per split).

The loop it reproduces (alpa_e._dp, values only), with A_s = T_XKIS[..., s - 1] capped:

    F(0, L, 0) = 0, else inf
    F(s, k, d) = min over x, i >= k of combine(A_s[x, k, i], F(s - 1, i + 1, d - units[x]))
    value      = min over s = 1 .. min(Smax, L) of F(s, 0, U)

Three changes, each leaving every candidate float as it was (one `combine` of the same two
operands) and taking the exact minimum of the same candidates (min is order-free; combine, + or
max, is monotone in each operand under rounding, so combine(a, min(b, c)) = min(combine(a, b),
combine(a, c)) bit for bit):

* one array operation per stage count s over every submesh x, first layer k and unit count d,
  reading the band i - k in [0, J) of stage ranges (J: the widest range whose latency is under
  the cap; the table is inf for i < k);
* the stage counts s >= s0, from which A_s no longer changes (Alpa's stash is min(s, B), so
  s0 <= B), are one state: G(k, d) = min over s >= s0 of F(s, k, d) obeys
      G(k, d) = min over x, i of combine(A_s0[x, k, i], min(F(s0 - 1, i + 1, d'), G(i + 1, d'))),
  d' = d - units[x], one sweep over k from the last layer down (a stage takes a layer and at
  least min(units) units, so s is bounded as in the loop whenever the table's Smax reaches that
  bound; otherwise every s runs explicitly);
* the table's band layout and s0 are computed once per table, not once per cap.

tests/test_baseline_alpa_e.py checks this value against `_dp` at every cap of random and real
tables, and the t_max walk on both.
"""

from __future__ import annotations

import numpy as np
from numpy.lib.stride_tricks import as_strided

# X: submesh options, K: first layer k, J: band offset i - k, S: stage counts, D: units d


class CapDP:
    """The DP's value for a cap (`value`), for one table T_XKIS [x, k, i, s - 1]."""

    def __init__(self, T_XKIS, units, U: int):
        T = np.asarray(T_XKIS, dtype=float)
        X, L, L2, Smax = T.shape
        assert L == L2 and len(units) == X
        self.L, self.U = L, int(U)
        self.units = np.asarray(units, dtype=np.int64)
        umin, self.umax = int(self.units.min()), int(self.units.max())
        self.s_last = min(Smax, L, self.U // umin)  # the loop's last stage count (dlo > U: stop)
        lower = np.tril(np.ones((L, L), dtype=bool), -1)
        # a finite latency for i < k: the band would miss it; the loop takes it (tests only)
        self.fallback = bool(np.isfinite(T[:, lower, :]).any())
        if self.fallback or self.s_last < 1:
            self.T = T
            return
        # s0 (1-based): A_s equals A_s0 for every s >= s0 up to Smax
        s0 = Smax
        while s0 > 1 and np.array_equal(T[..., s0 - 2], T[..., Smax - 1]):
            s0 -= 1
        # the sweep's unbounded stage count equals the loop's only if Smax reaches its bound
        self.sweep = s0 <= self.s_last and Smax >= min(L, self.U // umin)
        n_s = min(s0, self.s_last) if self.sweep else self.s_last
        fin = np.isfinite(T[..., :n_s])
        kk, ii = np.nonzero(fin.any(axis=(0, 3)))
        J = int((ii - kk).max()) + 1 if kk.size else 1
        # band_SJKX[s - 1, j, k, x] = T[x, k, k + j, s - 1] (inf past the last layer)
        k_KJ = np.arange(L)[:, None]
        i_KJ = k_KJ + np.arange(J)[None, :]
        inside = i_KJ < L
        band = T[:, k_KJ, np.minimum(i_KJ, L - 1), :n_s]  # [X, K, J, S]
        band = np.where(inside[None, :, :, None], band, np.inf)
        self.band_SJKX = np.ascontiguousarray(band.transpose(3, 2, 1, 0))
        self.n_s, self.J = n_s, J
        # the least latency at each band offset: the band under a cap ends at the last offset
        # that has one under it
        self.min_J = self.band_SJKX.min(axis=(0, 2, 3))
        # column c of a padded F row holds d = c - umax; cols_XD reads F(., d - units[x])
        self.cols_XD = (self.umax - self.units)[:, None] + np.arange(self.U + 1)[None, :]

    def value(self, cap, combine=np.add) -> float:
        """min_s F(s, 0, U) under `cap` (alpa_e._dp's first value, bit for bit)."""
        if self.fallback or self.s_last < 1:
            from baselines.alpa_e import _dp  # the reference loop (a table with i < k entries)

            return _dp(self.T, list(self.units), self.U, cap, combine)[0]
        under = np.nonzero(self.min_J <= cap)[0]
        if not under.size:
            return np.inf
        J, L, U, umax = int(under[-1]) + 1, self.L, self.U, self.umax
        A = self.band_SJKX[:, :J]
        A_SJKX = np.where(A <= cap, A, np.inf)
        X = len(self.units)
        R = L + J + 1  # rows k of F, inf past L (the band reads up to row L + J - 1)
        F = np.full((R, umax + U + 1), np.inf)
        F[L, umax] = 0.0  # F(0, L, 0)
        best = np.inf
        for s in range(1, self.n_s + (0 if self.sweep else 1)):
            K = L - s + 1  # the s - 1 later stages need a layer each
            G_RXD = F[1:, self.cols_XD]  # G[r, x, d] = F(s - 1, r + 1, d - units[x])
            r0, r1 = G_RXD.strides[:2]
            W_JKXD = as_strided(G_RXD, (J, K, X, U + 1), (r0, r0, r1, G_RXD.strides[2]),
                                writeable=False)  # W[j, k] = G[k + j]: stage k..k + j
            cand_JKXD = combine(A_SJKX[s - 1, :, :K, :, None], W_JKXD)
            v_KD = cand_JKXD.min(axis=0).min(axis=1)  # min over i, then over x
            F = np.full((R, umax + U + 1), np.inf)
            F[:K, umax:] = v_KD
            best = min(best, F[0, umax + U])
        if not self.sweep:
            return best
        # the states with s >= s0 stages left: H(r) = min(F(s0 - 1, r), G(r)), G from the top
        H = F
        A_KJX = A_SJKX[self.n_s - 1].transpose(1, 0, 2)[:, :, :, None]  # [K, J, X, 1]
        cols, g = self.cols_XD, None
        for k in range(L - 1, -1, -1):
            g = combine(A_KJX[k], H[k + 1: k + 1 + J][:, cols]).min(axis=(0, 1))
            np.minimum(H[k, umax:], g, out=H[k, umax:])
        return min(best, g[U])
