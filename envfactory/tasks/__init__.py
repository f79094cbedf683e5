"""Verified tasks and trajectories: models, initial states, the privileged solver, the verifier, offline
synthesis and batch runs (modules one concept each; see each module's docstring)."""
