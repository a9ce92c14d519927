"""Hypothesis strategies for random tiny planning instances (tests/test_bounds.py).

A strategy draws a plain dict (`instance_specs`): a cluster dict shaped like config/clusters/*.yaml,
the device count, a tiny model with its overrides (tied / untied embeddings, number of blocks,
extra tp=2 variants), global batch, micro-batch size, HBM and the search-space overrides
(placements incl. rank orders, heterogeneous stages). `build(spec)` turns it into
(Problem, SearchSpace). Hypothesis prints the dict of a falsifying example, so every failure is a
self-contained reproducer: `build({...})`.
"""

from __future__ import annotations

from dataclasses import replace

from hypothesis import strategies as st

from nest.graph import build_graph
from nest.graph.layer_graph import Variant
from nest.problem.problem import Problem
from nest.spec.settings import TrainingSettings
from nest.problem.space import SearchSpace, declare
from nest.spec.catalog import cluster_from_dict, load_model

BANDWIDTHS_GBPS = (1.0, 5.0, 12.5, 50.0, 100.0, 450.0)
NODE_SIZES = (2, 3, 4, 8)
MAX_DEVICES = 16
HBM_GB = {"tiny_accel": (0.03, 0.06, 0.12, 0.25, 4.0), "h100_sxm": (1.56, 1.6, 1.8, 80.0)}


@st.composite
def cluster_dicts(draw, max_devices: int = MAX_DEVICES):
    """(cluster dict, num_devices): 2-4 levels, node of 2, 3, 4 or 8 devices, each upper level 2-4x
    the one below; bandwidths hierarchical (falling upwards), flattened (upper levels as fast as
    the node or faster) or arbitrary; some levels oversubscribed, some with an NCCL efficiency.
    The device count fits the top level and is below one node or a multiple of it (the spec's
    rule), so a data-parallel degree that is no multiple of the node size leaves devices idle."""
    num_levels = draw(st.integers(2, 4))
    sizes = [draw(st.sampled_from(NODE_SIZES))]
    for _ in range(num_levels - 1):
        sizes.append(sizes[-1] * draw(st.sampled_from((2, 3, 4))))
    shape = draw(st.sampled_from(("hierarchical", "flattened", "arbitrary")))
    bws = [draw(st.sampled_from(BANDWIDTHS_GBPS)) for _ in sizes]
    if shape == "hierarchical":
        bws = sorted(bws, reverse=True)
    elif shape == "flattened":
        bws = sorted(bws)
    levels = []
    for i, (size, bw) in enumerate(zip(sizes, bws)):
        lv = {"name": f"l{i}", "devices_per_group": size, "bandwidth_GBps": bw,
              "latency_us": draw(st.sampled_from((0.0, 1.0, 2.0, 5.0, 10.0))),
              "oversubscription": draw(st.sampled_from((1.0, 1.0, 1.5, 2.0, 4.0)))}
        eff = draw(st.sampled_from((None, 0.82, 0.96)))
        if eff is not None:
            lv["efficiency"] = eff
        levels.append(lv)
    node, top = sizes[0], min(sizes[-1], max_devices)
    choices = [n for n in range(2, top + 1) if n <= node or n % node == 0]
    n = draw(st.sampled_from(choices))
    hardware = draw(st.sampled_from(("tiny_accel", "tiny_accel", "h100_sxm")))
    return {"name": "random_cluster", "hardware": hardware, "levels": levels,
            "source": "hypothesis"}, n


MODELS = {"tiny_gpt": (1, 2, 4), "tiny_llama": (1, 2, 4), "tiny_moe": (1, 2)}
# legacy names, every launcher order, and order strings with pp fastest (consecutive stages on
# neighbouring devices) or dp fastest (replicas interleaved: not aligned id blocks)
PLACEMENTS = (["replica_major"], ["stage_major"], ["replica_major", "stage_major"], ["orders"],
              ["pp-tp-cp-ep-dp"], ["dp-tp-cp-ep-pp", "stage_major"])
TP2 = (Variant(tp=2), Variant(tp=2, sp=True))


@st.composite
def instance_specs(draw, max_devices: int = MAX_DEVICES):
    """A random instance as a plain dict (see the module docstring)."""
    cluster, n = draw(cluster_dicts(max_devices))
    model = draw(st.sampled_from(sorted(MODELS)))
    return {
        "cluster": cluster, "num_devices": n, "model": model,
        "tied": draw(st.booleans()), "num_layers": draw(st.sampled_from(MODELS[model])),
        "global_batch": draw(st.sampled_from((1, 2, 3, 4, 6, 8, 16, 64))),
        "mbs": draw(st.sampled_from((1, 1, 2))),
        "hbm_GB": draw(st.sampled_from(HBM_GB[cluster["hardware"]])),
        "space": {
            "max_pp": draw(st.sampled_from((2, 3, 4, None))),
            "zero_stages": draw(st.lists(st.sampled_from((0, 1, 2, 3)), min_size=1, max_size=4,
                                         unique=True).map(sorted)),
            "recompute_modes": draw(st.lists(st.sampled_from(("none", "selective", "full")),
                                             min_size=1, max_size=3, unique=True)),
            "placements": draw(st.sampled_from(PLACEMENTS)),
            "heterogeneous_stages": draw(st.booleans()),
        },
        "tp2_variants": draw(st.booleans()),
    }


def build(spec: dict) -> tuple[Problem, SearchSpace]:
    """The (problem, space) of an instance dict."""
    m = load_model(spec["model"])
    m = replace(m, tied_embeddings=spec["tied"], num_layers=spec["num_layers"])
    cluster = cluster_from_dict(spec["cluster"], "hypothesis cluster", spec["num_devices"])
    tr = TrainingSettings(global_batch=spec["global_batch"])
    g = build_graph(m, spec["mbs"], tr.graph_source)
    pr = Problem.build(m, cluster, g, tr, m.name, cluster.name)
    if spec.get("tp2_variants"):  # tiny_llama / tiny_moe: a class {tp2, tp2+sp(, cp2)}
        pr = pr.with_variants(TP2)
    pr = pr.with_hardware(hbm_bytes=spec["hbm_GB"] * 1e9)
    return pr, declare(pr, spec["space"])
