# The paper's tables (2, 6, 7), Figure 2 and section 5.3's communication share.
# Registers its experiments in EXPERIMENTS (common.smk); its config lives under its own keys.
