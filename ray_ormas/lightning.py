"""Lightning on Ray, the public name: `RayOrmasLightningCallback` (docs/adoption.md).

A `LightningModule` trained through `ray.train.lightning` inside a `RayOrmasTrainer` loop gets
this callback on every rank without a line of change (Lightning's
`lightning.pytorch.callbacks_factory` entry point). Add one to the trainer's callbacks yourself to
choose its options (`optimizer_index`, `to_loggers`, `name`); the automatic one then stands down.

Importing this module needs Lightning: without it, an `ImportError` says what to install
(`pip install 'ray-ormas[lightning]'`). The callback lives in
`ray_ormas._internal.worker.integrations.lightning`, on the worker side.
"""

from __future__ import annotations

from ray_ormas._internal.worker.integrations.lightning import RayOrmasLightningCallback

__all__ = ["RayOrmasLightningCallback"]
