"""Process-local registries: request state one stage leaves for another in the same OS process.

Some real models hand a prepared request from their front stages to their
engine through module-level Python objects instead of the payload (MOSS-TTS's
PreparedRequestQueue, Qwen3-TTS's prepared-request registries, the voice
prompt caches of Ming-Omni-TTS and Voxtral). Such a handoff only works while
both stages share a process: a second process has its own, empty copy of the
module. That is why those edges are declared unsafe, and the stand-ins keep
their state here so a split really breaks, with a message that says why.

Entries are removed when taken, and never outlive `ttl_s`: a request that is
cancelled or fails between the two stages leaves its entry behind, so every
write first sweeps expired entries. `capacity` bounds memory if the consumer
stops taking; a full registry refuses new requests rather than evicting live
ones, since evicting would fail a request that is still being served.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from typing import Any, Callable

from stagevisor.stages.base import StageError

DEFAULT_CAPACITY = 4096
# Longer than any sane wait between a model's front stage and its engine, even
# under heavy queueing; short enough that abandoned entries do not pile up.
DEFAULT_TTL_S = 600.0


class ProcessLocalRegistry:
    """A bounded, expiring map from request id to state that only this process can read.

    `stages` names the stages that share the state, producer first and
    consumer last, so a miss can tell the operator which stages must share a
    process. Thread-safe.
    """

    def __init__(
        self,
        name: str,
        stages: tuple[str, ...],
        capacity: int = DEFAULT_CAPACITY,
        ttl_s: float = DEFAULT_TTL_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if capacity < 1 or ttl_s <= 0 or len(stages) < 2:
            raise ValueError("capacity must be >= 1, ttl_s > 0, and at least two stages share the state")
        self.name = name
        self.stages = tuple(stages)
        self.capacity = capacity
        self.ttl_s = ttl_s
        self._clock = clock
        self._entries: OrderedDict[str, tuple[float, Any]] = OrderedDict()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        with self._lock:
            self._sweep()
            return len(self._entries)

    def __contains__(self, key: str) -> bool:
        with self._lock:
            self._sweep()
            return key in self._entries

    def put(self, key: str, value: Any) -> None:
        """Publish `value` for request `key`; StageError when the key is taken or the registry is full."""
        with self._lock:
            self._sweep()
            if key in self._entries:
                raise StageError(f"request {key!r} is already waiting in the process-local {self.name}")
            if len(self._entries) >= self.capacity:
                raise StageError(
                    f"the process-local {self.name} holds {self.capacity} requests that stage "
                    f"{self.stages[-1]!r} has not taken yet; retry later"
                )
            self._entries[key] = (self._clock(), value)

    def get(self, key: str, stage: str) -> Any:
        """Read the entry for `key` without removing it; StageError when it is not in this process."""
        with self._lock:
            self._sweep()
            if key not in self._entries:
                raise self._missing(key, stage)
            return self._entries[key][1]

    def pop(self, key: str, stage: str) -> Any:
        """Take and remove the entry for `key`; StageError when it is not in this process."""
        with self._lock:
            self._sweep()
            if key not in self._entries:
                raise self._missing(key, stage)
            return self._entries.pop(key)[1]

    def discard(self, key: str) -> None:
        """Drop the entry for `key` if present (a request that ended early)."""
        with self._lock:
            self._entries.pop(key, None)

    def _sweep(self) -> None:
        # Entries are in insertion order, so the stale ones are at the front.
        deadline = self._clock() - self.ttl_s
        while self._entries:
            key, (created, _) = next(iter(self._entries.items()))
            if created > deadline:
                break
            del self._entries[key]

    def _missing(self, key: str, stage: str) -> StageError:
        names = [repr(s) for s in self.stages]
        listed = ", ".join(names[:-1]) + " and " + names[-1]
        return StageError(
            f"stage {stage!r} found no prepared state for request {key!r} in the process-local {self.name}. "
            f"Stages {listed} must share a process: {names[0]} hands the request over through "
            f"in-process memory that another process cannot read (or the entry expired after "
            f"{self.ttl_s:g} s). Place them in the same process."
        )


class PreparedRequestQueue(ProcessLocalRegistry):
    """MOSS-TTS's handoff: preprocessing publishes each prepared request, the AR engine pops it by key."""
