"""Shared fixtures: one real local Ray cluster for the whole test session, stopped at the end;
and the tiers of the suite, as markers (docs/contributing.md):

* `ray`: the test trains on the session's Ray cluster (it uses the `ray_cluster` fixture);
* `system`: the test starts whole-system processes of its own: fresh virtual environments, a
  Ray head with `ray start`, `ray job submit`, the MLflow or S3 API server, kustomize;
* neither: the fast tier (`pytest -m "not ray and not system"`), minutes on a laptop; with
  `smoke`, one representative fit of each kind is added to it (`pytest -m "smoke or not ray and
  not system"`).

Workers import the test loops from `tests.loops`, so the repository root goes on PYTHONPATH
before Ray starts (its worker processes inherit the driver's environment). The controller's
poll interval is lowered so that back-to-back reports do not each wait 2 s. The S3 API server's
endpoint and credentials go into the environment here, before anything starts, as a user of an
S3-compatible store would set them (tests/s3_server.py); the server runs only while a test asks
for it (`s3`).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import Iterator

import pytest

from .fit_count import FitCountPlugin
from .s3_server import S3Server, quiet_port, s3_environment
from .shared_fits import (  # noqa: F401  (fixtures)
    busy_fit,
    failed_fit,
    healthy_fit,
    killed_and_repaired_fit,
    repaired_example_fit,
    watched_fit,
    worker_view_fit,
)

ROOT = Path(__file__).resolve().parent.parent
S3 = S3Server(quiet_port())  # the endpoint is in the environment from here on
os.environ.update(s3_environment(S3.port))


def pytest_configure(config: pytest.Config) -> None:
    config.pluginmanager.register(FitCountPlugin(), "ray_ormas_fit_count")


SYSTEM_FIXTURES = {"s3", "server", "clone", "ray_head", "ray_head_with_token"}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark each test by what it needs: `ray` (the session's cluster), `system` (processes of its
    own); run the modules that need neither first."""
    for item in items:
        needs = set(getattr(item, "fixturenames", ()))
        if "ray_cluster" in needs:
            item.add_marker(pytest.mark.ray)
        if needs & SYSTEM_FIXTURES:
            item.add_marker(pytest.mark.system)
    # Modules whose tests need neither go first, whole (a module's fixtures live while its tests
    # run in a row): the fresh clone's install runs in the background meanwhile (`clone_setup`).
    heavy = {
        item.nodeid.split("::")[0]
        for item in items
        if item.get_closest_marker("ray") or item.get_closest_marker("system")
    }
    items.sort(key=lambda item: item.nodeid.split("::")[0] in heavy)


@pytest.fixture(scope="session")
def s3() -> Iterator[S3Server]:
    """The S3 API server, running (a test that stops it starts it again)."""
    S3.start()
    yield S3
    S3.shutdown()


@pytest.fixture(scope="session")
def multi_node(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory, s3) -> Iterator[dict]:
    """The simulated multi-node scenarios the selected tests need, run side by side to their end
    (tests/scenario_runs.py): name -> (its run, the folder of its outcomes, its storage). What
    the node-loss scenario's lost nodes staged on this machine is removed at the end."""
    from .scenario_runs import ACTS, STRATEGIES, elastic_run, node_loss_run

    wanted = {name for item in request.session.items for name in getattr(item, "fixturenames", ())}
    before = temporary_folders()
    scenarios: dict = {}
    fits = [*(STRATEGIES if "resized" in wanted else ()), *([ACTS] if "acted" in wanted else [])]
    if fits:  # the elastic fits, then the fleet's actions, on one simulated cluster
        base = tmp_path_factory.mktemp("elastic")
        scenarios["elastic"] = (elastic_run(base, fits), base, {})
    if "lost_nodes" in wanted:
        base = tmp_path_factory.mktemp("node-loss")
        storage = {
            "evict": str(base / "evict"),
            "local": str(base / "local"),
            "s3": f"{s3.bucket()}/runs",
            "bounded": str(base / "bounded"),
        }
        scenarios["node_loss"] = (node_loss_run(base, storage), base, storage)
    for run, _, _ in scenarios.values():
        run.start()
    for run, _, _ in scenarios.values():  # before any other test uses the machine again
        run.finish()
    yield scenarios
    for run, _, _ in scenarios.values():
        run.stop()
    for name in set(temporary_folders()) - set(before):
        shutil.rmtree(Path(tempfile.gettempdir()) / name, ignore_errors=True)


@pytest.fixture(scope="session")
def ray_cluster():
    import ray

    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    os.environ.setdefault("RAY_TRAIN_HEALTH_CHECK_INTERVAL_S", "0.1")
    ctx = ray.init(num_cpus=4, include_dashboard=False, log_to_driver=True)
    yield ctx
    ray.shutdown()


@pytest.fixture(scope="session", autouse=True)
def clone_setup(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[object]:
    """The fresh clone's setup (the README demo command's venv and install), begun in the
    background before the first test when a selected test needs the clone (tests/fresh_clone.py);
    stopped at the end of the session if it is still running."""
    if not any("clone" in getattr(item, "fixturenames", ()) for item in request.session.items):
        yield None
        return
    from .fresh_clone import CloneSetup

    setup = CloneSetup(tmp_path_factory.mktemp("docs"))
    yield setup
    setup.stop()


@pytest.fixture(scope="session")
def clone(clone_setup, tmp_path_factory: pytest.TempPathFactory):
    """A fresh clone with the README's demo command run in it (tests/fresh_clone.py): once per
    session, for the docs' commands and the demo's own test (its setup begun now if no test
    named the clone at collection, e.g. one asked for it by `request.getfixturevalue`)."""
    from .fresh_clone import CloneSetup, make_clone

    return make_clone(clone_setup or CloneSetup(tmp_path_factory.mktemp("docs")))


@pytest.fixture
def staging_in_tmp_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The temp folder, for this test only, inside its own tmp_path: what a non-local store stages
    there (`RecordStore.claim_segment`) goes when the test's folders do, not into the machine's."""
    import tempfile

    staging = tmp_path / "staging"
    staging.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(staging))
    return staging


@pytest.fixture
def storage(tmp_path: Path) -> Path:
    path = tmp_path / "runs"
    path.mkdir()
    return path


def temporary_folders() -> dict[str, int]:
    """ray-ormas's folders in this machine's temp folder (every worker of the local cluster
    shares it), with their sizes in bytes."""
    import tempfile

    root = Path(tempfile.gettempdir())
    return {
        p.name: sum(f.stat().st_size for f in p.rglob("*") if f.is_file())
        for p in root.glob("ray-ormas-*")
        if p.is_dir()
    }
