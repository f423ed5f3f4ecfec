"""Whether a fit continues an existing run, said before anything starts and again at the end.

Ray Train continues a run that has the same `RunConfig(name=...)` and storage: the loop's
`ray.train.get_checkpoint()` (and `ray_ormas.load_checkpoint`) gets the run's latest checkpoint,
and the record adds a segment after the run's earlier ones. A user who ran the same command twice
should hear that, with which run and which checkpoint, and how to start afresh instead; and, when
the loop found nothing left to do, that it trained nothing (the summary is then the whole run's).

Read on the driver before Ray starts: the run folder through Ray's public
`ray.train.Result.from_path` (its latest checkpoint and that report's metrics), and the record's
segments (record/store.py). Nothing here changes what Ray does.

Hooks relied on: `ray.train.Result.from_path` (raises when the folder holds no Ray Train run),
the `ormas/run_step` key of ray-ormas's reports (common/keys.py).
"""

from __future__ import annotations

import posixpath
from dataclasses import dataclass
from typing import Any

import pyarrow.fs as pafs
from ray.train import Result, RunConfig

from ray_ormas._internal.common import keys
from ray_ormas._internal.record.store import RecordStore, resolve

EPOCH_KEYS = ("epoch", "epochs", "train/epoch")  # a checkpoint report's own metrics that name its epoch


@dataclass(frozen=True)
class Continuation:
    """An existing run a fit continues.

    Attributes:
        run: the run's folder, as shown to the user.
        segments: the record's segments of its monitors so far.
        checkpoint: the latest checkpoint Ray resumes from (None: the run has none, so the loop
            starts from scratch, and the record still adds a segment).
        epoch: that checkpoint's report's `epoch` metric, when it has one.
        run_step: its `ormas/run_step` (the optimizer steps the run had made by then).
    """

    run: str
    segments: int
    checkpoint: str | None
    epoch: Any = None
    run_step: int | None = None

    def where(self) -> str:
        """The checkpoint, as a phrase: 'checkpoint_000002 (epoch 2, run step 96)'."""
        if self.checkpoint is None:
            return "no checkpoint"
        facts = [f"epoch {self.epoch}" if self.epoch is not None else None]
        facts.append(f"run step {self.run_step}" if self.run_step is not None else None)
        shown = ", ".join(f for f in facts if f)
        return posixpath.basename(self.checkpoint.rstrip("/")) + (f" ({shown})" if shown else "")

    def line(self) -> str:
        """What a fit says first when it continues this run."""
        start = (
            f"from its latest checkpoint, {self.where()}"
            if self.checkpoint is not None
            else "with no checkpoint to resume from, so the loop starts from scratch"
        )
        return (
            f"continuing the existing run at {self.run} ({self.segments} record segment"
            f"{'s' * (self.segments != 1)} so far) {start}: Ray Train continues a run with the same "
            f"name and storage. For a fresh run, give another RunConfig(name=...) (`name:` in a "
            f"config) or another storage path"
        )

    def nothing_trained(self) -> str:
        """What a fit says at the end when its loop made no optimizer step."""
        return (
            f"nothing was left to train: the loop made no optimizer step after resuming the run at "
            f"{self.run} from {self.where()}; the summary is the whole run's. For a fresh run, "
            f"give another name or storage path"
        )


def find_continuation(run_config: RunConfig, store: RecordStore) -> Continuation | None:
    """The existing run at `run_config`'s storage and name that a fit would continue, or None."""
    fs, base = resolve(run_config.storage_path, run_config.storage_filesystem)
    run_dir = posixpath.join(base, str(run_config.name))
    try:
        info = fs.get_file_info(run_dir)
    except OSError:
        return None
    if info.type != pafs.FileType.Directory:
        return None
    segments = sum(len(store.segments(m)) for m in store.monitors())
    checkpoint, metrics = _latest_checkpoint(run_dir, fs)
    if checkpoint is None and segments == 0:
        return None  # a folder without a run in it (or one Ray left empty)
    epoch = next((metrics[k] for k in EPOCH_KEYS if k in metrics), None)
    run_step = metrics.get(keys.RUN_STEP)
    return Continuation(
        run=posixpath.join(str(run_config.storage_path), str(run_config.name)),
        segments=segments,
        checkpoint=checkpoint,
        epoch=epoch,
        run_step=run_step if isinstance(run_step, int) else None,
    )


def _latest_checkpoint(run_dir: str, fs: pafs.FileSystem) -> tuple[str | None, dict[str, Any]]:
    """The run's latest checkpoint and its report's metrics, as Ray Train would resume (none:
    no Ray Train run there yet, or it has no checkpoint)."""
    try:
        result = Result.from_path(run_dir, storage_filesystem=fs)
    except Exception:  # not a Ray Train run folder (yet): nothing to resume from
        return None, {}
    if result.checkpoint is None:
        return None, {}
    return result.checkpoint.path, dict(result.metrics or {})
