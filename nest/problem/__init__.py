"""A problem and its plans: the frozen Problem, the plan contract, the search space, rank placement and the one evaluator that scores every plan."""
