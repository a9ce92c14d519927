# NEST's gain decomposed (capabilities switched off one at a time) and the network co-design sweep.
# Registers its experiments in EXPERIMENTS (common.smk); its config lives under its own keys.
