"""Rank orders (nest.problem.placement) against megatron-core's own group construction.

The block between the BEGIN / END markers is copied verbatim from NVIDIA/Megatron-LM
megatron/core/parallel_state.py at commit d98e8a64ddf34856e74b24714e3bedb2f5a39553
(generate_masked_orthogonal_rank_groups, RankGenerator, _inject_gtp_remat_axis); `core_groups`
below repeats initialize_model_parallel's construction of the dense and expert generators and its
order assertion (same file, lines 857-902). The whole parallel_state module is not imported: it
pulls in megatron.core's package (inference, utils, einops) that this project does not install.

Megatron-LM licence (BSD-3-Clause) for the copied block:
Copyright (c) 2019-2025, NVIDIA CORPORATION. All rights reserved. Redistribution and use in source
and binary forms, with or without modification, are permitted provided that the conditions of the
BSD-3-Clause licence are met (https://github.com/NVIDIA/Megatron-LM/blob/main/LICENSE).
"""

from __future__ import annotations

import random
from itertools import permutations
from typing import List  # noqa: UP035 (the verbatim megatron-core block uses it)

import pytest

from nest.common.errors import PlanError
from nest.problem.placement import (
    CLI_ORDERS,
    DIMS,
    LEGACY,
    expressible,
    harness_groups,
    launcher_orders,
    megatron_groups,
    stage_device_ids,
)
from nest.problem.plan import place

# ---------------------------------------------------------------------------------------------
# BEGIN verbatim megatron-core (parallel_state.py @ d98e8a64)
# ---------------------------------------------------------------------------------------------
# fmt: off
def generate_masked_orthogonal_rank_groups(
    world_size: int, parallel_size: List[int], mask: List[bool]  # noqa: UP006
) -> List[List[int]]:  # noqa: UP006
    r"""Generate orthogonal parallel groups based on the parallel size and mask.

    Arguments:
        world_size (int): world size

        parallel_size (List[int]):  # noqa: UP006
            The parallel size of each orthogonal parallel type. For example, if
            tensor_parallel_size = 2, pipeline_model_parallel_group = 3, data_parallel_size = 4,
            and the parallel mapping order is tp-pp-dp, then the parallel_size = [2, 3, 4].

        mask (List[bool]):  # noqa: UP006
            The mask controls which parallel methods the generated groups represent. If mask[i] is
            True, it means the generated group contains the i-th parallelism method. For example,
            if parallel_size = [tp_size, pp_size, dp_size], and mask = [True, False , True], then
            the generated group is the `tp-dp` group, if the mask = [False, True, False], then the
            generated group is the `pp` group.

    Algorithm:
        For orthogonal parallelism, such as tp/dp/pp/cp, the global_rank and
        local_rank satisfy the following equation:
            global_rank = tp_rank + dp_rank * tp_size + pp_rank * tp_size * dp_size (1)
                tp_rank \in [0, tp_size)
                dp_rank \in [0, dp_size)
                pp_rank \in [0, pp_size)

        If we want to get the `dp_group` (tp_size * pp_size groups of dp_size ranks each.
        For example,  if the gpu size is 8 and order is 'tp-pp-dp', size is '2-2-2', and the
        dp_group here is [[0, 4], [1, 5], [2, 6], [3, 7]].)
        The tp_rank and pp_rank will be combined to form the `dp_group_index`.
            dp_group_index = tp_rank + pp_rank * tp_size (2)

        So, Given that tp_rank and pp_rank satisfy equation (2), and dp_rank in
        range(0, dp_size), the ranks in dp_group[dp_group_index] satisfies the
        equation (1).

        This function solve this math problem.

    For example, if the parallel_size = [tp_size, dp_size, pp_size] = [2, 3, 4],
    and the mask = [False, True, False]. Then,
        dp_group_index(0) = tp_rank(0) + pp_rank(0) * 2
        dp_group_index(1) = tp_rank(1) + pp_rank(0) * 2
        ...
        dp_group_index(7) = tp_rank(1) + pp_rank(3) * 2

        dp_group[0] = 0 + range(0, 3) * 2 + 0 = [0, 2, 4]
        dp_group[1] = 1 + range(0, 3) * 2 + 0 = [1, 3, 5]
        ...
        dp_group[7] = 1 + range(0, 3) * 2 + 3 * 2 * 3 = [19, 21, 23]
    """

    def prefix_product(a: List[int], init=1) -> List[int]:  # noqa: UP006
        r = [init]
        for v in a:
            init = init * v
            r.append(init)
        return r

    def inner_product(a: List[int], b: List[int]) -> int:  # noqa: UP006
        return sum([x * y for x, y in zip(a, b)])

    def decompose(index, shape, stride=None):
        """
        This function solve the math problem below:
            There is an equation:
                index = sum(idx[i] * stride[i])
            And given the value of index, stride.
            Return the idx.
        This function will be used to get the pp/dp/pp_rank
        from group_index and rank_in_group.
        """
        if stride is None:
            stride = prefix_product(shape)
        idx = [(index // d) % s for s, d in zip(shape, stride)]
        # stride is a prefix_product result. And the value of stride[-1]
        # is not used.
        assert (
            sum([x * y for x, y in zip(idx, stride[:-1])]) == index
        ), "idx {} with shape {} mismatch the return idx {}".format(index, shape, idx)  # noqa: UP032
        return idx

    masked_shape = [s for s, m in zip(parallel_size, mask) if m]
    unmasked_shape = [s for s, m in zip(parallel_size, mask) if not m]

    global_stride = prefix_product(parallel_size)
    masked_stride = [d for d, m in zip(global_stride, mask) if m]
    unmasked_stride = [d for d, m in zip(global_stride, mask) if not m]

    group_size = prefix_product(masked_shape)[-1]
    num_of_group = world_size // group_size

    ranks = []
    for group_index in range(num_of_group):
        # get indices from unmaksed for group_index.
        decomposed_group_idx = decompose(group_index, unmasked_shape)
        rank = []
        for rank_in_group in range(group_size):
            # get indices from masked for rank_in_group.
            decomposed_rank_idx = decompose(rank_in_group, masked_shape)
            rank.append(
                inner_product(decomposed_rank_idx, masked_stride)
                + inner_product(decomposed_group_idx, unmasked_stride)
            )
        ranks.append(rank)
    return ranks


class RankGenerator(object):  # noqa: UP004
    """A class for generating rank groups for different modes of parallelism."""

    def __init__(
        self,
        tp: int,
        ep: int,
        dp: int,
        pp: int,
        cp: int,
        order: str,
        rank_offset: int = 0,
        gtp_remat: int = 1,
    ) -> None:
        assert (
            ep == 1 or cp == 1
        ), "Both EP and CP > 1 in not allow in one rank generator. \
            CP is only included in default RankGenerator, and EP only in expert RankGenerator."

        self.tp = tp
        self.ep = ep
        self.dp = dp
        self.pp = pp
        self.cp = cp
        self.gtp_remat = gtp_remat
        self.rank_offset = rank_offset
        self.world_size = tp * dp * pp * cp * ep * gtp_remat

        self.name_to_size = {
            "tp": self.tp,
            "pp": self.pp,
            "dp": self.dp,
            "ep": self.ep,
            "cp": self.cp,
            "gtp_remat": self.gtp_remat,
        }
        self.order = order
        order = order.lower()

        for name in self.name_to_size.keys():
            if name not in order and self.name_to_size[name] != 1:
                raise RuntimeError(
                    f"The size of ({name}) is ({self.name_to_size[name]}), but you haven't"
                    f"specified the order ({self.order})."
                )
            elif name not in order:
                order = order + "-" + name

        self.order = order
        self.ordered_size = []

        for token in order.split("-"):
            self.ordered_size.append(self.name_to_size[token])

    def get_mask(self, order: str, token: str):
        """Create a mask for the specified tokens based on the given order.

        Args:
            order (str): The order of parallelism types (e.g., 'tp-dp-pp').
            token (str): The specific parallelism types to include in the mask,
                         separated by hyphens (e.g., 'tp-dp').
        """
        ordered_token = order.split("-")
        token_list = token.split("-")
        mask = [False] * len(ordered_token)
        for t in token_list:
            mask[ordered_token.index(t)] = True
        return mask

    def get_ranks(self, token):
        """Get rank group by input token.

        Args:
            token (str):
                Specify the ranks type that want to get. If we want
                to obtain multiple parallel types, we can use a hyphen
                '-' to separate them. For example, if we want to obtain
                the TP_DP group, the token should be 'tp-dp'.
        """
        mask = self.get_mask(self.order, token)
        ranks = generate_masked_orthogonal_rank_groups(self.world_size, self.ordered_size, mask)
        if self.rank_offset > 0:
            for rank_group in ranks:
                for i in range(len(rank_group)):
                    rank_group[i] += self.rank_offset
        return ranks

    def get_gtp_ranks(self, gtp_remat_size: int):
        """Get the GTP weight-sharding groups (singletons when ``gtp_remat_size == 1``)."""
        assert (
            self.gtp_remat == gtp_remat_size
        ), f"gtp_remat axis size ({self.gtp_remat}) != requested gtp_remat_size ({gtp_remat_size})"
        return self.get_ranks('gtp_remat')


def _inject_gtp_remat_axis(order_str: str, after: str = "tp") -> str:
    """Inject the 'gtp_remat' axis into a RankGenerator order string for NCCL locality.

    Position controls locality (leftmost token = smallest stride = most adjacent ranks):
      - dense/decoder: inject after 'tp' -> 'tp-gtp_remat-cp-ep-dp-pp' (GTP_remat local).
      - expert: inject after 'ep' -> 'tp-cp-ep-gtp_remat-dp-pp' so EP keeps more-local placement
        than EGTP (the MoE EP all-to-all is the heavier expert-side collective).
    When gtp_remat/egtp_remat size is 1 the injected axis is a no-op (singleton groups).
    """
    toks = order_str.split("-")
    if "gtp_remat" in toks:
        return order_str
    anchor = after if after in toks else "tp"
    pos = (toks.index(anchor) + 1) if anchor in toks else 0
    toks.insert(pos, "gtp_remat")
    return "-".join(toks)

# fmt: on
# ---------------------------------------------------------------------------------------------
# END verbatim megatron-core
# ---------------------------------------------------------------------------------------------


def core_groups(tp: int, cp: int, ep: int, dp: int, pp: int, order: str):
    """The groups megatron-core's initialize_model_parallel(order=order) builds (expert tp = tp,
    no gtp_remat), with `dp` ours (Megatron's dp = dp*ep); None where it rejects the order."""
    world = tp * cp * ep * dp * pp
    data_parallel_size = world // (tp * pp * cp)
    dec = RankGenerator(tp=tp, ep=1, dp=data_parallel_size, pp=pp, cp=cp,
                        order=_inject_gtp_remat_axis(order, after="tp"))
    expert_dp = world // (tp * ep * pp)
    exp = RankGenerator(tp=tp, ep=ep, dp=expert_dp, pp=pp, cp=1,
                        order=_inject_gtp_remat_axis(order, after="ep"))
    if not (order.endswith("pp") or pp == 1 or expert_dp == data_parallel_size):
        return None
    if dec.get_ranks("pp") != exp.get_ranks("pp"):
        return None
    sets = lambda gs: {frozenset(g) for g in gs}
    return {"tp": sets(dec.get_ranks("tp")), "cp": sets(dec.get_ranks("cp")),
            "dp": sets(dec.get_ranks("dp")), "dp_cp": sets(dec.get_ranks("dp-cp")),
            "pp": sets(dec.get_ranks("pp")), "ep": sets(exp.get_ranks("ep")),
            "expert_tp": sets(exp.get_ranks("tp")), "expert_dp": sets(exp.get_ranks("dp"))}


ALL = ["-".join(p) for p in permutations(DIMS)]


def _degrees(n: int, seed: int = 11):
    rng = random.Random(seed)
    cases = [(1, 1, 1, 1, 1), (2, 2, 2, 2, 2), (2, 2, 1, 1, 2), (2, 1, 2, 1, 2), (1, 2, 2, 2, 1),
             (2, 3, 3, 1, 2)]
    while len(cases) < n:
        c = tuple(rng.choice((1, 1, 2, 2, 3)) for _ in range(5))
        if c not in cases:
            cases.append(c)
    return cases  # (tp, cp, ep, dp, pp)


DEGREES = _degrees(30)


@pytest.mark.parametrize("tp,cp,ep,dp,pp", DEGREES)
def test_launcher_orders_give_megatron_cores_groups(tp, cp, ep, dp, pp):
    """(a) every order of launcher_orders: megatron-core's groups (verbatim code) are exactly the
    groups the harness prices from our per-stage ids; and `expressible` is exactly the set of
    orders megatron-core accepts with those groups (brute force over all 120 orders); our
    re-derivation megatron_groups agrees with megatron-core wherever it accepts an order."""
    for o in ALL:
        core = core_groups(tp, cp, ep, dp, pp, o)
        ours = harness_groups(stage_device_ids(pp, dp, tp, cp, ep, o), tp, cp, ep, dp)
        faithful = core is not None and core == {k: ours[k] for k in core}
        assert expressible(tp, cp, ep, dp, pp, o) == faithful, o
        if core is not None:
            assert megatron_groups(tp, cp, ep, dp, pp, o) == core, o
    for o in launcher_orders(tp, cp, ep, dp, pp):
        core = core_groups(tp, cp, ep, dp, pp, o)
        ours = harness_groups(stage_device_ids(pp, dp, tp, cp, ep, o), tp, cp, ep, dp)
        assert core is not None and set(core) == set(ours) - {"dp_ours"}, o
        for kind in core:
            assert core[kind] == ours[kind], (o, kind)


def test_megatron_folds_ep_over_cp_under_both_cli_orders():
    """With cp > 1 and ep > 1 neither Megatron-LM CLI order gives orthogonal cp and ep groups
    (megatron-core's expert generator has cp = 1: ep takes cp's ranks); an order with ep and cp on
    either side of dp does. With ep > 1 and pp > 1, --use-tp-pp-dp-mapping is rejected unless
    cp == ep (initialize_model_parallel's assertion)."""
    for o in CLI_ORDERS:
        assert not expressible(2, 2, 2, 2, 2, o)
    assert launcher_orders(2, 2, 2, 1, 2)[0] in ("tp-ep-dp-cp-pp", "tp-cp-dp-ep-pp")
    assert core_groups(1, 1, 2, 1, 2, "tp-cp-ep-pp-dp") is None
    assert not expressible(1, 1, 2, 1, 2, "tp-cp-ep-pp-dp")
    assert expressible(1, 1, 2, 1, 1, "tp-cp-ep-pp-dp")


def _old_place(pp, dp, width, placement):  # nest.problem.plan.place before order strings
    out = []
    for j in range(pp):
        ids = []
        for r in range(dp):
            base = j * dp * width + r * width if placement == "replica_major" else (
                r * pp * width + j * width)
            ids.extend(range(base, base + width))
        out.append(tuple(ids))
    return out


@pytest.mark.parametrize("tp,cp,ep,dp,pp", DEGREES[:12])
def test_legacy_names_are_their_order_strings(tp, cp, ep, dp, pp):
    """(b) replica_major == tp-cp-ep-dp-pp, stage_major == tp-cp-ep-pp-dp, and place() with
    only a width still gives what it gave before."""
    w = tp * cp * ep
    for name, order in LEGACY.items():
        ids = stage_device_ids(pp, dp, tp, cp, ep, order)
        assert stage_device_ids(pp, dp, tp, cp, ep, name) == ids
        assert place(pp, dp, w, name, tp=tp, cp=cp, ep=ep) == ids
        assert place(pp, dp, w, order, tp=tp, cp=cp, ep=ep) == ids
        assert place(pp, dp, w, name) == _old_place(pp, dp, w, name) == ids


def test_place_errors():
    with pytest.raises(PlanError, match="tp, cp, ep"):
        place(2, 2, 4, "tp-ep-dp-cp-pp")
    with pytest.raises(PlanError, match="width"):
        place(2, 2, 4, "tp-ep-dp-cp-pp", tp=2, cp=1, ep=1)
    with pytest.raises(PlanError, match="permutation"):
        place(2, 2, 4, "tp-dp-pp", tp=4)


@pytest.mark.parametrize("tp,cp,ep,dp,pp", DEGREES)
def test_launcher_orders_dedup_and_cover(tp, cp, ep, dp, pp):
    """(c) no two returned orders share a layout; every layout of an expressible order is
    returned; deterministic, tp-cp-ep-dp-pp first where it is expressible."""
    got = launcher_orders(tp, cp, ep, dp, pp)
    assert got == launcher_orders(tp, cp, ep, dp, pp)
    lay = lambda o: tuple(stage_device_ids(pp, dp, tp, cp, ep, o))
    assert len({lay(o) for o in got}) == len(got)
    assert all(expressible(tp, cp, ep, dp, pp, o) for o in got)
    assert {lay(o) for o in got} == {lay(o) for o in ALL if expressible(tp, cp, ep, dp, pp, o)}
    if expressible(tp, cp, ep, dp, pp, "tp-cp-ep-dp-pp"):
        assert got[0] == "tp-cp-ep-dp-pp"
    if tp == cp == ep == dp == pp == 1:
        assert got == ("tp-cp-ep-dp-pp",)


def _ordered_plan(pr, v, pp, dp, order):
    """A plan laid out in `order` (make_plan takes legacy names only)."""
    from dataclasses import replace

    from nest.problem.space import make_plan

    L = pr.graph.num_layers
    cuts = [(0, L // 2 - 1), (L // 2, L - 1)][:pp] if pp == 2 else [(0, L - 1)]
    plan = make_plan(pr, "h", v, pp, dp, cuts, [0] * pp, ["none"] * pp, "replica_major")
    ids = place(pp, dp, v.width, order, tp=v.tp, cp=v.cp, ep=v.ep)
    return plan.with_(placement=order, stages=tuple(replace(s, device_ids=ids[j])
                                                    for j, s in enumerate(plan.stages)))


def test_export_round_trip_for_a_non_cli_order(tmp_path, capsys):
    """(d) an expressible order Megatron-LM's CLI does not name ('dp-tp-cp-ep-pp': dp fastest)
    on 8-GPU nodes: exported with the default CLI order and a launchable rank map (a node's 8
    ranks stay on one node), every group kind checked, nothing projected; the plan JSON keeps its
    order string through write / read / `nest export`."""
    from nest.interfaces import cli
    from nest.problem.evaluate import evaluate, make_problem
    from nest.interfaces.export import check_against_plan, to_megatron
    from nest.graph.layer_graph import Variant
    from nest.problem.plan import Plan

    pr = make_problem("tiny_gpt", "dgx_a100", 16)
    plan = _ordered_plan(pr, Variant(2), 2, 4, "dp-tp-cp-ep-pp")
    assert "dp-tp-cp-ep-pp" in launcher_orders(2, 1, 1, 4, 2)
    f = tmp_path / "plan.json"
    plan.write(f)
    back = Plan.read(f)
    assert back == plan and back.placement == "dp-tp-cp-ep-pp"
    exp = to_megatron(back, pr)
    assert not exp.warnings and exp.plan == plan and exp.order == "tp-cp-ep-dp-pp"
    assert "--use-tp-pp-dp-mapping" not in exp.args and not exp.identity_placement()
    assert exp.time_per_batch_s == evaluate(plan, pr).time_per_batch_s
    r1 = exp.rank_map[1]  # rank 1 is (tp 1, dp 0): device 4 under dp fastest
    assert (r1["tp"], r1["dp"], r1["device"]) == (1, 0, 4)
    check_against_plan(exp)
    bad = exp.rank_map[:]
    bad[0], bad[1] = dict(bad[0], device=bad[1]["device"]), dict(bad[1], device=bad[0]["device"])
    with pytest.raises(AssertionError):
        check_against_plan(type(exp)(**{**exp.__dict__, "rank_map": bad}))
    assert cli.main(["export", str(f)]) == 0  # in-process: the command's own output
    assert "not the identity" in capsys.readouterr().out


def test_export_projects_an_unlaunchable_order():
    """The same order on 2-GPU nodes puts a tensor-parallel pair on two nodes, which torchrun's
    rank blocks cannot: projected onto the better CLI order, both times reported."""
    from nest.problem.evaluate import evaluate, make_problem
    from nest.interfaces.export import to_megatron
    from nest.graph.layer_graph import Variant

    pr = make_problem("tiny_gpt", "tiny_cluster", 8)
    plan = _ordered_plan(pr, Variant(2), 2, 2, "dp-tp-cp-ep-pp")
    exp = to_megatron(plan, pr)
    assert exp.plan.placement in CLI_ORDERS and exp.order == exp.plan.placement
    assert exp.identity_placement()
    assert any("not launchable" in w for w in exp.warnings)
    assert "exported vs" in exp.warnings[-1]
    best = min(evaluate(_ordered_plan(pr, Variant(2), 2, 2, o), pr).time_per_batch_s
               for o in CLI_ORDERS)
    assert exp.time_per_batch_s == best
    assert exp.original_time_per_batch_s == evaluate(plan, pr).time_per_batch_s


def test_export_with_cp_and_ep_is_projected_to_a_runnable_plan():
    """cp = ep = 2: Megatron-LM's CLI fixes the order, and its expert grid (expert-tp, ep,
    expert-dp, pp) folds ep over the cp ranks, so no launch gives the plan's groups; the export
    re-scores the nearest runnable plans (ep 1, cp into tp, cp 1) and says so (nest.interfaces.export)."""
    from nest.problem.evaluate import evaluate, make_problem
    from nest.interfaces.export import to_megatron
    from nest.graph.layer_graph import Variant

    pr = make_problem("tiny_moe", "tiny_cluster", 8)
    plan = _ordered_plan(pr, Variant(1, False, 2, 2), 2, 1, "tp-ep-dp-cp-pp")
    exp = to_megatron(plan, pr)
    assert exp.order in CLI_ORDERS and exp.plan != plan
    assert exp.plan.cp == 1 or exp.plan.ep == 1
    assert any("separate (expert-tp, ep, expert-dp, pp) grid" in w for w in exp.warnings)
    assert exp.time_per_batch_s == evaluate(exp.plan, pr).time_per_batch_s
    assert exp.original_time_per_batch_s == evaluate(plan, pr).time_per_batch_s
