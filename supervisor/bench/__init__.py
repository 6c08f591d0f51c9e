"""`stagevisor bench`: topologies side by side under a load generator, and its plot."""
