"""Error types: bad input (file, key, expectation) vs internal invariants (assert)."""


class SpecError(ValueError):
    """Bad user input: the message names the file or key and what was expected."""


class PlanError(SpecError):
    """A malformed plan (not an infeasible one: infeasibility is a result, not an error)."""
