"""ray-ormas's internals, by where their code runs and what it owns. Nothing here is public API: the
public names are `ray_ormas` (its `__all__`), `ray_ormas.errors`, `ray_ormas.demo`, and the framework
callbacks' `ray_ormas.lightning` and `ray_ormas.transformers`; docs/architecture.md
draws the tree, and the import contracts in pyproject.toml keep its layers.
"""
