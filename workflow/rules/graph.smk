rule build_graph:
    """Model spec -> layer graph with every sub-graph variant (torch.fx on the meta device), at
    the micro-batch size and sequence length that the file name states (`mbs2`, `mbs1_seq8192`;
    without `_seq` the model's own)."""
    input:
        model=lambda wc: catalog("models", wc.model),
        hf_config=lambda wc: hf_config_files(wc.model),
        training="config/training.yaml",
    output:
        "results/graphs/{model}/{shape}.json",
    log:
        "logs/build_graph/{model}/{shape}.log",
    threads: 1
    resources:
        mem_mb=4000,
        runtime=30,
    conda:
        "../envs/nest.yaml"
    params:
        settings=lambda wc: batch_settings(wc.shape),
        code=CODE,
    script:
        "../scripts/build_graph.py"
