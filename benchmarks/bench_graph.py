"""Time and memory to build a model's full torch.fx layer graph with all its variants.

    .venv/bin/python benchmarks/bench_graph.py [model ...]      (default: gpt3_175b)

Each model is built cold (trace caches cleared). Peak memory is the process's peak resident set
(ru_maxrss), printed with the part already used after importing torch for reference.
"""

from __future__ import annotations

import resource
import sys
import time


def _rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB


def main(names: list[str]) -> None:
    t0 = time.perf_counter()
    from nest.graph import fx_extract
    from nest.spec.catalog import load_model

    import_s, import_rss = time.perf_counter() - t0, _rss_mib()
    print(f"import nest.graph.fx_extract (torch): {import_s:.2f} s, peak RSS {import_rss:.0f} MiB")
    for name in names:
        fx_extract.clear_caches()
        m = load_model(name)
        t = time.perf_counter()
        g = fx_extract.build_layer_graph_fx(m)
        dt = time.perf_counter() - t
        t = time.perf_counter()
        d = g.to_dict()
        dt_json = time.perf_counter() - t
        traced = len(g.variants) * 3
        print(f"{name}: {g.num_layers} layers x {len(g.variants)} variants "
              f"({traced} layer traces, fwd+bwd+2 recompute passes) in {dt:.2f} s "
              f"(+{dt_json:.2f} s to_dict, {len(d['layers'])} layers); "
              f"{g.num_params / 1e9:.2f} B params; peak RSS {_rss_mib():.0f} MiB")


if __name__ == "__main__":
    main(sys.argv[1:] or ["gpt3_175b"])
