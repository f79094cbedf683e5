"""QueryGen's parts that call no model: its configuration (presets), the records its agents pass
around (`records`), and the choice among solver branches and the redundancy filter (`select`).

The agents that call models are in `envfactory_agents/`; the graph that wires them is `graphs/querygen/`.
"""
