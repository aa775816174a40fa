"""The back end: an NPU subgraph of the integer model -> a tiled, synchronised instruction stream.

The phases, in the order `targets/compile.py` runs them, each handing the next plain data:

1. `fusion`: which activations run in their convolution's output path (`Fusion`).
2. `allocation`: where every tensor lives, DRAM by liveness or resident in SRAM (`Allocation`),
   checked by `verify_allocation`; `pinning`: where tables several ops read stay (a choice).
3. `schedule`: how each op is cut into tiles that fit SRAM (`OpSchedule`); `pipeline` picks the
   split of the largest fitting tile that the cycle model finds fastest.
4. `emit_*`: each op's high-level tile commands (`commands`: constant loads; per tile, loads, a
   compute and a store), addressed relative to the tile's buffer and the constant area.
5. `lowering`: one pass that assigns the ping-pong buffers, the synchronisation tokens and the
   constant slots (or, with fresh constants, each group its own SRAM), and hoists constant loads
   ahead so weights prefetch; `in_place`: tiles that read and write resident tensors where they
   lie.
6. `targets/isa.py` encodes the instructions.

`memory` holds the SRAM arithmetic every phase shares; `context` the view of the integer model the
emitters read.
"""
