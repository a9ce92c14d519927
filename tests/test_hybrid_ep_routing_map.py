"""HybridEP's routing-map all-gather (nest.costs.groups.routing_map_bytes / routing_map_terms):
once per MoE layer forward, T x E bool bytes per rank gathered over the ep group, only under the
hybridep dispatcher; checked on the Qwen3-30B-A3B ep-16 published row against a count of its
layers and micro-batches and the all-gather's own alpha-beta lines."""

import numpy as np
import pytest

from nest.costs.alike import inner_groups
from nest.costs.groups import ROUTING_MAP, routing_map_bytes
from nest.network.collectives import group_lines, lines_time

ROW = "bridge260401_qwen3_30b_a3b_16gpu_fp8"


def _row():
    from nest.fidelity import published_runs as P

    return next(r for r in P.load_runs() if r["id"] == ROW)


def test_routing_map_bytes_are_tokens_times_experts_and_only_under_hybridep():
    """Qwen3-30B-A3B at mbs 1, seq 4,096, tp 1: the router routes 4,096 tokens over 128
    experts, so a rank's map is 4,096 x 128 = 524,288 bool bytes (DeepEP's
    allgather_routing_map gathers a torch.bool [T, E] tensor); 0 with the flat alltoall
    dispatcher and on a block without experts."""
    from nest.fidelity import published_runs as P

    pr = P.problem_for(_row())
    block = next(la for la in pr.graph.layers if la.kind == "block")
    cost = block.costs["tp1_sp0_ep16_cp1"]
    assert routing_map_bytes(cost, "hybridep") == 4096 * 128
    assert routing_map_bytes(cost, "alltoall") == 0.0
    dense = block.costs["tp1_sp0_ep1_cp1"]  # no expert-parallel all-to-all: nothing to gather
    assert routing_map_bytes(dense, "hybridep") == 0.0


def test_the_step_carries_one_gather_per_layer_forward_and_microbatch():
    """The ep-16 row (pp 1, 48 MoE blocks, 1,024 / 16 = 64 micro-batches per rank): the
    stage's routing-map term is 48 x 64 x the all-gather of 16 x 524,288 bytes on its ep
    group's lines, in the forward; absent under the alltoall dispatcher, whose other terms
    are unchanged by it."""
    from nest.fidelity import published_runs as P
    from nest.problem.evaluate import evaluate
    from nest.problem.plan_spec import expand

    row = _row()
    pr = P.problem_for(row)
    plan = expand(P.plan_spec(row, pr.graph.num_layers), pr, "test")
    ev = evaluate(plan, pr)
    st = ev.stages[0]
    ids = np.asarray(plan.stages[0].device_ids)
    ep = inner_groups(ids, 1, 1, 16, plan.dp)["ep"]
    one = float(lines_time(group_lines(pr.cluster, "all_gather", ep), 16 * 4096 * 128))
    blocks = sum(la.kind == "block" for la in pr.graph.layers)
    assert blocks == 48
    mbs = row["global_batch"] // (row["mbs"] * row["dp"])
    assert mbs == 64
    got = {k: x for k, x in st.breakdown_s.items() if k.startswith(ROUTING_MAP)}
    assert len(got) == 1
    # the stage's breakdown is per micro-batch: one gather per block
    assert sum(got.values()) == pytest.approx(blocks * one, rel=1e-9)
    assert ev.breakdown_s["stage0." + next(iter(got))] == pytest.approx(
        mbs * blocks * one, rel=1e-9)
    assert one > 0
    flat = P.problem_for({**row, "moe_dispatcher": "alltoall"})
    bd = evaluate(plan, flat).stages[0].breakdown_s
    assert not any(k.startswith(ROUTING_MAP) for k in bd)
