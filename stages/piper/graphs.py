"""The Piper voice graph cut in three with the onnx package: the prior, the flow and the decoder (HiFi-GAN).

The VITS export is one graph; it is cut at the decoder's first node (`DECODER_START_NODE`) and again at the
flow's inputs, and each part's 1-D convolutions are rewritten as 2-D ones (stages/piper/conv2d.py). Pure data:
no thread, no onnxruntime.
"""

from __future__ import annotations

import collections
import functools
from typing import Any

DECODER_START_NODE = "/dec/conv_pre/Conv"
# The flow's nodes in the export: the acoustic model is cut again at the flow's inputs (the prior z_p
# and the frame mask), so the flow can run window by window (see `Voice.flow`).
FLOW_PREFIX = "/flow/"
# Names the rewrite split_graphs applies; a cached optimized graph of another revision is not reused.
GRAPH_REVISION = "conv2d-3-blocked"
PARTS = ("prior", "flow", "decoder")
"""The parts `split_graphs` returns, in order."""
_ACOUSTIC_INPUTS = ("input", "input_lengths", "scales")
_WAVEFORM_OUTPUT = "output"


def _decoder_input_name(model: Any) -> str:
    for node in model.graph.node:
        if node.name == DECODER_START_NODE:
            return node.input[0]
    raise ValueError(
        f"voice graph has no node {DECODER_START_NODE!r}; it is not a Piper VITS export this split understands"
    )


def _flow_inputs(model: Any) -> list[str]:
    """The flow's inputs from the rest of the graph: [z_p, the frame mask] (the tensor most flow nodes read)."""
    produced = {out: node.name for node in model.graph.node for out in node.output}
    flow = [node for node in model.graph.node if node.name.startswith(FLOW_PREFIX)]
    if not flow:
        raise ValueError(
            f"voice graph has no {FLOW_PREFIX!r} nodes; it is not a Piper VITS export this split understands"
        )
    z_p = flow[0].input[0]
    reads = collections.Counter(
        name
        for node in flow
        for name in node.input
        if name in produced and not produced[name].startswith(FLOW_PREFIX) and name != z_p
    )
    if not reads:
        raise ValueError(
            "the voice graph's flow reads no frame mask; it is not a Piper VITS export this split understands"
        )
    return [z_p, reads.most_common(1)[0][0]]


@functools.lru_cache(maxsize=2)
def split_graphs(model_path: str, lift: bool = True) -> tuple[bytes, bytes, bytes]:
    """The voice graph cut in three, serialized: (prior, flow, decoder).

    The prior maps phoneme ids to the flow's inputs (z_p, mask), the flow
    maps those to the latent, the decoder maps the latent to audio. Each
    part's 1-D convolutions are rewritten as 2-D ones (stages/piper/conv2d.py).
    Pure data (onnx and protobuf, no thread, no onnxruntime): the daemon's
    fork server computes it once (stagevisor.stages.piper.preload) and every worker
    forked from it starts with it in memory.
    """
    import onnx
    import onnx.utils

    from stagevisor.stages.piper.conv2d import lift_convolutions

    model = onnx.load(model_path)
    latent_name = _decoder_input_name(model)
    flow_inputs = _flow_inputs(model)
    extractor = onnx.utils.Extractor(model)
    prior = extractor.extract_model(list(_ACOUSTIC_INPUTS), flow_inputs)
    flow = extractor.extract_model(flow_inputs, [latent_name])
    decoder = extractor.extract_model([latent_name], [_WAVEFORM_OUTPUT])
    # Every part's 1-D convolutions run on onnxruntime's blocked 2-D kernels (stages/piper/conv2d.py);
    # `lift=False` keeps the export's own operators (tests/benchmarks/bench_voice.py compares the two).
    if not lift:
        return prior.SerializeToString(), flow.SerializeToString(), decoder.SerializeToString()
    return lift_convolutions(prior), lift_convolutions(flow), lift_convolutions(decoder)


def split_part(model_path: str, index: int) -> bytes:
    """One of the graphs `split_graphs` cuts (an index into PARTS)."""
    return split_graphs(model_path)[index]
