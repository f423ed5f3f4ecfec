"""Everything ray-ormas needs from Ray beyond its public API, in one place, each piece checked so
that a Ray release that changes it fails loudly (`RaySeamChanged`, saying what changed and what
to do) instead of quietly doing less. The dependency admits the Ray versions CI tests; each check
compares with what Ray 2.60 has. docs/architecture.md lists, per piece, why it exists and the
upstream change that would let it go.

* `report_seam()`: Ray Train V2's `TrainFnUtils`, through which every public `ray.train` call of
  a worker goes; zero-change adoption routes the loop's own `ray.train.report` calls through it
  (worker/report_route.py). Checked: the module, its three names, `report`'s parameters.
* `HEAD_NODE_RESOURCE`: the custom resource the head node carries, which Ray Train pins its own
  state actor with; the run ledger is pinned the same way (driver/trainer.py). Checked against
  Ray's own constant.
* `JOB_CONFIG_ENV`: the variable Ray's job supervisor sets in a submitted job's driver, which
  tells a `ray job submit` run from a local one (driver/paths.py). Checked against Ray's constant.
* `NCCL_HANG_ENV`: the variables Ray Train reads on the driver to build its NCCL hang detector
  (common/fleet_settings.py sets them). Checked against Ray Train's constants.
* `PRINT_PATCH_ENV`: the variable that switches off Ray Train's patch of `print` on workers, which
  in Ray 2.60 writes every line a worker prints twice (to the worker's stdout and through
  Ray Train's logger, both of which reach the driver's console). ray-ormas turns it off for its
  workers unless you set it (driver/trainer.py). Checked against Ray Train's constant.
* `POLL_INTERVAL_ENV`: the variable that sets how often Ray Train's controller polls its workers
  (2 s by default), which Ray propagates from the driver to the controller. A report is seen at
  one poll and the end of the loop at the next, so the final report every ray-ormas fit makes
  costs a whole poll interval at the fit's end; ray-ormas polls every 0.5 s unless you set it
  (driver/trainer.py). Checked against Ray Train's constant and its list of propagated variables.
* `hide_report_lines()`: a filter on the logger of Ray Train's worker context module that drops
  the INFO line Ray Train logs for every `ray.train.report` on every rank ("Reporting training
  result N: TrainingReport(...)", the whole metrics dict). Run on each worker unless
  `ray_report_lines` asks for them. If the logger is gone it says so once and does nothing: a
  console line is not worth a failed fit; tests/test_ray_seams.py checks it against a real fit.
* `drain_node(node_id, message, timeout_s)`: asks Ray's GCS to drain a node, as Ray's autoscaler (v2) does
  before it takes a node away, with the reason PREEMPTION: Ray schedules nothing new there (a
  restarted worker group's placement group goes to other nodes), and the node's raylet leaves the
  cluster once nothing runs on it. The `evict` action uses it (head/fleet_actions.py). Ray 2.60
  has no public call for it (the hidden `ray drain-node` command uses the same private client).
  Checked: `ray._raylet.GcsClient`, the `drain_node` of the inner client it forwards to, and the
  reason's name in Ray's autoscaler protocol.
* `controller_callback_class()` and `exclusion_selector(node_ids)`: the run-scoped `evict`
  (head/placement_callback.py). Ray Train 2.60 asks each `ControllerCallback` in
  `RunConfig.callbacks` for a label selector before it starts a worker group
  (`on_controller_start_worker_group`), and places the group's bundles only where the selector
  matches; a node's id is its `ray.io/node-id` label, and `!in(a,b)` keeps a bundle off those
  nodes. The class is not exported by `ray.train`. Checked: the module, the class, the hook's
  keyword parameters, and the label's name against `ray.util.placement_group.NODE_ID_LABEL_KEY`.
* `remote_error_line(text)`: the `Type: message` line that ends the remote traceback an
  `ActorDiedError` (or `RayTaskError`) carries as text (driver/failures.py). When a traceback ends
  without one, Ray's format changed: said once, and the whole text is used.

The checks import Ray's private modules only inside them, so importing this module costs
nothing and a worker never loads more of Ray than it uses.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import logging
import re
from typing import Any

from ray_ormas._internal.common.fleet_settings import HANG_ACTION_ENV, HANG_CONFIRM_ENV, HANG_DETECTOR_ENV
from ray_ormas._internal.common.logs import get_logger
from ray_ormas.errors import RaySeamChanged

logger = get_logger("ray_ormas.seams")

TESTED = "ray==2.60.0"
ADVICE = f"ray-ormas is tested with {TESTED}: pip install '{TESTED}', or a ray-ormas release made for this Ray"

REPORT_SEAM_MODULE = "ray.train.v2._internal.execution.train_fn_utils"
REPORT_PARAMETERS = (
    "self",
    "metrics",
    "checkpoint",
    "checkpoint_dir_name",
    "checkpoint_upload_mode",
    "delete_local_checkpoint_after_upload",
    "checkpoint_upload_fn",
    "validation",
)
HEAD_NODE_RESOURCE = "node:__internal_head__"
JOB_CONFIG_ENV = "RAY_JOB_CONFIG_JSON_ENV_VAR"
# ray-ormas's name -> (Ray Train's constants module, the constant's name there)
NCCL_HANG_ENV = {
    HANG_DETECTOR_ENV: "ENABLE_NCCL_HANG_DETECTOR_ENV_VAR",
    HANG_ACTION_ENV: "NCCL_RAS_ACTION_ENV_VAR",
    HANG_CONFIRM_ENV: "NCCL_RAS_CONFIRM_DURATION_S_ENV_VAR",
}
TRAIN_CONSTANTS_MODULE = "ray.train.v2._internal.constants"
PRINT_PATCH_ENV = "RAY_TRAIN_ENABLE_PRINT_PATCH"
POLL_INTERVAL_ENV = "RAY_TRAIN_HEALTH_CHECK_INTERVAL_S"
REPORT_LOG_MODULE = "ray.train.v2._internal.execution.context"
REPORT_LINE_PREFIX = "Reporting training result"
CONTROLLER_CALLBACK = ("ray.train.v2._internal.execution.callback", "ControllerCallback")
GROUP_START_HOOK = ("on_controller_start_worker_group", ("self", "scaling_config", "num_workers"))
NODE_ID_LABEL = "ray.io/node-id"
DRAIN_CLIENT = ("ray._raylet", "GcsClient", "InnerGcsClient", "drain_node")  # GcsClient forwards to the inner one
DRAIN_REASONS = ("ray.core.generated.autoscaler_pb2", "DrainNodeReason", "DRAIN_NODE_REASON_PREEMPTION")
_EXCEPTION_LINE = re.compile(r"^([A-Za-z_][\w.]*(?:Error|Exception|Invalid|Exit|Interrupt|Failure)\w*)(: .*)?$")


def changed(piece: str, what: str) -> RaySeamChanged:
    """The error for a changed piece of Ray: what ray-ormas uses it for, what changed, what to do."""
    import ray

    return RaySeamChanged(f"ray-ormas {piece}, and the installed Ray {ray.__version__} changed it ({what}). {ADVICE}")


def report_seam() -> Any:
    """Ray Train's `train_fn_utils` module, or `RaySeamChanged` saying what differs from Ray 2.60."""
    piece = "routes a loop's own ray.train.report calls through Ray Train's TrainFnUtils"
    try:
        module = importlib.import_module(REPORT_SEAM_MODULE)
    except ImportError as e:
        raise changed(piece, f"{REPORT_SEAM_MODULE} cannot be imported: {e}") from None
    for name in ("get_train_fn_utils", "set_train_fn_utils", "TrainFnUtils"):
        if not hasattr(module, name):
            raise changed(piece, f"{REPORT_SEAM_MODULE}.{name} is gone")
    got = tuple(inspect.signature(module.TrainFnUtils.report).parameters)
    if got != REPORT_PARAMETERS:
        raise changed(piece, f"TrainFnUtils.report takes {got}, not {REPORT_PARAMETERS}")
    return module


def _ray_constant(module: str, name: str, piece: str) -> Any:
    try:
        return getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as e:
        raise changed(piece, f"{module}.{name} is gone: {e}") from None


def _same_as_rays(ours: str, module: str, name: str, piece: str, what: str) -> str:
    """`ours`, checked to be the value of Ray's own constant `module.name`."""
    theirs = _ray_constant(module, name, piece)
    if theirs != ours:
        raise changed(piece, f"{what} {theirs!r}, not {ours!r}")
    return ours


@functools.cache
def head_node_resource() -> str:
    """The head node's custom resource, checked against Ray's own name for it."""
    piece = "keeps the run ledger on the head node with the resource Ray Train pins its state actor with"
    return _same_as_rays(
        HEAD_NODE_RESOURCE, "ray._common.constants", "HEAD_NODE_RESOURCE_NAME", piece, "the head node's resource is"
    )


@functools.cache
def job_config_env() -> str:
    """The variable Ray's job supervisor sets in a submitted job, checked against Ray's name for it."""
    piece = "tells a `ray job submit` driver from a local one by the variable Ray's job supervisor sets"
    return _same_as_rays(
        JOB_CONFIG_ENV,
        "ray._private.runtime_env.constants",
        "RAY_JOB_CONFIG_JSON_ENV_VAR",
        piece,
        "the job supervisor sets",
    )


@functools.cache
def check_nccl_hang_env() -> None:
    """The NCCL hang detector's variables, checked against Ray Train's names for them."""
    piece = "switches on Ray Train's NCCL hang detector through the variables Ray Train reads on the driver"
    for ours, constant in NCCL_HANG_ENV.items():
        _same_as_rays(ours, TRAIN_CONSTANTS_MODULE, constant, piece, "Ray Train reads")


@functools.cache
def print_patch_env() -> str:
    """The variable that switches Ray Train's print patch on workers, checked against Ray Train's name."""
    piece = "keeps each line a worker prints to one copy by switching off Ray Train's print patch"
    return _same_as_rays(
        PRINT_PATCH_ENV, TRAIN_CONSTANTS_MODULE, "ENABLE_PRINT_PATCH_ENV_VAR", piece, "Ray Train reads"
    )


@functools.cache
def poll_interval_env() -> str:
    """The variable that sets the controller's poll interval, checked against Ray Train's name for
    it and its list of the variables the driver propagates to the controller."""
    piece = "ends a fit one poll sooner by setting how often Ray Train's controller polls its workers"
    name = _same_as_rays(
        POLL_INTERVAL_ENV, TRAIN_CONSTANTS_MODULE, "HEALTH_CHECK_INTERVAL_S_ENV_VAR", piece, "Ray Train reads"
    )
    if name not in _ray_constant(TRAIN_CONSTANTS_MODULE, "ENV_VARS_TO_PROPAGATE", piece):
        raise changed(piece, f"Ray Train no longer propagates {name} from the driver to the controller")
    return name


@functools.cache
def _drain_pieces() -> tuple[Any, int]:
    """Ray's GCS client class and the PREEMPTION drain reason's value, checked."""
    piece = "evicts a node by asking Ray's GCS to drain it, as Ray's autoscaler does"
    module, client_name, inner_name, method = DRAIN_CLIENT
    client = _ray_constant(module, client_name, piece)
    if not callable(getattr(_ray_constant(module, inner_name, piece), method, None)):
        raise changed(piece, f"{module}.{inner_name}.{method}, which {client_name} forwards to, is gone")
    reasons_module, enum, reason = DRAIN_REASONS
    reasons = _ray_constant(reasons_module, enum, piece)
    try:
        value = int(reasons.Value(reason))
    except (AttributeError, ValueError) as e:
        raise changed(piece, f"{reasons_module}.{enum} has no {reason}: {e}") from None
    return client, value


def check_drain_seam() -> None:
    """The pieces `drain_node` uses, checked against the installed Ray (`RaySeamChanged` if not)."""
    _drain_pieces()


def drain_node(node_id: str, message: str, timeout_s: float) -> str | None:
    """Drain node `node_id` (hex) as a preemption, with no deadline for the node; None when Ray
    accepted it, else Ray's reason for refusing. The GCS has `timeout_s` to answer (the RPC's own
    timeout). Raises `RaySeamChanged` when Ray's pieces for it changed."""
    import ray

    client_class, reason = _drain_pieces()
    client = client_class(address=ray.get_runtime_context().gcs_address)
    accepted, rejection = client.drain_node(node_id, reason, message, 0, timeout=timeout_s)
    return None if accepted else str(rejection or "refused without a reason")


@functools.cache
def controller_callback_class() -> type:
    """Ray Train's `ControllerCallback`, checked to ask for a label selector before each worker
    group starts (`RaySeamChanged` if not)."""
    piece = "keeps a run's later worker groups off an evicted node with a label selector on the group's placement"
    module, name = CONTROLLER_CALLBACK
    cls = _ray_constant(module, name, piece)
    hook, parameters = GROUP_START_HOOK
    method = getattr(cls, hook, None)
    if not callable(method):
        raise changed(piece, f"{module}.{name}.{hook} is gone")
    got = tuple(inspect.signature(method).parameters)
    if got != parameters:
        raise changed(piece, f"{name}.{hook} takes {got}, not {parameters}")
    _same_as_rays(NODE_ID_LABEL, "ray.util.placement_group", "NODE_ID_LABEL_KEY", piece, "a node's id label is")
    return cls


def exclusion_selector(node_ids: list[str]) -> dict[str, str]:
    """The label selector that keeps a bundle off every node in `node_ids` (hex ids)."""
    return {NODE_ID_LABEL: f"!in({','.join(sorted(node_ids))})"}  # no spaces: Ray matches each value as written


class _ReportLineFilter(logging.Filter):
    """Drops Ray Train's INFO line per report; every warning and error passes."""

    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno > logging.INFO or not str(record.msg).startswith(REPORT_LINE_PREFIX)


def hide_report_lines() -> bool:
    """Keep Ray Train's per-report INFO line out of this worker's console. False (said once) when
    Ray's logger for it is gone; nothing else changes then."""
    try:
        found = getattr(importlib.import_module(REPORT_LOG_MODULE), "logger", None)
    except ImportError:
        found = None
    if not isinstance(found, logging.Logger):
        _say_once(
            f"Ray Train's per-report log line cannot be hidden: {REPORT_LOG_MODULE}.logger is gone, so each "
            f"ray.train.report shows its metrics on every rank. {ADVICE}"
        )
        return False
    if not any(isinstance(f, _ReportLineFilter) for f in found.filters):
        found.addFilter(_ReportLineFilter())
    return True


@functools.cache
def _say_once(message: str) -> None:
    logger.warning(message)


def remote_error_line(text: str) -> str | None:
    """The last `Type: message` line of a remote traceback in `text` (what an `ActorDiedError`
    carries for an actor whose constructor raised); None when `text` holds no traceback. A
    traceback without such a line means Ray's format changed: said once, and None."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    if len(lines) < 2 or not any(line.startswith(("File ", "Traceback")) for line in lines):
        return None
    for line in reversed(lines):
        if _EXCEPTION_LINE.match(line):
            return line
    _say_format_changed()
    return None


@functools.cache
def _say_format_changed() -> None:
    logger.warning(
        "a remote traceback from Ray ends without a `Type: message` line: Ray's error text changed, so failures "
        "are shown whole. %s",
        ADVICE,
    )
