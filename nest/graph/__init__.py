"""Model spec -> layer graph: torch.fx tracing on the meta device, or the closed-form formulas."""

from __future__ import annotations

from functools import lru_cache

from nest.graph.layer_graph import LayerGraph, Variant
from nest.spec.catalog import ModelSpec, check_microbatch

SOURCES = ("torch_fx", "closed_form")


@lru_cache(maxsize=64)
def build_graph(model: ModelSpec, mbs: int = 1, source: str = "torch_fx",
                variants: tuple[Variant, ...] | None = None) -> LayerGraph:
    """The layer graph of `model` with every sub-graph variant, or with `variants` only (a
    subset of the declared ones, in their order: `nest plan`'s launchable ones, whose traces
    are all it needs); cached per process."""
    check_microbatch(model, mbs)
    vs = list(variants) if variants is not None else None
    if source == "torch_fx":
        from nest.graph.fx_extract import build_layer_graph_fx

        return build_layer_graph_fx(model, mbs, vs)
    if source == "closed_form":
        from nest.graph.closed_form import build_layer_graph

        return build_layer_graph(model, mbs, vs)
    raise ValueError(f"graph source '{source}': expected one of {SOURCES}")
