"""Planning: the placement ILP (gadgets, location paths, formulation), solvers, decoding into a
Plan, and the baselines. `optimize` is the entry point (see `solve.py`)."""
