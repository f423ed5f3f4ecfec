"""Fleet health in Ray's own metrics: per-rank gauges and alarm counters through `ray.util.metrics`.

Ray exports them from the process that sets them (the run ledger, on the head node) to the
Prometheus endpoint of that node's metrics agent, with Ray's `ray_` prefix, where the
Prometheus and Grafana that Ray and KubeRay users already run pick them up:

    ray_ormas_fleet_straggler_score{run, rank, node, score="relative"|"individual"}
    ray_ormas_fleet_rank_seconds{run, rank, node, phase="data"|"forward"|"wall"}
    ray_ormas_fleet_loss{run, rank}            and {run, rank="mean"} for the fleet's mean
    ray_ormas_fleet_alarms_total{run, kind}    a counter, one per alarm
    ray_ormas_fleet_actions_total{run, kind, action}   a counter, one per action an alarm asked for
                                               (`action` is what was carried out: "log" when bounded or failed)

`k8s/grafana/ray-ormas-fleet.json` is a Grafana dashboard of them. A failure to export (Ray's
metrics disabled, an exporter error) is logged once and never reaches training.

Hooks relied on: `ray.util.metrics.Gauge` / `Counter` (`set` / `inc` with tags).
"""

from __future__ import annotations

from typing import Any

from ray_ormas._internal.common.logs import get_logger

logger = get_logger("ray_ormas.fleet")

SCORE = "ormas_fleet_straggler_score"
SECONDS = "ormas_fleet_rank_seconds"
LOSS = "ormas_fleet_loss"
ALARMS = "ormas_fleet_alarms"
ACTIONS = "ormas_fleet_actions"
EXPORTED = {SCORE: f"ray_{SCORE}", SECONDS: f"ray_{SECONDS}", LOSS: f"ray_{LOSS}", ALARMS: f"ray_{ALARMS}_total"}
ACTIONS_EXPORTED = f"ray_{ACTIONS}_total"  # exported once a fit has taken an action


class FleetGauges:
    """The fleet's gauges and counters of one run (tag `run` = the Ray run name)."""

    def __init__(self, run: str) -> None:
        from ray.util.metrics import Counter, Gauge

        self._run = run
        self._failed = False
        self._score = Gauge(
            SCORE,
            description="ray-ormas straggler score per rank (1 = as fast as the others / as its own best)",
            tag_keys=("run", "rank", "node", "score"),
        )
        self._seconds = Gauge(
            SECONDS,
            description="ray-ormas per-rank time at the last check, by phase",
            tag_keys=("run", "rank", "node", "phase"),
        )
        self._loss = Gauge(
            LOSS,
            description="ray-ormas per-rank loss at the last check, and the fleet's mean",
            tag_keys=("run", "rank"),
        )
        self._alarms = Counter(ALARMS, description="ray-ormas fleet alarms, by kind", tag_keys=("run", "kind"))
        self._actions = Counter(
            ACTIONS, description="ray-ormas fleet actions, by alarm kind and action", tag_keys=("run", "kind", "action")
        )

    def acted(self, lines: list[dict[str, Any]]) -> None:
        """Action lines (head/fleet_actions.py): one count each, by alarm kind and action."""
        try:
            for line in lines:
                if line.get("event") != "outcome" and line.get("alarm"):
                    self._actions.inc(1, tags={"run": self._run, "kind": line["alarm"], "action": line["action"]})
        except Exception as e:  # telemetry never breaks training
            if not self._failed:
                logger.warning("could not export fleet metrics to Ray (%s: %s)", type(e).__name__, e)
            self._failed = True

    def update(self, ranks: list[dict[str, Any]], loss_mean: float | None, alarms: list[dict[str, Any]]) -> None:
        try:
            for r in ranks:
                rank, node = str(r["rank"]), str(r.get("node"))
                for key, score in (("relative_score", "relative"), ("individual_score", "individual")):
                    if r.get(key) is not None:
                        self._score.set(r[key], tags={"run": self._run, "rank": rank, "node": node, "score": score})
                for phase in ("data", "forward", "wall"):
                    value = r.get(f"{phase}_s")
                    if value is not None:
                        self._seconds.set(value, tags={"run": self._run, "rank": rank, "node": node, "phase": phase})
                if isinstance(r.get("loss"), float):
                    self._loss.set(r["loss"], tags={"run": self._run, "rank": rank})
            if loss_mean is not None:
                self._loss.set(loss_mean, tags={"run": self._run, "rank": "mean"})
            for a in alarms:
                self._alarms.inc(1, tags={"run": self._run, "kind": a["kind"]})
        except Exception as e:  # telemetry never breaks training
            if not self._failed:
                logger.warning("could not export fleet metrics to Ray (%s: %s)", type(e).__name__, e)
            self._failed = True
