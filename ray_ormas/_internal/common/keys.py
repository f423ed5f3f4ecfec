"""The `ormas/...` keys ray-ormas adds to every `ray.train.report` and to the fit's MLflow run.

Run-wide keys are whole names; a monitor's keys come after its prefix (`monitor_prefix`): the
main (first) monitor's are `ormas/<key>`, another monitor's `ormas/<name>/<key>`. ormas-monitor's
own counts (`alarms`, `repairs`, `channels_repaired`, ...) are added under the same prefix, with
its names. Plain Python; every process uses them.
"""

from __future__ import annotations

PREFIX = "ormas/"  # every key ray-ormas adds starts so; a loop's own metric may not

# Run-wide, in every report of every rank.
RANK = "ormas/rank"
WORLD_SIZE = "ormas/world_size"
REPORT_INDEX = "ormas/report_index"
KIND = "ormas/kind"  # "user", "periodic" or "final"
RUN_STEP = "ormas/run_step"
EFFECTIVE_BATCH = "ormas/effective_batch"
STEPS_PER_RANK = "ormas/steps_per_rank"  # the final report only
# MLflow metrics the head node's writer adds.
ATTEMPT = "ormas/attempt"
CHECKPOINT = "ormas/checkpoint"

# A monitor's keys, after its prefix. Every rank:
RANK_LOSS = "rank_loss"
RANK_STEPS = "rank_steps"
PARAM_DIGEST = "param_digest"
REPORT_ERROR = "report_error"
# Rank 0 only: from its record.
CHECK_STEP = "check_step"
LOSS = "loss"
STUCK_CHANNELS = "stuck_channels"
STUCK_LAYERS = "stuck_layers"
CERTIFICATES = "certificates"
NEW_EVENTS = "new_events"  # events the record gained since the last report (the events: in the record)
CHECKS = "checks"
RECORD_DIR = "record_dir"
REPORT_PATH = "report_path"
STEP_OFFSET = "step_offset"
# The driver's `result.ormas.final` and the MLflow run's end only: the run's segments so far.
SEGMENTS = "segments"
RECORD_ERRORS = "record_errors"
# ormas-monitor's counts that the docs and the summary name.
ALARMS = "alarms"
CHANNELS_REPAIRED = "channels_repaired"


def monitor_prefix(name: str, primary: bool) -> str:
    """The prefix of a monitor's keys: `ormas/` for the main monitor, `ormas/<name>/` otherwise."""
    return PREFIX if primary else f"{PREFIX}{name}/"


def is_ormas(key: object) -> bool:
    """Whether a report key is one of ray-ormas's."""
    return isinstance(key, str) and key.startswith(PREFIX)
