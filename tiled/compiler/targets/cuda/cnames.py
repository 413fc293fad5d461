"""The C names of the element types, as the generated CUDA spells them."""

CTYPE = {"float16": "half", "bfloat16": "__nv_bfloat16", "float32": "float", "float64": "double",
         "int8": "int8_t", "int32": "int", "int64": "int64_t", "uint8": "uint8_t",
         "float8_e4m3": "__nv_fp8_e4m3", "float8_e5m2": "__nv_fp8_e5m2"}
