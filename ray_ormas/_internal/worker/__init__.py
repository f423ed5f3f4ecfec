"""Inside each Ray Train worker: the calls a loop makes, the per-attempt session, each rank's
monitor and fleet probe, zero-change adoption and the framework integrations. Never imports the
head side, MLflow tracking, or mlflow (an import contract)."""
