rule build_graph:
    """Model spec -> layer graph with every sub-graph variant (torch.fx on the meta device)."""
    input:
        model=lambda wc: catalog("models", wc.model),
        training="config/training.yaml",
    output:
        "results/graphs/{model}/mbs{mbs}.json",
    log:
        "logs/build_graph/{model}/mbs{mbs}.log",
    conda:
        "../envs/nest.yaml",
    params:
        mbs=lambda wc: int(wc.mbs),
    script:
        "../scripts/build_graph.py"
