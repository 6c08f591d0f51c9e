"""The shipped systemd unit is hardened and stays compatible with the GPU devices and /dev/shm handoff."""

from __future__ import annotations

from pathlib import Path

UNIT = Path(__file__).resolve().parents[2] / "deploy" / "systemd" / "stagevisor.service"


def service_settings() -> dict[str, str]:
    settings, section, text = {}, None, UNIT.read_text().replace("\\\n", " ")
    for line in text.splitlines():
        line = line.strip()
        if line.startswith("["):
            section = line.strip("[]")
        elif line and not line.startswith("#") and section == "Service":
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
