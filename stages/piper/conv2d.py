"""1-D convolutions of an ONNX graph rewritten as 2-D ones of height 1, for onnxruntime's blocked CPU kernels.

onnxruntime runs a 2-D convolution with its NCHWc kernels (MLAS, channels in
blocks of the vector width) once a session optimizes the graph at its highest
level, which is the default; a 1-D convolution takes the generic im2col and
GEMM path. A 1-D convolution over (N, C, L) computes exactly what a 2-D one
over (N, C, 1, L) with a (1, k) kernel does, so the rewrite changes how the
sums are ordered, not what is summed: the outputs agree to about 1e-6 of
their range. A strided transposed convolution becomes a polyphase one: a
convolution with stride-times the output channels whose phases are then
interleaved (see `_Lifter._polyphase`). Measured on the embedded voice
(2-core EPYC, one thread per session, process CPU time per call, 7
interleaved runs, tests/benchmarks/bench_voice.py): the decoder at 0.87x and
the flow at 0.92x the exported graphs' CPU; the prior, with few and small
convolutions, gains nothing (1.04x, within the runs' noise).

Two more rewrites keep a lifted tensor in onnxruntime's blocked layout
between convolutions, where it would otherwise be reordered out and back in
around each operator the blocked kernels lack (a pass over the tensor each
way). A LeakyRelu becomes a 1x1 depthwise convolution of weight 1 with the
activation fused (x times 1 is x: the same bytes), unless it follows a
convolution whose only reader it is (onnxruntime fuses that one itself);
and the interleaved output of a polyphase convolution passes a 1x1 max pool
(the identity), so the residual additions that read it stay blocked too. On
the embedded voice's decoder: 0.95x the CPU of a decode without them (median
of 21 interleaved runs over windows of 44 to 184 frames; fastest runs
0.96x), its audio within 0.01 of a 16-bit step of theirs.

`lift_convolutions` works on any graph. It lifts a tensor to 4-D (a unit
axis at position 2) where a convolution with constant 3-D weights consumes
it, keeps it lifted through the elementwise operators that follow (their
other inputs must be lifted too, or single numbers), and squeezes it back
wherever anything else reads it, so a graph made of convolutions and
activations (the HiFi-GAN decoder) stays 4-D from input to output, and one
with masks and attention (the acoustic model) gets each convolution lifted
on its own. Pure data: onnx and numpy only, no onnxruntime.
"""

from __future__ import annotations

import collections
from typing import Any

import numpy as np

_CONVOLUTIONS = frozenset({"Conv", "ConvTranspose"})
# Operators whose output has the shape of their (broadcast) inputs, element by element.
_ELEMENTWISE = frozenset(
    {
        "Abs",
        "Add",
        "Cast",
        "Clip",
        "Div",
        "Elu",
        "Exp",
        "Identity",
        "LeakyRelu",
        "Log",
        "Max",
        "Min",
        "Mul",
        "Neg",
        "Pow",
        "Reciprocal",
        "Relu",
        "Sigmoid",
        "Sin",
        "Softplus",
        "Sqrt",
        "Sub",
        "Tanh",
    }
)
_LIFTED = "/sv_lifted"
_AXIS = "/sv_lift_axis"


def lift_convolutions(model: Any) -> bytes:
    """The serialized graph with every liftable 1-D convolution run as a 2-D one (see the module docstring).

    `model` is a serialized graph, or an onnx ModelProto, which is changed in place (no copy to parse).
    """
    import onnx

    if isinstance(model, bytes):
        model = onnx.load_from_string(model)
    _Lifter(model).run()
    return model.SerializeToString()


class _Lifter:
    def __init__(self, model: Any) -> None:
        from onnx import numpy_helper

        self._model = model
        self._graph = model.graph
        self._numpy = numpy_helper
        self._opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 13)
        self._initializers = {t.name: t for t in self._graph.initializer}
        self._constants = {
            node.output[0]: node for node in self._graph.node if node.op_type == "Constant" and len(node.output) == 1
        }
        self._uses = collections.Counter(name for node in self._graph.node for name in node.input)
        self._lifted: set[str] = set()  # original names whose values now live lifted under _lifted_name()
        # Lifted values that come blocked from onnxruntime's kernels (a convolution's or a polyphase one's output,
        # and elementwise results of them), by original name -> (channels, numpy element type).
        self._blocked: dict[str, tuple[int, Any]] = {}
        self._convolved: set[str] = set()  # original names of lifted values a (non-polyphase) Conv computed
        self._squeezed: set[str] = set()  # lifted names already squeezed back to their original name
        self._nodes: list[Any] = []
        self._counter = 0

    def run(self) -> None:
        graph = self._graph
        graph_outputs = {o.name for o in graph.output}
        for node in list(graph.node):
            if node.op_type in _CONVOLUTIONS and self._liftable_convolution(node):
                self._lift_convolution(node)
            elif node.op_type in _ELEMENTWISE and self._stays_lifted(node):
                lifted, outputs = [i for i in node.input if i in self._lifted], list(node.output)
                blocked = next((self._blocked[i] for i in lifted if i in self._blocked), None)
                if node.op_type == "LeakyRelu" and blocked and not self._fused_by_runtime(node.input[0]):
                    self._leaky_relu_on_blocks(node, *blocked)
                else:
                    self._rename_io(node, lifted)
                if blocked:
                    self._blocked.update((name, blocked) for name in outputs)
            else:
                for name in node.input:
                    if name in self._lifted:
                        self._squeeze(name)
                self._nodes.append(node)
        for name in graph_outputs & self._lifted:
            self._squeeze(name)
        if self._lifted:
            axis = np.asarray([2], dtype=np.int64)
            graph.initializer.append(self._numpy.from_array(axis, _AXIS))
        del graph.node[:]
        graph.node.extend(self._nodes)
        # Shapes inferred for the 3-D graph no longer hold; onnxruntime infers them again.
        del graph.value_info[:]

    # -- convolutions ------------------------------------------------------------------

    def _liftable_convolution(self, node: Any) -> bool:
        if len(node.input) < 2 or node.input[1] not in self._initializers:
            return False
        weight = self._initializers[node.input[1]]
        if len(weight.dims) != 3:
            return False
        return all(a.name != "auto_pad" or a.s in (b"", b"NOTSET") for a in node.attribute)

    def _lift_convolution(self, node: Any) -> None:
        from onnx import helper

        source = node.input[0]
        if source not in self._lifted:
            self._unsqueeze(source)
        kernel = int(self._initializers[node.input[1]].dims[2])
        attributes = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        if node.op_type == "ConvTranspose" and self._polyphase_applies(node, attributes):
            self._polyphase(node, self._numpy.to_array(self._initializers[node.input[1]]), attributes)
            self._drop_if_unused(node.input[1:])
            return
        if node.op_type == "Conv":  # onnxruntime has no blocked kernel for a transposed one
            weight = self._initializers[node.input[1]]
            self._blocked[node.output[0]] = (int(weight.dims[0]), helper.tensor_dtype_to_np_dtype(weight.data_type))
            self._convolved.add(node.output[0])
        node.input[1] = self._lifted_weight(node.input[1])
        del node.attribute[:]
        for name, value in attributes.items():
            if name == "pads":
                value = [0, value[0], 0, value[1]]
            elif name in ("kernel_shape", "strides", "dilations", "output_shape"):
                value = [1, *value]
            elif name == "output_padding":
                value = [0, *value]
            node.attribute.append(helper.make_attribute(name, value))
        if "kernel_shape" not in attributes:
            node.attribute.append(helper.make_attribute("kernel_shape", [1, kernel]))
        self._rename_io(node, [source])

    def _lifted_weight(self, name: str) -> str:
        """The name of `name`'s weights with a unit axis at position 2.

        A unit axis leaves the bytes in the same order, so weights this node
        alone reads get new dims in place (no copy, which keeps serializing
        the graph cheap); shared ones get a lifted copy beside them.
        """
        if self._uses[name] == 1:
            tensor = self._initializers[name]
            dims = list(tensor.dims)
            del tensor.dims[:]
            tensor.dims.extend([dims[0], dims[1], 1, dims[2]])
            return name
        lifted = f"{name}{_LIFTED}"
        if lifted not in self._initializers:
            weight = self._numpy.to_array(self._initializers[name])
            tensor = self._numpy.from_array(np.ascontiguousarray(weight[:, :, np.newaxis, :]), lifted)
            self._graph.initializer.append(tensor)
            self._initializers[lifted] = tensor
        return lifted

    def _drop_if_unused(self, names: Any) -> None:
        """Remove initializers only the replaced node read (a polyphase kernel replaces them)."""
        for name in names:
            if name in self._initializers and self._uses[name] == 1:
                self._graph.initializer.remove(self._initializers.pop(name))

    # -- transposed convolutions as polyphase convolutions -------------------------------

    def _polyphase_applies(self, node: Any, attributes: dict[str, Any]) -> bool:
        stride = attributes.get("strides", [1])[0]
        return (
            self._opset >= 10
            and stride > 1
            and attributes.get("group", 1) == 1
            and all(d == 1 for d in attributes.get("dilations", [1]))
            and not any(attributes.get("output_padding", [0]))
            and "output_shape" not in attributes
            and (len(node.input) < 3 or not node.input[2] or node.input[2] in self._initializers)
        )

    def _polyphase(self, node: Any, weight: np.ndarray, attributes: dict[str, Any]) -> None:
        """A transposed convolution with stride s as one convolution with s times the output channels.

        Output sample t*s + r of the transposed convolution (before its pads
        are cut) sums x[t - i] times kernel tap r + i*s over i, so phase r is an
        ordinary convolution of x with those taps reversed. One convolution
        computes every phase (channel r*C_out + o), the phases are
        interleaved (reshape, transpose, reshape) and the pads cut (slice):
        the same multiply-adds, on the blocked kernels instead of a GEMM and
        col2im scatter.
        """
        from onnx import helper

        source, target = _lifted_name(node.input[0]), node.output[0]
        c_in, c_out, k = weight.shape
        stride = attributes["strides"][0]
        pad_begin, pad_end = attributes.get("pads", [0, 0])
        taps = -(-k // stride)
        padded = np.zeros((c_in, c_out, taps * stride), dtype=weight.dtype)
        padded[..., :k] = weight
        # [c, o, i, r] = tap i*s + r; the phase-major kernel takes the taps of each phase reversed.
        phases = padded.reshape(c_in, c_out, taps, stride)[:, :, ::-1, :]
        kernel = np.ascontiguousarray(phases.transpose(3, 1, 0, 2).reshape(stride * c_out, c_in, 1, taps))
        bias = (
            self._numpy.to_array(self._initializers[node.input[2]])
            if len(node.input) > 2 and node.input[2]
            else np.zeros(c_out, dtype=weight.dtype)
        )
        prefix = f"{node.name or target}/sv_polyphase"
        trim = taps * stride - k + pad_end
        constants = {
            "kernel": kernel,
            "bias": np.tile(bias, stride),
            "phases": np.asarray([0, stride, c_out, -1], dtype=np.int64),
            "interleaved": np.asarray([0, c_out, 1, -1], dtype=np.int64),
            "starts": np.asarray([pad_begin], dtype=np.int64),
            "ends": np.asarray([-trim if trim else np.iinfo(np.int64).max], dtype=np.int64),
            "axes": np.asarray([3], dtype=np.int64),
        }
        for name, value in constants.items():
            self._graph.initializer.append(self._numpy.from_array(value, f"{prefix}/{name}"))
        self._nodes += [
            helper.make_node(
                "Conv",
                [source, f"{prefix}/kernel", f"{prefix}/bias"],
                [f"{prefix}/z"],
                name=f"{prefix}/Conv",
                kernel_shape=[1, taps],
                pads=[0, taps - 1, 0, taps - 1],
            ),
            helper.make_node(
                "Reshape", [f"{prefix}/z", f"{prefix}/phases"], [f"{prefix}/by_phase"], name=f"{prefix}/Reshape"
            ),
            helper.make_node(
                "Transpose",
                [f"{prefix}/by_phase"],
                [f"{prefix}/by_time"],
                name=f"{prefix}/Transpose",
                perm=[0, 2, 3, 1],
            ),
            helper.make_node(
                "Reshape",
                [f"{prefix}/by_time", f"{prefix}/interleaved"],
                [f"{prefix}/full"],
                name=f"{prefix}/Interleave",
            ),
            helper.make_node(
                "Slice",
                [f"{prefix}/full", f"{prefix}/starts", f"{prefix}/ends", f"{prefix}/axes"],
                [f"{prefix}/cut"],
                name=f"{prefix}/Slice",
            ),
            # The identity, computed in the blocked layout: its readers get the output blocked (module docstring).
            helper.make_node(
                "MaxPool", [f"{prefix}/cut"], [_lifted_name(target)], name=f"{prefix}/Blocked", kernel_shape=[1, 1]
            ),
        ]
        self._lifted.add(target)
        self._blocked[target] = (c_out, weight.dtype)

    # -- elementwise operators ---------------------------------------------------------

    def _fused_by_runtime(self, name: str) -> bool:
        """onnxruntime fuses an activation into the convolution that computed `name` when it is its only reader."""
        return name in self._convolved and self._uses[name] == 1

    def _leaky_relu_on_blocks(self, node: Any, channels: int, dtype: Any) -> None:
        """LeakyRelu(x) as LeakyRelu(depthwise 1x1 convolution of x, weight 1): fused, it stays blocked."""
        from onnx import helper

        ones = f"/sv_ones_{channels}_{np.dtype(dtype).name}"
        if ones not in self._initializers:
            tensor = self._numpy.from_array(np.ones((channels, 1, 1, 1), dtype=dtype), ones)
            self._graph.initializer.append(tensor)
            self._initializers[ones] = tensor
        source, copied = node.input[0], f"{node.name or node.output[0]}/sv_blocked"
        self._nodes.append(
            helper.make_node(
                "Conv",
                [_lifted_name(source), ones],
                [copied],
                name=f"{copied}/Conv",
                group=channels,
                kernel_shape=[1, 1],
            )
        )
        node.input[0] = copied
        self._rename_io(node, [])

    def _stays_lifted(self, node: Any) -> bool:
        inputs = [name for name in node.input if name]
        if not any(name in self._lifted for name in inputs):
            return False
        return all(name in self._lifted or self._is_single_number(name) for name in inputs)

    def _is_single_number(self, name: str) -> bool:
        if name in self._initializers:
            return int(np.prod(self._initializers[name].dims)) == 1
        constant = self._constants.get(name)
        if constant is None:
            return False
        for attribute in constant.attribute:
            if attribute.name == "value":
                return int(np.prod(attribute.t.dims)) == 1
            if attribute.name in ("value_float", "value_int"):
                return True
        return False

    # -- bookkeeping ---------------------------------------------------------------------

    def _rename_io(self, node: Any, lifted_inputs: list[str]) -> None:
        for index, name in enumerate(node.input):
            if name in lifted_inputs:
                node.input[index] = _lifted_name(name)
        for index, name in enumerate(node.output):
            node.output[index] = _lifted_name(name)
            self._lifted.add(name)
        self._nodes.append(node)

    def _unsqueeze(self, name: str) -> None:
        self._nodes.append(self._axis_node("Unsqueeze", name, _lifted_name(name)))
        self._lifted.add(name)
        # The 3-D original stays available to every other reader.
        self._squeezed.add(name)

    def _squeeze(self, name: str) -> None:
        if name in self._squeezed:
            return
        self._nodes.append(self._axis_node("Squeeze", _lifted_name(name), name))
        self._squeezed.add(name)

    def _axis_node(self, op: str, source: str, target: str) -> Any:
        from onnx import helper

        self._counter += 1
        node_name = f"/sv_lift/{op}_{self._counter}"
        if self._opset >= 13:
            return helper.make_node(op, [source, _AXIS], [target], name=node_name)
        return helper.make_node(op, [source], [target], name=node_name, axes=[2])


def _lifted_name(name: str) -> str:
    return f"{name}{_LIFTED}"
