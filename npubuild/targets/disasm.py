"""The readable listing of a .npub: header, subgraphs, and every instruction under its op."""

from __future__ import annotations

from npubuild.targets import npub
from npubuild.targets.isa import subgraph_program


def disassemble(binary: npub.Npub) -> str:
    meta = binary.meta
    target = meta.get("target", {})
    lines = [
        f"; npub format {binary.version[0]}.{binary.version[1]}, target {target.get('name')} "
        f"(digest {binary.target_digest.hex()[:16]}), {len(binary.code)} bytes of code, "
        f"{len(binary.constants)} bytes of constants",
        f"; DRAM {meta.get('dram_size', 0)} bytes (constants at {meta.get('constants_base', 0):#x}), "
        f"SRAM {target.get('sram_kib', 0)} KiB",
    ]
    for spec in meta.get("inputs", []):
        lines.append(f"; input  {spec['name']} float32 {spec['shape']}")
    for spec in meta.get("outputs", []):
        q = spec.get("quant")
        how = f"int{q['bits']} scale {q['scale']:.6g} zero point {q['zero_point']}" if q else "float32"
        lines.append(f"; output {spec['name']} {how} {spec['shape']}")
    for k, sg in enumerate(meta.get("subgraphs", [])):
        lines.append("")
        if sg["device"] == "cpu":
            lines.append(f"; CPU subgraph {k} (onnxruntime): {', '.join(sg['ops'])}")
            continue
        program = subgraph_program(binary, sg, k)
        lines.append(f"; NPU subgraph {k}: {len(sg['ops'])} ops, {len(program)} instructions")
        for spec in sg["inputs"]:
            lines.append(f";   in  {spec['name']} int{spec['bits']} {spec['shape']} @ {spec['dram']:#x}")
        for spec in sg["outputs"]:
            lines.append(f";   out {spec['name']} int{spec['bits']} {spec['shape']} @ {spec['dram']:#x}")
        marks: dict[int, list[str]] = {}
        for at, node, kind in sg.get("marks", []):
            marks.setdefault(at, []).append(f"  ; {node} ({kind})")
        for n, instruction in enumerate(program):
            lines += marks.get(n, [])
            lines.append(f"  {n:6d}  {instruction.listing()}")
    return "\n".join(lines) + "\n"
