"""`stagevisor bench`: topologies side by side under a load generator, and its plot.

For every topology: validate it exactly as `plan` does (an invalid one is
reported with its code and skipped), start `stagevisor serve` on private
sockets, warm up, run the measured workload at each concurrency (or rate),
sample the workers' CPU time and resident memory, and stop the daemon
cleanly, also when the bench is interrupted. Ratios compare every topology
with the first valid one.

- workload.py: what to measure (Workload) on which topologies (Topology, validate);
- daemon.py: the daemon under test, started and stopped (Daemon);
- measure.py: one measurement against a serving daemon (measure, Resources, RefusalWatch);
- results.py: its figures (Row, TopologyResult) and repeated runs combined (combine);
- compare.py: ratios against the first topology and the verdict in words;
- loadgen.py: the load generator; table.py and plot.py: the report as a table and as a figure.
"""
