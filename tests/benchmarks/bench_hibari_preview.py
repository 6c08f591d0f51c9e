"""Could the default voice's first frames come before its acoustic pass ends? The model cut at its length regulator.

hibari's acoustic model attends over phonemes only: after its length
regulator (phonemes -> frames) it is convolutional over frames. Cut there
(`onnx.utils.extract_model`), its phoneme half and frame half run one after
the other; the frame half run on only the first regulator frames a
sentence's first 16 output frames need gives those frames early (a
"preview"). This prints, on the four texts bench_hibari.py uses:

- whether the two halves give the whole model's outputs bit for bit;
- the median time (min-max over `--repeats` interleaved runs) of the whole
  pass, the phoneme half, and the frame half on the preview's frames;
- how far the preview's first 16 frames are from the whole pass's (each
  int8 layer's `DynamicQuantizeLinear` takes its scale from the frames it
  is given, so they differ).

    python tests/benchmarks/bench_hibari_preview.py [--repeats 9]

Needs the `demo` extra and `onnx` (the test extra has both).
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

FIRST_FRAMES = 16
"""The vocoder's first run (stages/hibari/render.py FIRST_RUN_FRAMES)."""
CUT_INPUTS = ("/Transpose_22_output_0", "/ReduceSum_1_output_0", "/Transpose_55_output_0")
"""What the frame half reads: the phoneme encoder's output, each regulator frame's phoneme, the prosody input."""
FRAMES_PER_REGULATOR_FRAME = 2
"""Output frames per regulator frame (the decoder upsamples by 2)."""


def receptive_field(model, prefix: str) -> int:
    """Frames each side that the depthwise convolutions named `prefix*` see, added up (kernel-1)/2 * dilation."""
    import onnx

    reach = 0
    for node in model.graph.node:
        if node.op_type == "Conv" and node.name.startswith(prefix):
            attributes = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
            reach += (attributes["kernel_shape"][0] - 1) // 2 * attributes.get("dilations", [1])[0]
    return reach


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=9)
    args = parser.parse_args()

    import hibari
    import numpy as np
    import onnx
    import onnxruntime as ort
    from onnx import utils

    from stagevisor.stages.hibari.voice import Phonemizer
    from bench_hibari import TEXTS  # this directory (the script's) is on sys.path

    path = os.path.join(os.path.dirname(hibari.__file__), "assets", "hibari.onnx")
    model = onnx.load(path)
    outputs = [output.name for output in model.graph.output]
    prosody = receptive_field(model, "/pro")
    decoder = receptive_field(model, "/dec")
    # Output frame 15 needs regulator frame 7, the decoder's reach (in output frames) and the prosody stack's.
    window = FIRST_FRAMES // FRAMES_PER_REGULATOR_FRAME + -(-decoder // FRAMES_PER_REGULATOR_FRAME) + prosody
    print(
        f"receptive field: prosody {prosody} regulator frames, decoder {decoder} output frames each side; "
        f"the first {FIRST_FRAMES} frames need the first {window} regulator frames"
    )

    def session(model_path: str):
        options = ort.SessionOptions()
        options.intra_op_num_threads = options.inter_op_num_threads = 1  # the package's, and stagevisor's
        return ort.InferenceSession(model_path, options, providers=["CPUExecutionProvider"])

    with tempfile.TemporaryDirectory() as directory:
        phoneme_path, frame_path = str(Path(directory, "phonemes.onnx")), str(Path(directory, "frames.onnx"))
        utils.extract_model(path, phoneme_path, ["ids", "speed"], list(CUT_INPUTS))
        utils.extract_model(path, frame_path, list(CUT_INPUTS), outputs)
        whole, phonemes, frames = session(path), session(phoneme_path), session(frame_path)

    phonemizer = Phonemizer()
    feeds = [
        {"ids": np.asarray([phonemizer.phoneme_ids(text)[0]], np.int64), "speed": np.asarray([1.0], np.float32)}
        for text in TEXTS
    ]
    for index, feed in enumerate(feeds):
        reference = whole.run(None, feed)
        cut = dict(zip(CUT_INPUTS, phonemes.run(None, feed), strict=True))
        halves = frames.run(None, cut)
        preview = frames.run(None, {**cut, CUT_INPUTS[1]: cut[CUT_INPUTS[1]][:window]})
        exact = all(np.array_equal(a, b) for a, b in zip(reference, halves, strict=True))
        differences = ", ".join(
            f"{name} {np.abs(a[..., :FIRST_FRAMES] - b[..., :FIRST_FRAMES]).max():.3g} "
            f"(largest {np.abs(a[..., :FIRST_FRAMES]).max():.3g})"
            for name, a, b in zip(outputs, reference, preview, strict=True)
        )
        print(
            f"text {index}: {reference[-1].shape[-1]} frames; halves bit for bit: {exact}; first "
            f"{FIRST_FRAMES} frames of the preview against the whole pass, largest difference: {differences}"
        )

    # The frame half's inputs, cut to the preview's frames, made once: only the runs are timed.
    previews = []
    for feed in feeds:
        cut = dict(zip(CUT_INPUTS, phonemes.run(None, feed), strict=True))
        previews.append({**cut, CUT_INPUTS[1]: cut[CUT_INPUTS[1]][:window]})
    runs = {
        "whole pass": (whole, feeds),
        "phoneme half": (phonemes, feeds),
        f"frame half, {window} frames": (frames, previews),
    }
    times: dict[str, list[float]] = {label: [] for label in runs}
    for _ in range(args.repeats):  # interleaved: each repetition times all three on every text
        for label, (model, inputs) in runs.items():
            started = time.perf_counter()
            for one in inputs:
                model.run(None, one)
            times[label].append((time.perf_counter() - started) / len(inputs) * 1e3)
    print(f"ms a sentence, medians of {args.repeats} runs of the {len(feeds)} texts [min-max]:")
    for label, values in times.items():
        print(f"  {label:28} {statistics.median(values):6.1f} [{min(values):.1f}-{max(values):.1f}]")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
