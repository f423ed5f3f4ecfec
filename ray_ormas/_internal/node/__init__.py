"""What runs in a small actor on each worker node: the fleet facts' relay (one per node and
attempt, created by the run ledger on the head node, called by the node's ranks; the first of
each group of nodes also collects its group's rows for the head)."""
