"""`stagevisor check`: a stage's contract and every edge's handoffs, checked before serving."""
