"""RayOrmasTrainer: Ray Train's `TorchTrainer` with an ormas-monitor on every rank (driver side).

    trainer = RayOrmasTrainer(train_loop, train_loop_config={"lr": 1e-3}, repair=True, check_every=20,
                              scaling_config=ScalingConfig(num_workers=2), run_config=RunConfig(name="digits"))
    result = trainer.fit()           # a ray.train.Result, plus result.ormas
    result.ormas.record_dir          # rank 0's record: diary.jsonl, metrics.jsonl, report.html, ...

Everything that can be checked without a worker is checked in `__init__`, on the driver, before
Ray starts anything (driver/arguments.py): the strategy, every monitor option (ormas-monitor's
own `MonitorConfig` validates the thresholds), `repair` with FSDP, SyncBatchNorm without GPUs, a
global batch that does not split over the workers, the scaling and run configs, the loop's
signature, and that the record's storage can be written (record/store.py). `fit()` ends through
one function, whether the training succeeded or failed (driver/wind_down.py).

Hooks relied on (Ray Train V2):

* `TorchTrainer(train_loop_per_worker, ...)`: runs our wrapper of the user's loop (worker/session.py).
* `RunConfig.callbacks`: a controller-side `UserCallback` (head/ledger.py) receives every report's
  per-rank metrics; the trainer adds it to the user's callbacks, which stay as they were. When
  an alarm can act and an evict is the run's (`FleetSettings.evict_scope="run"`), a
  `ControllerCallback` too (head/placement_callback.py): it keeps later worker groups off the
  nodes the run evicted.
* `RunConfig.name`, `storage_path`, `storage_filesystem`: the record's place, known before launch
  (Ray's RunConfig always sets a name). A local storage path (and `record_dir`) is resolved to
  an absolute one here (driver/paths.py): Ray's controller refuses relative ones only after it started.
* `Result`: `fit()` returns a subclass of Ray's `Result` with every field as Ray set it and one
  more, `ormas` (an `OrmasRun`: where the record is, the reports, the fleet view).
"""

from __future__ import annotations

import contextlib
import dataclasses
import difflib
import functools
import inspect
import os
import time
import uuid
from typing import Any, Callable, Iterator, Sequence

import ray
from ormas_monitor import MonitorConfig
from ray.train import Checkpoint, DataConfig, Result, RunConfig, ScalingConfig, ValidationConfig
from ray.train.torch import TorchConfig, TorchTrainer
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from ray_ormas._internal.common import keys
from ray_ormas._internal.common.fleet_settings import FleetSettings
from ray_ormas._internal.common.logs import get_logger
from ray_ormas._internal.common.mlflow_settings import MLflowSettings
from ray_ormas._internal.common.preflight_settings import PreflightSettings
from ray_ormas._internal.common.settings import (
    DEFAULT_SYNC_TIMEOUT_S,
    BatchSize,
    MonitorSettings,
    RepairMode,
)
from ray_ormas._internal.driver.arguments import check_arguments, local_run_dir
from ray_ormas._internal.driver.capacity import check_capacity, lone_node_eviction, per_worker
from ray_ormas._internal.driver.continuation import Continuation, find_continuation
from ray_ormas._internal.driver.failures import fleet_stop
from ray_ormas._internal.driver.result import OrmasRun, RayOrmasResult
from ray_ormas._internal.driver.wind_down import Ending, Status, WoundDown, close_goodput, wind_down
from ray_ormas._internal.head.fleet_head import FleetSpec
from ray_ormas._internal.head.goodput_keeper import GoodputSpec
from ray_ormas._internal.head.ledger import LedgerSnapshot, RunLedger
from ray_ormas._internal.head.ledger_callback import LedgerCallback
from ray_ormas._internal.head.mlflow_writer import WriterSpec
from ray_ormas._internal.head.placement_callback import node_exclusion_callback
from ray_ormas._internal.record.goodput import GoodputAccount
from ray_ormas._internal.record.layout import DEFAULT_MONITOR_NAME, REPORT
from ray_ormas._internal.record.run_facts import run_facts, state_at_end, whole_run_counts
from ray_ormas._internal.record.store import RecordStore
from ray_ormas._internal.seams.ray_train import (
    check_nccl_hang_env,
    head_node_resource,
    poll_interval_env,
    print_patch_env,
)
from ray_ormas._internal.tracking.values import absolute_store_uri, mlflow_environment, mlflow_host_idle_s
from ray_ormas._internal.worker.loop import wrap_train_loop
from ray_ormas._internal.worker.plan import WorkerPlan
from ray_ormas.errors import OptionError, OptionTypeError, RaySeamChanged

POLL_INTERVAL_S = 0.5  # Ray Train's controller polls its workers this often in a ray-ormas fit (Ray's default: 2 s)

logger = get_logger("ray_ormas.trainer")


class RayOrmasTrainer:
    """Train with Ray Train's TorchTrainer, an ormas-monitor on every rank.

    Args:
        train_loop_per_worker: the training loop, `fn()` or `fn(config)`. Inside it,
            `ray_ormas.prepare_model`, `ray_ormas.monitor` and `mon.step(loss)`.
        train_loop_config: passed to the loop (a dict).
        monitor: the monitor's settings as one object, a `ray_ormas.MonitorSettings` (repair,
            check_every, thresholds, layers, what rank 0 prints, report cadence, sync timeout,
            zero-change mode; the YAML's `monitor:` section). `repair=` and `check_every=` are
            shortcuts beside it for a field it leaves at its default; a field given both ways is
            an `OptionError`. With `monitor=`, the flat keywords below it are refused.
        repair: False (watch only), True, or "all" (see ormas-monitor); refused with FSDP.
        check_every: steps between checks (overrides `monitor_config.check_every`).
        monitor_config, layers, verbose, progress, ray_report_lines, report_every, sync_timeout_s,
        auto_monitor: the fields of `MonitorSettings` as flat keywords (without `monitor=`):
            `monitor_config` an `ormas_monitor.MonitorConfig` with every threshold; `layers`
            fnmatch pattern(s) of the layers to monitor; `verbose` rank 0 prints the monitor's
            events; `progress` one line per check; `ray_report_lines` Ray Train's own line for
            every report (docs/cli.md, "What the console shows"); `report_every` also report every
            this many checks (a barrier each time); `sync_timeout_s` how long ranks wait for each
            other at a ray-ormas report; `auto_monitor` zero-change mode (docs/adoption.md): a
            monitor on each model an optimizer steps, ormas-monitor's callback on a Lightning or
            Transformers trainer; `ray_ormas.monitor(...)` in the loop wins.
        record_dir: where the record persists, a local path or a URI pyarrow can open. Default:
            `<storage_path>/<name>/ormas` on the run's storage (`storage_filesystem` included),
            beside Ray's checkpoints. Checked for writing here, before anything starts.
        strategy: "ddp" (DistributedDataParallel) or "fsdp" (FSDP2 `fully_shard`, on CPU and GPU);
            see worker/strategies.py and docs/strategies.md.
        sync_batchnorm: convert BatchNorm layers to SyncBatchNorm before DDP wraps the model
            (needs GPU workers: torch refuses SyncBatchNorm on CPU).
        batch: a `ray_ormas.BatchSize` saying whether the batch size is per rank or global (and
            the accumulation steps); checked here against num_workers, read in the loop with
            `ray_ormas.batch_size()`, the effective batch recorded.
        mlflow: True (default: track in MLflow with `MLflowSettings()`: `MLFLOW_TRACKING_URI`, else
            an embedded store in the run directory), an `MLflowSettings`, or False (no tracking).
        fleet: True (default: fleet health with `FleetSettings()` when there is more than one
            worker), a `FleetSettings`, or False: every rank's timings, loss, non-finite values and
            parameter digest at every check, stragglers, divergence and non-finite values named
            (docs/fleet-health.md).
        scaling_config, run_config, torch_config, datasets, dataset_config, validation_config,
        metadata, resume_from_checkpoint: as for `TorchTrainer`, passed to it unchanged, and
            checked by it here (Ray Train V2 refuses metadata and resume_from_checkpoint). With
            `ScalingConfig(num_workers=0)` (Ray Train's local mode) the loop runs in this process
            with the monitor, for debugging. With an elastic `num_workers=(min, max)` Ray Train
            restarts the worker group at another size as nodes come and go; each attempt is a
            segment of the record with its world size, and a global batch is split again at each
            size (docs/elastic.md).
    """

    def __init__(
        self,
        train_loop_per_worker: Callable[..., Any],
        *,
        train_loop_config: dict[str, Any] | None = None,
        monitor: MonitorSettings | None = None,
        repair: RepairMode = False,
        check_every: int | None = None,
        monitor_config: MonitorConfig | None = None,
        layers: str | Sequence[str] | None = None,
        verbose: bool = True,
        progress: bool = True,
        ray_report_lines: bool = False,
        report_every: int | None = None,
        sync_timeout_s: float = DEFAULT_SYNC_TIMEOUT_S,
        auto_monitor: bool = True,
        record_dir: str | os.PathLike | None = None,
        strategy: str = "ddp",
        sync_batchnorm: bool = False,
        batch: BatchSize | None = None,
        mlflow: MLflowSettings | bool = True,
        fleet: FleetSettings | bool = True,
        scaling_config: ScalingConfig | None = None,
        run_config: RunConfig | None = None,
        torch_config: TorchConfig | None = None,
        datasets: dict[str, Any] | None = None,
        dataset_config: DataConfig | None = None,
        validation_config: ValidationConfig | None = None,
        metadata: dict[str, Any] | None = None,
        resume_from_checkpoint: Checkpoint | None = None,
        **unknown: Any,
    ) -> None:
        if unknown:
            raise OptionTypeError(_unknown_options(unknown))
        passed_through = {
            "dataset_config": dataset_config,
            "validation_config": validation_config,
            "metadata": metadata,
            "resume_from_checkpoint": resume_from_checkpoint,
        }
        checked = check_arguments(
            train_loop_per_worker,
            train_loop_config=train_loop_config,
            monitor=monitor,
            monitor_options={
                "repair": repair,
                "check_every": check_every,
                "monitor_config": monitor_config,
                "layers": layers,
                "verbose": verbose,
                "report_every": report_every,
                "sync_timeout_s": sync_timeout_s,
                "progress": progress,
                "auto_monitor": auto_monitor,
                "ray_report_lines": ray_report_lines,
            },
            strategy=strategy,
            scaling_config=scaling_config,
            run_config=run_config,
            record_dir=record_dir,
            sync_batchnorm=sync_batchnorm,
            batch=batch,
            mlflow=mlflow,
            fleet=fleet,
            torch_trainer_arguments={"torch_config": torch_config, "datasets": datasets, **passed_through},
        )
        self.strategy = checked.strategy
        self.settings = checked.settings
        self.scaling_config = checked.scaling_config
        self.elastic = checked.elastic
        self.world_size = checked.world_size
        self.sync_batchnorm = checked.sync_batchnorm
        self.batches = checked.batches
        self.run_config = checked.run_config
        self.store = checked.store
        self.mlflow = checked.mlflow
        self.fleet = checked.fleet
        self.frameworks = checked.frameworks
        self.train_loop_per_worker = train_loop_per_worker
        self.train_loop_config = train_loop_config
        self.torch_config = torch_config
        self.datasets = datasets
        self.passed_through = passed_through
        self._continuation: Continuation | None = None
        self._continuation_said = False

    def fit(self) -> RayOrmasResult:
        """Run the training; return Ray's Result with `.ormas` added.

        On failure, raises exactly what `TorchTrainer.fit()` raises (for an error in the loop, a
        `ray.train.TrainingFailedError` whose `worker_failures` hold the loop's own exception,
        unchanged), after printing where the record of the failed run is.
        """
        called = time.time()  # the goodput account's start (head/goodput_keeper.py)
        continuation = self._announce_continuation()
        started_here = not ray.is_initialized()
        if started_here:
            ray.init()
            shortfall = check_capacity(self.scaling_config)
            if shortfall is not None:  # a cluster started here never grows: Ray Train would wait forever
                ray.shutdown()
                raise OptionError(
                    f"{shortfall}. (fit() started this Ray cluster on this machine, so it cannot "
                    f"grow; on a cluster with an autoscaler, call ray.init(address=...) first)"
                )
        lone = lone_node_eviction(self.fleet)
        if lone is not None and started_here:  # it never gains a node to evict
            ray.shutdown()
            raise OptionError(f"{lone}. (fit() started this Ray cluster on this machine, so it cannot grow)")
        if lone is not None:
            logger.warning("%s, unless the cluster grows (an autoscaler) before an alarm", lone)
        fit_id = uuid.uuid4().hex
        tracking = self._tracking_spec(fit_id)
        local = self.scaling_config.num_workers == 0
        fleet = (
            None
            if self.fleet is None
            else FleetSpec(
                self.fleet,
                self.store,
                fit_id,
                self.run_config.name,
                self.world_size,
                self.strategy,
                self.elastic,
                driver_node=ray.get_runtime_context().get_node_id(),
                worker_need=per_worker(self.scaling_config),
                min_workers=int(self.scaling_config.min_workers),
            )
        )
        goodput = GoodputSpec(fit_id, self.store, self.run_config.name, called)
        ledger = RunLedger.options(num_cpus=0, **_on_head_node()).remote(tracking, fleet, goodput)
        acts = self.fleet is not None and self.fleet.acts
        callback = LedgerCallback(ledger, tracking is not None, acts)
        # A run-scoped evict keeps the run's later worker groups off the evicted nodes.
        run_scoped = self.fleet is not None and self.fleet.acts and self.fleet.evict_scope == "run"
        placement = [node_exclusion_callback(ledger)] if run_scoped else []
        plan = WorkerPlan(
            settings=self.settings,
            strategy=self.strategy,
            store=self.store,
            run_name=self.run_config.name,
            fit_id=fit_id,
            ledger=ledger,
            tracked=tracking is not None,
            fleet=fleet is not None,
            fleet_acts=acts,
            sync_batchnorm=self.sync_batchnorm,
            batches=self.batches,
            local_reports=callback if local else None,
            frameworks=self.frameworks,
            preflight=_screen_of(self.fleet, local),
        )
        run_config = dataclasses.replace(
            self.run_config,
            callbacks=[*(self.run_config.callbacks or []), callback, *placement],
            worker_runtime_env=_print_once(self.run_config.worker_runtime_env),
        )
        trainer = TorchTrainer(
            wrap_train_loop(self.train_loop_per_worker, plan),
            train_loop_config=self.train_loop_config or {},
            torch_config=self.torch_config,
            scaling_config=self.scaling_config,
            run_config=run_config,
            datasets=self.datasets,
            **self.passed_through,
        )
        try:
            hang_env = self.fleet.hang_detector_env() if self.fleet is not None else {}
            if hang_env:
                check_nccl_hang_env()  # the names Ray Train reads, checked (seams/ray_train.py)
            with _environment({**_poll_interval(), **hang_env}):
                result = trainer.fit()
        except BaseException as e:
            # Ray's own SIGINT handler aborts the run and leaves fit() with SystemExit.
            interrupted = isinstance(e, (KeyboardInterrupt, SystemExit))
            if local and not interrupted:  # the loop's own error, raised here unchanged: tell the ledger
                with contextlib.suppress(Exception):
                    ray.get(callback.forward_exception({0: e}), timeout=60)
            with contextlib.suppress(Exception):  # the training error propagates as it is, whatever happens here
                status: Status = "KILLED" if interrupted else "FAILED"
                wind_down(ledger, self.store, self.mlflow, Ending(status, error=e))
                _say_goodput(close_goodput(ledger, status))
            stop = fleet_stop(e)
            if stop is not None:  # an alarm's `stop`: the package's own error, once the record is closed
                raise stop from e
            raise
        else:
            checkpoint = result.checkpoint.path if result.checkpoint else None
            ended = wind_down(ledger, self.store, self.mlflow, Ending("FINISHED", checkpoint=checkpoint))
            ended = dataclasses.replace(ended, goodput=close_goodput(ledger, "FINISHED") or ended.goodput)
            _say_goodput(ended.goodput)
        finally:
            ray.kill(ledger, no_restart=True)
        return self._result(result, ended, continuation)

    def _result(self, result: Result, ended: WoundDown, continuation: Continuation | None) -> RayOrmasResult:
        """Ray's Result, every field as Ray set it, and `ormas` (an OrmasRun) from the fit's end."""
        fields = {f.name: getattr(result, f.name) for f in dataclasses.fields(Result) if f.init}
        run = dataclasses.replace(
            _ormas_run(ended.snapshot, self.store),
            fleet=ended.fleet,
            not_uploaded=ended.not_uploaded,
            run_page=ended.run_page,
            goodput=ended.goodput,
        )
        if continuation is not None and _trained_nothing(ended.snapshot):
            logger.warning("%s", continuation.nothing_trained())
        if ended.tracking is not None:
            run = dataclasses.replace(
                run,
                mlflow_run_id=ended.tracking.run_id,
                tracking_uri=ended.tracking.tracking_uri,
                mlflow_complete=ended.tracking.complete,
            )
        return RayOrmasResult(**fields, ormas=run)

    def _announce_continuation(self) -> Continuation | None:
        """Say, once and before Ray starts, when this fit continues an existing run (driver/continuation.py)."""
        if not self._continuation_said:
            self._continuation_said = True
            try:
                self._continuation = find_continuation(self.run_config, self.store)
            except Exception as e:  # a note only: never in the way of the fit
                logger.debug("could not tell whether the run exists (%s: %s)", type(e).__name__, e)
            if self._continuation is not None:
                logger.warning("%s", self._continuation.line())
        return self._continuation

    def _tracking_spec(self, fit_id: str) -> WriterSpec | None:
        """What the ledger's MLflow writer needs (None when tracking is off). Nothing here talks to
        MLflow: the writer on the head node does, once training has started."""
        if self.mlflow is None:
            return None
        rc = self.run_config
        sc = self.scaling_config
        params = {
            "train_loop_config": self.train_loop_config or {},
            "monitor": self.settings.to_dict(),
            "strategy": self.strategy,
            "sync_batchnorm": self.sync_batchnorm,
            "batch": _batch_params(self.batches),
            "scaling": {
                "num_workers": list(sc.num_workers) if isinstance(sc.num_workers, tuple) else sc.num_workers,
                "use_gpu": sc.use_gpu,
                "resources_per_worker": sc.resources_per_worker or {},
            },
            "ray_run_name": rc.name,
        }
        uri = absolute_store_uri(self.mlflow.tracking_uri or os.environ.get("MLFLOW_TRACKING_URI"))
        settings = dataclasses.replace(self.mlflow, tracking_uri=uri)
        return WriterSpec(
            settings=settings,
            store=self.store,
            fit_id=fit_id,
            run_name=rc.name,
            params=params,
            run_dir=local_run_dir(self.run_config),
            environment=mlflow_environment(),
            host_idle_s=mlflow_host_idle_s(),
        )


def _batch_params(batches: dict[int, dict[str, Any]] | None) -> dict[str, Any]:
    """The MLflow run's `batch.*` params: the batch as given; per rank and effective at the one
    size of a fixed fit, or for each size of an elastic range (`per_rank.<workers>`, ...)."""
    if not batches:
        return {}
    if len(batches) == 1:
        return next(iter(batches.values()))
    first = next(iter(batches.values()))
    return {
        **{k: first[k] for k in ("size", "per", "accumulation")},
        "per_rank": {str(w): s["per_rank"] for w, s in batches.items()},
        "effective": {str(w): s["effective"] for w, s in batches.items()},
    }


@contextlib.contextmanager
def _environment(env: dict[str, str]) -> Iterator[None]:
    """Set `env` on the driver for the duration (Ray Train reads its feature flags there); a
    variable the user already set is left as it is."""
    added = {k: v for k, v in env.items() if k not in os.environ}
    os.environ.update(added)
    try:
        yield
    finally:
        for k in added:
            os.environ.pop(k, None)


def _poll_interval() -> dict[str, str]:
    """Ray Train's controller poll interval for this fit (seams/ray_train.py): every fit ends with
    ray-ormas's final report, which the controller sees one poll before the loop's end, so at
    Ray's default of 2 s the fit's end waits a whole interval more than a plain one. A value the
    user set wins (`_environment` leaves it). If Ray renamed the variable, that is said (once) and
    the fit polls at Ray's default."""
    try:
        return {poll_interval_env(): str(POLL_INTERVAL_S)}
    except RaySeamChanged as e:  # a faster end is not worth a failed fit
        _say_once(str(e))
        return {}


def _print_once(worker_runtime_env: Any) -> Any:
    """The workers' runtime environment with Ray Train's print patch off (seams/ray_train.py): in
    Ray 2.60 it writes every line a worker prints to the console twice. A value the user set, in
    `RunConfig(worker_runtime_env=...)` or in the driver's environment, is left as it is. If Ray
    renamed the variable, that is said (once) and the workers print as Ray makes them."""
    try:
        name = print_patch_env()
    except RaySeamChanged as e:  # a console nicety is not worth a failed fit
        _say_once(str(e))
        return worker_runtime_env
    env = dict(worker_runtime_env or {})
    env_vars = dict(env.get("env_vars") or {})
    if name in env_vars or name in os.environ:
        return worker_runtime_env
    env["env_vars"] = {**env_vars, name: "0"}
    return env


def _say_goodput(account: GoodputAccount | None) -> None:
    """The fit's goodput in one console line (docs/goodput.md)."""
    if account is not None:
        logger.info("%s", account.line())


@functools.cache
def _say_once(message: str) -> None:
    logger.warning("%s", message)


def _on_head_node() -> dict[str, Any]:
    """Actor options that keep the ledger on the head node (as Ray Train keeps its own state
    actor), so that losing a worker node never takes it along; else near the driver. An explicit
    strategy either way: a fit inside a Ray Tune trial runs in the trial's placement group, which
    would otherwise capture the ledger, and the head node's resource fits none of its bundles."""
    head = head_node_resource()  # Ray's own name for it, checked (seams/ray_train.py)
    if head in ray.cluster_resources():
        return {"resources": {head: 0.001}, "scheduling_strategy": "DEFAULT"}
    return {"scheduling_strategy": NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=True)}


def _trained_nothing(snapshot: LedgerSnapshot) -> bool:
    """The fit's last attempt made no optimizer step on any rank (its final report says so)."""
    steps = snapshot.final.get(keys.STEPS_PER_RANK)
    return isinstance(steps, list) and bool(steps) and not any(steps)


def _ormas_run(snapshot: LedgerSnapshot, store: RecordStore) -> OrmasRun:
    final = snapshot.final
    records = dict(snapshot.records)
    main = records.get(DEFAULT_MONITOR_NAME, next(iter(records.values()), None))
    record_dir = store.local_path(main) if main is not None else None
    report = record_dir / REPORT if record_dir is not None and final.get(keys.PREFIX + keys.REPORT_PATH) else None
    segments: list[dict[str, Any]] = []
    try:  # the whole run's counts (every attempt, every fit of the run) and its state at the end
        final.update(state_at_end(store))
        final.update(whole_run_counts(store))
        segments = [seg.row() for monitor in store.monitors() for seg in run_facts(store, monitor).segments]
    except Exception as e:  # storage unreadable at the very end: the last report's own figures stand
        logger.warning(
            "the record at %s could not be read back for the whole run's counts (%s: %s); "
            "result.ormas.final holds the last attempt's",
            store.shown(),
            type(e).__name__,
            e,
        )
    return OrmasRun(
        store=store,
        records=records,
        record_dir=record_dir,
        report=report,
        final=final,
        segments=segments,
        reports=snapshot.reports,
        worker_errors=snapshot.exceptions,
    )


def _unknown_options(unknown: dict[str, Any]) -> str:
    options = [
        p.name for p in inspect.signature(RayOrmasTrainer.__init__).parameters.values() if p.kind is p.KEYWORD_ONLY
    ]
    parts = []
    for name in unknown:
        close = difflib.get_close_matches(name, options, n=1)
        parts.append(f"{name!r}" + (f" (did you mean {close[0]!r}?)" if close else ""))
    return (
        f"RayOrmasTrainer got unknown option(s) {', '.join(parts)}. Options: {', '.join(options)}; the "
        f"monitor's thresholds go in monitor_config=ormas_monitor.MonitorConfig(...)"
    )


def _screen_of(fleet: FleetSettings | None, local: bool) -> PreflightSettings | None:
    """The pre-flight screen the workers run before their first step (None: none: fleet health
    off, the screen off, or Ray Train's local mode, where the loop runs in the driver)."""
    if fleet is None or not fleet.preflight.enabled or local:
        return None
    return fleet.preflight
