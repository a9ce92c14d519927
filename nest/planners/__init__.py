"""The planner registry and the rule for ties (NEST's solver: nest/solver; the baselines: baselines/)."""
