"""A link's wire format: frames concatenated as the elements of one FrameBatch, parsed one by one.

Each frame is serialized once, when it is sent; a batch is the concatenation
of their wire encodings (field 1, length-delimited), so batching costs no
re-encoding. A batch that does not parse as a whole is parsed frame by frame:
a frame that does not parse is reported apart (with its request id, when that
much can be read), so only its request fails and the link goes on.
"""

from __future__ import annotations

import logging
from typing import NamedTuple

from google.protobuf.message import DecodeError

from stagevisor.supervisor._proto import dataplane_pb2 as pb
from stagevisor.supervisor.logs import Throttled

# The link's logger: warnings about what peers sent keep the logger name they were always logged under.
log = logging.getLogger("stagevisor.supervisor.dataplane.link")


def frame_bytes(frame: pb.Frame) -> bytes:
    """The frame as one element of FrameBatch.frames on the wire (field 1, length-delimited)."""
    body: bytes = frame.SerializeToString()
    size = len(body)
    if size < 0x80:
        return bytes((0x0A, size)) + body
    if size < 0x4000:
        return bytes((0x0A, size & 0x7F | 0x80, size >> 7)) + body
    return b"\x0a" + _varint(size) + body


bad_frames_log = Throttled(log)
"""Warnings about what peers sent (bad frames, refused buffers): one budget per process."""


class BadFrame(NamedTuple):
    """A frame that did not parse: its request id where it could be read, and why."""

    request_id: str
    error: str


def parse_batch(data: bytes) -> tuple[list[pb.Frame], list[BadFrame]]:
    """The frames of a serialized FrameBatch; frames that do not parse are returned apart."""
    try:
        return list(pb.FrameBatch.FromString(data).frames), []
    except DecodeError:
        pass
    frames: list[pb.Frame] = []
    bad: list[BadFrame] = []
    position = 0
    while position < len(data):
        tag, position = _read_varint(data, position)
        if tag != 0x0A or position < 0:
            bad.append(BadFrame("", "a frame batch with a malformed envelope; the rest of it was dropped"))
            break
        length, position = _read_varint(data, position)
        if position < 0 or position + length > len(data):
            bad.append(BadFrame("", "a frame batch cut short; the rest of it was dropped"))
            break
        body = data[position : position + length]
        position += length
        try:
            frames.append(pb.Frame.FromString(body))
        except DecodeError as error:
            bad.append(BadFrame(_request_id_of(body), f"a malformed frame ({error})"))
    return frames, bad


def _read_varint(data: bytes, position: int) -> tuple[int, int]:
    """(value, next position); next position -1 when the varint is cut short or too long."""
    value = shift = 0
    while position < len(data) and shift < 64:
        byte = data[position]
        position += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, position
        shift += 7
    return 0, -1


def _request_id_of(body: bytes) -> str:
    """Field 1 (request_id) of a Frame that does not parse as a whole, if it is readable and leads."""
    if body[:1] != b"\x0a":
        return ""
    length, position = _read_varint(body, 1)
    if position < 0 or length > 256 or position + length > len(body):
        return ""
    try:
        return body[position : position + length].decode()
    except UnicodeDecodeError:
        return ""


def _varint(value: int) -> bytes:
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def identity(data: bytes) -> bytes:
    """The (de)serializer of the Link method: its messages are bytes, a FrameBatch serialized by hand."""
    return data
