"""The head node: the run ledger actor (rendezvous, the fleet view, the MLflow writer) and the
controller-side callback that feeds it. Runs in the ledger's actor on the head node and in Ray
Train's controller; never imported by a worker."""
