"""Alpa-E's inter-operator DP under a cap, vectorised: the same floats as the loop
baselines.alpa_e._dp(T_XKIS, units, U, cap, combine, backtrack) for every cap, in fewer and
larger array operations (the t_max walk prices up to hundreds of caps per split).

The loop it reproduces, with A_s = T_XKIS[..., s - 1] capped:

    F(0, L, 0) = 0, else inf
    F(s, k, d) = min over x, i >= k of combine(A_s[x, k, i], F(s - 1, i + 1, d - units[x]))
    value      = min over s = 1 .. min(Smax, L) of F(s, 0, U)

`value` changes three things, each leaving every candidate float as it was (one `combine` of
the same two operands) and taking the exact minimum of the same candidates (min is order-free;
combine, + or max, is monotone in each operand under rounding, so combine(a, min(b, c)) =
min(combine(a, b), combine(a, c)) bit for bit):

* one array operation per stage count s and submesh x over every first layer k and unit count
  d in [s min(units), s max(units)], reading the band i - k in [0, J) of stage ranges (J: the
  widest range of that (s, x) whose latency is under the cap; the table is inf for i < k), with
  F(s - 1, ., d - units[x]) read as strided views (no copies);
* the stage counts s >= s0, from which A_s no longer changes (Alpa's stash is min(s, B), so
  s0 <= B), are one state: G(k, d) = min over s >= s0 of F(s, k, d) obeys
      G(k, d) = min over x, i of combine(A_s0[x, k, i], min(F(s0 - 1, i + 1, d'), G(i + 1, d'))),
  d' = d - units[x], one sweep over k from the last layer down (a stage takes a layer and at
  least min(units) units, so s is bounded as in the loop whenever the table's Smax reaches that
  bound; otherwise every s runs explicitly);
* the table's band layout and s0 are computed once per table, not once per cap.

`stages` is the loop's backtrack (every s explicit, the stages read back along the optimum
only, with the loop's tie rules); `least_cap` is the bottleneck value without a cap (the least
feasible t_max), found by probing caps from a lower bound upward.

tests/test_alpa_e_dp.py checks all three against `_dp` at every cap of random tables (ties
included), a medium table and the tiny meshes' real tables, and the planner's t_max search
against Alpa's walk on the loop.
"""

from __future__ import annotations

import numpy as np
from numpy.lib.stride_tricks import as_strided

# X: submesh options, K: first layer k, J: band offset i - k, S: stage counts, D: units d


class CapDP:
    """The DP's value for a cap (`value`), for one table T_XKIS [x, k, i, s - 1]."""

    CHUNK = 8  # band offsets per array operation of a stage step (`_stage`)

    def __init__(self, T_XKIS, units, U: int):
        T = np.asarray(T_XKIS, dtype=float)
        X, L, L2, Smax = T.shape
        assert L == L2 and len(units) == X
        self.L, self.U = L, int(U)
        self.T_XKIS, self._floor = T, None
        self.units = np.asarray(units, dtype=np.int64)
        self.umin, self.umax = int(self.units.min()), int(self.units.max())
        self.s_last = min(Smax, L, self.U // self.umin)  # the loop's last s (dlo > U: stop)
        lower = np.tril(np.ones((L, L), dtype=bool), -1)
        # a finite latency for i < k: the band would miss it; the loop takes it (tests only)
        self.fallback = bool(np.isfinite(T[:, lower, :]).any())
        # s0 (1-based): A_s equals A_s0 for every s >= s0 up to Smax
        s0 = Smax
        while s0 > 1 and np.array_equal(T[..., s0 - 2], T[..., Smax - 1]):
            s0 -= 1
        # least_cap's probes and the t_max walk's candidates: the table's distinct latencies
        # (those of s >= s0 repeat s0's), from the least one that a stage over the costliest
        # layer to cover can take (a lower bound on every plan's bottleneck)
        head = T[..., :s0]
        self.caps = np.unique(head[np.isfinite(head)])
        lower_KI = head.min(axis=(0, 3))  # over x and s
        self.floor = max(lower_KI[: l + 1, l:].min() for l in range(L))  # k <= l <= i
        if self.fallback or self.s_last < 1:
            self.T = T
            return
        # the sweep's unbounded stage count equals the loop's only if Smax reaches its bound
        self.sweep = s0 <= self.s_last and Smax >= min(L, self.U // self.umin)
        n_s = min(s0, self.s_last) if self.sweep else self.s_last
        kk, ii = np.nonzero(np.isfinite(T[..., :n_s]).any(axis=(0, 3)))
        J = int((ii - kk).max()) + 1 if kk.size else 1
        # band_SXJK[s - 1, x, j, k] = T[x, k, k + j, s - 1] (inf past the last layer)
        k_JK = np.arange(L)[None, :]
        i_JK = k_JK + np.arange(J)[:, None]
        band = T[:, k_JK, np.minimum(i_JK, L - 1), :n_s]  # [X, J, K, S]
        band = np.where((i_JK < L)[None, :, :, None], band, np.inf)
        self.band_SXJK = np.ascontiguousarray(band.transpose(3, 0, 1, 2))
        self.n_s, self.J = n_s, J
        # the least latency of each (s, x) at each band offset: that band under a cap ends at
        # the last offset with a latency under it
        self.min_SXJ = self.band_SXJK.min(axis=3)

    def value(self, cap, combine=np.add) -> float:
        """min_s F(s, 0, U) under `cap` (alpa_e._dp's first value, bit for bit)."""
        if self.fallback or self.s_last < 1:
            return self._loop(cap, combine)[0]
        J_SX = self._bands(cap)
        F = self._base(J_SX)
        best, U, umax = np.inf, self.U, self.umax
        for s in range(1, self.n_s + (0 if self.sweep else 1)):
            F = self._stage(F, s, J_SX, cap, combine)
            best = min(best, F[0, umax + U])
        if not self.sweep:
            return best
        # the states with s >= s0 stages left: H(r) = min(F(s0 - 1, r), G(r)), G from the top;
        # per submesh x its own band (past it every latency is above the cap: inf candidates),
        # H's rows read as views (no gathered copy), row k only at the unit counts its layers
        # can leave (`_window`)
        H, L = F, self.L
        J_X = J_SX[self.n_s - 1]
        if not J_X.max():
            return best
        A = self.band_SXJK[self.n_s - 1, :, : int(J_X.max()), :]
        A_XKJ1 = np.where(A <= cap, A, np.inf).transpose(0, 2, 1)[..., None]
        xs = [(x, umax - int(u), int(J_X[x])) for x, u in enumerate(self.units) if J_X[x]]
        g_all = np.empty(U + 1)
        for k in range(L - 1, -1, -1):
            lo = self._window(k)
            g = g_all[lo:]
            g.fill(np.inf)
            for x, o, Jx in xs:
                j1 = min(Jx, L - k)  # i = k + j <= L - 1
                np.minimum(g, combine(A_XKJ1[x, k, :j1],
                                      H[k + 1: k + 1 + j1, o + lo: o + U + 1]).min(axis=0), out=g)
            np.minimum(H[k, umax + lo:], g, out=H[k, umax + lo:])
        return min(best, g_all[U])

    def sum_floor(self) -> float:
        """A lower bound on value(inf) (np.add), float for float, from a DP without the unit
        count: R(s, k) = min over i of (min over x of T[x, k, i, s - 1]) + R(s - 1, i + 1),
        R(0, L) = 0, the least over the stage counts s whose units can add up to U (s min(units)
        <= U <= s max(units), where the loop's F(s, 0, U) can be finite). Every path of the loop
        is a path here (its d dropped, its x, i and s kept), and each step's sum a + F with
        F >= R rounds to at least a + R (IEEE addition is monotone in each operand), so R(s, k)
        <= F(s, k, d) for every d by induction: no plan's sum of stage latencies is below it.
        O(S L^2) instead of the pass's O(S X L J U); the t_max walk stops on it where it already
        decides the stop, and prices the exact value only where it does not
        (alpa_e._Floor, tests/test_alpa_e_dp.py)."""
        if self._floor is None:
            T = self.T_XKIS
            X, L, _, Smax = T.shape
            T_KIS = T.min(axis=0)
            R = np.full(L + 1, np.inf)
            R[L] = 0.0
            best = np.inf
            for s in range(1, min(Smax, L) + 1):
                if s * self.umin > self.U:
                    break
                R = np.concatenate([(T_KIS[:, :, s - 1] + R[None, 1:]).min(axis=1), [np.inf]])
                if self.U <= s * self.umax:
                    best = min(best, float(R[0]))
            self._floor = best
        return self._floor

    def least_cap(self) -> float:
        """The least t_max any plan meets, value(inf, np.maximum) bit for bit, probing few caps:
        the bottleneck value under a cap c is that same minimum whenever c reaches it (min and
        max select, they do not round) and inf below it, and the minimum is a latency of the
        table. Every plan has a stage over each layer l, so it is at least the largest over l of
        the least latency of a range holding l: the probes start there and step up, 1, 2, 4,
        ... latencies at a time, each at the narrow band of its cap."""
        vals = self.caps
        if self.fallback or self.s_last < 1 or not np.isfinite(self.floor):
            return self.value(np.inf, np.maximum)  # (a layer no stage covers: inf)
        idx, step = int(np.searchsorted(vals, self.floor)), 1
        while True:
            v = self.value(vals[min(idx, vals.size - 1)], np.maximum)
            if np.isfinite(v) or idx >= vals.size - 1:
                return v
            idx, step = idx + step, 2 * step

    def stages(self, cap):
        """alpa_e._dp(T, units, U, cap, np.add, backtrack=True), bit for bit: (value, s, stages
        [(k, i, x, s)]), every stage count explicit, the stages read back along the optimum
        only: at (s, k, d) the first x (in order) whose least candidate is F(s, k, d), then the
        least i reaching it (the loop's strict-less update over x and its argmin over i)."""
        if self.fallback or self.s_last < 1:
            return self._loop(cap, np.add, backtrack=True)
        J_SX = self._bands(cap)
        Fs = [self._base(J_SX)]
        best, best_s, U, umax, L = np.inf, 0, self.U, self.umax, self.L
        for s in range(1, self.s_last + 1):
            Fs.append(self._stage(Fs[-1], s, J_SX, cap, np.add))
            if Fs[-1][0, umax + U] < best:
                best, best_s = Fs[-1][0, umax + U], s
        if not np.isfinite(best):
            return best, best_s, None
        out, k, d = [], 0, U
        for s in range(best_s, 0, -1):
            target, band = Fs[s][k, umax + d], self.band_SXJK[min(s, self.n_s) - 1]
            jn = min(self.J, L - s - k + 1)  # i = k + j <= L - s
            for x, u in enumerate(self.units):
                a = band[x, :jn, k]
                cand = np.add(np.where(a <= cap, a, np.inf),
                              Fs[s - 1][k + 1: k + 1 + jn, umax + d - int(u)])
                if cand.min() == target:
                    i = k + int(cand.argmin())
                    break
            else:
                raise AssertionError("no candidate reaches F(s, k, d)")
            out.append((k, i, x, s))
            k, d = i + 1, d - int(u)
        assert k == L and d == 0
        return best, best_s, out

    def _loop(self, cap, combine, backtrack=False):
        from baselines.alpa_e import _dp  # the reference loop (a table with i < k entries)

        return _dp(self.T, list(self.units), self.U, cap, combine, backtrack)

    def _window(self, k: int) -> int:
        """The least unit count d of row k that min_s F(s, 0, U) can read: the stages over layers
        0..k-1 take at most max(units) units per layer, so d >= U - k max(units). An entry below
        it feeds only entries below the windows of the rows before it (d - u < U - (k' + 1)
        max(units) for any row k' < k reading it), never F(s, 0, U): leaving it unpriced (inf)
        changes no value nor any entry the backtrack reads along the optimum."""
        return max(0, self.U - k * self.umax)

    def _bands(self, cap):
        """J_SX: 1 + the last band offset of (s, x) with a latency under the cap (0: none)."""
        under_SXJ = self.min_SXJ <= cap
        return np.where(under_SXJ.any(axis=2), self.J - np.argmax(under_SXJ[..., ::-1], axis=2),
                        0)

    def _base(self, J_SX):
        """F(0, ., .): rows k (inf past L: the band reads up to row L + J - 1), columns
        c = umax + d (d < 0: inf)."""
        L = self.L
        F = np.full((L + max(int(J_SX.max()), 1) + 1, self.umax + self.U + 1), np.inf)
        F[L, self.umax] = 0.0  # F(0, L, 0)
        return F

    def _stage(self, F, s, J_SX, cap, combine):
        """F(s, ., .) from F = F(s - 1, ., .)."""
        L, U, umin, umax = self.L, self.U, self.umin, self.umax
        sl = min(s, self.n_s) - 1  # the table is the same for every s >= n_s (the sweep's s0)
        K = L - s + 1  # the s - 1 later stages need a layer each
        # rows 0..K-1 at the unit counts of their windows (the union: row K - 1's)
        dlo, dhi = max(s * umin, self._window(K - 1)), min(U, s * umax)
        rs, cs = F.strides
        F_new = np.full(F.shape, np.inf)
        if dlo > dhi:
            return F_new
        out = F_new[:K, umax + dlo: umax + dhi + 1]
        for x, u in enumerate(self.units):
            Jx = min(int(J_SX[sl, x]), K)  # i = k + j <= L - s: j < K
            if not Jx:
                continue
            A = self.band_SXJK[sl, x, :Jx, :K]
            A_JK1 = np.where(A <= cap, A, np.inf)[:, :, None]
            # W[j, k, d] = F(s - 1, k + j + 1, d - u) for d in [dlo, dhi]
            W_JKD = as_strided(F[1:, umax + dlo - int(u):], (Jx, K, dhi - dlo + 1),
                               (rs, rs, cs), writeable=False)
            # offsets in chunks of CHUNK, each over the first layers k whose row k + j + 1 can
            # still hold the s - 1 later stages (k + j <= K - 1; past it F(s - 1) is inf and
            # the candidates too): the same candidates that can be finite, a smaller temporary
            for j0 in range(0, Jx, self.CHUNK):
                j1, kk = min(Jx, j0 + self.CHUNK), K - j0
                np.minimum(out[:kk], combine(A_JK1[j0:j1, :kk], W_JKD[j0:j1, :kk]).min(axis=0),
                           out=out[:kk])
        return F_new
