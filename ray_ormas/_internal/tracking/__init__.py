"""MLflow tracking's content: what a fit's run should hold (from the record and the journal) and
how it is brought up to it. Used by the head node's writer and by `ray-ormas mlflow-sync`; never
by a worker."""
