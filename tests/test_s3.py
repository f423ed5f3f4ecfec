"""Run storage on a real S3 API: moto's server on 127.0.0.1 (tests/s3_server.py), found through
the environment as any S3-compatible store is. Checkpoints and the record go to `s3://`; a
SIGKILLed rank 0 resumes from its S3 checkpoint with every recorded row kept; `ray-ormas report`
and `export` read the run back from S3; the record survives the server going away and coming
back; and storage that is down or silent fails on the driver, in bounded time."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pyarrow.fs as pafs
import pytest
import ray
from ormas_monitor.record import verify_run
from ray.train import Checkpoint, FailureConfig, RunConfig, ScalingConfig

from ray_ormas import RayOrmasTrainer, RecordStorageError, open_records

from .conftest import temporary_folders
from .loops import digits_loop, resume_loop

RAY_ORMAS = str(Path(sys.executable).with_name("ray-ormas"))
STEPS_PER_EPOCH = 8  # 512 samples / 2 ranks / batch 32


def fit(run_config: RunConfig, record_dir: str | None = None, **config) -> object:
    return RayOrmasTrainer(
        resume_loop,
        train_loop_config=config,
        check_every=3,
        verbose=False,
        mlflow=False,
        scaling_config=ScalingConfig(num_workers=2),
        run_config=run_config,
        record_dir=record_dir,
    ).fit()


def s3_files(uri: str) -> dict[str, int]:
    """Every object under `uri`, by its path below it, with its size."""
    fs, root = pafs.FileSystem.from_uri(uri)
    infos = fs.get_file_info(pafs.FileSelector(root, recursive=True, allow_not_found=True))
    return {i.path[len(root) + 1 :]: i.size for i in infos if i.type == pafs.FileType.File}


def s3_lines(uri: str) -> list[bytes]:
    fs, path = pafs.FileSystem.from_uri(uri)
    with fs.open_input_stream(path) as f:
        return f.read().splitlines()


@pytest.mark.timeout(420)
def test_a_run_on_s3_survives_a_killed_rank_0_and_reads_back(s3, ray_cluster, tmp_path):
    storage = f"{s3.bucket()}/runs"
    before = temporary_folders()
    kill_at = 2 * STEPS_PER_EPOCH + 4  # rank 0 SIGKILLs itself 4 steps into epoch 2
    result = fit(
        RunConfig(name="s3run", storage_path=storage, failure_config=FailureConfig(max_failures=1)),
        epochs=3,
        kill_rank=0,
        kill_at=kill_at,
        kill_marker=str(tmp_path / "killed-once"),
    )
    run = result.ormas
    assert run.store.shown() == f"{storage}/s3run/ormas" and run.record_dir is None and run.not_uploaded == []
    assert result.checkpoint.path.startswith(storage.removeprefix("s3://") + "/s3run/checkpoint_")
    assert result.return_value["step"] == 3 * STEPS_PER_EPOCH

    # Two segments in S3. The killed one holds every row up to the kill, not only those up to its
    # last checkpoint: its staging folder on the node was uploaded when the fit ended.
    records = open_records(f"{storage}/s3run")
    first, second = records.segments()
    assert not first.complete and second.complete
    killed = records.metrics().to_pylist()
    assert records.fleet_checks().num_rows > 0  # the fleet record, read back from its parts too
    assert [r["run_step"] for r in killed if r["segment"] == 0] == list(range(0, kill_at, 3))
    assert second.link["previous"]["segment"] == "segment-000"
    # Resumed from epoch 1's checkpoint in S3 (or epoch 0's, if the controller had not registered
    # epoch 1's when rank 0 died), whose pointer names the killed segment.
    assert result.return_value["resumed_from_epoch"] in (0, 1)
    assert second.link["resumed_from"]["checkpoint"].startswith(storage.removeprefix("s3://"))
    assert second.link["resumed_from"]["record"]["segment"] == "segment-000"
    pointer = Checkpoint(result.checkpoint.path, result.checkpoint.filesystem).get_metadata()["ormas"]["model"]
    assert (
        pointer["path"] == run.records["model"] and pointer["steps"] == 3 * STEPS_PER_EPOCH - second.link["step_offset"]
    )
    # Nothing left on the node: no checkpoint copies, no staging folders.
    assert {n: s for n, s in temporary_folders().items() if n not in before} == {}

    # Read back from S3 as a user would, with the commands.
    reports = tmp_path / "reports"
    done = subprocess.run(
        [RAY_ORMAS, "report", f"{storage}/s3run", "--out", str(reports)], capture_output=True, text=True, timeout=180
    )
    assert done.returncode == 0, done.stdout + done.stderr
    copied = sorted(p for p in (reports / "model").iterdir())
    assert [p.name for p in copied] == ["segment-000", "segment-001"]
    assert verify_run(copied[1]).ok and (copied[1] / "report.html").is_file()
    assert {c.name: c.status for c in verify_run(copied[0]).checks}["chain"] == "pass"
    # The run's page: written in S3 by the fit's end and again by the command, and beside the copies.
    assert run.run_page == f"{storage}/s3run/ormas/run.html"
    assert f"run page in the record: {storage}/s3run/ormas/run.html" in done.stdout
    in_s3 = b"".join(s3_lines(f"{storage}/s3run/ormas/run.html")).decode()
    assert in_s3.replace("\n", "") == (reports / "run.html").read_text().replace("\n", "")
    assert "data-complete='false'" in in_s3 and "href='model/segment-001/report.html'" in in_s3
    export = tmp_path / "export"
    done = subprocess.run(
        [RAY_ORMAS, "export", f"{storage}/s3run", "--out", str(export)], capture_output=True, text=True, timeout=180
    )
    assert done.returncode == 0, done.stdout + done.stderr
    import pyarrow.parquet as pq

    assert pq.read_table(export / "metrics.parquet").num_rows == len(killed)


@pytest.mark.timeout(420)
def test_the_record_survives_an_s3_outage_between_its_uploads(s3, ray_cluster, tmp_path):
    """Checkpoints on local disk, the record on S3; the S3 server goes away after the first
    checkpoint and comes back after the second: training goes on, the second upload fails (and
    is written into the record), the third brings storage up to date, nothing is lost."""
    records_uri = f"{s3.bucket('records')}/digits"
    local = tmp_path / "runs"
    diary_uri = f"{records_uri}/model/segment-000/diary.jsonl"
    timeline: list[str] = []

    def outage() -> None:
        try:
            deadline = time.monotonic() + 300
            while (
                not any(k.startswith("model/segment-000/diary.jsonl") for k in s3_files(records_uri))
                and time.monotonic() < deadline
            ):
                time.sleep(0.2)  # the first checkpoint's upload reached S3 (the diary's first part)
            s3.stop()
            timeline.append("down")
            while (
                len([p for p in (local / "outage").glob("checkpoint_*") if p.is_dir()]) < 2
                and time.monotonic() < deadline
            ):
                time.sleep(0.2)  # the second checkpoint was reported while S3 was down
            s3.start()
            timeline.append("up")
        except Exception as e:  # shown by the assertion on the timeline
            timeline.append(f"{type(e).__name__}: {e}")

    thread = threading.Thread(target=outage, daemon=True)
    thread.start()
    try:
        result = fit(
            RunConfig(name="outage", storage_path=str(local)), record_dir=records_uri, epochs=4, sleep_per_step=0.3
        )
    finally:
        thread.join(timeout=60)
        if not s3.running:
            s3.start()
    assert timeline == ["down", "up"]
    assert result.ormas.not_uploaded == []
    records = open_records(records_uri)
    (segment,) = records.segments()
    assert segment.complete
    rows = records.metrics().to_pylist()
    assert [r["step"] for r in rows] == list(range(0, 4 * STEPS_PER_EPOCH, 3))  # every row
    events = records.events().to_pylist()
    errors = [e for e in events if e["event"] == "sink_error"]
    # One failed upload or two (the outage can begin while the first checkpoint's upload is
    # still sending), each written into the record.
    assert 1 <= len(errors) <= 2 and all("ray-ormas upload to s3://" in str(e) for e in errors), errors
    # Every checkpoint's pointer is a prefix of the record in S3, the one taken during the outage too.
    diary = s3_lines(diary_uri)

    hashes = [json.loads(x)["hash"] for x in diary]
    for path in sorted(p for p in (local / "outage").glob("checkpoint_*") if p.is_dir()):
        pointer = Checkpoint(str(path)).get_metadata()["ormas"]["model"]
        assert hashes[pointer["events"] - 1] == pointer["last_hash"]


@pytest.mark.timeout(420)
def test_storage_still_down_at_the_end_leaves_the_whole_record_on_the_node_and_says_where(
    s3, ray_cluster, tmp_path, caplog
):
    storage = f"{s3.bucket()}/runs"
    marker = tmp_path / "last-report-done"
    snapshot = f"{storage}/late/checkpoint_manager_snapshot.json"  # Ray Train's checkpoint index
    before = temporary_folders()
    seen: list[str] = []

    def outage() -> None:
        # Storage goes down after the last checkpoint is in S3 and Ray's controller has indexed
        # it (so Ray has nothing left to write and the fit ends as Ray decides without storage),
        # while rank 0 is still in the loop: before the record's final upload.
        deadline = time.monotonic() + 300
        while not marker.exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        while time.monotonic() < deadline:
            try:
                if json.loads(b"".join(s3_lines(snapshot)))["current_report_index"] == 2:
                    seen.append("indexed")
                    break
            except (OSError, ValueError, KeyError):
                pass
            time.sleep(0.1)
        # Ray may write its index again just after (CI once saw that write fail): wait until the
        # snapshot has not changed for 2 s; rank 0 sleeps 8 s after its last report.
        last, stable_since = b"", time.monotonic()
        while time.monotonic() - stable_since < 2 and time.monotonic() < deadline:
            try:
                now = b"".join(s3_lines(snapshot))
            except OSError:
                now = b""
            if now != last:
                last, stable_since = now, time.monotonic()
            time.sleep(0.1)
        s3.stop()

    thread = threading.Thread(target=outage, daemon=True)
    thread.start()
    try:
        result = fit(RunConfig(name="late", storage_path=storage), epochs=2, done_marker=str(marker), sleep_after=8)
    finally:
        thread.join(timeout=60)
        if not s3.running:
            s3.start()
    assert seen == ["indexed"], "Ray's controller did not index the last checkpoint while rank 0 slept"
    assert result.checkpoint is not None and result.metrics["epoch"] == 1  # training is not lost
    # The driver's warning says where the whole record is: its staging folder on rank 0's node.
    (message,) = [r.getMessage() for r in caplog.records if "its local copy is" in r.getMessage()]
    segment = open_records(f"{storage}/late").segments()[0]
    assert f"could not be brought up to date in s3://{segment.path}" in message
    assert not segment.complete  # in S3: as of the last checkpoint
    folder = Path(message.split("its local copy is ")[1].split(" on node ")[0])
    assert folder.is_dir() and verify_run(folder).ok  # the whole record, closed, on the node
    # What the message says to do, once storage is back: copy its files there.
    records = open_records(f"{storage}/late")
    pafs.copy_files(
        str(folder),
        segment.path,
        source_filesystem=pafs.LocalFileSystem(),
        destination_filesystem=records.store.filesystem,
    )
    assert open_records(f"{storage}/late").segments()[0].complete
    # The fleet record (on the head node) is kept the same way; both are removed here.
    left = set(temporary_folders()) - set(before)
    assert folder.name in left and any(n.startswith("ray-ormas-fleet-") for n in left), left
    for name in left:
        shutil.rmtree(folder.parent / name)


def silent_port() -> tuple[socket.socket, int]:
    """A port that takes connections and never answers."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen(64)
    return s, s.getsockname()[1]


def closed_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def trainer_on(storage: str) -> RayOrmasTrainer:
    return RayOrmasTrainer(
        digits_loop,
        run_config=RunConfig(name="nowhere", storage_path=storage),
        mlflow=False,
        scaling_config=ScalingConfig(num_workers=2),
    )


@pytest.mark.timeout(120)
def test_storage_that_is_down_silent_or_missing_fails_on_the_driver_in_bounded_time(s3, monkeypatch, tmp_path):
    was_running = ray.is_initialized()
    # No server on the port: pyarrow's retries end within seconds.
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{closed_port()}")
    started = time.monotonic()
    with pytest.raises(RecordStorageError) as e:
        trainer_on("s3://nobucket/runs")
    assert time.monotonic() - started < 25
    assert "cannot write the ormas record to s3://nobucket/runs/nowhere/ormas" in str(e.value)
    assert "Could not connect to server" in str(e.value)
    # A port that never answers: pyarrow would retry for minutes; the check gives up in time.
    listener, port = silent_port()
    try:
        monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{port}")
        monkeypatch.setenv("RAY_ORMAS_STORAGE_CHECK_TIMEOUT_S", "3")
        started = time.monotonic()
        with pytest.raises(
            RecordStorageError,
            match=r"did not answer within 3 s \(is the endpoint "
            rf"http://127.0.0.1:{port} right",
        ):
            trainer_on("s3://nobucket/runs")
        assert time.monotonic() - started < 8
    finally:
        listener.close()
    # The server answers, but the bucket does not exist; and no credentials are in sight.
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3.endpoint)
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.delenv(name)
    monkeypatch.setenv("HOME", str(tmp_path))
    with pytest.raises(RecordStorageError, match="Bucket 'nobucket' not found") as e:
        trainer_on("s3://nobucket/runs")
    assert "No AWS credentials were found" in str(e.value)
    assert ray.is_initialized() == was_running  # all of it before any worker, or Ray, started


def test_storage_is_brought_up_to_date_with_what_is_new(s3, tmp_path):
    from ray_ormas._internal.record.store import RecordStore
    from ray_ormas._internal.record.uploads import IncrementalUpload

    store = RecordStore.at(f"{s3.bucket()}/runs/r/ormas")
    local = tmp_path / "segment"
    local.mkdir()
    (local / "segment.json").write_text('{"segment": 0}\n')
    diary = local / "diary.jsonl"
    diary.write_bytes(b'{"seq": 1}\n{"seq": 2}\n{"seq": 3, "half')  # a line still being written
    remote = f"{store.root}/model/segment-000"
    upload = IncrementalUpload(store, local, remote)
    assert upload.push() == len(b'{"seq": 1}\n{"seq": 2}\n') + len(b'{"segment": 0}\n')
    assert store.read_bytes(f"{remote}/diary.jsonl") == b'{"seq": 1}\n{"seq": 2}\n'
    with open(diary, "ab") as f:
        f.write(b'": 1}\n{"seq": 4}\n')
    assert upload.push() == len(b'{"seq": 3, "half": 1}\n{"seq": 4}\n')  # only what is new
    assert upload.push() == 0
    whole = diary.read_bytes()
    assert store.read_bytes(f"{remote}/diary.jsonl") == whole
    # A part sent again (a retry after a timeout that had in fact succeeded), or overlapping
    # another, changes nothing: parts are placed at their offsets.
    store.write_bytes(f"{remote}/diary.jsonl.parts/0000000000000000", b'{"seq": 1}\n{"seq": 2}\n')
    store.write_bytes(f"{remote}/diary.jsonl.parts/0000000000000011", b'{"seq": 2}\n{"seq": 3, "half": 1}\n')
    assert store.read_bytes(f"{remote}/diary.jsonl") == whole
    copy = store.download(remote, tmp_path / "copy")
    assert (copy / "diary.jsonl").read_bytes() == whole and not list(copy.glob("*.parts"))
    # Closed: whole files, no parts left.
    assert upload.finish() == len(whole)
    assert sorted(s3_files(f"s3://{remote}")) == ["diary.jsonl", "segment.json"]
    assert store.read_bytes(f"{remote}/diary.jsonl") == whole


def test_a_checkpoint_on_s3_is_kept_as_a_copy_in_the_record_and_deleted_at_the_fits_end(s3, tmp_path):
    # The copy a restart after damage may need (head/checkpoint_pins.py), on the S3 API server:
    # the checkpoint's folder (nested files included) copied under the record root, the copy a
    # Checkpoint on the record's filesystem, and every copy gone when the fit ends.
    from ray.train import Checkpoint

    from ray_ormas._internal.head.checkpoint_pins import CheckpointPins
    from ray_ormas._internal.record.store import RecordStore

    store = RecordStore.at(f"{s3.bucket()}/runs/pinned/ormas")
    original = f"{store.root.rsplit('/', 1)[0]}/checkpoint_000003"
    store.write_bytes(f"{original}/model.pt", b"weights" * 100)
    store.write_bytes(f"{original}/extra/state.json", b'{"step": 30}')
    checkpoint = Checkpoint(original, filesystem=store.filesystem)
    pins = CheckpointPins(store, "fit-1")
    pins.pin(checkpoint)
    copy = pins.kept(checkpoint)
    assert copy.path == f"{store.root}/.pinned/fit-1/checkpoint_000003"
    assert store.read_bytes(f"{copy.path}/model.pt") == b"weights" * 100
    assert store.read_bytes(f"{copy.path}/extra/state.json") == b'{"step": 30}'
    pins.release()
    assert store.read_bytes(f"{copy.path}/model.pt") is None and pins.kept(checkpoint) is None
    assert store.read_bytes(f"{original}/model.pt") == b"weights" * 100  # the original is Ray's, untouched
