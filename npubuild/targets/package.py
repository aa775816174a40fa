"""Packaging: the compiled subgraphs -> the `.npub` binary (header, code, constants, CPU models)
and the statistics the reports show (instructions, estimated cycles, DRAM traffic
against the compulsory bytes, per-layer rows for the roofline)."""

from __future__ import annotations

import numpy as np

from npubuild.intmodel.program import IntegerModel, Op, TensorQuant
from npubuild.targets import npub
from npubuild.targets.backend.allocation import Allocation
from npubuild.targets.backend.memory import SramPlan
from npubuild.targets.cpu import CpuSubgraph
from npubuild.targets.cpu_cost import cpu_estimate
from npubuild.targets.cycles import engine, estimate, per_op, roofline
from npubuild.targets.isa import Instruction, encode
from npubuild.targets.spec import TargetSpec, target_digest


class Assembly:
    """The binary's parts, added subgraph by subgraph in the plan's order."""

    def __init__(
        self,
        program: IntegerModel,
        arrays: dict,
        shapes: dict,
        target: TargetSpec,
        plan: dict,
        allocation: Allocation,
        input_dtypes: dict[str, str] | None = None,
    ):
        self.program, self.shapes, self.target, self.plan = program, shapes, target, plan
        self.input_dtypes = input_dtypes or {}
        self.arrays = arrays
        self.allocation = allocation
        self.target_fields = target.model_dump()
        ops = program.ops
        # which subgraph first needs each tensor, and in which state it is at each boundary
        position = {i: k for k, sg in enumerate(plan["subgraphs"]) for i in sg["ops"]}
        self.readers: dict[str, set[int]] = {}
        for i, op in enumerate(ops):
            for n in op.data_inputs:
                self.readers.setdefault(n, set()).add(position[i])
        # pixel inputs arrive as codes (the input DMA flips their sign bit), the rest as floats
        self.states = {n: "q" if n in program.pixel_inputs else "f" for n in program.inputs}
        self.code = bytearray()
        self.cpu_blob = bytearray()
        self.subgraphs: list[dict] = []
        self.counts: dict[str, int] = {}
        self.cycles = self.macs = 0
        self.layers: list[dict] = []
        self.weight_bytes = {
            op.node: int(arrays[op.arrays.weight].size) for op in ops if op.kind in ("conv", "matmul")
        }

    def _needed(self, k: int) -> list[str]:
        """What subgraph k produces that the network outputs or a later subgraph reads."""
        ops = self.program.ops
        produced = [o for i in self.plan["subgraphs"][k]["ops"] for o in ops[i].outputs if o]
        outputs = set(self.program.outputs)
        return sorted({n for n in produced if n in outputs or any(p > k for p in self.readers.get(n, ()))})

    def _names(self, k: int) -> list[str]:
        ops = self.program.ops
        return [ops[i].label for i in self.plan["subgraphs"][k]["ops"]]

    def add_npu(self, k: int, code: list[Instruction], marks: list[tuple[int, Op]]) -> None:
        ops = self.program.ops
        indices = self.plan["subgraphs"][k]["ops"]
        produced = {o for i in indices for o in ops[i].outputs if o}
        consumed = []
        for i in indices:
            for n in ops[i].inputs:
                if n and n not in ops[i].constants and n not in consumed:
                    consumed.append(n)
        read_first = _read_first(indices, ops)
        inputs = [n for n in consumed if n not in produced or read_first[n]]
        blob = encode(code)
        entry = {
            "device": "npu",
            "code": [len(self.code), len(blob)],
            "inputs": [self._io(n) for n in inputs],
            "outputs": [self._io(n) for n in self._needed(k)],
            "ops": self._names(k),
        }
        self.code += blob
        entry["marks"] = [[at, op.label, op.kind] for at, op in marks]
        for instruction in code:
            queue = engine(instruction, self.target_fields)
            self.counts[queue] = self.counts.get(queue, 0) + 1
        timing = estimate(code, self.target_fields)
        entry["estimate"] = timing
        self.cycles += timing["cycles"]
        self.macs += timing["macs"]
        for row in per_op(code, entry["marks"], self.target_fields):
            row["weight_bytes"] = self.weight_bytes.get(row["node"], 0)
            row["roofline_cycles"] = roofline(
                row["macs"], row["weight_bytes"], self.target_fields, row.get("int16_macs", 0)
            )
            self.layers.append(row)
        self.subgraphs.append(entry)
        for o in produced:
            self.states[o] = "q"

    def add_cpu(self, k: int, cpu: CpuSubgraph) -> None:
        blob, cin, cout = cpu.build(self._needed(k))
        self.subgraphs.append(
            {
                "device": "cpu",
                "model": [len(self.cpu_blob), len(blob)],
                "inputs": cin,
                "outputs": cout,
                "ops": self._names(k),
            }
        )
        self.cpu_blob += blob

    def _io(self, name: str) -> dict:
        t = self.program.tensors[name]
        return {
            "name": name,
            "dram": self.allocation.addr[name],
            "shape": self.shapes[name],
            "bits": t.bits,
        }

    def finish(
        self, constants: bytes, sram: SramPlan, network_macs: int, network_int16_macs: int
    ) -> tuple[bytes, dict]:
        """The binary and its statistics; `network_macs`, the network's own
        multiply-accumulates (compile.py), make the roofline bound, which counts them once
        whatever the binary executes (a stripe's halo rows, the input rows two tiles of a
        transposed convolution share); `network_int16_macs` of them multiply a 16-bit operand."""
        program, shapes, target, allocation = self.program, self.shapes, self.target, self.allocation
        tensors = {
            n: {**program.tensors[n].model_dump(), "shape": shapes[n], "dram": allocation.addr[n]}
            for n in sorted(allocation.addr)
            # a window's, a shuffle's or an upsample's bytes are not row-major at its address: only
            # its readers' strided loads make it (windows.py, shuffles.py, upsamples.py)
            if n not in allocation.resident
            and not any(n in v for v in (allocation.windows, allocation.shuffled, allocation.upsampled))
        }
        meta = {
            "target": self.target_fields,
            # dtype only where it is not float32: the binaries of float-input models stay as they were
            "inputs": [
                {
                    "name": n,
                    "shape": shapes[n],
                    **({"dtype": d} if (d := self.input_dtypes.get(n)) else {}),
                    **({"pixels": True} if n in program.pixel_inputs else {}),
                }
                for n in program.inputs
            ],
            "outputs": [
                {"name": n, "shape": shapes.get(n, []), "quant": _quant(program.tensors.get(n))}
                for n in program.outputs
            ],
            "tensors": tensors,
            "dram_size": allocation.tensor_area + len(constants),
            "constants_base": allocation.tensor_area,
            "subgraphs": self.subgraphs,
        }
        data = npub.write(
            npub.Npub(
                target_digest=target_digest(target),
                meta=meta,
                sections={"code": bytes(self.code), "constants": constants, "cpu": bytes(self.cpu_blob)},
            )
        )
        # compulsory traffic: every weight once, the network's inputs and outputs once (NPU side)
        io_bytes = sum(
            int(np.prod(shapes[n], dtype=np.int64)) * (1 if program.tensors[n].bits == 8 else 2)
            for n in {*program.inputs, *program.outputs}
            if n in program.tensors and n in allocation.addr
        )
        compulsory = sum(self.weight_bytes.values()) + io_bytes
        cpu = cpu_estimate(program, self.arrays, shapes, self.plan, target)
        cycles, mac_count = self.cycles, self.macs
        npu_ms = cycles / (target.clock_mhz * 1000.0)
        stats = {
            "instructions": sum(self.counts.values()),
            "instructions_by_engine": dict(sorted(self.counts.items())),
            "dram_tensor_bytes": allocation.tensor_area,
            "resident_bytes": allocation.resident_bytes,
            "resident_tensors": len(allocation.resident),
            "const_slot_bytes": sram.const_slot,
            "constant_bytes": len(constants),
            "binary_bytes": len(data),
            "estimated_cycles": cycles,
            # the NPU's cycles, the CPU subgraphs and every hand-over between them (cpu_cost.py)
            "npu_latency_ms": npu_ms,
            **cpu,
            "estimated_latency_ms": npu_ms + cpu["cpu_latency_ms"] + cpu["transition_ms"],
            "macs": mac_count,
            "mac_utilisation": mac_count / (cycles * target.mac_rows * target.mac_cols) if cycles else 0.0,
            "dram_bytes": sum(r["dram_bytes"] for r in self.layers),
            "compulsory_dram_bytes": compulsory,
            # every MAC at the int8 peak (issue 19's bound), and each at its operands' width's peak:
            # what the array allows for this precision table
            "roofline_cycles": roofline(network_macs, compulsory, self.target_fields),
            "roofline_cycles_at_widths": roofline(
                network_macs, compulsory, self.target_fields, network_int16_macs
            ),
            "layers": self.layers,
            "npu_subgraphs": sum(1 for s in self.subgraphs if s["device"] == "npu"),
            "cpu_subgraphs": sum(1 for s in self.subgraphs if s["device"] == "cpu"),
        }
        return data, stats


def _read_first(indices: list[int], ops: list[Op]) -> dict[str, bool]:
    """For each tensor the ops name: whether the first of them to name it reads it (an op that
    reads and writes it reads first), rather than writes it."""
    first: dict[str, bool] = {}
    for i in indices:
        for n in ops[i].inputs:
            first.setdefault(n, True)
        for n in ops[i].outputs:
            first.setdefault(n, False)
    return first


def _quant(t: TensorQuant | None) -> dict | None:
    return t.model_dump() if t is not None else None
