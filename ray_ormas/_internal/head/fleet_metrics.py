"""Fleet health in Ray's own metrics: gauges and alarm counters through `ray.util.metrics`.

Ray exports them from the process that sets them (the run ledger, on the head node) to the
Prometheus endpoint of that node's metrics agent, with Ray's `ray_` prefix, where the
Prometheus and Grafana that Ray and KubeRay users already run pick them up. Per run, at every
size (a bounded number of series, whatever the number of ranks):

    ray_ormas_fleet_quantile{run, value, q}    each per-rank value's quantiles at the last check:
                                               value = relative_score, individual_score, data_s,
                                               forward_s, wall_s, loss; q = min, p10, p50, p90, max
    ray_ormas_fleet_slow_ranks{run}            how many ranks were slow at the last check
    ray_ormas_fleet_worst_rank{run}            the rank with the lowest straggler score (its id)
    ray_ormas_fleet_loss{run, rank="mean"}     the fleet's mean loss
    ray_ormas_fleet_alarms_total{run, kind}    a counter, one per alarm
    ray_ormas_fleet_actions_total{run, kind, action}   a counter, one per action an alarm asked for
                                               (`action` is what was carried out: "log" when bounded or failed)

and per node, from each attempt's screen before its first step (the pre-flight screen,
fleet/preflight.py; a node's slowest rank; set again at every check of the attempt):

    ray_ormas_preflight_seconds{run, node, probe="compute"|"link"|"allreduce"}

and per rank, only while the fit has at most `FleetSettings.metrics_ranks` ranks (64 by
default; one series per rank and node would overwhelm Prometheus on a large cluster, the reason
Ray 2.53 stopped exporting its own per-worker label by default):

    ray_ormas_fleet_straggler_score{run, rank, node, score="relative"|"individual"}
    ray_ormas_fleet_rank_seconds{run, rank, node, phase="data"|"forward"|"wall"}
    ray_ormas_fleet_loss{run, rank}

`k8s/grafana/ray-ormas-fleet.json` is a Grafana dashboard of both forms. A failure to export
(Ray's metrics disabled, an exporter error) is logged once and never reaches training.

Hooks relied on: `ray.util.metrics.Gauge` / `Counter` (`set` / `inc` with tags).
"""

from __future__ import annotations

from typing import Any

from ray_ormas._internal.common.logs import get_logger
from ray_ormas._internal.record.check_summaries import QUANTILES, SUMMARISED, check_summary

logger = get_logger("ray_ormas.fleet")

SCORE = "ormas_fleet_straggler_score"
SECONDS = "ormas_fleet_rank_seconds"
LOSS = "ormas_fleet_loss"
QUANTILE = "ormas_fleet_quantile"
SLOW = "ormas_fleet_slow_ranks"
WORST = "ormas_fleet_worst_rank"
ALARMS = "ormas_fleet_alarms"
ACTIONS = "ormas_fleet_actions"
PREFLIGHT = "ormas_preflight_seconds"
EXPORTED = {
    SCORE: f"ray_{SCORE}",
    SECONDS: f"ray_{SECONDS}",
    LOSS: f"ray_{LOSS}",
    QUANTILE: f"ray_{QUANTILE}",
    SLOW: f"ray_{SLOW}",
    WORST: f"ray_{WORST}",
    ALARMS: f"ray_{ALARMS}_total",
}
PREFLIGHT_EXPORTED = f"ray_{PREFLIGHT}"  # per attempt, before its first step (set again at every check)
ACTIONS_EXPORTED = f"ray_{ACTIONS}_total"  # exported once a fit has taken an action
Sample = tuple[str, float, dict[str, str]]  # (metric, value, tags)


def check_samples(
    run: str,
    ranks: list[dict[str, Any]],
    loss_mean: float | None,
    per_rank_up_to: int,
    summary: dict[str, Any] | None = None,
) -> list[Sample]:
    """What one complete check sets: the per-run summaries (from `summary`, the check's row of
    the fleet record's `summaries`, or made from `ranks`), and the per-rank series when there are
    at most `per_rank_up_to` ranks (`ranks`: the check's rows, as the `checks` table has them;
    not needed above)."""
    if summary is None:
        summary = check_summary(ranks)
    samples: list[Sample] = []
    for value in SUMMARISED:
        for q, _ in QUANTILES:
            found = summary.get(f"{value}_{q}")
            if found is not None:
                samples.append((QUANTILE, float(found), {"run": run, "value": value, "q": q}))
    samples.append((SLOW, float(summary.get("slow_count") or 0), {"run": run}))
    if summary.get("worst_rank") is not None:
        samples.append((WORST, float(summary["worst_rank"]), {"run": run}))
    if loss_mean is not None:
        samples.append((LOSS, loss_mean, {"run": run, "rank": "mean"}))
    if summary["ranks"] > per_rank_up_to:
        return samples
    for r in ranks:
        rank, node = str(r["rank"]), str(r.get("node"))
        for key, score in (("relative_score", "relative"), ("individual_score", "individual")):
            if r.get(key) is not None:
                samples.append((SCORE, r[key], {"run": run, "rank": rank, "node": node, "score": score}))
        for phase in ("data", "forward", "wall"):
            if r.get(f"{phase}_s") is not None:
                samples.append((SECONDS, r[f"{phase}_s"], {"run": run, "rank": rank, "node": node, "phase": phase}))
        if isinstance(r.get("loss"), float):
            samples.append((LOSS, r["loss"], {"run": run, "rank": rank}))
    return samples


def preflight_samples(run: str, rows: list[dict[str, Any]]) -> list[Sample]:
    """A screen's rows as one sample per node and probe: the node's slowest rank's seconds."""
    slowest: dict[tuple[str, str], float] = {}
    for r in rows:
        node = str(r.get("node_id") or r.get("node"))
        for probe in ("compute", "link", "allreduce"):
            value = r.get(f"{probe}_s")
            if isinstance(value, (int, float)):
                slowest[(node, probe)] = max(value, slowest.get((node, probe), value))
    return [(PREFLIGHT, value, {"run": run, "node": node, "probe": probe}) for (node, probe), value in slowest.items()]


class FleetGauges:
    """The fleet's gauges and counters of one run (tag `run` = the Ray run name)."""

    def __init__(self, run: str, per_rank_up_to: int = 64) -> None:
        from ray.util.metrics import Counter, Gauge

        self._run = run
        self._per_rank_up_to = per_rank_up_to
        self._failed = False
        self._screen: list[Sample] = []  # the last pre-flight screen's samples
        self._gauges = {
            SCORE: Gauge(
                SCORE,
                description="ray-ormas straggler score per rank (1 = as fast as the others / as its own best)",
                tag_keys=("run", "rank", "node", "score"),
            ),
            SECONDS: Gauge(
                SECONDS,
                description="ray-ormas per-rank time at the last check, by phase",
                tag_keys=("run", "rank", "node", "phase"),
            ),
            LOSS: Gauge(
                LOSS,
                description="ray-ormas per-rank loss at the last check, and the fleet's mean",
                tag_keys=("run", "rank"),
            ),
            QUANTILE: Gauge(
                QUANTILE,
                description="ray-ormas quantiles of a per-rank value at the last check (min, p10, p50, p90, max)",
                tag_keys=("run", "value", "q"),
            ),
            SLOW: Gauge(SLOW, description="ray-ormas ranks slow at the last check", tag_keys=("run",)),
            WORST: Gauge(
                WORST, description="ray-ormas rank with the lowest straggler score at the last check", tag_keys=("run",)
            ),
            PREFLIGHT: Gauge(
                PREFLIGHT,
                description="ray-ormas pre-flight screen: a node's slowest rank's seconds, by probe",
                tag_keys=("run", "node", "probe"),
            ),
        }
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
            self._say(e)

    def screened(self, rows: list[dict[str, Any]]) -> None:
        """One attempt's pre-flight rows: per node, its slowest rank's seconds by probe (set
        again at every check, as the other gauges are: Ray drops a gauge not set for a while)."""
        try:
            self._screen = preflight_samples(self._run, rows)
            for _, value, tags in self._screen:
                self._gauges[PREFLIGHT].set(value, tags=tags)
        except Exception as e:  # telemetry never breaks training
            self._say(e)

    @property
    def per_rank_up_to(self) -> int:
        """Up to this many ranks, a series per rank (`FleetSettings.metrics_ranks`)."""
        return self._per_rank_up_to

    def update(
        self,
        ranks: list[dict[str, Any]],
        loss_mean: float | None,
        alarms: list[dict[str, Any]],
        summary: dict[str, Any] | None = None,
    ) -> None:
        """One complete check's summary and rows (the rows needed only up to `per_rank_up_to`
        ranks; none and no summary: alarms alone) and its alarms."""
        try:
            if ranks or summary is not None:
                samples = check_samples(self._run, ranks, loss_mean, self._per_rank_up_to, summary) + self._screen
                for metric, value, tags in samples:
                    self._gauges[metric].set(value, tags=tags)
            for a in alarms:
                self._alarms.inc(1, tags={"run": self._run, "kind": a["kind"]})
        except Exception as e:  # telemetry never breaks training
            self._say(e)

    def _say(self, e: Exception) -> None:
        if not self._failed:
            logger.warning("could not export fleet metrics to Ray (%s: %s)", type(e).__name__, e)
        self._failed = True
