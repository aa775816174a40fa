"""Hardware descriptions of the virtual NPU (spec, built-in targets); ISA, binary and simulator follow."""
