"""Ray: what a Plan asks of a cluster, and the launcher that runs workers as Ray actors."""
