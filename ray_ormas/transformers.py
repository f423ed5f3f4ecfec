"""Hugging Face Transformers on Ray, the public name: `RayOrmasTransformersCallback` (docs/adoption.md).

A `transformers.Trainer` run through `ray.train.huggingface.transformers.prepare_trainer` inside a
`RayOrmasTrainer` loop gets this callback on every rank without a line of change. Add one yourself
(`trainer.add_callback(RayOrmasTransformersCallback(...))`) to choose its options; the automatic
one is then not added.

Importing this module needs Transformers: without it, an `ImportError` says what to install
(`pip install 'ray-ormas[transformers]'`). The callback lives in
`ray_ormas._internal.worker.integrations.transformers`, on the worker side.
"""

from __future__ import annotations

from ray_ormas._internal.worker.integrations.transformers import RayOrmasTransformersCallback

__all__ = ["RayOrmasTransformersCallback"]
