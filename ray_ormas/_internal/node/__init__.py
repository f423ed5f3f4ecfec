"""What runs in a small actor on each worker node: the fleet facts' relay (one per node and fit,
created by the run ledger on the head node, called by the node's ranks)."""
