"""The integer model: what quantize produces and the back end compiles and runs.

Integer codes and saturation (`codes`), the fixed-point requantization rule (`fixedpoint`), exact
integer kernels (`kernels`), which ops have integer forms (`ops`), lookup-table functions (`lut`),
the tensor archive it is stored in (`tensorfile`) and the golden interpreter (`interpreter`).
Imports nothing from `stages/` or `targets/`.
"""
