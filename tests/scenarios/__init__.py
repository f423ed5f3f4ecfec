"""Scenarios that need a simulated multi-node cluster of their own (`ray.cluster_utils.Cluster`),
run as separate processes by their tests.

`FAST_NODE_DEATH` is the head's GCS health check for them: a removed node is declared dead after
about 1.5 s (three missed 0.5 s checks) instead of Ray's default of about 15 s (five missed 3 s
checks). A cloud node that vanishes is noticed by the same check with the defaults; only how
long the scenario waits for Ray to notice changes, not what Ray or ray-ormas then does.
"""

FAST_NODE_DEATH = {
    "health_check_initial_delay_ms": 0,
    "health_check_period_ms": 500,
    "health_check_timeout_ms": 1000,
    "health_check_failure_threshold": 3,
}
