"""Quantization: every precision below fp32 the build makes, in one room.

- graph_recipes.py  the transformer fusions, fp16 conversion and dynamic int8 of the text tasks
- recipes.py        the named int8 recipes a build may pin (`--int8-recipe`)
- int8_search.py    the search that picks the fastest recipe within the parity budget (text int8,
                    a decoder's weight-only int8 and int4)
- static_int8.py    int8 on ONNX Runtime's int8 kernels for the image tasks (calibration, bias
                    correction, the gate-driven fallback to float, the kernel census)
- weight_only.py    weight-only int4 and int8 (`MatMulNBits`) for decoders, with the search that
                    keeps the costliest layers in float until the gate passes
"""
