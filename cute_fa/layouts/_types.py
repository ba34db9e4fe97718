"""Mapping from the configuration's dtype name to the CuTe DSL numeric type."""

import cutlass


def cutlass_dtype(name: str):
    return {"float16": cutlass.Float16, "bfloat16": cutlass.BFloat16,
            "float32": cutlass.Float32}[name]
