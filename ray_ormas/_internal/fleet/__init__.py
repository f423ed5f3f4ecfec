"""Fleet health's pure parts: the analysis of every rank's facts (run in the head node's ledger)
and the parameter digest (computed on every rank). No Ray, no I/O."""
