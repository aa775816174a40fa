"""Partition plan + integer model -> a .npub binary, its listing and its statistics."""

from __future__ import annotations

import numpy as np
import onnx

from npubuild.targets import npub
from npubuild.targets.codegen import Codegen, DoesNotFit, Stream
from npubuild.targets.cpu import CpuSubgraph
from npubuild.targets.cycles import estimate, per_op, roofline
from npubuild.targets.disasm import disassemble
from npubuild.targets.isa import ENGINES, encode
from npubuild.targets.partition import partition
from npubuild.targets.spec import TargetSpec, target_digest


def model_shapes(model: onnx.ModelProto) -> dict[str, list[int]]:
    shapes = {}
    for v in [*model.graph.input, *model.graph.value_info, *model.graph.output]:
        shapes[v.name] = [d.dim_value for d in v.type.tensor_type.shape.dim]
    for t in model.graph.initializer:
        shapes[t.name] = list(t.dims)
    return shapes


def plan_partition(program: dict, arrays: dict, model: onnx.ModelProto, target: TargetSpec) -> dict:
    """partition(), with every op the NPU supports dry-run through the code generator: one that
    cannot be tiled into this SRAM at all goes to the CPU with that reason."""
    shapes = model_shapes(model)
    dry = Codegen(program, arrays, shapes, target, {"subgraphs": []})
    dry.addr = _Zero()

    def fits(op: dict) -> bool:
        try:
            dry.emit(Stream(), op)
        except DoesNotFit:
            return False
        return True

    return partition(program, arrays, shapes, target, fits)


class _Zero(dict):
    def __missing__(self, key):
        return 0


# Shares of SRAM the grouping search tries to reserve for tensors kept on chip between layers. At
# most half: beyond that the estimate gains a few percent (YOLOv8n on vnpu-s: 4%) for tiles so small
# that the instruction stream grows 2.4x.
RESIDENT_SHARES = (0.0, 0.25, 0.5)
# Shares of the rest that each of the two constant slots takes (0: no prefetch of the next weights).
CONST_SLOT_SHARES = (0.0, 0.125, 0.25)


def compile_npub(
    program: dict,
    arrays: dict,
    model: onnx.ModelProto,
    target: TargetSpec,
    plan: dict,
    reuse_dram: bool = True,
    group: bool = True,
) -> tuple[bytes, str, dict]:
    """The binary with the least estimated latency over the grouping choices: how much SRAM keeps
    intermediates on chip (layers whose tensors stay there form one group, no DRAM round trip)
    versus how much is left for tiles. Without grouping (or when checking every op's result),
    every tensor goes through DRAM."""
    grouping = group and reuse_dram
    shares = [(r, c) for r in RESIDENT_SHARES for c in CONST_SLOT_SHARES] if grouping else [(0.0, 0.0)]
    best = None
    tried = []
    for share, const_share in shares:
        budget = int(share * target.sram_kib * 1024)
        try:
            result = _compile(program, arrays, model, target, plan, reuse_dram, budget, grouping, const_share)
        except DoesNotFit:
            continue
        stats = result[2]
        tried.append(
            {
                "resident_bytes": budget,
                "const_slot_bytes": stats["const_slot_bytes"],
                "estimated_cycles": stats["estimated_cycles"],
                "dram_bytes": stats["dram_bytes"],
            }
        )
        if best is None or stats["estimated_cycles"] < best[2]["estimated_cycles"]:
            best = result
    data, listing, stats = best
    stats["grouping_search"] = tried
    return data, listing, stats


def _compile(
    program: dict,
    arrays: dict,
    model: onnx.ModelProto,
    target: TargetSpec,
    plan: dict,
    reuse_dram: bool,
    resident_bytes: int,
    fuse: bool,
    const_share: float = 0.0,
) -> tuple[bytes, str, dict]:
    shapes = model_shapes(model)
    ops = program["ops"]
    gen = Codegen(program, arrays, shapes, target, plan)
    if fuse:  # fused intermediates never exist, so the every-op check compiles without
        gen.fuse()
    gen.allocate(reuse=reuse_dram, resident_bytes=resident_bytes)
    gen.const_slot = int(const_share * gen.sram) // 64 * 64
    # which subgraph first needs each tensor, and in which state it is at each boundary
    position = {i: k for k, sg in enumerate(plan["subgraphs"]) for i in sg["ops"]}
    readers: dict[str, set[int]] = {}
    for i, op in enumerate(ops):
        for n in op["inputs"]:
            if n and n not in op.get("constants", {}):
                readers.setdefault(n, set()).add(position[i])
    network_outputs = set(program["outputs"])
    states = {n: "f" for n in program["inputs"]}
    code = bytearray()
    cpu_blob = bytearray()
    subgraphs = []
    counts: dict[str, int] = {}
    cycles = mac_count = 0
    layers: list[dict] = []
    weight_bytes = {
        op.get("node", ""): int(arrays[op["arrays"]["weight"]].size)
        for op in ops
        if op["kind"] in ("conv", "matmul")
    }
    for k, sg in enumerate(plan["subgraphs"]):
        produced: list[str] = []
        for i in sg["ops"]:
            produced += [o for o in ops[i]["outputs"] if o]
        needed = sorted(
            {n for n in produced if n in network_outputs or any(p > k for p in readers.get(n, ()))}
        )
        consumed = []
        for i in sg["ops"]:
            for n in ops[i]["inputs"]:
                if n and n not in ops[i].get("constants", {}) and n not in consumed:
                    consumed.append(n)
        if sg["device"] == "npu":
            stream = Stream()
            marks = []
            for i in sg["ops"]:
                marks.append((len(stream.code), ops[i]))
                gen.emit(stream, ops[i])
            if gen.const_slot:
                position, moved = stream.hoist_constants()
                marks = [(_first_kept(at, position, moved), op) for at, op in marks]
            stream.emit("end")
            local = set(produced)
            inputs = [n for n in consumed if n not in local or _read_before_write(sg["ops"], ops, n)]
            blob = encode(stream.code)
            subgraphs.append(
                {
                    "device": "npu",
                    "code": [len(code), len(blob)],
                    "inputs": [_io(n, gen, shapes, program) for n in inputs],
                    "outputs": [_io(n, gen, shapes, program) for n in needed],
                    "ops": [ops[i].get("node", ops[i]["outputs"][0]) for i in sg["ops"]],
                }
            )
            code += blob
            subgraphs[-1]["marks"] = [[at, op.get("node", op["outputs"][0]), op["kind"]] for at, op in marks]
            for instruction in stream.code:
                engine = ENGINES[instruction.op]
                counts[engine] = counts.get(engine, 0) + 1
            timing = estimate(stream.code, target.model_dump())
            subgraphs[-1]["estimate"] = timing
            cycles += timing["cycles"]
            mac_count += timing["macs"]
            for row in per_op(stream.code, subgraphs[-1]["marks"], target.model_dump()):
                row["weight_bytes"] = weight_bytes.get(row["node"], 0)
                row["roofline_cycles"] = roofline(row["macs"], row["weight_bytes"], target.model_dump())
                layers.append(row)
            for i in sg["ops"]:
                for o in ops[i]["outputs"]:
                    if o:
                        states[o] = "q"
        else:
            cpu = CpuSubgraph(model, program, arrays, k)
            for i in sg["ops"]:
                cpu.add_op(ops[i], states)
                for o in ops[i]["outputs"]:
                    if o and o in cpu.current:
                        states[o] = cpu.current[o][1]
            blob, cin, cout = cpu.build(needed)
            subgraphs.append(
                {
                    "device": "cpu",
                    "model": [len(cpu_blob), len(blob)],
                    "inputs": cin,
                    "outputs": cout,
                    "ops": [ops[i].get("node", ops[i]["outputs"][0]) for i in sg["ops"]],
                }
            )
            cpu_blob += blob
    tensors = {
        n: {**program["tensors"][n], "shape": shapes[n], "dram": gen.addr[n]}
        for n in sorted(gen.addr)
        if n not in gen.resident
    }
    meta = {
        "target": target.model_dump(),
        "inputs": [{"name": n, "shape": shapes[n]} for n in program["inputs"]],
        "outputs": [
            {"name": n, "shape": shapes.get(n, []), "quant": program["tensors"].get(n)}
            for n in program["outputs"]
        ],
        "tensors": tensors,
        "dram_size": gen.tensor_area + len(gen.consts),
        "constants_base": gen.tensor_area,
        "subgraphs": subgraphs,
    }
    data = npub.write(
        npub.Npub(
            target_digest=target_digest(target),
            meta=meta,
            sections={"code": bytes(code), "constants": bytes(gen.consts), "cpu": bytes(cpu_blob)},
        )
    )
    # compulsory traffic: every weight once, the network's inputs and outputs once (NPU side)
    io_bytes = sum(
        int(np.prod(shapes[n], dtype=np.int64)) * (1 if program["tensors"][n]["bits"] == 8 else 2)
        for n in {*program["inputs"], *program["outputs"]}
        if n in program["tensors"] and n in gen.addr
    )
    compulsory = sum(weight_bytes.values()) + io_bytes
    stats = {
        "instructions": sum(counts.values()),
        "instructions_by_engine": dict(sorted(counts.items())),
        "dram_tensor_bytes": gen.tensor_area,
        "resident_bytes": resident_bytes,
        "resident_tensors": len(gen.resident),
        "const_slot_bytes": gen.const_slot,
        "constant_bytes": len(gen.consts),
        "binary_bytes": len(data),
        "estimated_cycles": cycles,
        "estimated_latency_ms": cycles / (target.clock_mhz * 1000.0),
        "macs": mac_count,
        "mac_utilisation": mac_count / (cycles * target.mac_rows * target.mac_cols) if cycles else 0.0,
        "dram_bytes": sum(r["dram_bytes"] for r in layers),
        "compulsory_dram_bytes": compulsory,
        "roofline_cycles": roofline(mac_count, compulsory, target.model_dump()),
        "layers": layers,
        "npu_subgraphs": sum(1 for s in subgraphs if s["device"] == "npu"),
        "cpu_subgraphs": sum(1 for s in subgraphs if s["device"] == "cpu"),
    }
    return data, disassemble(npub.read(data)), stats


def _first_kept(at: int, position: list[int], moved: set[int]) -> int:
    """Where an op's first instruction that stayed in place went (its start after hoisting)."""
    while at < len(position) and at in moved:
        at += 1
    return position[at] if at < len(position) else len(position)


def _read_before_write(indices: list[int], ops: list[dict], name: str) -> bool:
    for i in indices:
        if name in ops[i]["inputs"]:
            return True
        if name in ops[i]["outputs"]:
            return False
    return False


def _io(name: str, gen: Codegen, shapes: dict, program: dict) -> dict:
    t = program["tensors"][name]
    return {"name": name, "dram": gen.addr[name], "shape": shapes[name], "bits": t["bits"]}
