"""The interleaved schedule's warm-up and stash against Megatron-Core's own functions.

nest.costs.pipeline prices Megatron's interleaved 1F1B: `interleaved_order` walks one device's
forwards and backwards, `stash` prices its peak. Here both are checked against the installed
megatron-core (megatron/core/pipeline_parallel/schedules.py): `get_pp_rank_microbatches` (the
warm-up count of a pipeline rank, given p, its rank, m, v and the group size N =
microbatch_group_size_per_vp_stage) and `get_schedule_table` (the order of (micro-batch, chunk)
forwards). A device holds, at its peak, the warm-up forwards plus the first steady-state forward.
"""

from types import SimpleNamespace

import pytest

from nest.costs.pipeline import interleaved_order, stash

schedules = pytest.importorskip("megatron.core.pipeline_parallel.schedules")


def _megatron_warmup(p: int, rank: int, m: int, v: int, n: int) -> tuple[int, int]:
    """(total, warm-up) chunk forwards of pipeline rank `rank`, from megatron-core itself."""
    comm = SimpleNamespace(pp_group=SimpleNamespace(size=lambda: p, rank=lambda: rank),
                           virtual_pipeline_model_parallel_size=v)
    total, _, warm, _ = schedules.get_pp_rank_microbatches(m, v, n, p2p_communicator=comm)
    return total, warm


CASES = [(p, m, v, n) for p, m, v, n in
         [(4, 4, 2, 4), (4, 8, 2, 4), (4, 8, 3, 4), (4, 10, 2, 5), (8, 8, 2, 8), (8, 16, 4, 8),
          (16, 16, 8, 16), (16, 32, 8, 16), (16, 32, 4, 16), (16, 32, 2, 16), (16, 48, 8, 24)]]


@pytest.mark.parametrize("p, m, v, n", CASES)
def test_warmup_and_peak_match_megatron_core(p, m, v, n):
    for d in range(p):
        total, warm = _megatron_warmup(p, d, m, v, n)
        ops = list(interleaved_order(p, m, v, d, n))
        assert len(ops) == 2 * total
        first_b = next(i for i, (kind, _, _) in enumerate(ops) if kind == "B")
        # the forwards before the first backward: the warm-up, plus one steady-state forward
        # unless every forward is a warm-up one
        assert first_b == (warm if warm == total else warm + 1)
        held = peak = 0
        for kind, _, _ in ops:
            held += 1 if kind == "F" else -1
            peak = max(peak, held)
        assert peak == first_b
        if n == p:  # `stash` prices Megatron's default group size N = p
            assert stash(p, d, m, "interleaved", v) == pytest.approx(peak / v)


@pytest.mark.parametrize("p, m, v, n", [c for c in CASES if c[1] % c[3] == 0])
def test_forward_order_is_megatron_schedule_table(p, m, v, n):
    table = schedules.get_schedule_table(m, v, n)  # (micro-batch, chunk) in forward order
    fwd = [(mb, c) for kind, c, mb in interleaved_order(p, m, v, 0, n) if kind == "F"]
    assert fwd == table


def test_m_equal_p_last_devices_start_1f1b_early():
    """Llama 3 405B on 16,384 GPUs: p = m = 16, v = 8. Megatron-Core runs 2 (p - d - 1) +
    (v - 1) p warm-up forwards: every one of the 128 on devices 0..7, 112 + 2 (15 - d) on
    devices 8..15 (device 15: 112, then one forward before its first backward: 113 held, not
    the 128 of the pre-November-2024 rule that made every forward a warm-up one when m = p)."""
    assert [stash(16, d, 16, "interleaved", 8) * 8 for d in range(16)] == \
        [128] * 8 + [min(2 * (15 - d) + 112 + 1, 128) for d in range(8, 16)]
    assert stash(16, 15, 16, "interleaved", 8) * 8 == 113
