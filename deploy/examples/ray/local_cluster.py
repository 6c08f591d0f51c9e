"""A two-node Ray cluster on this machine for trying `--launcher ray`; it stops only itself.

Starts a head node holding the resource `tts-a` and a second node holding
`tts-b` (Ray's own ray.cluster_utils.Cluster), with Ray's files in a private
directory, writes `export RAY_ADDRESS=... RAY_TMPDIR=...` to --env-file, and
runs until SIGTERM or Ctrl-C. Then it shuts down these two nodes and removes
their directory, and nothing else: unlike `ray stop`, which stops every Ray
on the machine. Needs the `ray` extra.

    python deploy/examples/ray/local_cluster.py --env-file ray.env &
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import tempfile
import threading


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--env-file", required=True, help="where to write the cluster's RAY_ADDRESS and RAY_TMPDIR")
    parser.add_argument("--cpus", type=int, default=1, help="CPUs each node offers Ray (default %(default)s)")
    args = parser.parse_args()
    stop = threading.Event()
    # Short: Ray's unix sockets live under it (paths are limited to 107 bytes).
    private = tempfile.mkdtemp(prefix="svray", dir="/tmp")
    os.environ["RAY_TMPDIR"] = private
    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=False)
    try:
        for resource in ("tts-a", "tts-b"):
            cluster.add_node(
                num_cpus=args.cpus, resources={resource: 1}, include_dashboard=False, object_store_memory=80 * 2**20
            )
        cluster.wait_for_nodes()
        # After the nodes start: Ray installs its own SIGTERM handler on the way, which exits at once.
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, lambda *_: stop.set())
        partial = f"{args.env_file}.partial"
        with open(partial, "w") as env:
            env.write(f"export RAY_ADDRESS={cluster.address}\nexport RAY_TMPDIR={private}\n")
        os.replace(partial, args.env_file)  # whoever waits for the file never reads half of it
        print(f"Ray cluster at {cluster.address}: nodes tts-a and tts-b; stop it with SIGTERM or Ctrl-C", flush=True)
        while not stop.wait(0.5):  # a timeout, so the signal handlers run promptly
            pass
    finally:
        cluster.shutdown()
        shutil.rmtree(private, ignore_errors=True)
        if os.path.exists(args.env_file):
            os.unlink(args.env_file)
    print("Ray cluster stopped", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
