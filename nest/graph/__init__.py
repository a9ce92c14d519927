"""Model spec -> layer graph: torch.fx tracing on the meta device, or the closed-form formulas."""

from __future__ import annotations

from functools import lru_cache

from nest.graph.layer_graph import LayerGraph
from nest.spec.catalog import ModelSpec, check_microbatch

SOURCES = ("torch_fx", "closed_form")


@lru_cache(maxsize=64)
def build_graph(model: ModelSpec, mbs: int = 1, source: str = "torch_fx") -> LayerGraph:
    """The layer graph of `model` with every sub-graph variant (cached per process)."""
    check_microbatch(model, mbs)
    if source == "torch_fx":
        from nest.graph.fx_extract import build_layer_graph_fx

        return build_layer_graph_fx(model, mbs)
    if source == "closed_form":
        from nest.graph.closed_form import build_layer_graph

        return build_layer_graph(model, mbs)
    raise ValueError(f"graph source '{source}': expected one of {SOURCES}")
