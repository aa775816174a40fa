"""A fast stand-in for "build the quantized model with these per-layer precisions and run it".

One onnxruntime session over the float model in which every activation can pass through an int8
or an int16 QuantizeLinear/DequantizeLinear pair and every MAC weight can be swapped for its
quantized (and bias-corrected) version, each switched by a boolean input. Which switches are on
for a given precision table comes from the quantizer itself (its plan, planning.py), so the
probe quantizes exactly the tensors, with exactly the parameters, that the integer model would.
It is the QDQ twin of that integer model, built once and reconfigured per run; the golden
interpreter and the QDQ model agree within 1 LSB op by op.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from npubuild.intmodel.codes import qdq_grid
from npubuild.intmodel.ops import MAC_OPS
from npubuild.intmodel.ortconv import ExactConvs
from npubuild.stages.feeds import session
from npubuild.stages.metrics import Agreement
from npubuild.stages.onnx_utils import default_opset
from npubuild.stages.parallel import in_order, sample_workers
from npubuild.stages.quantize.integer_model import build_integer_model
from npubuild.stages.quantize.planning import Planner, attr, node_label
from npubuild.stages.quantize.precision import Layers, precision_overrides
from npubuild.stages.quantize.tables import WIDE_INPUT_SHIFT
from npubuild.stages.quantize.weights import bias_correction, constant_params, quantize_weight


class PrecisionProbe:
    def __init__(
        self,
        model: onnx.ModelProto,
        stats_meta: dict,
        stats_arrays: dict,
        settings: dict,
        feeds: list[dict[str, np.ndarray]],
        widths: tuple[int, ...] = (8, 16),
    ):
        """`widths`: the activation widths a run may ask for; a pass that never asks for int16
        (the sensitivity pass of int8 tables) builds a graph with half the Q/DQ pairs."""
        self.model = model
        self.widths = tuple(sorted(widths))
        self.stats_meta, self.stats_arrays = stats_meta, stats_arrays
        self.settings = settings
        self.feeds = feeds
        self.range_cache: dict = {}
        self.exact_convs = ExactConvs()  # the golden confirmations' sessions, shared across tables
        self.layers = Layers(model, stats_meta, stats_arrays, settings)
        planner = self._planner()
        self.producers = planner.info.producers
        # a tensor a Concat joins is on the Concat's grid (concat_grids = "shared"), as the
        # quantizer plans it with these settings
        plan = planner.build()
        self.shared_grids = plan.shared_grids
        # int8 depthwise inputs with a grid per channel (depthwise_inputs = "channel"), as planned
        self.channel_grids = {n: p for n, p in plan.params.items() if p.channel_shifts}
        self.outputs = [o.name for o in model.graph.output]
        self._build_graph()
        self.runs = 0
        float_session = session(model)
        self.references = [float_session.run(self.outputs, f) for f in feeds]

    @staticmethod
    def planned_widths(model, stats_meta: dict, stats_arrays: dict, settings: dict) -> tuple[int, ...]:
        """The activation widths the quantizer plans with these settings and no precision table."""
        plan = Planner(model, stats_meta, stats_arrays, {"overrides": [], **settings}).build()
        return tuple(sorted({8} | {t["bits"] for t in plan.tensors.values()}))

    def _planner(self, settings: dict | None = None) -> Planner:
        """The quantizer's planner over this model, sharing the range cache across every use."""
        return Planner(
            self.model, self.stats_meta, self.stats_arrays, settings or self.settings, self.range_cache
        )

    # the switchable graph ---------------------------------------------------------------------
    def _preactivation(self, name: str, bits: int) -> bool:
        """Whether `name` is a 16-bit MAC result that only an activation reads."""
        producer = self.producers.get(name)
        return (
            bits == 16
            and producer is not None
            and producer.op_type in MAC_OPS
            and self._planner().only_activation(name) is not None
        )

    def _params(self, name: str, bits: int):
        """`name`'s grid at `bits`: a MAC result that only an activation reads has at 16 bits the
        range the quantizer gives a fine pre-activation (the usual case: its table stays int8; an
        int16 table reads a wider range, clipped here where the activation is flat); a tensor a
        Concat joins has the Concat's (in a table that gives the two different widths the
        quantizer keeps its own grid, and the probe leaves it unquantized, as a mismatch)."""
        if bits == 8 and name in self.channel_grids:
            return self.channel_grids[name]
        levels = 2 ** (16 - WIDE_INPUT_SHIFT) if self._preactivation(name, bits) else None
        grid = self.shared_grids.get(name, name)
        return self._planner().from_stats(grid, bits, self.settings["method"], levels)

    def _build_graph(self) -> None:
        model = onnx.ModelProto()
        model.CopyFrom(self.model)
        g = model.graph
        initializers = {t.name: t for t in g.initializer}
        new_nodes: list[onnx.NodeProto] = []
        new_inits: list[onnx.TensorProto] = []
        self.tensor_switches: dict[str, dict[int, str]] = {}
        self.weight_switches: dict[str, str] = {}
        rename: dict[str, str] = {}
        graph_outputs = {o.name for o in g.output}

        def switch_tensor(name: str, source: str | None = None) -> list[onnx.NodeProto]:
            """Where(on16, QDQ16(x), Where(on8, QDQ8(x), x)) with `name`'s parameters, reading `source`
            (one Where per width the probe was built for)."""
            source = source or name
            nodes, flags, selected = [], {}, source
            for bits in self.widths:
                scales, zero_points, domain, axis = qdq_grid(self._params(name, bits))
                s, z = f"{name}__s{bits}", f"{name}__z{bits}"
                new_inits.append(numpy_helper.from_array(scales, s))
                new_inits.append(numpy_helper.from_array(zero_points, z))
                q, dq = f"{name}__q{bits}", f"{name}__dq{bits}"
                nodes.append(helper.make_node("QuantizeLinear", [source, s, z], [q], domain=domain, **axis))
                nodes.append(helper.make_node("DequantizeLinear", [q, s, z], [dq], domain=domain, **axis))
                flags[bits] = f"{name}__on{bits}"
                out = f"{name}__sel{bits}" if bits != self.widths[-1] else f"{name}__probe"
                nodes.append(helper.make_node("Where", [flags[bits], dq, selected], [out]))
                selected = out
            self.tensor_switches[name] = flags
            rename[name] = selected
            return nodes

        for value in g.input:
            if value.name not in initializers:
                new_nodes += switch_tensor(value.name)
        weight_nodes = []
        for node in g.node:
            if node.op_type in MAC_OPS and len(node.input) > 1 and node.input[1] in initializers:
                weight_nodes.append(node)
        quantized_weights = self._quantized_weights(weight_nodes, initializers)
        self.constant_switches: dict[str, tuple[str, str]] = {}
        for node in g.node:
            label = node_label(node)
            if node.op_type in ("Add", "Sub", "Mul", "Div", "Concat") and any(
                i in initializers for i in node.input
            ):
                new_nodes += self._switch_constants(node, initializers, new_inits)
            if label in quantized_weights:
                w8, bias8, bias_name, shift = quantized_weights[label]
                flag = f"{label}__wq"
                self.weight_switches[label] = flag
                wn, bn = f"{label}__w8", f"{label}__b8"
                new_inits.append(numpy_helper.from_array(w8, wn))
                sel_w = f"{label}__wsel"
                new_nodes.append(helper.make_node("Where", [flag, wn, node.input[1]], [sel_w]))
                node.input[1] = sel_w
                if bias8 is not None:
                    new_inits.append(numpy_helper.from_array(bias8, bn))
                    sel_b = f"{label}__bsel"
                    if bias_name:
                        new_nodes.append(helper.make_node("Where", [flag, bn, bias_name], [sel_b]))
                        node.input[2] = sel_b
                if shift is not None:
                    zero, corr = f"{label}__shift0", f"{label}__shift"
                    new_inits.append(numpy_helper.from_array(np.zeros_like(shift), zero))
                    new_inits.append(numpy_helper.from_array(shift, corr))
                    raw, sel = f"{node.output[0]}__mm", f"{label}__shiftsel"
                    new_nodes.append(helper.make_node("Where", [flag, corr, zero], [sel]))
                    after = helper.make_node("Add", [raw, sel], [node.output[0]])
                    node.output[0] = raw
                    pending_after = after
                else:
                    pending_after = None
            else:
                pending_after = None
            for k, i in enumerate(node.input):
                if i in rename:
                    node.input[k] = rename[i]
            new_nodes.append(node)
            if pending_after is not None:
                new_nodes.append(pending_after)
                node = pending_after
            for o in node.output:
                if o and o not in graph_outputs:
                    new_nodes += switch_tensor(o)
                elif o in graph_outputs:
                    raw = f"{o}__raw"
                    node.output[list(node.output).index(o)] = raw
                    nodes = switch_tensor(o, source=raw)
                    nodes.append(helper.make_node("Identity", [rename.pop(o)], [o]))
                    new_nodes += nodes
        del g.node[:]
        g.node.extend(new_nodes)
        g.initializer.extend(new_inits)
        del g.value_info[:]
        flags = [f for by_width in self.tensor_switches.values() for f in by_width.values()]
        flags += [f for pair in self.constant_switches.values() for f in pair]
        for flag in flags + list(self.weight_switches.values()):
            g.input.append(helper.make_tensor_value_info(flag, TensorProto.BOOL, []))
        if not any(o.domain == "com.microsoft" for o in model.opset_import):
            model.opset_import.append(helper.make_opsetid("com.microsoft", 1))
        _switches_as_branches(g, set(flags) | set(self.weight_switches.values()))
        self.switchable = model
        self.session = session(model)

    def _switch_constants(self, node, initializers, new_inits) -> list[onnx.NodeProto]:
        """Constant operands quantized to their own grid, as the integer Add/Mul/Concat use them
        (a Div by a constant becomes a Mul by its quantized reciprocal)."""
        label = node_label(node)
        on8, on16 = f"{label}__c8", f"{label}__c16"
        nodes = []
        for k, name in enumerate(node.input):
            if name not in initializers:
                continue
            value = numpy_helper.to_array(initializers[name]).astype(np.float64)
            if node.op_type == "Div" and k == 1:
                value = 1.0 / value
            exact = value.astype(np.float32)
            variants = {}
            for bits in (8, 16):
                params, q = constant_params(value, bits)
                dq = ((q.astype(np.float64) - params.zero_point) * params.scale).astype(np.float32)
                variants[bits] = f"{label}__const{k}_{bits}"
                new_inits.append(numpy_helper.from_array(dq.reshape(value.shape), variants[bits]))
            plain = f"{label}__const{k}"
            new_inits.append(numpy_helper.from_array(exact.reshape(value.shape), plain))
            mid, out = f"{label}__const{k}_sel8", f"{label}__const{k}_sel"
            nodes.append(helper.make_node("Where", [on8, variants[8], plain], [mid]))
            nodes.append(helper.make_node("Where", [on16, variants[16], mid], [out]))
            node.input[k] = out
        if node.op_type == "Div":
            node.op_type = "Mul"
        self.constant_switches[label] = (on8, on16)
        return nodes

    def _quantized_weights(self, nodes, initializers) -> dict:
        """Per MAC node: dequantized int8 weights and the bias-corrected bias, as the encoder makes them."""
        out = {}
        for node in nodes:
            w = numpy_helper.to_array(initializers[node.input[1]])
            transpose = node.op_type == "ConvTranspose"
            group = next((a.i for a in node.attribute if a.name == "group"), 1)
            if node.op_type in ("MatMul", "Gemm"):
                if node.op_type == "Gemm" or w.ndim != 2:
                    continue  # Gemm layouts vary; its weight stays float in the probe
                axis = 1
            elif transpose:
                if group != 1:
                    continue
                axis = 1
            else:
                axis = 0
            wq, wscale = quantize_weight(w, axis, self.settings["per_channel"])
            shape = [1] * w.ndim
            shape[axis] = -1
            w8 = (wq.astype(np.float64) * wscale.reshape(shape)).astype(np.float32)
            bias_name = node.input[2] if len(node.input) > 2 and node.input[2] in initializers else None
            bias8 = None
            if node.op_type in ("Conv", "ConvTranspose"):
                bias = (
                    numpy_helper.to_array(initializers[bias_name]).astype(np.float64)
                    if bias_name
                    else np.zeros(w.shape[0] if not transpose else w.shape[1])
                )
                mean = self.stats_arrays.get(f"{node.input[0]}/channel_mean")
                mean = mean if self.settings["bias_correction"] else None
                strides = attr(node, "strides", [1] * (w.ndim - 2))
                corrected = bias_correction(mean, w, wq, wscale, bias, group, transpose, strides)
                bias8 = corrected.astype(np.float32) if bias_name else None
            shift = None
            mean = self.stats_arrays.get(f"{node.input[0]}/channel_mean")
            if node.op_type == "MatMul" and self.settings["bias_correction"] and mean is not None:
                # the bias MatMul gains
                shift = bias_correction(mean, w, wq, wscale, np.zeros(w.shape[1]), 1, False).astype(
                    np.float32
                )
            out[node_label(node)] = (w8, bias8, bias_name, shift)
        return out

    # running a configuration -------------------------------------------------------------------
    def plan(self, table: dict[str, str]) -> tuple[dict, set[str]]:
        """The quantized tensors (name -> bits) and integer nodes the quantizer plans for a table."""
        settings = {
            **self.settings,
            "overrides": list(self.settings.get("overrides", []))
            + precision_overrides(self.layers.expand(table)),
        }
        program = self._planner(settings).build()
        tensors = program.tensors
        self.tensor_bits = {name: t["bits"] for name, t in tensors.items()}  # every quantized tensor
        self.fine_preactivations = program.fine_preactivations
        # A MAC that reads a 16-bit tensor runs at the int16 rate whatever its own output width.
        self.mac_input_bits = {
            label: tensors[self.layers.nodes[label].input[0]]["bits"]
            for label in program.integer_nodes
            if self.layers.nodes[label].op_type in MAC_OPS and self.layers.nodes[label].input[0] in tensors
        }
        bits = {}
        for name, t in tensors.items():
            # A tensor that inherits its input's grid (Reshape, MaxPool, an unfused ReLU) is
            # already on it; only tensors with parameters of their own get a Q/DQ pair.
            own = self._params(name, t["bits"])
            if (
                (own.scale, own.zero_point) == (t["scale"], t["zero_point"])
                or name not in self.producers
                or self._preactivation(name, t["bits"])
            ):
                bits[name] = t["bits"]
        # an integer Add/Mul/Concat quantizes its constants at its output's width
        self.constant_bits = {}
        for label in self.constant_switches:
            out = self.layers.nodes[label].output[0]
            if out in tensors:
                self.constant_bits[label] = tensors[out]["bits"]
        return bits, set(program.integer_nodes)

    def confirm(self, table: dict[str, str], feeds: list[dict] | None = None) -> dict:
        """The same configuration as the integer model itself, run by the golden interpreter on
        the probe's samples or on `feeds` (held-out images, measured against the float model)."""
        from npubuild.intmodel.interpreter import Interpreter
        from npubuild.intmodel.program import parse

        overrides = precision_overrides(self.layers.expand(table))
        settings = {**self.settings, "overrides": list(self.settings.get("overrides", [])) + overrides}
        _, meta, arrays = build_integer_model(
            self.model, self.stats_meta, self.stats_arrays, settings, range_cache=self.range_cache
        )
        opset = default_opset(self.model) or 13
        program = parse(meta, "the integer model of a precision table")
        opsets = {"": opset, "npubuild": 1}
        interpreter = Interpreter(program, arrays, list(self.model.functions), opsets, self.exact_convs)

        def measure(sample: tuple) -> list[tuple]:
            feed, reference = sample
            outputs, _ = interpreter.run(feed)
            return [Agreement.terms(r, outputs[name]) for name, r in zip(self.outputs, reference)]

        self.runs += 1
        if feeds is None:
            return self._agreement(measure)
        float_session = session(self.model)
        references = [float_session.run(self.outputs, f) for f in feeds]
        return self._agreement(measure, list(zip(feeds, references)))

    def run(self, table: dict[str, str]) -> dict:
        bits, integer_nodes = self.plan(table)
        flags = {}
        true, false = np.array(True), np.array(False)
        for name, by_width in self.tensor_switches.items():
            b = bits.get(name)
            if b is not None and b not in by_width:
                raise ValueError(f"the probe was built for widths {self.widths}; '{name}' needs {b}")
            for width, flag in by_width.items():
                flags[flag] = true if b == width else false
        for label, flag in self.weight_switches.items():
            flags[flag] = true if label in integer_nodes else false
        for label, (on8, on16) in self.constant_switches.items():
            b = self.constant_bits.get(label) if label in integer_nodes else None
            flags[on8] = true if b == 8 else false
            flags[on16] = true if b == 16 else false

        def measure(sample: tuple) -> list[tuple]:
            feed, reference = sample
            result = self.session.run(self.outputs, {**feed, **flags})
            return [Agreement.terms(r, c) for r, c in zip(reference, result)]

        self.runs += 1
        return self._agreement(measure)

    def _agreement(self, measure, samples: list[tuple] | None = None) -> dict:
        """The outputs' agreement over the samples (the probe's own unless given), each measured
        in a thread, summed in order."""
        agreement = Agreement()
        samples = samples if samples is not None else list(zip(self.feeds, self.references))
        for terms in in_order(measure, samples, sample_workers()):
            for t in terms:
                agreement.add(t)
        return agreement.result()


# ops a switch's branch may take along: the Q/DQ pair of a switched tensor, computed only when on
_BRANCH_OPS = {"QuantizeLinear", "DequantizeLinear"}


def _switches_as_branches(graph: onnx.GraphProto, switches: set[str]) -> None:
    """Every Where(switch, a, b) on a scalar switch input becomes If(switch) whose branches hand
    over a or b, each taking along the QuantizeLinear/DequantizeLinear nodes that only it reads.
    onnxruntime's Where broadcasts the scalar condition element by element: on PP-OCRv4 det it
    was half of a probe run (124 ms of which Where 51%; 71 ms as If). The values are the same:
    a select either way, and a branch's Q/DQ are the nodes that computed a before."""
    nodes = list(graph.node)
    producer = {o: k for k, n in enumerate(nodes) for o in n.output}
    uses: dict[str, int] = {o.name: 1 for o in graph.output}
    for n in nodes:
        for name in n.input:
            uses[name] = uses.get(name, 0) + 1
    if any(
        a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS) for n in nodes for a in n.attribute
    ):
        return  # a model's own subgraphs read the outer scope too, which `uses` does not count
    moved: set[int] = set()

    def exclusive(name: str) -> list[int]:
        """The Q/DQ nodes computing `name` that nothing else reads, in graph order."""
        k = producer.get(name)
        if k is None or k in moved or nodes[k].op_type not in _BRANCH_OPS or uses.get(name, 0) != 1:
            return []
        chain = [k]
        for source in nodes[k].input[:1]:
            chain = exclusive(source) + chain
        return chain

    replacement: dict[int, onnx.NodeProto] = {}
    for k, n in enumerate(nodes):
        if n.op_type != "Where" or n.input[0] not in switches:
            continue
        branches = []
        for side, source in (("then", n.input[1]), ("else", n.input[2])):
            chain = exclusive(source)
            moved.update(chain)
            out = f"{n.output[0]}__{side}"
            body = [nodes[j] for j in chain] + [helper.make_node("Identity", [source], [out])]
            branches.append(
                helper.make_graph(body, side, [], [helper.make_value_info(out, onnx.TypeProto())])
            )
        replacement[k] = helper.make_node(
            "If", [n.input[0]], list(n.output), then_branch=branches[0], else_branch=branches[1]
        )
    kept = [replacement.get(k, n) for k, n in enumerate(nodes) if k not in moved]
    del graph.node[:]
    graph.node.extend(kept)
