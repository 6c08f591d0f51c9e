"""stages/piper/conv2d.py: 1-D convolutions lifted to 2-D compute the same values, on small hand-built graphs."""

from __future__ import annotations

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
onnxruntime = pytest.importorskip("onnxruntime")

from onnx import TensorProto, helper, numpy_helper  # noqa: E402

from stagevisor.stages.piper.conv2d import lift_convolutions  # noqa: E402

RNG = np.random.default_rng(7)


def _initializer(name: str, shape: tuple[int, ...]) -> object:
    return numpy_helper.from_array(RNG.standard_normal(shape).astype(np.float32), name)


def _model(nodes, initializers, outputs=("y",), opset=15) -> bytes:
    graph = helper.make_graph(
        nodes,
        "g",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, None]),
            helper.make_tensor_value_info("mask", TensorProto.FLOAT, [1, 1, None]),
        ],
        [helper.make_tensor_value_info(name, TensorProto.FLOAT, None) for name in outputs],
        initializer=initializers,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)]).SerializeToString()


def _run(model: bytes, x: np.ndarray, mask: np.ndarray) -> list[np.ndarray]:
    session = onnxruntime.InferenceSession(model, providers=["CPUExecutionProvider"])
    feeds = {i.name: v for i, v in zip(session.get_inputs(), (x, mask), strict=True)}
    return session.run(None, feeds)


def _ops(model: bytes) -> list[str]:
    return [n.op_type for n in onnx.load_from_string(model).graph.node]


def _decoder_like(opset: int = 15) -> bytes:
    """conv -> leaky relu -> transposed conv -> residual conv with a dilation, averaged -> tanh."""
    nodes = [
        helper.make_node("Conv", ["x", "w0", "b0"], ["c0"], kernel_shape=[7], pads=[3, 3]),
        helper.make_node("LeakyRelu", ["c0"], ["a0"], alpha=0.1),
        helper.make_node("ConvTranspose", ["a0", "wt", "bt"], ["u"], kernel_shape=[8], strides=[4], pads=[2, 2]),
        helper.make_node("LeakyRelu", ["u"], ["a1"], alpha=0.1),
        helper.make_node("Conv", ["a1", "w1", "b1"], ["c1"], kernel_shape=[3], pads=[2, 2], dilations=[2]),
        helper.make_node("Add", ["c1", "u"], ["r"]),
        helper.make_node("Div", ["r", "two"], ["h"]),
        helper.make_node("Conv", ["h", "w2"], ["c2"], pads=[1, 1]),  # no kernel_shape: taken from the weight
        helper.make_node("Tanh", ["c2"], ["y"]),
    ]
    initializers = [
        _initializer("w0", (16, 8, 7)),
        _initializer("b0", (16,)),
        _initializer("wt", (16, 8, 8)),
        _initializer("bt", (8,)),
        _initializer("w1", (8, 8, 3)),
        _initializer("b1", (8,)),
        numpy_helper.from_array(np.asarray([2.0], dtype=np.float32), "two"),
        _initializer("w2", (1, 8, 3)),
    ]
    return _model(nodes, initializers, opset=opset)


@pytest.mark.parametrize("opset", [11, 15])
def test_a_graph_of_convolutions_and_activations_stays_lifted_and_computes_the_same(opset):
    model = _decoder_like(opset)
    lifted = lift_convolutions(model)
    x = RNG.standard_normal((1, 8, 50)).astype(np.float32)
    mask = np.ones((1, 1, 50), dtype=np.float32)
    (expected,), (got,) = _run(model, x, mask), _run(lifted, x, mask)
    assert got.shape == expected.shape == (1, 1, 200)
    np.testing.assert_allclose(got, expected, rtol=0, atol=1e-5)
    ops = _ops(lifted)
    # Lifted once at the input and squeezed once at the output: nothing in between leaves 4-D.
    assert ops.count("Unsqueeze") == 1 and ops.count("Squeeze") == 1
    weights = {t.name: tuple(t.dims) for t in onnx.load_from_string(lifted).graph.initializer}
    assert weights["w0"] == (16, 8, 1, 7)  # read by this convolution alone: lifted in place, not copied
    assert "wt" not in weights and "bt" not in weights  # the polyphase kernel replaced the transposed one's


def test_a_convolution_beside_a_mask_is_lifted_on_its_own_and_the_mask_read_unlifted():
    nodes = [
        helper.make_node("Conv", ["x", "w0"], ["c0"], kernel_shape=[5], pads=[2, 2]),
        helper.make_node("Mul", ["c0", "mask"], ["m"]),  # a 3-D mask: the product is computed unlifted
        helper.make_node("Relu", ["m"], ["y"]),
        helper.make_node("Transpose", ["c0"], ["t"], perm=[0, 2, 1]),  # another reader of the conv's output
    ]
    model = _model(nodes, [_initializer("w0", (8, 8, 5))], outputs=("y", "t"))
    lifted = lift_convolutions(model)
    x = RNG.standard_normal((1, 8, 33)).astype(np.float32)
    mask = (RNG.random((1, 1, 33)) > 0.3).astype(np.float32)
    for expected, got in zip(_run(model, x, mask), _run(lifted, x, mask), strict=True):
        assert got.shape == expected.shape
        np.testing.assert_allclose(got, expected, rtol=0, atol=1e-5)
    ops = _ops(lifted)
    assert ops.count("Squeeze") == 1  # the conv's output is squeezed once for both readers
    assert ops.index("Squeeze") < ops.index("Mul")


def test_weights_another_reader_still_needs_in_3_d_are_copied_for_the_lifted_convolution():
    nodes = [
        helper.make_node("Conv", ["x", "w"], ["c0"], kernel_shape=[3], pads=[1, 1]),
        helper.make_node("Conv", ["c0", "w"], ["y"], kernel_shape=[3], auto_pad="SAME_UPPER"),  # left 1-D
    ]
    model = _model(nodes, [_initializer("w", (8, 8, 3))])
    lifted = lift_convolutions(model)
    weights = {t.name: tuple(t.dims) for t in onnx.load_from_string(lifted).graph.initializer}
    assert weights["w"] == (8, 8, 3) and weights["w/sv_lifted"] == (8, 8, 1, 3)
    x = RNG.standard_normal((1, 8, 20)).astype(np.float32)
    mask = np.ones((1, 1, 20), dtype=np.float32)
    expected = _run(model, x, mask)[0]  # two convolutions deep: values of about 20, float32 rounding of about 1e-5
    np.testing.assert_allclose(_run(lifted, x, mask)[0], expected, rtol=0, atol=1e-6 * np.abs(expected).max() * 8)


def test_a_convolution_whose_weights_are_computed_or_padded_automatically_is_left_alone():
    nodes = [
        helper.make_node("Identity", ["w0"], ["w_runtime"]),
        helper.make_node("Conv", ["x", "w_runtime"], ["c0"], kernel_shape=[3], pads=[1, 1]),
        helper.make_node("Conv", ["c0", "w1"], ["y"], kernel_shape=[3], auto_pad="SAME_UPPER"),
    ]
    model = _model(nodes, [_initializer("w0", (8, 8, 3)), _initializer("w1", (8, 8, 3))])
    lifted = lift_convolutions(model)
    assert "Unsqueeze" not in _ops(lifted)
    x = RNG.standard_normal((1, 8, 20)).astype(np.float32)
    mask = np.ones((1, 1, 20), dtype=np.float32)
    np.testing.assert_array_equal(_run(lifted, x, mask)[0], _run(model, x, mask)[0])


@pytest.mark.parametrize(
    "kernel, stride, pads, bias",
    [(16, 8, (4, 4), True), (7, 3, (1, 2), True), (5, 2, (0, 0), False), (2, 4, (0, 1), True)],
)
def test_a_strided_transposed_convolution_becomes_a_polyphase_one_with_the_same_output(kernel, stride, pads, bias):
    inputs = ["x", "w", "b"] if bias else ["x", "w"]
    nodes = [helper.make_node("ConvTranspose", inputs, ["y"], kernel_shape=[kernel], strides=[stride], pads=list(pads))]
    initializers = [_initializer("w", (8, 6, kernel))] + ([_initializer("b", (6,))] if bias else [])
    model = _model(nodes, initializers)
    lifted = lift_convolutions(model)
    assert "ConvTranspose" not in _ops(lifted)
    for length in (1, 9, 40):
        x = RNG.standard_normal((1, 8, length)).astype(np.float32)
        mask = np.ones((1, 1, length), dtype=np.float32)
        (expected,), (got,) = _run(model, x, mask), _run(lifted, x, mask)
        assert got.shape == expected.shape == (1, 6, (length - 1) * stride + kernel - sum(pads))
        np.testing.assert_allclose(got, expected, rtol=0, atol=1e-5)


def test_a_transposed_convolution_of_stride_one_or_with_output_padding_stays_a_transposed_convolution():
    nodes = [
        helper.make_node("ConvTranspose", ["x", "w"], ["t"], kernel_shape=[3], pads=[1, 1]),
        helper.make_node("ConvTranspose", ["t", "w"], ["y"], kernel_shape=[3], strides=[2], output_padding=[1]),
    ]
    model = _model(nodes, [_initializer("w", (8, 8, 3))])
    lifted = lift_convolutions(model)
    assert _ops(lifted).count("ConvTranspose") == 2
    x = RNG.standard_normal((1, 8, 12)).astype(np.float32)
    mask = np.ones((1, 1, 12), dtype=np.float32)
    np.testing.assert_allclose(_run(lifted, x, mask)[0], _run(model, x, mask)[0], rtol=0, atol=1e-5)


def test_leaky_relus_onnxruntime_would_not_fuse_run_as_depthwise_convolutions_and_an_interleave_as_a_max_pool():
    """Residual blocks stay in the blocked layout: the same values, the rewrites where they are due."""
    nodes = [
        helper.make_node("Conv", ["x", "w0", "b0"], ["c0"], kernel_shape=[3], pads=[1, 1]),
        helper.make_node("LeakyRelu", ["c0"], ["a0"], alpha=0.1),  # the conv's only reader: onnxruntime fuses it
        helper.make_node("ConvTranspose", ["a0", "wt"], ["u"], kernel_shape=[4], strides=[2], pads=[1, 1]),
        helper.make_node("LeakyRelu", ["u"], ["a1"], alpha=0.1),  # u is also the residual
        helper.make_node("Conv", ["a1", "w1"], ["c1"], kernel_shape=[3], pads=[3, 3], dilations=[3]),
        helper.make_node("Add", ["c1", "u"], ["r"]),
        helper.make_node("LeakyRelu", ["r"], ["a2"], alpha=0.2),  # after an addition: nothing to fuse into
        helper.make_node("Conv", ["a2", "w2"], ["c2"], kernel_shape=[3], pads=[1, 1]),
        helper.make_node("Add", ["c2", "r"], ["y"]),
    ]
    initializers = [
        _initializer("w0", (16, 8, 3)),
        _initializer("b0", (16,)),
        _initializer("wt", (16, 8, 4)),
        _initializer("w1", (8, 8, 3)),
        _initializer("w2", (8, 8, 3)),
    ]
    model = _model(nodes, initializers)
    lifted = lift_convolutions(model)
    x = RNG.standard_normal((1, 8, 40)).astype(np.float32)
    mask = np.ones((1, 1, 40), dtype=np.float32)
    (expected,), (got,) = _run(model, x, mask), _run(lifted, x, mask)
    assert got.shape == expected.shape == (1, 8, 80)
    # Four convolutions deep with unit-variance weights: values in the hundreds, float32 rounding to match.
    np.testing.assert_allclose(got, expected, rtol=0, atol=1e-6 * np.abs(expected).max())
    graph = onnx.load_from_string(lifted).graph
    producers = {output: node for node in graph.node for output in node.output}
    relus = [node for node in graph.node if node.op_type == "LeakyRelu"]
    assert len(relus) == 3
    first = producers[relus[0].input[0]]
    assert first.op_type == "Conv" and first.input[1] == "w0"  # reads the convolution itself
    for relu in relus[1:]:
        depthwise = producers[relu.input[0]]
        attributes = {a.name: helper.get_attribute_value(a) for a in depthwise.attribute}
        weight = numpy_helper.to_array(next(t for t in graph.initializer if t.name == depthwise.input[1]))
        assert depthwise.op_type == "Conv" and attributes == {"group": 8, "kernel_shape": [1, 1]}
        assert weight.shape == (8, 1, 1, 1) and np.all(weight == 1) and len(depthwise.input) == 2
    # The polyphase output reaches its readers through the identity max pool.
    pools = [node for node in graph.node if node.op_type == "MaxPool"]
    assert len(pools) == 1 and producers[pools[0].input[0]].op_type == "Slice"
    assert {a.name: helper.get_attribute_value(a) for a in pools[0].attribute} == {"kernel_shape": [1, 1]}
