"""The shipped systemd unit is hardened and stays compatible with the GPU devices and /dev/shm handoff."""

from __future__ import annotations

from pathlib import Path

UNIT = Path(__file__).resolve().parents[2] / "deploy" / "systemd" / "stagevisor.service"


def systemd_lines(text: str) -> list[str]:
    """The unit's logical lines as systemd reads them (systemd.syntax(7)): a line ending in `\\` continues with the
    next line that is not a comment (a comment block inside a continuation is skipped)."""
    lines: list[str] = []
    pending: str | None = None
    for raw in text.splitlines():
        line = raw.strip()
        if line.startswith(("#", ";")) or (not line and pending is None):
            continue
        joined = line if pending is None else f"{pending} {line}"
        if line.endswith("\\"):
            pending = joined[:-1].rstrip()
        else:
            lines.append(joined)
            pending = None
    return lines


def service_settings() -> dict[str, str]:
    settings, section = {}, None
    for line in systemd_lines(UNIT.read_text()):
        if line.startswith("["):
            section = line.strip("[]")
        elif section == "Service":
            key, _, value = line.partition("=")
            settings[key] = value
    return settings


def test_the_unit_raises_the_fd_limit_and_sandboxes_the_service():
    service = service_settings()
    assert int(service["LimitNOFILE"]) >= 65536
    for key, value in {
        "NoNewPrivileges": "true",
        "ProtectSystem": "strict",
        "ProtectHome": "true",
        "PrivateTmp": "true",
        "RestrictSUIDSGID": "true",
        "CapabilityBoundingSet": "",
        "UMask": "0077",
    }.items():
        assert service[key] == value, key


def test_the_sandbox_keeps_gpus_shared_memory_and_jit_code_working():
    service = service_settings()
    assert service.get("PrivateDevices", "false") == "false"  # /dev/nvidia* stay visible
    assert "MemoryDenyWriteExecute" not in service  # CUDA, torch and onnxruntime generate code
    # Options that set a device ACL (DeviceAllow=, or ProtectClock= which implies one on older
    # systemd) close the device policy and hide the GPUs.
    assert "DeviceAllow" not in service and "ProtectClock" not in service
    assert "/dev/shm" not in service.get("InaccessiblePaths", "")
    writable = {service.get("RuntimeDirectory"), service.get("CacheDirectory")}
    assert {"stagevisor"} == writable  # what ProtectSystem=strict leaves writable: sockets and model cache


def test_uploaded_voices_go_to_the_state_directory_the_sandbox_leaves_writable():
    """Before: no --voices-dir and no StateDirectory=: the default, ~/.local/share/stagevisor/voices, is read-only
    under ProtectHome, so `serve` warned at start and every upload got 500 voice_store_unavailable."""
    service = service_settings()
    arguments = service["ExecStart"].split()
    voices = arguments[arguments.index("--voices-dir") + 1]
    assert voices.startswith(f"/var/lib/{service['StateDirectory']}/") and service["StateDirectoryMode"] == "0700"


def exec_start_of(text: str) -> list[str]:
    """ExecStart='s arguments after the executable, the credentials directory substituted; every line is a section or
    a `Key=value` (systemd ignores any other line with "Missing '='": an option left outside the command line)."""
    for line in systemd_lines(text):
        assert line.startswith("[") or "=" in line, f"systemd ignores this line (missing '='): {line}"
    (command,) = [line.partition("=")[2] for line in systemd_lines(text) if line.startswith("ExecStart=")]
    executable, *arguments = command.replace("${CREDENTIALS_DIRECTORY}", "/run/credentials/stagevisor.service").split()
    assert executable.endswith("/bin/stagevisor")
    return arguments


def test_the_exec_start_command_line_parses_with_the_cli():
    from stagevisor.supervisor.cli import build_parser

    args = build_parser().parse_args(exec_start_of(UNIT.read_text()))
    assert (args.command, args.listen, args.drain_timeout, args.stop_timeout) == ("serve", "127.0.0.1:50551", 30, 10)


def test_uncommenting_the_tls_lines_turns_tls_and_the_token_on():
    """Before: the commented --tls-*/--api-key-file lines followed ExecStart='s last line; uncommented, systemd
    ignored them ("Missing '='") and the daemon served plaintext without a token on 127.0.0.1."""
    from stagevisor.supervisor.cli import build_parser

    text = UNIT.read_text()
    uncommented = "\n".join(
        line[1:] if line.startswith(("#LoadCredential=", "#   --")) else line for line in text.splitlines()
    )
    assert uncommented.count("LoadCredential=") == 3
    args = build_parser().parse_args(exec_start_of(uncommented))
    credentials = "/run/credentials/stagevisor.service"
    assert (args.listen, args.tls_cert, args.tls_key, args.api_key_file) == (
        "0.0.0.0:50551",
        f"{credentials}/tls.pem",
        f"{credentials}/tls.key",
        f"{credentials}/api.key",
    )
    assert args.voices_dir == "/var/lib/stagevisor/voices"  # the lines after them still belong to the command
