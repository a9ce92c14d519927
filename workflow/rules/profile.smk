rule profile_hardware:
    """GPU only, outside the default target: time the operators and blocks on this machine's GPU
    (`snakemake -j1 profiles/measured/h100_sxm` on an H100; the folder is named after the card
    found, so an H200 writes h200_sxm). Review, then commit it as profiles/<hardware>/.
    The hardware wildcard admits a catalog-style name only and is quoted in the command."""
    output:
        directory("profiles/measured/{hardware}"),
    log:
        "logs/profile_hardware/{hardware}.log",
    threads: 1
    resources:
        mem_mb=16000,
        runtime=120,
        gpu=1,
    conda:
        "../envs/nest.yaml"
    shell:
        "nest profile --hardware {wildcards.hardware:q} --out profiles/measured > {log:q} 2>&1"
