"""Planning the integer model: which nodes become integer ops, which stay float and why, which
activations fold into the MAC before them, and every tensor's quantization parameters. The plan is
data (`QuantPlan`): the encoder (`encoding.py`) turns it into ops and arrays, and the precision
search reads it directly, many times over one model, without encoding any weight."""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass, field

import numpy as np
import onnx

from npubuild.intmodel.ops import LUT_OPS, MAC_OPS, MOVE_OPS
from npubuild.intmodel.program import grid_scales, walk_back
from npubuild.intmodel.rowwise import SOFTMAX_GRID
from npubuild.stages.optimize.graph import recorded_grids
from npubuild.stages.quantize import depthwise, ranges, reader_facts, squares
from npubuild.stages.quantize.graphinfo import GraphInfo, attr, node_label
from npubuild.stages.quantize.tables import WIDE_INPUT_SHIFT, activation_function
from npubuild.targets.support import integer_blocker


@dataclass
class TensorParams:
    """A tensor's grid: real = (code - zero_point) * scale, or with `channel_shifts` (a depthwise
    convolution's input, docs/quantization.md "Per-channel depthwise inputs") real = code * scale
    * 2^channel_shifts[c] in channel c (axis 1), zero point 0."""

    scale: float
    zero_point: int
    bits: int
    channel_shifts: tuple[int, ...] = ()

    def as_dict(self) -> dict:
        grid = {"scale": self.scale, "zero_point": self.zero_point, "bits": self.bits}
        return {**grid, "channel_shifts": list(self.channel_shifts)} if self.channel_shifts else grid

    def channel_scales(self):
        """The scale of each channel (one per channel), or the scale."""
        return grid_scales(self.scale, self.channel_shifts)


# a network output's grid reaches back through element-wise ops, concatenation and a Softmax
TAIL_OPS = frozenset({"Add", "Sub", "Mul", "Div", "Concat", "Softmax"})
KEEPS_GRID = MOVE_OPS | {"Relu", "Clip"}  # ops whose result carries their input's grid


@dataclass
class NodeChoice:
    integer: bool
    bits: int
    method: str
    reason: str = ""


@dataclass(frozen=True)
class Step:
    """One entry of the program in order: `quantize` a tensor (`name`) a float op or the model
    made; a `float` node (with its `reason`); an `integer` node (with its `choice` and the
    Relu/Clip `activation` folded into it)."""

    kind: str
    name: str = ""
    node: onnx.NodeProto | None = None
    reason: str = ""
    choice: NodeChoice | None = None
    activation: onnx.NodeProto | None = None


@dataclass
class QuantPlan:
    steps: list[Step] = field(default_factory=list)
    params: dict[str, TensorParams] = field(default_factory=dict)
    float_nodes: list[dict] = field(default_factory=list)
    integer_nodes: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    pixel_inputs: list[str] = field(default_factory=list)  # arrive as uint8 pixel bytes (fuse_preprocess)
    # MAC results at preactivation_bits whose table reads their top bits (tables.WIDE_INPUT_SHIFT)
    fine_preactivations: set[str] = field(default_factory=set)
    # tensor -> the Concat output whose grid it takes (concat_grids = "shared")
    shared_grids: dict[str, str] = field(default_factory=dict)

    @property
    def tensors(self) -> dict[str, dict]:
        return {name: p.as_dict() for name, p in self.params.items()}


class _OverrideIndex:
    """Which overrides match a node, in their order: those naming a layer exactly (a precision
    table is one per layer) are looked up, only glob patterns are matched. A search plans a
    thousand tables of a det's 400 nodes against 184 overrides each; matching every pattern
    against every node was most of its time."""

    def __init__(self, overrides: list[dict]):
        self.exact: dict[str, list[int]] = {}
        self.patterns: list[tuple[int, str]] = []
        self.by_type: dict[str, list[int]] = {}
        for i, override in enumerate(overrides):
            match = override.get("match")
            if match and any(c in match for c in "*?["):
                self.patterns.append((i, match))
            elif match:
                self.exact.setdefault(match, []).append(i)
            if override.get("op_type"):
                self.by_type.setdefault(override["op_type"], []).append(i)

    def matching(self, label: str, op_type: str) -> list[int]:
        found = set(self.exact.get(label, ())) | set(self.by_type.get(op_type, ()))
        found.update(i for i, pattern in self.patterns if fnmatch.fnmatchcase(label, pattern))
        return sorted(found)


class Planner:
    """Plans one model under one configuration; `range_cache` shares graph facts and every
    (tensor, bits, method) range across planners of the same model and statistics."""

    def __init__(
        self, model: onnx.ModelProto, stats_meta: dict, stats_arrays: dict, config: dict, range_cache=None
    ):
        self.range_cache = range_cache if range_cache is not None else {}
        self.model, self.graph, self.config = model, model.graph, config
        self.stats_meta, self.stats_arrays = stats_meta, stats_arrays
        if "__graph__" not in self.range_cache:
            self.range_cache["__graph__"] = GraphInfo.of(self.graph)
        self.info: GraphInfo = self.range_cache["__graph__"]
        # a pre-quantized model's own grids (its Q/DQ pairs, recorded by optimize) win over statistics
        self.given = recorded_grids(model)
        self.plan = QuantPlan()
        self.matched_overrides: set[int] = set()
        self._overrides = _OverrideIndex(config.get("overrides", []))
        # what the target's integer ops cannot take depends on the graph alone: once per model
        # (by id(node): GraphInfo holds the nodes, so an id names one node while the cache lives)
        self._blockers: dict[int, str | None] = self.range_cache.setdefault("__blockers__", {})
        self._choices: dict[int, NodeChoice] = {}  # by id(node), once build() has chosen

    # choices ----------------------------------------------------------------------------------
    def choose(self, node: onnx.NodeProto) -> NodeChoice:
        cfg = self.config
        bits = cfg["activation_bits"]
        if node.op_type == "Softmax":  # probabilities of ~1/n on a 1/256 grid: softmax_bits
            bits = max(bits, cfg["softmax_bits"])
        choice = NodeChoice(True, bits, cfg["method"])
        overrides = self.config.get("overrides", [])
        for i in self._overrides.matching(node_label(node), node.op_type):
            override = overrides[i]
            self.matched_overrides.add(i)
            if override.get("keep_float"):
                return NodeChoice(False, 0, "", f"override #{i + 1} keeps it float")
            if override.get("bits"):
                choice.bits = override["bits"]
            if override.get("method"):
                choice.method = override["method"]
        for name in (*node.input[:1], *node.output):
            if name in self.info.stays_float:
                return NodeChoice(False, 0, "", self.info.stays_float[name])
        read = [i for i in node.input if i]
        if read and all(i in self.info.constants for i in read):
            # what optimize could not fold (a network output, or too large): no grid to read
            return NodeChoice(False, 0, "", "reads constants only")
        if (
            cfg["float_output_activations"]
            and node.op_type in LUT_OPS
            and any(o in self.info.outputs for o in node.output)
        ):
            return NodeChoice(
                False, 0, "", "a network output's activation stays float (float_output_activations)"
            )
        if id(node) not in self._blockers:
            self._blockers[id(node)] = integer_blocker(
                node, lambda name, default: attr(node, name, default), self.info.constants, self.info.shapes
            )
        reason = self._blockers[id(node)]
        if reason:
            return NodeChoice(False, 0, "", reason)
        return choice

    # tensor parameters ------------------------------------------------------------------------
    def from_stats(self, name: str, bits: int, method: str, table_levels: int | None = None) -> TensorParams:
        """`table_levels`: a fine pre-activation's, the steps its table tells apart."""
        gap = self._softmax_gap(name)
        key = (name, bits, method, table_levels, gap)
        if key not in self.range_cache:
            self.range_cache[key] = self._from_stats(name, bits, method, table_levels, gap)
        params, warnings = self.range_cache[key]
        self.plan.warnings.extend(w for w in warnings if w not in self.plan.warnings)
        return params

    def _from_stats(
        self, name: str, bits: int, method: str, table_levels: int | None, gap: float | None
    ) -> tuple[TensorParams, list[str]]:
        warnings = []
        given = self.given.get(name)
        if given is not None and given["bits"] == bits:
            return TensorParams(float(given["scale"]), int(given["zero_point"]), bits), warnings
        if self.config.get("pixel_input") and name in self.info.image_inputs:
            # fused preprocessing: the input is 8-bit pixels, whose exact grid is scale 1, zero
            # point -128 (code = pixel - 128) whatever the width or method asked for
            return TensorParams(1.0, -128, 8), warnings
        meta = self.stats_meta.get(name)
        image_range = self.config.get("input_range")
        if image_range is not None and name in self.info.image_inputs:
            # a photo's input: every value its preprocessing can give, not what calibration saw
            lo, hi = image_range
        elif self.config.get("fused_range") and name == self.info.fused_head:
            lo, hi = self.config["fused_range"]
        elif meta is None or meta["count"] == 0:
            warnings.append(f"no calibration statistics for '{name}'; using range [-1, 1]")
            lo, hi = -1.0, 1.0
        else:
            hist = self.stats_arrays[f"{name}/hist"]
            if method == "mse" and self.each_sample_weighs_the_same(meta):
                hist = self.stats_arrays[f"{name}/relative_hist"]
            activation = self.only_activation(name)
            if method == "mse" and bits == 8 and not self.config["symmetric_activations"]:
                lo, hi = ranges.mse_through(
                    meta, hist, bits, activation, averaged=reader_facts.averaged_count(self.info, name)
                )
            elif method == "mse" and table_levels and activation is not None:
                # a fine pre-activation: the error after the activation, at the table's steps
                lo, hi = ranges.mse_through(meta, hist, bits, activation, 96, table_levels, symmetric=True)
            else:
                lo, hi = ranges.METHOD_FUNCTIONS[method](
                    meta, hist, bits, self.config["symmetric_activations"], self.config["percentile"]
                )
            if meta.get("nonfinite"):
                warnings.append(
                    f"'{name}' had {meta['nonfinite']} NaN/Inf values in calibration; "
                    "they were left out of its range"
                )
            if gap is not None:
                symmetric = ranges.centred(bits, self.config["symmetric_activations"])
                lo, hi = ranges.spanning(lo, hi, gap, symmetric)
        scale, zp = ranges.quant_params(float(lo), float(hi), bits, self.config["symmetric_activations"])
        return TensorParams(scale, zp, bits), warnings

    def _softmax_bits(self, node: onnx.NodeProto) -> int:
        """A Softmax's result width: a network output's probabilities at int16, else its choice."""
        result = self.config["float_output_activations"] and self._is_result(node.output[0])
        return 16 if result else self._choice(node).bits

    def _choice(self, node: onnx.NodeProto) -> NodeChoice:
        """The node's choice: the plan's, or made now (the precision probe plans no model)."""
        return self._choices[id(node)] if id(node) in self._choices else self.choose(node)

    def _softmax_gap(self, name: str) -> float | None:
        """The gap the integer Softmax that alone reads `name` needs its grid to span, else None."""
        softmax = reader_facts.softmax_of(self.info, name)
        if softmax is None or not self._choice(softmax).integer:
            return None
        return reader_facts.gap_to_zero(SOFTMAX_GRID[self._softmax_bits(softmax)][0])

    def each_sample_weighs_the_same(self, meta: dict) -> bool:
        """Whether `mse` sums each calibration sample's error relative to its own power (else
        every value counts once). `range_error = "spread"` (the default) weighs them alike where
        the samples' powers spread over more than `spread_decades` (a faint image's values sit
        in the lowest steps of a range the bright ones set), and pools them elsewhere, where the
        weights differ little and pooling keeps the rare large values that matter downstream
        (docs/quantization.md, "Every image weighs the same")."""
        choice = self.config["range_error"]
        if choice == "spread":
            return meta.get("power_spread", 0.0) > self.config["spread_decades"]
        return choice == "relative"

    def only_activation(self, name: str):
        """The float function of the one lookup-table activation that reads `name`, if that is
        its only reader and it is not a network output (whose error is measured as it is);
        else None (the error is measured on the tensor itself)."""
        node = reader_facts.sole_reader(self.info, name)
        if node is None or node.op_type not in LUT_OPS:
            return None
        return activation_function(node)

    def ensure_quantized(self, name: str, bits: int, method: str) -> None:
        """An integer op reads `name`: give it parameters if a float op or the model made it."""
        if name in self.plan.params:
            return
        self.plan.params[name] = self.from_stats(name, bits, method)
        if self.config.get("pixel_input") and name in self.info.image_inputs:
            self.plan.pixel_inputs.append(name)  # no quantize op: the NPU reads the pixel bytes
        else:
            self.plan.steps.append(Step("quantize", name=name))

    # the plan ---------------------------------------------------------------------------------
    def build(self) -> QuantPlan:
        plan, info = self.plan, self.info
        choices = self._choices = {id(n): self.choose(n) for n in info.nodes}
        self._tail = self._result_tail(choices)
        self._table_chains = self._tables_and_absorbed(choices)
        self._depthwise_inputs = self._depthwise_read(choices)
        fused: dict[int, onnx.NodeProto] = {}  # id(MAC) -> the Relu/Clip folded into it
        for n in info.nodes:
            if n.op_type in MAC_OPS and choices[id(n)].integer:
                user = reader_facts.sole_reader(info, n.output[0])
                if user is not None and user.op_type in ("Relu", "Clip") and choices[id(user)].integer:
                    fused[id(n)] = user
        skip = {id(a) for a in fused.values()}
        self._shared = self._concat_sources(choices, skip)
        plan.shared_grids = {name: self._shared_grid(name) for name in self._shared}
        for value in self.graph.input:
            if value.name in info.constants:
                continue
            users = info.consumers.get(value.name, [])
            if any(choices[id(u)].integer for u in users):
                bits = max(choices[id(u)].bits for u in users if choices[id(u)].integer)
                self.ensure_quantized(value.name, bits, self.config["method"])
        for node in info.nodes:
            if id(node) in skip:
                continue
            choice = choices[id(node)]
            if choice.integer:
                self._integer(node, choice, fused.get(id(node)))
                continue
            plan.steps.append(Step("float", node=node, reason=choice.reason))
            plan.float_nodes.append(
                {"node": node_label(node), "op_type": node.op_type, "reason": choice.reason}
            )
            for out in node.output:
                integer_users = [u for u in info.consumers.get(out, []) if choices[id(u)].integer]
                if integer_users:
                    bits = max(choices[id(u)].bits for u in integer_users)
                    self.ensure_quantized(out, bits, self.config["method"])
        for i, override in enumerate(self.config.get("overrides", [])):
            if i not in self.matched_overrides:
                what = override.get("match") or override.get("op_type")
                plan.warnings.append(f"override #{i + 1} ('{what}') matches no node")
        return plan

    def _fine_preactivation(self, out: str, choice: NodeChoice) -> bool:
        """Whether a MAC result `out` gets `preactivation_bits`: a narrower MAC whose one reader
        is an integer lookup-table activation (of either width), whose table reads the result's
        top 10 bits; the code generator runs the table in the MAC's output path, so the finer
        grid is never stored. A pre-quantized model's own grid wins."""
        fine = self.config["preactivation_bits"]
        if fine <= choice.bits or self.only_activation(out) is None or out in self.given:
            return False
        (reader,) = self.info.consumers[out]
        return self._choices[id(reader)].integer

    def _result_tail(self, choices: dict) -> set[str]:
        """The tensors a network output is computed from by integer element-wise ops, moves,
        concatenations and a Softmax only, back to (and including) the results of the MACs,
        tables and other ops before them: they get `output_bits`. A float op ends the walk."""
        producers = self.info.producers

        def follow(name: str) -> list[str] | None:
            node = producers.get(name)
            if node is None or not choices[id(node)].integer:
                return None
            if node.op_type in TAIL_OPS or node.op_type in MOVE_OPS:
                return [i for i in node.input if i and i not in self.info.constants]
            return []

        return walk_back(self.info.outputs, follow)

    def _scalar_op(self, node: onnx.NodeProto) -> str | None:
        """The data input of an Add, Sub, Mul or Div of one tensor and a constant scalar (an op a
        lookup table before it absorbs: absorb.py), else None."""
        if node.op_type not in ("Add", "Sub", "Mul", "Div") or len(node.input) != 2:
            return None
        data = [i for i in node.input if i not in self.info.constants]
        scalars = [i for i in node.input if i in self.info.constants and self.info.constants[i].size == 1]
        return data[0] if len(data) == 1 and len(scalars) == 1 else None

    def _tables_and_absorbed(self, choices: dict) -> dict[str, bool]:
        """Each tensor an integer lookup table makes, and each an integer scalar op makes from
        such a tensor that it alone reads (which the table absorbs: absorb.py), mapped to whether
        another such op reads it in turn (then the table absorbs that one too, and the tensor is
        never stored: its grid is 16 bits at no cost)."""
        chains: dict[str, bool] = {}
        for node in self.info.nodes:  # in order: a chain's start comes first
            if not choices[id(node)].integer:
                continue
            data = self._scalar_op(node)
            if node.op_type in LUT_OPS or (
                data in chains
                and len(self.info.consumers.get(data, [])) == 1
                and data not in self.info.outputs
            ):
                chains[node.output[0]] = False
                if data in chains:
                    chains[data] = True
        return chains

    def _width(self, node: onnx.NodeProto, out: str) -> int:
        """The width an integer node's result gets outside fine pre-activations and Softmax."""
        bits = self._choices[id(node)].bits
        if out in self._tail and out not in self.given:
            bits = max(bits, self.config["output_bits"])
        if out in self._depthwise_inputs and out not in self.given and self._wide_depthwise(node, out, bits):
            bits = 16
        if self._table_chains.get(out) and out not in self.given:
            # absorbed into the table that makes it (absorb.py): never stored, so never narrow
            bits = max(bits, self.config["absorbed_bits"])
        if out not in self.given and squares.wide_by_content(node, self.info, self.plan.params):
            bits = max(bits, self.config["square_bits"])
        return bits

    def _wide_depthwise(self, node: onnx.NodeProto, out: str, bits: int) -> bool:
        """Whether a depthwise convolution's input gets int16: always with `depthwise_inputs =
        "int16"`; with "channel_or_int16" (the default) where an int8 grid per channel would not
        serve it (its channels' ranges are alike, or a non-table op makes it). A depthwise
        convolution mixes nothing across channels, so it passes each channel's rounding on whole,
        and its few MACs make the int16 rate cheap; so only a tensor that depthwise convolutions
        alone read (docs/quantization.md, "Depthwise inputs the per-channel grids do not serve")."""
        mode = self.config["depthwise_inputs"]
        if mode == "int16":
            return True
        if mode != "channel_or_int16" or bits != 8 or not self._read_by_depthwise_only(out):
            return False
        one_grid = self.from_stats(out, 8, self._choices[id(node)].method)
        return self._channel_shifts(node, out, one_grid) is None

    def _read_by_depthwise_only(self, name: str) -> bool:
        """Whether every op that reads `name`, through ops that keep its grid (moves, Relu/Clip),
        is a depthwise convolution: a dense convolution reading a widened tensor would run at the
        int16 rate too, which the reason for widening (a depthwise convolution's few MACs) does
        not cover."""
        readers = list(self.info.consumers.get(name, []))
        while readers:
            reader = readers.pop()
            if reader.op_type in KEEPS_GRID:
                readers += self.info.consumers.get(reader.output[0], [])
            elif not depthwise.is_depthwise(self.info, reader):
                return False
        return name not in self.info.outputs

    def _channel_grid(self, node: onnx.NodeProto, out: str, params: TensorParams) -> TensorParams:
        """A table's int8 result that only integer int8 depthwise convolutions read gets one grid
        per channel (`depthwise_inputs = "channel"` or "channel_or_int16"), where that is finer
        than one grid (`_channel_shifts`) and the tensor does not take a concatenation's grid."""
        if self.config["depthwise_inputs"] not in ("channel", "channel_or_int16") or out in self._shared:
            return params
        grids = self._channel_shifts(node, out, params)
        if grids is None:
            return params
        base, shifts = grids
        return TensorParams(base, 0, 8, shifts)

    def _channel_shifts(
        self, node: onnx.NodeProto, out: str, params: TensorParams
    ) -> tuple[float, tuple[int, ...]] | None:
        """A depthwise input's grids per channel, (the base step, each channel's power-of-two
        shift), or None where they do not serve it. Each channel's calibrated peak is rounded up
        to a power-of-two multiple of the tensor's int16 grid, so that the table's 16-bit entries
        shifted right per channel give every channel's codes and the convolution folds its
        channel's scale into its requantization. One grid must otherwise hold channels whose
        ranges differ 100x (a MobileNet-style expansion), and most channels get a handful of codes."""
        absmax = self.stats_arrays.get(f"{out}/channel_absmax")
        if (
            out not in self._table_chains
            or params.bits != 8
            or absmax is None
            or out in self.given
            or out in self.info.outputs
            or not float(absmax.max()) > 0
            or not all(
                self._choices[id(r)].integer
                and self._choices[id(r)].bits == 8
                and depthwise.is_depthwise(self.info, r)
                for r in self.info.consumers.get(out, [])
            )
        ):
            return None
        # the base grid is the tensor's int16 grid (its range by the method, clipping outliers as
        # at 16 bits)
        base = self.from_stats(out, 16, self._choices[id(node)].method).scale
        shifts = depthwise.channel_shifts(np.asarray(absmax, np.float64), base, params.scale)
        return None if shifts is None else (base, shifts)

    def _depthwise_read(self, choices: dict) -> set[str]:
        """The tensors an integer depthwise convolution reads, followed back through the ops that
        keep their input's grid (moves, Relu/Clip) to the op that makes them: every name on the way
        (a Relu fused into its convolution writes the last of them)."""
        producers = self.info.producers
        found = set()
        for node in self.info.nodes:
            if not depthwise.is_depthwise(self.info, node) or not choices[id(node)].integer:
                continue
            name = node.input[0]
            found.add(name)
            while (maker := producers.get(name)) is not None and maker.op_type in KEEPS_GRID:
                name = maker.input[0]
                found.add(name)
        return found

    def _concat_sources(self, choices: dict, fused_activations: set[int]) -> dict[str, str]:
        """`concat_grids = "shared"`: the tensors that take a Concat's grid, each mapped to the
        Concat output whose grid it takes (that output may itself take a later Concat's: the last
        of the chain decides). Each input of an integer Concat is followed back through the ops
        that keep their input's grid (moves, Relu/Clip, Resize) to the tensor whose grid it
        carries; that tensor joins when an integer op at the Concat's width makes it, it is no
        network input or output, its grid was not recorded by a pre-quantized model, and no
        earlier Concat took it. The code generator then writes it straight into its place in the
        concatenation (targets/backend/allocation.py)."""
        self._concats: dict[str, onnx.NodeProto] = {}
        if self.config["concat_grids"] != "shared":
            return {}
        producers = self.info.producers
        keeps_grid = KEEPS_GRID | {"Resize"}
        shared: dict[str, str] = {}
        self._concats = {n.output[0]: n for n in self.info.nodes if n.op_type == "Concat"}
        for node in self.info.nodes:
            if node.op_type != "Concat" or not choices[id(node)].integer:
                continue
            out = node.output[0]
            bits = self._width(node, out)
            for name in node.input:
                source = name
                while (
                    (maker := producers.get(source)) is not None
                    and maker.op_type in keeps_grid
                    and id(maker) not in fused_activations
                    and choices[id(maker)].integer
                ):
                    source = maker.input[0]
                maker = producers.get(source)
                if (
                    maker is None
                    or not choices[id(maker)].integer
                    or maker.op_type == "Softmax"
                    or source in shared
                    or source == out
                    or source in self.info.outputs
                    or source in self.given
                    or self._width(maker, source) != bits
                ):
                    continue
                shared[source] = out
        return shared

    def _shared_grid(self, name: str) -> str:
        """The Concat output whose grid `name` takes (the end of its chain of Concats)."""
        while name in self._shared:
            name = self._shared[name]
        return name

    def _ranged_on(self, name: str) -> str:
        """The tensor whose statistics set `name`'s grid: the output of the MaxPool that alone
        reads it (through a chain of such pools), else `name` itself. Rounding and clipping are
        monotone, so max(q(x)) = q(max(x)): what flows on is the pooled values on this grid, and
        the values the pool drops never matter. A range that minimises the error over `name`'s
        own histogram clips its top, the values the pool keeps (docs/quantization.md, "Ranged
        where it is read")."""
        while (
            (reader := reader_facts.sole_reader(self.info, name)) is not None
            and reader.op_type == "MaxPool"
            and reader.input[0] == name
            and self._choices[id(reader)].integer
            and reader.output[0] in self.stats_meta
        ):
            name = reader.output[0]
        return name

    def _is_result(self, name: str) -> bool:
        """Whether `name` is a network output or reaches one through moves only (a Flatten)."""
        seen, todo = set(), [name]
        while todo:
            t = todo.pop()
            if t in self.info.outputs:
                return True
            seen.add(t)
            for user in self.info.consumers.get(t, []):
                if user.op_type in MOVE_OPS and user.input[0] == t:
                    todo.extend(o for o in user.output if o and o not in seen)
        return False

    def _integer(self, node: onnx.NodeProto, choice: NodeChoice, activation: onnx.NodeProto | None) -> None:
        """The parameters of an integer node's inputs and outputs: moves and clamps keep their
        input's; a Resize too; the others get their own from the statistics."""
        plan = self.plan
        plan.integer_nodes.append(node_label(node))
        for i in node.input:
            if i and i not in self.info.constants:
                self.ensure_quantized(i, choice.bits, choice.method)
        out = (activation or node).output[0]
        if node.op_type in MOVE_OPS:
            for o in node.output:
                if o:
                    plan.params[o] = plan.params[node.input[0]]
        elif node.op_type in ("Relu", "Clip"):
            plan.params[out] = plan.params[node.input[0]]
        elif node.op_type == "Softmax":  # a fixed grid; a network output's probabilities at int16
            bits = self._softmax_bits(node)
            scale, zero_point = SOFTMAX_GRID[bits]
            plan.params[out] = TensorParams(scale, zero_point, bits)
        elif node.op_type in MAC_OPS and self._fine_preactivation(out, choice):
            bits = self.config["preactivation_bits"]
            levels = 2 ** (bits - WIDE_INPUT_SHIFT)  # the table reads its top bits
            plan.params[out] = self.from_stats(out, bits, choice.method, levels)
            plan.fine_preactivations.add(out)
        else:
            grid = self._shared_grid(out)  # a Concat's, or its own
            method = self._choices[id(self._concats[grid])].method if grid != out else choice.method
            params = self.from_stats(self._ranged_on(grid), self._width(node, out), method)  # (warnings too)
            params = self._channel_grid(node, out, params)
            plan.params[out] = plan.params[node.input[0]] if node.op_type == "Resize" else params
        plan.steps.append(Step("integer", node=node, choice=choice, activation=activation))
