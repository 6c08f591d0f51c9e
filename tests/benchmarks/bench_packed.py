"""The per-frame Python cost of a small handoff's data tree: packed (msgpack) against the Value tree.

For `{"tensor": float32 array, "step": 1}` payloads it measures, in this
thread's CPU time (minimum over --repeats runs of --count frames each):

  encode  codec.encode of the tree, set as a Chunk frame's value, framed as
          the link frames it (link.frame_bytes)
  decode  the Frame parsed back and codec.decode of its value

for `packed` (the codec as shipped), `tree` (the same codec with packed values
off) and, with `--baseline FILE`, `baseline`: the codec with pack/unpack taken
from another version of packed.py (e.g. `git show OLD:supervisor/dataplane/packed.py
> /tmp/old_packed.py`), all in the same run. Ratios are against `tree`.

    python tests/benchmarks/bench_packed.py --sizes 256 4096 --baseline /tmp/old_packed.py
"""

from __future__ import annotations

import argparse
import importlib.util
import time
from contextlib import contextmanager
from typing import Iterator

import numpy as np

from stagevisor.supervisor._proto import dataplane_pb2 as pb
from stagevisor.supervisor.dataplane import codec as codec_module, decoding
from stagevisor.supervisor.dataplane.codec import Codec
from stagevisor.supervisor.dataplane.link.frames import frame_bytes


def payload_of(size: int) -> dict:
    return {"tensor": np.ones(size // 4, dtype=np.float32), "step": 1}


@contextmanager
def packed_from(path: str | None) -> Iterator[None]:
    """The codec with pack/unpack/PackError from the packed.py at `path` (None: as shipped)."""
    if path is None:
        yield
        return
    spec = importlib.util.spec_from_file_location("baseline_packed", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    # pack is the encoding's (codec.py), unpack and PackError the decoding's (decoding.py).
    saved = codec_module.pack, decoding.unpack, decoding.PackError
    codec_module.pack, decoding.unpack, decoding.PackError = module.pack, module.unpack, module.PackError
    try:
        yield
    finally:
        codec_module.pack, decoding.unpack, decoding.PackError = saved


def measure(codec: Codec, payload: dict, count: int) -> tuple[float, float, bytes]:
    """(encode us, decode us, one framed frame) per frame, thread CPU time."""
    started = time.thread_time()
    for _ in range(count):
        frame = pb.Frame(request_id="r", src="a", dst="b")
        frame.chunk.value.CopyFrom(codec.encode(payload))
        framed = frame_bytes(frame)
    encoded = time.thread_time() - started
    body = frame.SerializeToString()
    started = time.thread_time()
    for _ in range(count):
        back = codec.decode(pb.Frame.FromString(body).chunk.value)
    decoded = time.thread_time() - started
    assert back["step"] == 1 and np.array_equal(back["tensor"], payload["tensor"])
    return encoded / count * 1e6, decoded / count * 1e6, framed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=int, nargs="+", default=[256, 4096], help="tensor sizes in bytes")
    parser.add_argument("--count", type=int, default=5000, help="frames per run")
    parser.add_argument("--repeats", type=int, default=7, help="interleaved runs; the minimum is reported")
    parser.add_argument("--baseline", help="another packed.py to compare (e.g. the hand-written layout)")
    args = parser.parse_args()
    systems = [("tree", Codec(packed=False), None), ("packed", Codec(), None)]
    if args.baseline:
        systems.append(("baseline", Codec(), args.baseline))
    print(f"thread CPU time per frame, minimum of {args.repeats} runs of {args.count}; ratio against tree")
    for size in args.sizes:
        payload = payload_of(size)
        best: dict[str, list[float]] = {name: [float("inf"), float("inf")] for name, _, _ in systems}
        wire: dict[str, int] = {}
        for _ in range(args.repeats):
            for name, codec, path in systems:
                with packed_from(path):
                    encode, decode, framed = measure(codec, payload, args.count)
                best[name] = [min(best[name][0], encode), min(best[name][1], decode)]
                wire[name] = len(framed)
        base_encode, base_decode = best["tree"]
        for name, _, _ in systems:
            encode, decode = best[name]
            print(
                f"{size:>7} B  {name:<9} encode+frame {encode:6.2f} us ({encode / base_encode:.2f}x)   "
                f"parse+decode {decode:6.2f} us ({decode / base_decode:.2f}x)   frame {wire[name]} B"
            )


if __name__ == "__main__":
    main()
