rule profile_hardware:
    """GPU only, outside the default target: time the operators and blocks on this machine's GPU
    (`snakemake -j1 profiles/measured/h100_sxm` on an H100; the folder is named after the card
    found, so an H200 writes h200_sxm). Review, then commit it as profiles/<hardware>/."""
    output:
        directory("profiles/measured/{hardware}"),
    log:
        "logs/profile_hardware/{hardware}.log",
    conda:
        "../envs/nest.yaml"
    shell:
        "nest profile --hardware {wildcards.hardware} --out profiles/measured > {log} 2>&1"
