"""How many chunk activations a device holds under interleaved 1F1B, computed without the model.

nest.costs.pipeline prices Megatron-Core's interleaved schedule: device d runs
W_d = 2 (p - d - 1) + (V - 1) N warm-up forwards (N the micro-batch group, default p), so it
holds W_d + 1 chunk activations at its peak (`stash` x V; `interleaved_order`,
`interleaved_peak_activations`). Here that count is rebuilt twice, independently of the model:

- by transcribing the structure of Megatron-Core's loop (megatron/core/pipeline_parallel/
  schedules.py, forward_backward_pipelining_with_interleaving, 0.16.1: the schedule table of
  micro-batch groups, the warm-up forwards, one forward and one backward per steady step, the
  cool-down backwards) and counting live chunks;
- by running every device's program against the pipeline's data dependencies (a forward needs
  the previous virtual stage's forward, a backward the next virtual stage's backward) in a
  discrete-event walk with unit chunk times, which shows why the warm-up is that long: with
  Megatron's steady-state exchange (a steady forward's output leaves together with that step's
  backward, send_forward_backward_recv_forward_backward) W_d is the fewest forwards that keep
  the bubble at (p - 1) / (V m); one fewer on any device but the last stretches the batch. With
  sends that leave as soon as a forward ends (asynchronous point-to-point, as Grattafiori et al.
  2024, section 3.3.2, describe for Llama 3), (p - d - 1) + (V - 1) N forwards are enough: p V - d
  chunks on device d, i.e. device 0 holds exactly 1F1B's p micro-batches of a whole stage.
"""

import itertools

import numpy as np
import pytest

from nest.costs.pipeline import interleaved_order, interleaved_peak_activations, stash


def _groups(m: int, v: int, n: int) -> list[tuple[int, int]]:
    """(micro-batch, chunk) in forward order: groups of n micro-batches, each run through every
    chunk before the next group starts; a last group shorter than n takes what is left."""
    out = []
    for lo in range(0, m, n):
        hi = min(lo + n, m)
        out += [(mb, c) for c in range(v) for mb in range(lo, hi)]
    return out


def _megatron_program(p: int, m: int, v: int, d: int, n: int | None = None,
                      warm: int | None = None) -> list[tuple[str, int, int]]:
    """Device d's operations, ('F' | 'B', chunk, micro-batch), in the loop's order: `warm`
    forwards (Megatron-Core's count unless given), then a forward and a backward per step, then
    the remaining backwards; the k-th backward is the k-th forward's micro-batch in the mirrored
    chunk (the last chunk's gradient comes back first)."""
    n = n or p
    table = _groups(m, v, n)
    total = len(table)
    if warm is None:
        warm = 2 * (p - d - 1) + (v - 1) * n
    warm = min(warm, total)
    fwd = [("F", c, mb) for mb, c in table]
    bwd = [("B", v - 1 - c, mb) for mb, c in table]
    ops = fwd[:warm]
    for k in range(total - warm):
        ops += [fwd[warm + k], bwd[k]]
    return ops + bwd[total - warm:]


def _live_peak(ops, size=None) -> float:
    held = peak = 0.0
    for kind, c, _ in ops:
        held += (1.0 if size is None else size[c]) * (1 if kind == "F" else -1)
        peak = max(peak, held)
    return peak


@pytest.mark.parametrize("p, v, m", [(16, v, m) for v in (2, 4, 8) for m in (16, 32)]
                         + [(4, 3, 8), (8, 2, 24)])
def test_in_flight_chunks_are_megatrons(p, v, m):
    """Llama 3 405B's pipeline (p = 16, V = 2, 4, 8, m = 16 at 16,384 GPUs, 32 at 8,192) and two
    small ones: on every device the model's stash, its operation order and its weighted peak are
    the loop's, live chunk by live chunk."""
    rng = np.random.default_rng(p * 100 + v * 10 + m)
    size = rng.uniform(0.1, 1.0, v)  # unequal chunks (Meta's embedding- and head-only ones)
    for d in range(p):
        ops = _megatron_program(p, m, v, d)
        assert list(interleaved_order(p, m, v, d)) == ops
        live = _live_peak(ops)
        assert live == min(2 * (p - d - 1) + (v - 1) * p + 1, m * v)
        assert stash(p, d, m, "interleaved", v) * v == pytest.approx(live, rel=1e-12)
        assert interleaved_peak_activations(size, p, m, d) == pytest.approx(
            _live_peak(ops, size), rel=1e-12)


def test_llama3_405b_counts():
    """The two 405B rows at V = 8: device 1 (8 one-block chunks) holds 141 chunks at 8,192 GPUs
    and all 128 at 16,384; device 0 holds 143 and 128 (its embedding-only chunk among them)."""
    assert [_live_peak(_megatron_program(16, 32, 8, d)) for d in (0, 1, 15)] == [143, 141, 113]
    assert [_live_peak(_megatron_program(16, 16, 8, d)) for d in (0, 1, 15)] == [128, 128, 113]


def _run(p: int, m: int, v: int, warm, paired: bool, f: float = 1.0, b: float = 2.0):
    """Every device's program against the data dependencies: an operation starts when its device
    is free and its input has arrived (transfers take no time). paired: a steady-state forward's
    output leaves when that step's backward ends (Megatron's exchange after both); else it leaves
    when the forward ends. The last virtual stage's backward reads its own forward's loss, which
    never travels. Returns (makespan, per-device peak live chunks), or None on a deadlock."""
    progs = [_megatron_program(p, m, v, d, warm=warm(d)) for d in range(p)]
    total, last = m * v, v * p - 1
    ready: dict = {}
    pc, clock, live, peak = [0] * p, [0.0] * p, [0] * p, [0] * p
    pending: list = [None] * p
    moved = True
    while moved:
        moved = False
        for d in range(p):
            w = min(warm(d), total)
            while pc[d] < len(progs[d]):
                i = pc[d]
                kind, c, mb = progs[d][i]
                s = c * p + d  # virtual stage
                if kind == "F":
                    dep = None if s == 0 else ("F", s - 1, mb)
                else:
                    dep = ("F", s, mb) if s == last else ("B", s + 1, mb)
                if dep is not None and dep not in ready:
                    break
                clock[d] = max(clock[d], ready[dep] if dep else 0.0) + (f if kind == "F" else b)
                steady_fwd = kind == "F" and w <= i < 2 * total - w and (i - w) % 2 == 0
                if paired and steady_fwd and s != last:
                    pending[d] = ("F", s, mb)
                else:
                    ready[(kind, s, mb)] = clock[d]
                if kind == "B" and pending[d] is not None:
                    ready[pending[d]], pending[d] = clock[d], None
                live[d] += 1 if kind == "F" else -1
                peak[d] = max(peak[d], live[d])
                pc[d] += 1
                moved = True
    if any(pc[d] < len(progs[d]) for d in range(p)):
        return None
    return max(clock), peak


@pytest.mark.parametrize("p, v, m", [(4, 2, 8), (8, 4, 16), (16, 8, 32)])
def test_megatron_warmup_is_the_least_for_its_exchange(p, v, m):
    """Forward 1, backward 2 per chunk: the ideal batch is (m V + p - 1) (f + b), the bubble
    (p - 1) / (V m). Megatron's warm-up reaches it with its paired exchange and holds W_d + 1
    chunks; one warm-up forward fewer on every device but the last does not; neither does the
    asynchronous minimum below."""
    ideal = (m * v + p - 1) * 3.0
    meg = _run(p, m, v, lambda d: 2 * (p - d - 1) + (v - 1) * p, paired=True)
    assert meg[0] == ideal
    assert meg[1] == [min(2 * (p - d - 1) + (v - 1) * p + 1, m * v) for d in range(p)]
    fewer = _run(p, m, v, lambda d: 2 * (p - d - 1) + (v - 1) * p - (d < p - 1), paired=True)
    assert fewer is None or fewer[0] > ideal
    async_min = _run(p, m, v, lambda d: (p - d - 1) + (v - 1) * p, paired=True)
    assert async_min is None or async_min[0] > ideal


@pytest.mark.parametrize("p, v, m", [(4, 2, 8), (8, 4, 16), (16, 8, 32)])
def test_asynchronous_sends_need_one_forward_per_downstream_device(p, v, m):
    """Sends that leave when the forward ends: (p - d - 1) + (V - 1) p warm-up forwards keep the
    ideal batch, holding p V - d chunks (device 0: p V, one whole stage for each of 1F1B's p
    micro-batches); one fewer on any device but the last stretches the batch or deadlocks, and
    the last device cannot hold fewer than (V - 1) p + 1."""
    ideal = (m * v + p - 1) * 3.0
    t, peak = _run(p, m, v, lambda d: (p - d - 1) + (v - 1) * p, paired=False)
    assert t == ideal
    assert peak == [p * v - d for d in range(p)]
    for skip in itertools.islice(range(p - 1), 0, None, max(1, (p - 1) // 3)):
        fewer = _run(p, m, v, lambda d, s=skip: (p - d - 1) + (v - 1) * p - (d == s),
                     paired=False)
        assert fewer is None or fewer[0] > ideal
    assert _run(p, m, v, lambda d: (p - d - 1) + (v - 1) * p - (d == p - 1), paired=False) is None
