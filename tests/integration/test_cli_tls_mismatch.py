"""The admin CLI dialling a healthy daemon with TLS settings that do not fit it: told so, never to kill it."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.integration.daemon_helpers import ROOT, DaemonProcess, colocated_pipeline


@pytest.mark.slow  # CLI runs that each wait out the connect timeout (test_cli_unreachable.py: the quick one)
def test_tls_asked_of_a_plaintext_daemon_or_a_ca_file_that_is_no_certificate_is_said_so(tmp_path):
    """`status --tls` on a SERVING daemon's unix socket said it was wedged and to `kill -KILL` it; so did
    `--tls-ca /etc/passwd`, after four lines of gRPC's own.

    1. a daemon serves its admin API on a unix socket (plaintext, as it always does there)
    2. `status --tls` and `topology --tls --format json` say it serves plaintext, to drop --tls (exit 2)
    3. `status --tls-ca FILE` with a file that holds no certificate is refused before dialling, naming it
    4. the daemon was SERVING throughout, and `status` without TLS still reads it
    """
    not_pem = tmp_path / "ca.pem"
    not_pem.write_text("root:x:0:0:root:/root:/bin/bash\n")
    with DaemonProcess(colocated_pipeline()) as daemon:
        daemon.wait_serving()
        address = daemon.admin_address

        status = daemon.cli("status", "--tls")
        assert status.returncode == 2, status.stderr
        assert status.stderr == (
            f"error: the stagevisor daemon (pid {daemon.pid}) at {address} serves its admin API in plaintext (on a "
            "unix socket it always does: the socket's private directory and peer-credential check protect it), and "
            "this command dialled it with TLS (--tls): drop --tls. The daemon is up; its log says "
            f"`admin API listening on {address} (plaintext, ...)`\n"
        )
        assert f"admin API listening on {address} (plaintext, " in daemon.log()

        topology = daemon.cli("topology", "--tls", "--format", "json")
        assert topology.returncode == 2 and "kill" not in topology.stderr
        assert json.loads(topology.stdout)["error"]["code"] == "TLS_MISMATCH"

        refused = daemon.cli("status", "--tls-ca", str(not_pem))
        assert refused.returncode == 2
        assert refused.stderr.startswith(f"error: --tls-ca {not_pem} is not a PEM CA bundle (")
        assert len(refused.stderr.splitlines()) == 1, refused.stderr  # no lines of gRPC's own

        # synthesize, on the public endpoint: it said it could not reach the daemon, "is `stagevisor serve` running?"
        said = subprocess.run(
            [sys.executable, "-m", "stagevisor", "synthesize", "Hi.", "--address", daemon.listen, "--tls", "-o",
             str(tmp_path / "hi.wav")],
            cwd=ROOT, env=daemon.env, capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert said.returncode == 2, said.stderr
        assert said.stderr.startswith(
            f"error: the stagevisor daemon at {daemon.listen} serves its public endpoint in plaintext"
        ), said.stderr
        assert f"`public endpoint listening on {daemon.listen} (plaintext, ...)`" in said.stderr
        assert f"public endpoint listening on {daemon.listen} (plaintext, " in daemon.log()

        assert daemon.status()["state"] == "SERVING"
