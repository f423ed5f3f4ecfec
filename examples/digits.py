"""Model and data factories for `ray-ormas train examples/digits_watch.yaml` (and _repair.yaml).

scikit-learn's bundled 8x8 digits (no download) and the demo's CNN, optionally with conv2 and
conv3 zeroed: two dead layers for the monitor to find (watch) and heal (repair). The factories
live in `ray_ormas.demo` (so an installed package, e.g. in a cluster image, has them too:
`ray_ormas.demo:cnn`); this module is where a project's own factories would go.
"""

from ray_ormas.demo import cnn, datasets

__all__ = ["cnn", "datasets"]
