"""The precision search's cost of a table against the code generator: compiling a mixed table on
the real PP-OCR classifier gives the estimated latency the search's price list predicted for it,
within 5%, on both built-in targets (issue 16, "one cost")."""

from __future__ import annotations

import random

import pytest

from conftest import make_small_ws, run_build
from npubuild.cache.store import Store
from npubuild.intmodel import tensorfile
from npubuild.rules.attrs import QuantizeConfig
from npubuild.stages.onnx_utils import load_model
from npubuild.stages.quantize.cost import op_work
from npubuild.stages.quantize.planning import node_label
from npubuild.stages.quantize.precision import Layers
from npubuild.stages.quantize.search.prices import Prices, compile_table, device_parts, latency_cycles
from npubuild.targets.spec import BUILTIN_TARGETS

# Left out of the quick tier: it compiles the real classifier five times per target
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def optimized_cls(tmp_path_factory, cls_model):
    root = tmp_path_factory.mktemp("prices")
    ws = make_small_ws(root / "ws", cls_model)
    store = Store(root / "cache")
    try:
        outcome = run_build(ws, store, ["//models:cls_npu"], until="calibrate")
        assert outcome.ok, outcome.errors
    finally:
        store.close()
    out = ws / "npubuild-out" / "models" / "cls_npu"
    arrays, stats = tensorfile.load(out / "stats.npbt")
    return load_model(out / "optimized.onnx", "the optimized model"), stats["tensors"], arrays


def mixed_tables(layers: Layers, model) -> list[dict[str, str]]:
    """Every third layer int16; a random 40% int16; a random 20% int16 with the pooling and the
    classifier's matrix product kept float (CPU; a Gemm with its bias since matmul_bias_as_gemm):
    the ten float pools cut the NPU program into 11 parts, each of which starts slower; the last
    pool and the Gemm after it float, alone: two adjacent float layers are one CPU part with one
    pair of hand-overs (priced as two pairs until the forty-sixth session, 1.31x codegen's
    estimate on vnpu-m)."""
    units = layers.units
    rng = random.Random(7)
    kinds = {node_label(n): n.op_type for n in model.graph.node}
    third = {u: "int16" for u in units[::3]}
    forty = {u: "int16" for u in units if rng.random() < 0.4}
    with_float = {u: "int16" for u in units if rng.random() < 0.2}
    with_float.update({u: "float" for u in units if kinds.get(u) in ("GlobalAveragePool", "MatMul", "Gemm")})
    pools = [u for u in units if kinds.get(u) == "GlobalAveragePool"]
    tail = {u: "float" for u in units if kinds.get(u) in ("MatMul", "Gemm")} | {pools[-1]: "float"}
    return [third, forty, with_float, tail]


@pytest.mark.parametrize("target_name", ["vnpu-s", "vnpu-m"])
def test_the_search_prices_a_table_as_codegen_estimates_it(optimized_cls, target_name):
    model, stats_meta, stats_arrays = optimized_cls
    quantize = {**QuantizeConfig().model_dump(), "overrides": []}
    settings = {"quantize": quantize, "target": BUILTIN_TARGETS[target_name].model_dump()}
    layers = Layers(model, stats_meta, stats_arrays, quantize)
    work = op_work(model)
    prices = Prices.compiled(model, stats_meta, stats_arrays, settings, layers, work)
    tables = mixed_tables(layers, model)
    assert any("float" in t.values() for t in tables) and all(len(t) >= 2 for t in tables)
    int8 = compile_table(model, stats_meta, stats_arrays, settings, {}, layers).stats
    for table in tables:
        compiled = compile_table(model, stats_meta, stats_arrays, settings, table, layers)
        predicted = prices.table_cycles(
            model.graph,
            compiled.tensor_bits,
            set(compiled.integer_nodes),
            [work[u] for u, p in table.items() if p == "float"],
            work,
            compiled.fine,
        )
        codegen = compiled.stats
        estimate = latency_cycles(codegen, BUILTIN_TARGETS[target_name])
        print(f"{target_name}: {len(table)} layers set, search / codegen {predicted / estimate:.3f}")
        # the hand-overs and NPU parts the price counts are the ones the partition adds to int8's
        hand_overs, parts = device_parts(model.graph, prices.on_npu(compiled.integer_nodes))
        assert hand_overs - prices.int8_cuts[0] == codegen["transitions"] - int8["transitions"]
        assert parts - prices.int8_cuts[1] == codegen["npu_subgraphs"] - int8["npu_subgraphs"]
        assert abs(predicted / estimate - 1) <= 0.05, (target_name, len(table), predicted, estimate)
