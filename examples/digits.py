"""Model and data factories for `ray-ormas train examples/digits_watch.yaml` (and _repair.yaml).

scikit-learn's bundled 8x8 digits (no download) and the demo's CNN, optionally with conv2 and
conv3 zeroed: two dead layers for the monitor to find (watch) and heal (repair).
"""
from __future__ import annotations

from torch.utils.data import TensorDataset

from ray_ormas.demo import DigitsCNN, lesion, load_digits


def cnn(lesioned: bool = False) -> DigitsCNN:
    net = DigitsCNN()
    if lesioned:
        lesion(net)
    return net


def datasets(seed: int = 0) -> dict[str, TensorDataset]:
    x_train, y_train, x_test, y_test = load_digits(seed)
    return {"train": TensorDataset(x_train, y_train), "val": TensorDataset(x_test, y_test)}
