"""`ray-ormas`: the command line.

    ray-ormas train CONFIG.yaml [--set key=value ...] [--dry-run]   train as the config says
    ray-ormas demo                       the digits demo on a local Ray cluster
    ray-ormas report RUN [--out DIR]     rebuild the HTML reports of every segment and the run's page, from run storage
    ray-ormas goodput RUN [--json]       where the run's time went: each fit's goodput account, and the run's
    ray-ormas export RUN --out DIR       events, metrics and segments .parquet (fleet_* with a fleet)
    ray-ormas mlflow-sync RUN            bring the run's MLflow run(s) up to its record (after an outage);
                                         a fit whose loop ended but whose end never ran is closed as
                                         FINISHED; --close-as KILLED closes one whose loop never ended
    ray-ormas ptrace-py-spy DIR          a py-spy in DIR that may read this pod's processes (KubeRay's
                                         `diagnose` component, k8s/components/diagnose: an init container)

`train` starts a local Ray cluster when none is running, and joins the cluster under
`ray job submit` (Ray sets RAY_ADDRESS for the job). RUN is a run's folder
(`<storage_path>/<name>`) or its `ormas` folder: a local path or a URI pyarrow can open
(`s3://...`, `gs://...`). Exit codes: 0 success, 1 training failed or a record failed
verification, 2 usage, config or storage error.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path
from typing import Sequence

# The command's own lines ("ray-ormas train: ...") speak as the command, without the notes' prefix.
logger = logging.getLogger("ray_ormas.cli")


def _parser() -> argparse.ArgumentParser:
    from ray_ormas import __version__

    p = argparse.ArgumentParser(prog="ray-ormas", description="Ray Train with ormas-monitor on every rank.")
    p.add_argument("--version", action="version", version=f"ray-ormas {__version__}")
    sub = p.add_subparsers(dest="command", required=True)
    t = sub.add_parser(
        "train",
        help="train as CONFIG.yaml says (locally, or under ray job submit on a cluster)",
        description="Train with Ray Train and an ormas monitor on every rank, as CONFIG.yaml says. "
        "Sections: name, model, data (or loop), optimizer, train, strategy, "
        "sync_batchnorm, parallel_kwargs, scaling, monitor, mlflow, storage, failure; "
        "every key is in docs/cli.md. Exit 0: trained; 1: training failed; 2: the "
        "config or a value is wrong (nothing was started).",
    )
    t.add_argument("config", help="the YAML config file")
    t.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a key, e.g. --set train.epochs=3 --set monitor.repair=true (repeatable; the "
        "value is read as YAML)",
    )
    t.add_argument("--dry-run", action="store_true", help="validate the config and print it resolved; start nothing")
    d = sub.add_parser("demo", help="digits CNN on 2 local Ray workers (DDP): healthy, dead layers watched, repaired")
    d.add_argument("--out", default="ray_ormas_demo", help="run storage folder (default: %(default)s)")
    d.add_argument("--epochs", type=int, default=12, help="training epochs per run (default: %(default)s)")
    d.add_argument("--workers", type=int, default=2, help="Ray Train workers (default: %(default)s)")
    d.add_argument("--check-every", type=int, default=10, help="steps between monitor checks (default: %(default)s)")
    d.add_argument("--seed", type=int, default=0)
    d.add_argument("--verbose", action="store_true", help="show the workers' logs and the monitor's events")
    r = sub.add_parser(
        "report",
        help="copy a run's record segments from storage and rebuild their HTML reports",
        description="Copy every segment of every monitor of RUN into --out, rebuild its reports "
        "with ormas-monitor and verify it. Exit 1 if a segment fails verification "
        "(a crashed segment without run_end counts as incomplete, not failed).",
    )
    r.add_argument("run", help="the run's folder or its ormas/ folder: a local path or a URI (s3://...)")
    r.add_argument("--out", default="ray_ormas_reports", help="local folder for the copies (default: %(default)s)")
    r.add_argument("--monitor", help="only this monitor (default: all)")
    g = sub.add_parser(
        "goodput",
        help="where a run's time went: each fit's goodput account (productive, start-up, restarts by cause, ...)",
        description="Print each fit's goodput account of RUN (its wall time cut into productive, "
        "start-up, warm-up, data wait, checkpoint, restart by cause, lost progress, hang, "
        "monitoring, wind-down and other; docs/goodput.md), then the whole run's. Exit 0: printed; "
        "2: no record, or no fit of it kept a timeline.",
    )
    g.add_argument("run", help="the run's folder or its ormas/ folder: a local path or a URI (s3://...)")
    g.add_argument("--json", action="store_true", help="print the accounts as one JSON object")
    e = sub.add_parser(
        "export",
        help="write a run's record (all segments) as Parquet: events, metrics, segments (and the fleet's)",
    )
    e.add_argument("run", help="the run's folder or its ormas/ folder: a local path or a URI (s3://...)")
    e.add_argument("--out", required=True, help="local folder for the .parquet files")
    e.add_argument("--monitor", help="only this monitor (default: all)")
    m = sub.add_parser(
        "mlflow-sync",
        help="bring a run's MLflow run up to date from its record (after an outage)",
        description="Send to MLflow whatever the run's record and MLflow journal hold that the "
        "MLflow run lacks (monitor rows and events, the loop's reported metrics, "
        "checkpoints, the record's files, the final status); create the run if the "
        "tracker was down for the whole fit. Running it twice adds nothing. Exit 0: "
        "up to date; 1: the tracker is unreachable (nothing changed); 2: no record or "
        "no MLflow journal at RUN.",
    )
    m.add_argument("run", help="the run's folder or its ormas/ folder: a local path or a URI (s3://...)")
    m.add_argument("--tracking-uri", help="send to this tracking server instead of the one the fit used")
    m.add_argument(
        "--close-as",
        choices=["FINISHED", "FAILED", "KILLED"],
        help="also close a run whose fit never reached its end (a Ray Tune trial a scheduler stopped, "
        "a driver that was killed) with this status; a status the fit recorded is never changed, and a "
        "fit whose loop ended (its record's run_end) is closed as FINISHED without this option",
    )
    s = sub.add_parser(
        "ptrace-py-spy",
        help="copy py-spy into DIR with the SYS_PTRACE file capability (the fleet's diagnose on KubeRay)",
        description="Copy the py-spy this node runs into DIR/py-spy and give the copy the file "
        "capability cap_sys_ptrace=ep, so that a non-root container with SYS_PTRACE allowed can read "
        "its Ray workers' stacks (set RAY_ORMAS_PY_SPY=DIR/py-spy there). Run as root with the "
        "SETFCAP capability, in an init container (k8s/components/diagnose). Exit 0: written; 2: it "
        "could not be (the line says what to do).",
    )
    s.add_argument("dir", help="the folder to write py-spy into (an emptyDir the worker container mounts)")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.command == "train":
        from ray_ormas._internal.cli.train import train

        return train(args.config, args.overrides, dry_run=args.dry_run)
    if args.command == "demo":
        from ray_ormas import demo

        try:
            demo.run(
                out=args.out,
                epochs=args.epochs,
                workers=args.workers,
                check_every=args.check_every,
                seed=args.seed,
                verbose=args.verbose,
            )
        except Exception as e:
            logger.error("ray-ormas demo failed: %s: %s", type(e).__name__, e)
            return 1
        return 0
    if args.command == "ptrace-py-spy":
        from ray_ormas._internal.cli.ptrace_py_spy import ptrace_py_spy

        return ptrace_py_spy(args.dir)
    from ray_ormas._internal.record.reader import open_records
    from ray_ormas._internal.record.store import RecordStorageError

    try:
        records = open_records(args.run)
    except (RecordStorageError, OSError) as e:
        logger.error("ray-ormas %s: %s", args.command, e)
        return 2
    if args.command == "mlflow-sync":
        return _mlflow_sync(records, args.tracking_uri, args.close_as)
    if args.command == "goodput":
        from ray_ormas._internal.cli.goodput import print_goodput

        return print_goodput(records, args.json)
    if args.command == "export":
        paths = records.write_parquet(args.out, monitor=args.monitor)
        for kind, path in paths.items():
            print(f"{kind}: {path}")
        return 0
    return _report(records, Path(args.out), args.monitor)


def _mlflow_sync(records, tracking_uri: str | None, close_as: str | None = None) -> int:
    from ray_ormas._internal.tracking.sync import close_unended, loop_ended, read_journals, sync_fit, write_journal
    from ray_ormas._internal.tracking.values import first_line, quick_requests, shown
    from ray_ormas.errors import JournalError

    try:
        journals = read_journals(records.store)
    except JournalError as e:
        logger.error("ray-ormas mlflow-sync: %s", e)
        return 2
    if not journals:
        logger.error(
            "ray-ormas mlflow-sync: no MLflow journal under %s (its .mlflow/ folder): the run was trained "
            "with mlflow=False, or by a ray-ormas that kept no MLflow journal yet",
            records.store.shown(),
        )
        return 2
    quick_requests(10.0)
    from mlflow import MlflowClient

    clients = {}
    for uri in {tracking_uri or j.tracking_uri for j in journals}:
        client = MlflowClient(tracking_uri=uri)
        try:
            client.search_experiments(max_results=1)
        except Exception as e:
            logger.error(
                "ray-ormas mlflow-sync: MLflow at %s is unreachable (%s: %s); nothing was changed. Run it "
                "again when the tracker answers, or give --tracking-uri",
                shown(uri),
                type(e).__name__,
                first_line(e),
            )
            return 1
        clients[uri] = client
    for journal in journals:
        ended = journal.status is None and loop_ended(records, journal.fit_id)
        if journal.status is None and (ended or close_as is not None):
            # The fit never reached its end. A loop that ended (its record says so) is FINISHED
            # whatever --close-as says; else --close-as names how it ended.
            close_unended(journal, close_as, loop_ended=ended)
            write_journal(records.store, journal)
            print(f"fit {journal.fit_id}: closed as {journal.status} ({journal.closed_by})")
            _write_page(records)  # the fit's end did not write it: before the sync, which uploads it
        uri = tracking_uri or journal.tracking_uri
        try:
            r = sync_fit(clients[uri], records, journal, finished=True)
        except Exception as e:
            logger.error("ray-ormas mlflow-sync: fit %s: %s: %s", journal.fit_id, type(e).__name__, first_line(e))
            return 1
        what = "created; " if r.created else ""
        closed = f"; set {r.closed}" if r.closed else ""
        print(f"run {r.run_id} at {shown(uri)}: {what}{r.sent} metric values and {r.artifacts} files sent{closed}")
        for path in r.missing_checkpoints:
            print(f"    checkpoint {path} is no longer in storage; not uploaded")
    return 0


def _write_page(records) -> None:
    from ray_ormas._internal.driver.run_page import write_run_page

    try:
        print(f"run.html: {write_run_page(records)}")
    except Exception as e:  # the page is a view: the sync goes on without it
        logger.warning("could not write run.html (%s: %s); `ray-ormas report` writes it", type(e).__name__, e)


def _report(records, out: Path, monitor: str | None) -> int:
    done = records.rebuild_reports(out, monitor=monitor)
    failed = 0
    for r in done:
        seg = r.segment
        state = "complete" if seg.complete else "incomplete (no run_end: its attempt stopped before closing it)"
        verdict = "verified" if r.verified else "FAILED verification"
        print(f"{seg.monitor}/{Path(seg.path).name}  attempt {seg.attempt}  {seg.events} events  {state}  {verdict}")
        for problem in r.problems:
            print(f"    {problem}")
        print(f"    report: {r.reports['report']}")
        failed += not r.verified
    if not done:
        logger.error("no segments found")
    from ray_ormas._internal.cli.summary import whole_run_line
    from ray_ormas._internal.record.run_facts import run_facts

    for name in records.monitors() if monitor is None else [monitor]:
        print(whole_run_line(run_facts(records.store, name)))
    _fleet_report(records)
    from ray_ormas._internal.cli.goodput import goodput_lines

    for line in goodput_lines(records):
        print(line)
    from ray_ormas._internal.driver.run_page import write_run_page

    # Beside the rebuilt reports (its links to them work there, for a run on object storage too),
    # and in the record.
    print(f"run page: {write_run_page(records, to=out)}")
    try:
        print(f"run page in the record: {write_run_page(records)}")
    except OSError as e:
        logger.warning("the record at %s could not take run.html (%s: %s)", records.store.shown(), type(e).__name__, e)
    return 1 if failed else 0


def _fleet_report(records) -> None:
    """Each fit's fleet health (when it was on): the per-rank table, the alarms and the actions."""
    from ray_ormas._internal.record.fleet_record import (
        action_text,
        alarm_when,
        fleet_folder,
        fleet_summary,
        preflight_text,
        ranks_label,
        read_fleet_actions,
        read_fleet_alarms,
        read_fleet_attempts,
        read_fleet_meta,
        read_fleet_preflight,
        read_fleet_summaries,
        read_fleet_table,
    )
    from ray_ormas._internal.record.fleet_tables import CHECKS_TABLE

    for fit_id in records.fleets():
        meta = read_fleet_meta(records.store, fit_id)
        checks = read_fleet_table(records.store, fit_id, CHECKS_TABLE, meta)
        alarms = read_fleet_alarms(records.store, fit_id)
        attempts = read_fleet_attempts(records.store, fit_id)
        shown = records.store.shown(fleet_folder(records.store, fit_id))
        summaries = read_fleet_summaries(records.store, fit_id)
        summary = fleet_summary(shown, checks, alarms, None, attempts, summaries=summaries)
        print(
            f"fleet of fit {fit_id}: {ranks_label(meta)}, {summary.checks} checks, "
            f"{len(alarms)} alarms  ({summary.record})"
        )
        print(summary.table())
        for a in summary.resizes:
            print(
                f"    resized at run step {a.get('run_step')}: {a.get('resized_from')} -> {a.get('world_size')} ranks"
            )
        for screen in read_fleet_preflight(records.store, fit_id):
            print(f"    pre-flight: {preflight_text(screen)}")
        for a in alarms:
            print(f"    alarm {alarm_when(a)}: {a.get('kind')}: {a.get('message')}")
        for x in read_fleet_actions(records.store, fit_id):
            print(f"    action: {action_text(x)}")


if __name__ == "__main__":
    sys.exit(main())
