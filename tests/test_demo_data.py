"""The demo's digits (ray_ormas.demo.load_digits): scikit-learn's bundled images, read back from a
NumPy copy in the temp folder after the first load, identical either way."""

from __future__ import annotations

import tempfile

import torch

from ray_ormas.demo import load_digits


def test_the_digits_are_sklearns_whether_built_or_read_back(tmp_path, monkeypatch):
    from sklearn.datasets import load_digits as sklearn_digits

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    built = load_digits(0)
    [cached] = (tmp_path / "ray_ormas_cache").glob("digits-sklearn-*.npz")
    again = load_digits(0)
    assert all(torch.equal(a, b) for a, b in zip(built, again))
    d = sklearn_digits()
    x = torch.tensor(d.images, dtype=torch.float32).unsqueeze(1) / 16.0
    assert torch.equal(torch.cat([built[0], built[2]]).sort(0).values, x.sort(0).values)
    assert built[0].shape == (1438, 1, 8, 8) and built[2].shape == (359, 1, 8, 8)
    for damaged in (b"damaged", cached.read_bytes()[:200]):  # a broken copy is built again, never read
        cached.write_bytes(damaged)
        assert all(torch.equal(a, b) for a, b in zip(built, load_digits(0)))
