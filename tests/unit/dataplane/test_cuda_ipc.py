"""The CUDA IPC policy and its hook in the codec, on CPU (the real handle path is in tests/gpu/)."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.torch
torch = pytest.importorskip("torch")

from stagevisor.supervisor._proto import dataplane_pb2 as pb  # noqa: E402
from stagevisor.supervisor.dataplane import codec as codec_module, cuda_ipc  # noqa: E402
from stagevisor.supervisor.dataplane.codec import Codec  # noqa: E402
from stagevisor.supervisor.dataplane.out_of_line import discard_shared  # noqa: E402
from stagevisor.supervisor.dataplane.cuda_ipc import CudaIpc  # noqa: E402

ADDRESSES = {"unix:/r/g0.sock": 0, "unix:/r/g1.sock": 0, "unix:/r/g2.sock": 1, "unix:/r/g3.sock": None}


class CudaLooking(torch.Tensor):
    """A CPU tensor that says it is on CUDA, so the codec consults its IPC policy."""

    @property
    def is_cuda(self):
        return True


CudaLooking.__module__ = "torch.stagevisor_test"  # the codec recognizes tensors by their module


def cuda_looking(values) -> torch.Tensor:
    return torch.Tensor._make_subclass(CudaLooking, torch.tensor(values))


class RecordingPolicy:
    def __init__(self, share: bool) -> None:
        self.share = share
        self.asked: list[str | None] = []
        self.encoded = 0

    def shares_with(self, address):
        self.asked.append(address)
        return address == "unix:/same"

    def encode(self, tensor, message):
        self.encoded += 1
        if self.share:
            message.framework = cuda_ipc.FRAMEWORK
        return self.share


def test_only_workers_on_the_same_gpu_share_by_handle_never_itself_or_the_daemon():
    policy = CudaIpc.for_worker(0, "unix:/r/g0.sock", {**ADDRESSES, "unix:/r/gateway.sock": None}, environ={})
    assert [a for a in ADDRESSES if policy.shares_with(a)] == ["unix:/r/g1.sock"]
    assert not policy.shares_with("unix:/r/gateway.sock") and not policy.shares_with(None)


def test_a_cpu_worker_and_the_switch_turn_ipc_off():
    assert not CudaIpc.for_worker(None, "unix:/r/g3.sock", ADDRESSES, environ={}).enabled
    off = CudaIpc.for_worker(0, "unix:/r/g0.sock", ADDRESSES, environ={"STAGEVISOR_CUDA_IPC": "0"})
    assert not off.shares_with("unix:/r/g1.sock")


def test_a_host_tensor_is_never_encoded_by_handle():
    message = pb.Tensor()
    assert CudaIpc(0, {"unix:/x": 0}).encode(torch.arange(4), message) is False
    assert message == pb.Tensor()


def test_the_codec_asks_the_policy_about_the_destination_of_each_encode():
    policy = RecordingPolicy(share=False)
    codec = Codec(cuda=policy)
    value = pb.Value()
    codec.encode_into({"x": cuda_looking([1.5, 2.5])}, value, "unix:/same")
    codec.encode_into({"x": torch.tensor([1.0])}, pb.Value(), "unix:/same")  # a host tensor: not asked
    codec.encode({"x": cuda_looking([1.0])})  # no destination given
    assert policy.asked == ["unix:/same", None] and policy.encoded == 1
    decoded = codec.decode(value)["x"]  # the policy declined: a bit-exact host copy
    assert decoded.dtype == torch.float32 and decoded.tolist() == [1.5, 2.5]


def test_a_handle_message_is_decoded_and_discarded_by_the_ipc_module(monkeypatch):
    seen = []
    monkeypatch.setattr(cuda_ipc, "decode", lambda message: seen.append(("decode", message.framework)) or "t")
    monkeypatch.setattr(cuda_ipc, "discard", lambda message: seen.append(("discard", message.framework)))
    codec = Codec(cuda=RecordingPolicy(share=True))
    decoded, dropped = codec_module.pb.Value(), codec_module.pb.Value()
    codec.encode_into([cuda_looking([3])], decoded, "unix:/same")
    codec.encode_into([cuda_looking([4])], dropped, "unix:/same")
    assert Codec().decode(decoded) == ["t"]
    discard_shared(dropped)
    assert seen == [("decode", cuda_ipc.FRAMEWORK), ("discard", cuda_ipc.FRAMEWORK)]


def test_a_handle_is_given_back_once_when_its_frame_is_dropped_after_it_decoded(monkeypatch):
    # The rebuilt tensor's storage gives the sender's count back when collected; a drop of the frame (a later
    # value failed, or the request did) must not give it back a second time, or the sender frees a block the
    # receiver still reads.
    seen = []
    monkeypatch.setattr(cuda_ipc, "decode", lambda message: seen.append("decode") or "t")
    monkeypatch.setattr(cuda_ipc, "discard", lambda message: seen.append("discard"))
    value = codec_module.pb.Value()
    Codec(cuda=RecordingPolicy(share=True)).encode_into(
        {"a": cuda_looking([1]), "b": cuda_looking([2]), "c": cuda_looking([3])}, value, "unix:/same"
    )
    value.map.values[1].tensor.dtype = "torch.nonsense"  # `b` fails after `a` is rebuilt; `c` is never reached
    real_decode = cuda_ipc.decode

    def fail_b(message):
        if message.dtype == "torch.nonsense":
            raise ValueError("no such dtype")
        return real_decode(message)

    monkeypatch.setattr(cuda_ipc, "decode", fail_b)
    with pytest.raises(codec_module.CodecError, match="CUDA IPC tensor refused"):
        Codec().decode(value)
    discard_shared(value)
    assert seen == ["decode", "discard", "discard"]  # a: rebuilt, its storage's; b and c: given back by the drop
    with pytest.raises(codec_module.CodecError, match="already took"):
        Codec().decode(codec_module.pb.Value(tensor=value.map.values[0].tensor))
