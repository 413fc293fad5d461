"""ctypes mirrors of the C structs the CPU launcher passes: DLPack's DLTensor
(dlpack/dlpack.h, v1.x) and TVM FFI's TVMFFIAny (tvm/ffi/c_api.h, apache-tvm-ffi 0.1.x)."""

from __future__ import annotations

import ctypes

# DLDeviceType / DLDataTypeCode values (dlpack.h)
KDL_CPU = 1
KDL_INT, KDL_UINT, KDL_FLOAT, KDL_BFLOAT, KDL_BOOL = 0, 1, 2, 4, 6
KDL_FLOAT8_E4M3FN, KDL_FLOAT8_E5M2 = 10, 12

# TVMFFITypeIndex values (c_api.h)
K_TVMFFI_NONE, K_TVMFFI_INT, K_TVMFFI_BOOL, K_TVMFFI_FLOAT = 0, 1, 2, 3
K_TVMFFI_DLTENSOR_PTR = 7

# manifest dtype -> (DLDataTypeCode, bits)
DL_DTYPES = {
    "bool": (KDL_BOOL, 8), "int8": (KDL_INT, 8), "int16": (KDL_INT, 16), "int32": (KDL_INT, 32),
    "int64": (KDL_INT, 64), "uint8": (KDL_UINT, 8), "uint16": (KDL_UINT, 16),
    "uint32": (KDL_UINT, 32), "uint64": (KDL_UINT, 64), "float16": (KDL_FLOAT, 16),
    "bfloat16": (KDL_BFLOAT, 16), "float32": (KDL_FLOAT, 32), "float64": (KDL_FLOAT, 64),
    "float8_e4m3": (KDL_FLOAT8_E4M3FN, 8), "float8_e5m2": (KDL_FLOAT8_E5M2, 8),
}


class DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", DLDevice), ("ndim", ctypes.c_int32),
                ("dtype", DLDataType), ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64)]


class _AnyValue(ctypes.Union):
    _fields_ = [("v_int64", ctypes.c_int64), ("v_float64", ctypes.c_double),
                ("v_ptr", ctypes.c_void_p)]


class TVMFFIAny(ctypes.Structure):
    _anonymous_ = ("value",)
    _fields_ = [("type_index", ctypes.c_int32), ("zero_padding", ctypes.c_uint32),
                ("value", _AnyValue)]


# int fn(void* self, const TVMFFIAny* args, int32_t num_args, TVMFFIAny* result)
SAFE_CALL_ARGTYPES = [ctypes.c_void_p, ctypes.POINTER(TVMFFIAny), ctypes.c_int32,
                      ctypes.POINTER(TVMFFIAny)]

assert ctypes.sizeof(DLTensor) == 48 and ctypes.sizeof(TVMFFIAny) == 16
