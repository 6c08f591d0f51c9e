"""The gateway's start-up choice of shared memory: its private area, or the inline fallback and the SHM_FALLBACK
warning that tells the operator how to get shared memory back."""

from __future__ import annotations

import logging
from pathlib import Path

from stagevisor.supervisor.dataplane import shm
from stagevisor.supervisor.dataplane.out_of_line import DEFAULT_SHM_THRESHOLD, PIECE_BYTES

# The gateway's logger: these lines keep the name operators (and their log filters) know them by.
log = logging.getLogger("stagevisor.supervisor.dataplane.gateway")


def open_area(shm_root: Path, shm_dir: str, needed: int) -> tuple[shm.Room, shm.SharedArea | None]:
    """Sweep areas of daemons that are gone, then create `shm_dir` under `shm_root` if it has `needed` bytes.

    Returns what the check found and the area (None: large payloads go inline, and the warning says why).
    """
    swept = shm.remove_orphan_areas(shm_root)
    if swept:
        log.info("removed %d shared-memory directories left by daemons that are gone", swept)
    area: shm.SharedArea | None = None
    room = shm.check_room(shm_root, needed)
    if room.ok:
        try:
            area = shm.SharedArea.create(Path(shm_dir))
        except OSError as error:
            room = shm.Room(
                False, room.root, room.free, room.needed, f"cannot create {shm_dir}: {error}", writable=False
            )
    if area is None and not room.writable:
        # More room would not help: the directory itself is refused (read-only, not ours, missing).
        log.warning(
            "SHM_FALLBACK: %s; payloads of %d KiB or more go inline in %d KiB pieces instead: slower, never "
            "wrong. To use shared memory, make %s a directory this user can write to (a tmpfs, like "
            "/dev/shm) or set %s to one.",
            room.reason,
            DEFAULT_SHM_THRESHOLD // 1024,
            PIECE_BYTES // 1024,
            shm_root,
            shm.SHM_DIR_ENV,
        )
    elif area is None:
        log.warning(
            "SHM_FALLBACK: %s (%s per request x %d requests); payloads of %d KiB or more go inline in "
            "%d KiB pieces instead: slower, never wrong. To use shared memory, give %s more room (docker run "
            "--shm-size=%dm; Kubernetes: a memory-backed emptyDir at /dev/shm with that sizeLimit) or set "
            "%s to a larger tmpfs; %s sets the per-request figure.",
            room.reason,
            shm.mib(shm.bytes_per_request()),
            max(1, needed // shm.bytes_per_request()),
            DEFAULT_SHM_THRESHOLD // 1024,
            PIECE_BYTES // 1024,
            shm_root,
            -(-needed * 2 // (1024 * 1024)),
            shm.SHM_DIR_ENV,
            shm.SHM_BYTES_PER_REQUEST_ENV,
        )
    return room, area
