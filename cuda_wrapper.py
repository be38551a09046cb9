"""Python bindings for libcuda_kernels.so (ctypes; the C ABI is cuda_kernels.h).

Three levels, from convenient to exact:

* NumPy / ``__cuda_array_interface__`` functions: :func:`quantize_int8`,
  :func:`dequantize_int8`, :func:`quantize_fp8`, :func:`dequantize_fp8` (E4M3 / E5M2, scaled
  per tensor, row or block), :func:`quantize_int4`, :func:`dequantize_int4`, the block 4-bit
  formats (:func:`quantize_nf4` / :func:`dequantize_nf4`, :func:`quantize_mxfp4` /
  :func:`dequantize_mxfp4`, :func:`quantize_nvfp4` / :func:`dequantize_nvfp4`), the matrix products
  :func:`gemm_int8` (int32 out), :func:`gemm_int8_scaled` (W8A8 with a fused scale/bias/ReLU
  epilogue) with :func:`int8_prepack` ([K, N] weights to [N, K]), :func:`gemm_fp8_scaled` (the
  same with FP8 E4M3 operands, or DeepSeek-V3's block scales) and the layer :class:`Fp8Linear`,
  :func:`gemm_w4a8` (symmetric INT4 weights times FP8 E4M3 activations, W4A8) and its layer
  :class:`W4A8Linear`, :func:`linear` (fp32/fp16/bf16), :func:`gemm_w4a16` (fp16/bf16 activations
  times a packed INT4 weight, W4A16) with :func:`w4a16_prepack` / :func:`gemm_w4a16_prepacked`
  (its fast path), :func:`gemm_int4` / :func:`gemm_int4_scaled` (INT4 x INT4), the checkpoint
  importers :func:`import_gptq` / :func:`import_awq` with :func:`permute_columns`, the layer
  :class:`QuantizedLinear`, the Mixture-of-experts layer (:func:`moe_route`,
  :func:`moe_prepack`, :func:`moe_forward`, :class:`QuantizedMoE`), and the seed API
  :func:`quantize_tensor` /
  :func:`dequantize_tensor` / :func:`int8_matmul`. Results come in the kind of the first
  array: torch CUDA tensors give torch tensors (allocated by torch, the call on torch's
  current stream of their device), CuPy arrays CuPy arrays (CuPy's allocator and current
  stream), other ``__cuda_array_interface__`` objects (numba, :class:`DeviceArray`)
  DeviceArrays (on the stream their interface names); device inputs are used in place,
  zero-copy. NumPy inputs are copied to the GPU and the results come back as NumPy arrays
  (torch CPU tensors as CPU tensors). ``out=`` arrays are written in place; ``stream=`` picks
  the stream. Nothing on a device call's path calls cudaMalloc, cudaFree or synchronizes once
  the allocators are warm: outputs and scratch memory come from the framework's allocator or
  from the pool of DeviceArray memory (host data in a DeviceArray call, a Python scale say, is
  copied up with cudaMemcpyAsync; torch and CuPy write a Python scalar with a fill kernel).
  No framework is imported here: one is recognized when its arrays arrive.
* :data:`raw`: one function per C entry point, taking ints for device pointers and streams.
* :data:`cuda`: a small libcudart binding (malloc, memcpy, streams, events, CUDA graph
  capture, the pool's memory_stats / empty_cache) and :class:`DeviceArray`, a typed device
  buffer.
* :func:`torch_ops`: the torch custom operators of QuantizedLinear and moe_forward, for
  torch.compile and CUDA graphs.

bfloat16 data is held as ``np.uint16`` bit patterns; ``dtype="bf16"`` (inputs),
``out_dtype="bf16"`` (outputs) or ``DeviceArray.ck_dtype == DType.BF16`` says so; torch
bfloat16 tensors say it themselves (and bf16 results on torch are torch.bfloat16).
Every library failure raises :class:`CKError` (``.status`` is a :class:`Status`, ``.message``
the library's own words); a failing CUDA runtime call made here raises :class:`CUDAError`.

Example::

    import numpy as np
    import cuda_wrapper as ck

    x = np.random.randn(16, 4096).astype(np.float32)
    q, scales = ck.quantize_int8(x, granularity="row")     # int8 [16, 4096], float32 [16]
    y = ck.dequantize_int8(q, scales, granularity="row")    # float32 [16, 4096]

    w = np.random.randn(4096, 4096).astype(np.float16)
    packed, s, z = ck.quantize_int4(w, group_size=128, symmetric=False)
    w2 = ck.dequantize_int4(packed, s, z, cols=4096, group_size=128)   # float16, like s

    wq, ws = ck.quantize_int8(w, granularity="row")          # int8 [4096, 4096], [N, K] layout
    y = ck.gemm_int8_scaled(q, wq, scales, ws, out_dtype="fp16", activation="relu")
    y2 = ck.linear(x, w.astype(np.float32), bias=None)      # float32 [16, 4096]
    y3 = ck.gemm_w4a16(x.astype(np.float16), packed, s, z, group_size=128)  # float16 [16, 4096]

    xt = torch.randn(16, 4096, device="cuda", dtype=torch.bfloat16)    # where torch is used
    qt, st = ck.quantize_int8(xt, granularity="row")         # torch tensors, current stream

    xd = ck.DeviceArray.from_numpy(x)                        # any __cuda_array_interface__
    qd, sd = ck.quantize_int8(xd, granularity="row")         # DeviceArrays, nothing copied
    stream = ck.cuda.stream_create()
    with ck.cuda.graph_capture(stream) as graph:             # every entry point is capturable
        ck.raw.quantize_int8(xd.ptr, ck.DType.FP32, 16, 4096, ck.PER_ROW, ck.DYNAMIC,
                             sd.ptr, qd.ptr, stream)
    graph.launch(stream)
    ck.cuda.stream_synchronize(stream)

The library is looked up next to this file, or where ``CK_LIBRARY_PATH`` (a file or a
directory) says; it is loaded on first use.
"""

import atexit
import contextlib
import ctypes
import ctypes.util
import enum
import inspect
import math
import numbers
import operator
import os
import sys
import threading

import numpy as np

__all__ = [
    "DType", "Status", "CKError", "CUDAError", "LibraryNotFoundError",
    "PER_TENSOR", "PER_ROW", "PER_BLOCK_1X128", "PER_BLOCK_128X128", "FP8_E4M3", "FP8_E5M2",
    "FP8_BLOCK", "STATIC", "DYNAMIC", "INT4_SYMMETRIC", "INT4_ASYMMETRIC",
    "GROUP_ROW", "LAYOUT_NK", "LAYOUT_KN", "ACTIVATION_NONE", "ACTIVATION_RELU", "MOE_SWIGLU",
    "version", "device_count", "library_path", "load_library",
    "cuda", "CUDAGraph", "DeviceArray", "raw",
    "quantize_int8", "dequantize_int8", "quantize_fp8", "dequantize_fp8", "quantize_int4",
    "dequantize_int4", "NF4_BLOCK_SIZES", "MXFP4_BLOCK", "NVFP4_BLOCK", "quantize_nf4", "dequantize_nf4",
    "quantize_mxfp4", "dequantize_mxfp4", "quantize_nvfp4", "dequantize_nvfp4",
    "gemm_int8", "gemm_int8_scaled", "gemm_fp8_scaled", "Fp8Linear", "gemm_w4a8", "W4A8Linear",
    "int8_prepack", "linear", "gemm_w4a16", "w4a16_prepack",
    "gemm_w4a16_prepacked", "BLOCK4_NF4", "BLOCK4_MXFP4", "BLOCK4_NVFP4", "block4_prepack",
    "gemm_block4_prepacked", "import_gptq", "import_awq", "permute_columns", "gemm_int4",
    "gemm_int4_scaled", "QuantizedLinear", "MoeParams", "moe_route", "moe_prepack",
    "moe_workspace_size", "moe_forward", "QuantizedMoE", "AttentionParams", "attention",
    "AttentionDecodeParams", "attention_decode_workspace_size", "attention_decode",
    "KV_DTYPE", "KV_FP8_E4M3", "KV_INT8", "KV_SCALE_PER_HEAD", "KV_SCALE_PER_TOKEN",
    "KvCacheAppendParams", "kv_cache_append",
    "WEIGHT4_INT4", "WEIGHT4_NF4", "WEIGHT4_MXFP4", "WEIGHT4_NVFP4", "ROPE_NONE", "ROPE_NEOX",
    "ROPE_INTERLEAVED", "QkvParams", "qkv_prepack", "qkv_projection", "QkvProjection",
    "quantize_tensor", "dequantize_tensor", "int8_matmul", "torch_ops",
    "SPARSITY_2_4", "SPARSITY_16_32", "sparse_prune", "sparse_quantize_int4",
    "sparse_dequantize_int4", "sparse_w4a16_prepack", "gemm_sparse_w4a16",
    "gemm_sparse_w4a16_prepacked", "SparseQuantizedLinear", "sparse_1632_to_24",
    "sparse_w4a16_prepack_dense",
]

LIBRARY_NAME = "libcuda_kernels.so"
_HERE = os.path.dirname(os.path.abspath(__file__))


# ------------------------------------------------------------------------------------------------
# Enums and constants (values from cuda_kernels.h)
# ------------------------------------------------------------------------------------------------
class DType(enum.IntEnum):
    FP32 = 0
    FP16 = 1
    BF16 = 2
    INT8 = 3
    INT32 = 4
    UINT8 = 5


class Status(enum.IntEnum):
    SUCCESS = 0
    INVALID_VALUE = 1
    MISALIGNED = 2
    UNSUPPORTED = 3
    NO_DEVICE = 4
    CUDA_ERROR = 5
    CUBLAS_ERROR = 6
    INTERNAL_ERROR = 7


PER_TENSOR = 0          # ck_granularity_t
PER_ROW = 1
PER_BLOCK_1X128 = 2     # FP8 only: one scale per row per 128 columns
PER_BLOCK_128X128 = 3   #           one scale per 128 x 128 tile
FP8_E4M3 = 0            # ck_fp8_format_t
FP8_E5M2 = 1
FP8_BLOCK = 128         # the edge of FP8's scale blocks
STATIC = 0              # ck_scale_mode_t
DYNAMIC = 1
INT4_SYMMETRIC = 0      # ck_int4_mode_t
INT4_ASYMMETRIC = 1
GROUP_ROW = -1          # CK_GROUP_ROW
LAYOUT_NK = 0           # ck_layout_t: the weight b is [N, K] (nn.Linear): out = a b^T
LAYOUT_KN = 1           #              the weight b is [K, N]: out = a b
ACTIVATION_NONE = 0     # ck_activation_t
ACTIVATION_RELU = 1
MOE_SWIGLU = 0          # ck_moe_activation_t: silu(gate) * up
BLOCK4_NF4 = 0          # ck_block4_format_t
BLOCK4_MXFP4 = 1
BLOCK4_NVFP4 = 2
WEIGHT4_INT4 = 0        # ck_weight4_format_t: INT4, then the block formats in BLOCK4_ order
WEIGHT4_NF4 = 1
WEIGHT4_MXFP4 = 2
WEIGHT4_NVFP4 = 3
ROPE_NONE = 0           # ck_rope_style_t
ROPE_NEOX = 1
ROPE_INTERLEAVED = 2
SPARSITY_2_4 = 0        # ck_sparsity_t: at most 2 non-zeros in every block of 4 k
SPARSITY_16_32 = 1      #                at most 16 in every block of 32 k
KV_DTYPE = 0            # ck_kv_format_t: the attention's fp16/bf16 values
KV_FP8_E4M3 = 1         #                 FP8 E4M3 bytes times scales
KV_INT8 = 2             #                 int8 codes times scales
KV_SCALE_PER_HEAD = 0   # ck_kv_scaling_t: scales [Hkv], given
KV_SCALE_PER_TOKEN = 1  #                  scales [slots, Hkv], one per cache row

# Host-side storage of each library dtype (bf16 as its bit pattern).
_NUMPY_OF = {
    DType.FP32: np.dtype(np.float32),
    DType.FP16: np.dtype(np.float16),
    DType.BF16: np.dtype(np.uint16),
    DType.INT8: np.dtype(np.int8),
    DType.INT32: np.dtype(np.int32),
    DType.UINT8: np.dtype(np.uint8),
}
# The library dtype of each NumPy dtype; uint16 is ambiguous (bf16 must be said explicitly).
_DTYPE_OF = {v: k for k, v in _NUMPY_OF.items() if k != DType.BF16}

_DTYPE_NAMES = {
    "fp32": DType.FP32, "float32": DType.FP32, "float": DType.FP32,
    "fp16": DType.FP16, "float16": DType.FP16, "half": DType.FP16,
    "bf16": DType.BF16, "bfloat16": DType.BF16,
}


# ------------------------------------------------------------------------------------------------
# Errors
# ------------------------------------------------------------------------------------------------
class LibraryNotFoundError(OSError):
    """libcuda_kernels.so (or libcudart) could not be found or loaded."""


class CKError(RuntimeError):
    """A library call returned a status other than CK_STATUS_SUCCESS.

    status: a Status (an int if the library returned an unknown value); message: the calling
    thread's ck_last_error_message(); cuda_error: ck_last_cuda_error() for CUDA_ERROR and
    NO_DEVICE (else 0); function: the entry point that failed.
    """

    def __init__(self, status, message, cuda_error=0, function=None):
        try:
            status = Status(status)
        except ValueError:
            pass
        self.status = status
        self.message = message
        self.cuda_error = cuda_error
        self.function = function
        super().__init__(status, message)

    def __str__(self):
        name = self.status.name if isinstance(self.status, Status) else "status %d" % self.status
        text = "%s: %s" % (name, self.message or "(no message)")
        if self.cuda_error:
            text += " [cudaError %d: %s]" % (self.cuda_error, cuda.error_string(self.cuda_error))
        return text


class CUDAError(RuntimeError):
    """A CUDA runtime call made by this module failed. code: the cudaError_t value."""

    def __init__(self, code, call, text):
        self.code = code
        self.call = call
        self.text = text
        super().__init__(code, call, text)

    def __str__(self):
        return "%s failed: cudaError %d: %s" % (self.call, self.code, self.text)


# ------------------------------------------------------------------------------------------------
# Loading libcuda_kernels.so; the table of its exports
# ------------------------------------------------------------------------------------------------
_STATUS = "ck_status_t"   # declared as c_int; a non-zero value raises CKError

_VOIDP = ctypes.c_void_p
_I64 = ctypes.c_int64
_ENUM = ctypes.c_int
_PTR = _VOIDP             # a device pointer: an int at the raw level, 0 for NULL
_FLAG = ctypes.c_int      # a C int that is a boolean (renormalize, gate_up): 0 or 1
_STREAM = ("stream", _VOIDP)   # the last argument of every entry point; 0 by default


class _ParamsStruct(ctypes.Structure):
    """A ck_*_params_t, field for field in the header's order (tests/test_abi.py checks the
    layout against the header's). Device pointers are ints (0 for NULL), enums and flags ints.
    struct_size defaults to ctypes.sizeof of the subclass (the layout this module was written
    against), every other field to 0, which is the header's default where it has one; repr
    shows pointers in hex."""

    def __init__(self, **fields):
        fields.setdefault("struct_size", ctypes.sizeof(type(self)))
        super().__init__(**fields)

    def __repr__(self):
        return "%s(%s)" % (type(self).__name__, ", ".join(
            "%s=%s" % (name, hex(getattr(self, name) or 0) if ctype is _VOIDP else
                       getattr(self, name)) for name, ctype in self._fields_))


class MoeParams(_ParamsStruct):
    """ck_moe_params_t: the arguments of ck_moe_workspace_size and ck_moe_forward (the raw level
    passes an instance by reference). Zero fields: fp32 router logits, no renormalization,
    CK_MOE_SWIGLU."""
    _fields_ = [
        ("struct_size", ctypes.c_size_t),
        ("tokens", _I64),
        ("hidden", _I64),
        ("intermediate", _I64),
        ("experts", _I64),
        ("top_k", _I64),
        ("dtype", _ENUM),
        ("group_size", _I64),
        ("mode", _ENUM),
        ("x", _VOIDP),
        ("router_logits", _VOIDP),
        ("router_dtype", _ENUM),
        ("renormalize", ctypes.c_int32),
        ("topk_ids", _VOIDP),
        ("topk_weights", _VOIDP),
        ("w13", _VOIDP),
        ("w13_scales", _VOIDP),
        ("w13_zeros", _VOIDP),
        ("w2", _VOIDP),
        ("w2_scales", _VOIDP),
        ("w2_zeros", _VOIDP),
        ("activation", _ENUM),
        ("out", _VOIDP),
    ]


class AttentionParams(_ParamsStruct):
    """ck_attention_params_t: the arguments of ck_attention_forward (passed by reference). Zero
    fields: no lse, one sequence, max_seqlen = the totals, softmax_scale 1 / sqrt(D), not
    causal."""
    _fields_ = [
        ("struct_size", ctypes.c_size_t),
        ("dtype", _ENUM),
        ("q", _VOIDP),
        ("k", _VOIDP),
        ("v", _VOIDP),
        ("out", _VOIDP),
        ("lse", _VOIDP),
        ("total_q", _I64),
        ("total_k", _I64),
        ("num_heads_q", _I64),
        ("num_heads_kv", _I64),
        ("head_dim", _I64),
        ("batch", _I64),
        ("cu_seqlens_q", _VOIDP),
        ("cu_seqlens_k", _VOIDP),
        ("max_seqlen_q", _I64),
        ("max_seqlen_k", _I64),
        ("softmax_scale", ctypes.c_float),
        ("causal", ctypes.c_int32),
    ]


class AttentionDecodeParams(_ParamsStruct):
    """ck_attention_decode_params_t: the arguments of ck_attention_decode and
    ck_attention_decode_workspace_size (passed by reference). Zero fields: no lse, a contiguous
    cache, softmax_scale 1 / sqrt(D), the automatic num_splits."""
    _fields_ = [
        ("struct_size", ctypes.c_size_t),
        ("dtype", _ENUM),
        ("q", _VOIDP),
        ("k_cache", _VOIDP),
        ("v_cache", _VOIDP),
        ("seqlens_k", _VOIDP),
        ("block_table", _VOIDP),
        ("out", _VOIDP),
        ("lse", _VOIDP),
        ("batch", _I64),
        ("seqlen_q", _I64),
        ("num_heads_q", _I64),
        ("num_heads_kv", _I64),
        ("head_dim", _I64),
        ("max_seqlen_k", _I64),
        ("num_pages", _I64),
        ("page_size", _I64),
        ("max_blocks_per_seq", _I64),
        ("softmax_scale", ctypes.c_float),
        ("num_splits", ctypes.c_int32),
        ("kv_format", _ENUM),
        ("kv_scaling", _ENUM),
        ("k_scale", _VOIDP),
        ("v_scale", _VOIDP),
    ]


class KvCacheAppendParams(_ParamsStruct):
    """ck_kv_cache_append_params_t: the arguments of ck_kv_cache_append (passed by reference).
    Zero fields: a cache of the dtype's values (a copy)."""
    _fields_ = [
        ("struct_size", ctypes.c_size_t),
        ("dtype", _ENUM),
        ("kv_format", _ENUM),
        ("kv_scaling", _ENUM),
        ("k", _VOIDP),
        ("v", _VOIDP),
        ("slot_mapping", _VOIDP),
        ("k_cache", _VOIDP),
        ("v_cache", _VOIDP),
        ("k_scale", _VOIDP),
        ("v_scale", _VOIDP),
        ("num_tokens", _I64),
        ("num_heads_kv", _I64),
        ("head_dim", _I64),
        ("num_slots", _I64),
    ]


class QkvParams(_ParamsStruct):
    """ck_qkv_params_t: the layer description of ck_qkv_prepack and the call of
    ck_qkv_projection (passed by reference). Zero fields: symmetric INT4, no RoPE, no bias."""
    _fields_ = [
        ("struct_size", ctypes.c_size_t),
        ("tokens", _I64),
        ("hidden", _I64),
        ("num_heads_q", _I64),
        ("num_heads_kv", _I64),
        ("head_dim", _I64),
        ("dtype", _ENUM),
        ("format", _ENUM),
        ("group_size", _I64),
        ("mode", _ENUM),
        ("rope_style", _ENUM),
        ("rotary_dim", _I64),
        ("x", _VOIDP),
        ("w_prepacked", _VOIDP),
        ("scales_prepacked", _VOIDP),
        ("zeros_prepacked", _VOIDP),
        ("global_scale", _VOIDP),
        ("bias", _VOIDP),
        ("positions", _VOIDP),
        ("cos_sin", _VOIDP),
        ("max_position", _I64),
        ("q", _VOIDP),
        ("k", _VOIDP),
        ("v", _VOIDP),
    ]


# Every export of cuda_kernels.h: name -> (restype, ((argument, ctypes type), ...)). The argument
# names are the raw level's (raw.<name without ck_>), which are the header's with "_ptr" added
# to each device pointer; a third field gives the header's name where the raw level says it
# otherwise (the weight is w_ptr, the converted weight w_out_ptr, whatever their packing).
# A parameter struct is declared as a pointer to its ctypes.Structure (an instance is passed by
# reference, None is NULL). tests/test_abi.py checks this table against the header, declaration
# by declaration.
DECLARATIONS = {
    "ck_version": (ctypes.c_int, ()),
    "ck_status_string": (ctypes.c_char_p, (("status", _ENUM),)),
    "ck_last_error_message": (ctypes.c_char_p, ()),
    "ck_last_cuda_error": (ctypes.c_int, ()),
    "ck_device_count": (_STATUS, (("count", ctypes.POINTER(ctypes.c_int)),)),
    "ck_quantize_int8": (_STATUS, (
        ("x_ptr", _PTR), ("x_dtype", _ENUM), ("rows", _I64), ("cols", _I64),
        ("granularity", _ENUM), ("scale_mode", _ENUM), ("scales_ptr", _PTR), ("q_ptr", _PTR),
        _STREAM)),
    "ck_dequantize_int8": (_STATUS, (
        ("q_ptr", _PTR), ("scales_ptr", _PTR), ("rows", _I64), ("cols", _I64),
        ("granularity", _ENUM), ("out_ptr", _PTR), ("out_dtype", _ENUM), _STREAM)),
    "ck_quantize_fp8": (_STATUS, (
        ("x_ptr", _PTR), ("x_dtype", _ENUM), ("rows", _I64), ("cols", _I64), ("format", _ENUM),
        ("granularity", _ENUM), ("scale_mode", _ENUM), ("scales_ptr", _PTR), ("q_ptr", _PTR),
        _STREAM)),
    "ck_dequantize_fp8": (_STATUS, (
        ("q_ptr", _PTR), ("format", _ENUM), ("scales_ptr", _PTR), ("rows", _I64), ("cols", _I64),
        ("granularity", _ENUM), ("out_ptr", _PTR), ("out_dtype", _ENUM), _STREAM)),
    "ck_int4_groups_per_row": (_I64, (("cols", _I64), ("group_size", _I64))),
    "ck_quantize_int4": (_STATUS, (
        ("x_ptr", _PTR), ("x_dtype", _ENUM), ("rows", _I64), ("cols", _I64),
        ("group_size", _I64), ("mode", _ENUM), ("q_ptr", _PTR, "q_packed"), ("scales_ptr", _PTR),
        ("zeros_ptr", _PTR), _STREAM)),
    "ck_dequantize_int4": (_STATUS, (
        ("q_ptr", _PTR, "q_packed"), ("scales_ptr", _PTR), ("zeros_ptr", _PTR), ("rows", _I64),
        ("cols", _I64), ("group_size", _I64), ("mode", _ENUM), ("out_ptr", _PTR),
        ("out_dtype", _ENUM), _STREAM)),
    "ck_quantize_nf4": (_STATUS, (
        ("x_ptr", _PTR), ("x_dtype", _ENUM), ("rows", _I64), ("cols", _I64),
        ("blocksize", _I64), ("packed_ptr", _PTR), ("absmax_ptr", _PTR), _STREAM)),
    "ck_dequantize_nf4": (_STATUS, (
        ("packed_ptr", _PTR), ("absmax_ptr", _PTR), ("rows", _I64), ("cols", _I64),
        ("blocksize", _I64), ("out_ptr", _PTR), ("out_dtype", _ENUM), _STREAM)),
    "ck_quantize_mxfp4": (_STATUS, (
        ("x_ptr", _PTR), ("x_dtype", _ENUM), ("rows", _I64), ("cols", _I64),
        ("packed_ptr", _PTR), ("scales_ptr", _PTR), _STREAM)),
    "ck_dequantize_mxfp4": (_STATUS, (
        ("packed_ptr", _PTR), ("scales_ptr", _PTR), ("rows", _I64), ("cols", _I64),
        ("out_ptr", _PTR), ("out_dtype", _ENUM), _STREAM)),
    "ck_quantize_nvfp4": (_STATUS, (
        ("x_ptr", _PTR), ("x_dtype", _ENUM), ("rows", _I64), ("cols", _I64),
        ("scale_mode", _ENUM), ("global_scale_ptr", _PTR), ("packed_ptr", _PTR),
        ("scales_ptr", _PTR), _STREAM)),
    "ck_dequantize_nvfp4": (_STATUS, (
        ("packed_ptr", _PTR), ("scales_ptr", _PTR), ("global_scale_ptr", _PTR), ("rows", _I64),
        ("cols", _I64), ("out_ptr", _PTR), ("out_dtype", _ENUM), _STREAM)),
    "ck_gemm_int8": (_STATUS, (
        ("a_ptr", _PTR), ("b_ptr", _PTR), ("b_layout", _ENUM), ("m", _I64), ("n", _I64),
        ("k", _I64), ("c_ptr", _PTR), _STREAM)),
    "ck_int8_prepack": (_STATUS, (
        ("b_kn_ptr", _PTR), ("k", _I64), ("n", _I64), ("b_nk_ptr", _PTR), _STREAM)),
    "ck_gemm_int8_scaled": (_STATUS, (
        ("a_ptr", _PTR), ("b_ptr", _PTR), ("b_layout", _ENUM), ("m", _I64), ("n", _I64),
        ("k", _I64), ("scale_a_ptr", _PTR), ("a_granularity", _ENUM), ("scale_b_ptr", _PTR),
        ("b_granularity", _ENUM), ("bias_ptr", _PTR), ("activation", _ENUM), ("out_ptr", _PTR),
        ("out_dtype", _ENUM), _STREAM)),
    "ck_gemm_fp8_scaled": (_STATUS, (
        ("a_ptr", _PTR), ("b_ptr", _PTR), ("m", _I64), ("n", _I64), ("k", _I64),
        ("scale_a_ptr", _PTR), ("a_granularity", _ENUM), ("scale_b_ptr", _PTR),
        ("b_granularity", _ENUM), ("bias_ptr", _PTR), ("activation", _ENUM), ("out_ptr", _PTR),
        ("out_dtype", _ENUM), _STREAM)),
    "ck_gemm_w4a8": (_STATUS, (
        ("a_ptr", _PTR), ("scale_a_ptr", _PTR), ("a_granularity", _ENUM),
        ("w_ptr", _PTR, "w_packed"), ("w_scales_ptr", _PTR), ("scale_dtype", _ENUM),
        ("group_size", _I64), ("bias_ptr", _PTR), ("activation", _ENUM), ("m", _I64),
        ("n", _I64), ("k", _I64), ("out_ptr", _PTR), ("out_dtype", _ENUM), _STREAM)),
    "ck_linear": (_STATUS, (
        ("x_ptr", _PTR), ("w_ptr", _PTR), ("bias_ptr", _PTR), ("dtype", _ENUM), ("m", _I64),
        ("n", _I64), ("k", _I64), ("activation", _ENUM), ("out_ptr", _PTR), _STREAM)),
    "ck_gemm_w4a16": (_STATUS, (
        ("x_ptr", _PTR), ("dtype", _ENUM), ("w_ptr", _PTR, "w_packed"), ("scales_ptr", _PTR),
        ("zeros_ptr", _PTR), ("group_size", _I64), ("mode", _ENUM), ("bias_ptr", _PTR),
        ("activation", _ENUM), ("m", _I64), ("n", _I64), ("k", _I64), ("out_ptr", _PTR),
        _STREAM)),
    "ck_w4a16_prepacked_bytes": (_I64, (("n", _I64), ("k", _I64))),
    "ck_w4a16_prepacked_groups": (_I64, (("n", _I64), ("k", _I64), ("group_size", _I64))),
    "ck_w4a16_prepack": (_STATUS, (
        ("w_ptr", _PTR, "w_packed"), ("scales_ptr", _PTR), ("zeros_ptr", _PTR), ("dtype", _ENUM),
        ("n", _I64), ("k", _I64), ("group_size", _I64), ("mode", _ENUM),
        ("w_out_ptr", _PTR, "w_prepacked"), ("scales_out_ptr", _PTR, "scales_prepacked"),
        ("zeros_out_ptr", _PTR, "zeros_prepacked"), _STREAM)),
    "ck_gemm_w4a16_prepacked": (_STATUS, (
        ("x_ptr", _PTR), ("dtype", _ENUM), ("w_ptr", _PTR, "w_prepacked"),
        ("scales_ptr", _PTR, "scales_prepacked"), ("zeros_ptr", _PTR, "zeros_prepacked"),
        ("group_size", _I64), ("mode", _ENUM), ("bias_ptr", _PTR), ("activation", _ENUM),
        ("m", _I64), ("n", _I64), ("k", _I64), ("out_ptr", _PTR), _STREAM)),
    "ck_block4_prepacked_scales_bytes": (_I64, (
        ("format", _ENUM), ("n", _I64), ("k", _I64), ("blocksize", _I64))),
    "ck_block4_prepack": (_STATUS, (
        ("format", _ENUM), ("packed_ptr", _PTR), ("scales_ptr", _PTR), ("n", _I64), ("k", _I64),
        ("blocksize", _I64), ("w_out_ptr", _PTR, "w_prepacked"),
        ("scales_out_ptr", _PTR, "scales_prepacked"), _STREAM)),
    "ck_gemm_block4_prepacked": (_STATUS, (
        ("x_ptr", _PTR), ("dtype", _ENUM), ("format", _ENUM), ("w_ptr", _PTR, "w_prepacked"),
        ("scales_ptr", _PTR, "scales_prepacked"), ("global_scale_ptr", _PTR),
        ("blocksize", _I64), ("bias_ptr", _PTR), ("activation", _ENUM), ("m", _I64), ("n", _I64),
        ("k", _I64), ("out_ptr", _PTR), _STREAM)),
    "ck_qkv_prepack": (_STATUS, (
        ("params", ctypes.POINTER(QkvParams)), ("packed_ptr", _PTR), ("scales_ptr", _PTR),
        ("zeros_ptr", _PTR), ("w_out_ptr", _PTR, "w_prepacked"),
        ("scales_out_ptr", _PTR, "scales_prepacked"), ("zeros_out_ptr", _PTR, "zeros_prepacked"),
        _STREAM)),
    "ck_qkv_projection": (_STATUS, (("params", ctypes.POINTER(QkvParams)), _STREAM)),
    "ck_import_gptq": (_STATUS, (
        ("qweight_ptr", _PTR), ("qzeros_ptr", _PTR), ("scales_ptr", _PTR), ("g_idx_ptr", _PTR),
        ("dtype", _ENUM), ("n", _I64), ("k", _I64), ("group_size", _I64),
        ("w_ptr", _PTR, "w_packed"), ("scales_out_ptr", _PTR), ("zeros_out_ptr", _PTR),
        ("perm_ptr", _PTR), _STREAM)),
    "ck_import_awq": (_STATUS, (
        ("qweight_ptr", _PTR), ("qzeros_ptr", _PTR), ("scales_ptr", _PTR), ("dtype", _ENUM),
        ("n", _I64), ("k", _I64), ("group_size", _I64), ("w_ptr", _PTR, "w_packed"),
        ("scales_out_ptr", _PTR), ("zeros_out_ptr", _PTR), _STREAM)),
    "ck_permute_columns": (_STATUS, (
        ("x_ptr", _PTR), ("dtype", _ENUM), ("rows", _I64), ("cols", _I64), ("perm_ptr", _PTR),
        ("out_ptr", _PTR), _STREAM)),
    "ck_sparse_prune": (_STATUS, (
        ("w_ptr", _PTR), ("dtype", _ENUM), ("sparsity", _ENUM), ("n", _I64), ("k", _I64),
        ("out_ptr", _PTR), _STREAM)),
    "ck_sparse_quantize_int4": (_STATUS, (
        ("w_ptr", _PTR), ("dtype", _ENUM), ("sparsity", _ENUM), ("n", _I64), ("k", _I64),
        ("group_size", _I64), ("mode", _ENUM), ("codes_ptr", _PTR), ("meta_ptr", _PTR),
        ("scales_ptr", _PTR), ("zeros_ptr", _PTR), ("violations_ptr", _PTR), _STREAM)),
    "ck_sparse_1632_to_24": (_STATUS, (
        ("masks_ptr", _PTR), ("n", _I64), ("k", _I64), ("meta_ptr", _PTR, "meta_24"),
        ("violations_ptr", _PTR), _STREAM)),
    "ck_sparse_dequantize_int4": (_STATUS, (
        ("codes_ptr", _PTR), ("meta_ptr", _PTR), ("scales_ptr", _PTR), ("zeros_ptr", _PTR),
        ("sparsity", _ENUM), ("n", _I64), ("k", _I64), ("group_size", _I64), ("mode", _ENUM),
        ("out_ptr", _PTR), ("out_dtype", _ENUM), _STREAM)),
    "ck_gemm_sparse_w4a16": (_STATUS, (
        ("x_ptr", _PTR), ("dtype", _ENUM), ("sparsity", _ENUM), ("codes_ptr", _PTR),
        ("meta_ptr", _PTR), ("scales_ptr", _PTR), ("zeros_ptr", _PTR), ("group_size", _I64),
        ("mode", _ENUM), ("bias_ptr", _PTR), ("activation", _ENUM), ("m", _I64), ("n", _I64),
        ("k", _I64), ("out_ptr", _PTR), _STREAM)),
    "ck_sparse_w4a16_prepacked_bytes": (_I64, (("n", _I64), ("k", _I64))),
    "ck_sparse_w4a16_prepacked_groups": (_I64, (
        ("n", _I64), ("k", _I64), ("group_size", _I64))),
    "ck_sparse_w4a16_prepack": (_STATUS, (
        ("codes_ptr", _PTR), ("meta_ptr", _PTR), ("scales_ptr", _PTR), ("zeros_ptr", _PTR),
        ("dtype", _ENUM), ("n", _I64), ("k", _I64), ("group_size", _I64), ("mode", _ENUM),
        ("w_out_ptr", _PTR, "w_prepacked"), ("scales_out_ptr", _PTR, "scales_prepacked"),
        ("zeros_out_ptr", _PTR, "zeros_prepacked"), _STREAM)),
    "ck_sparse_w4a16_prepack_dense": (_STATUS, (
        ("codes_ptr", _PTR), ("meta_ptr", _PTR), ("scales_ptr", _PTR), ("zeros_ptr", _PTR),
        ("sparsity", _ENUM), ("dtype", _ENUM), ("n", _I64), ("k", _I64), ("group_size", _I64),
        ("mode", _ENUM), ("w_out_ptr", _PTR, "w_prepacked"),
        ("scales_out_ptr", _PTR, "scales_prepacked"), ("zeros_out_ptr", _PTR, "zeros_prepacked"),
        _STREAM)),
    "ck_gemm_sparse_w4a16_prepacked": (_STATUS, (
        ("x_ptr", _PTR), ("dtype", _ENUM), ("w_ptr", _PTR, "w_prepacked"),
        ("scales_ptr", _PTR, "scales_prepacked"), ("zeros_ptr", _PTR, "zeros_prepacked"),
        ("group_size", _I64), ("mode", _ENUM), ("bias_ptr", _PTR), ("activation", _ENUM),
        ("m", _I64), ("n", _I64), ("k", _I64), ("out_ptr", _PTR), _STREAM)),
    "ck_gemm_int4": (_STATUS, (
        ("a_ptr", _PTR), ("b_ptr", _PTR), ("m", _I64), ("n", _I64), ("k", _I64), ("c_ptr", _PTR),
        _STREAM)),
    "ck_gemm_int4_scaled": (_STATUS, (
        ("a_ptr", _PTR), ("b_ptr", _PTR), ("m", _I64), ("n", _I64), ("k", _I64),
        ("scale_a_ptr", _PTR), ("a_granularity", _ENUM), ("scale_b_ptr", _PTR),
        ("b_granularity", _ENUM), ("bias_ptr", _PTR), ("activation", _ENUM), ("out_ptr", _PTR),
        ("out_dtype", _ENUM), _STREAM)),
    "ck_moe_route": (_STATUS, (
        ("logits_ptr", _PTR), ("logits_dtype", _ENUM), ("tokens", _I64), ("experts", _I64),
        ("top_k", _I64), ("renormalize", _FLAG), ("topk_ids_ptr", _PTR),
        ("topk_weights_ptr", _PTR), _STREAM)),
    "ck_moe_prepacked_bytes": (_I64, (("experts", _I64), ("n", _I64), ("k", _I64))),
    "ck_moe_prepacked_groups": (_I64, (
        ("experts", _I64), ("n", _I64), ("k", _I64), ("group_size", _I64))),
    "ck_moe_prepack": (_STATUS, (
        ("w_ptr", _PTR, "w_packed"), ("scales_ptr", _PTR), ("zeros_ptr", _PTR), ("dtype", _ENUM),
        ("experts", _I64), ("n", _I64), ("k", _I64), ("group_size", _I64), ("mode", _ENUM),
        ("gate_up", _FLAG), ("w_out_ptr", _PTR, "w_prepacked"),
        ("scales_out_ptr", _PTR, "scales_prepacked"), ("zeros_out_ptr", _PTR, "zeros_prepacked"),
        _STREAM)),
    "ck_moe_workspace_size": (_STATUS, (
        ("params", ctypes.POINTER(MoeParams)), ("bytes", ctypes.POINTER(ctypes.c_size_t)))),
    "ck_moe_forward": (_STATUS, (
        ("params", ctypes.POINTER(MoeParams)), ("workspace_ptr", _PTR),
        ("workspace_bytes", ctypes.c_size_t), _STREAM)),
    "ck_attention_forward": (_STATUS, (
        ("params", ctypes.POINTER(AttentionParams)), _STREAM)),
    "ck_kv_cache_append": (_STATUS, (
        ("params", ctypes.POINTER(KvCacheAppendParams)), _STREAM)),
    "ck_attention_decode_workspace_size": (_STATUS, (
        ("params", ctypes.POINTER(AttentionDecodeParams)),
        ("bytes", ctypes.POINTER(ctypes.c_size_t)))),
    "ck_attention_decode": (_STATUS, (
        ("params", ctypes.POINTER(AttentionDecodeParams)), ("workspace_ptr", _PTR),
        ("workspace_bytes", ctypes.c_size_t), _STREAM)),
}

_lib_lock = threading.RLock()
_lib = None


def library_path():
    """Where the library is looked for: $CK_LIBRARY_PATH (a file, or a directory holding
    libcuda_kernels.so), else next to this module."""
    env = os.environ.get("CK_LIBRARY_PATH")
    if env:
        return os.path.join(env, LIBRARY_NAME) if os.path.isdir(env) else env
    return os.path.join(_HERE, LIBRARY_NAME)


def _raise_for_status(status, func, args):
    """ctypes errcheck for entry points returning ck_status_t."""
    if status == Status.SUCCESS:
        return status
    lib = _lib
    message = (lib.ck_last_error_message() or b"").decode("utf-8", "replace")
    cuda_error = 0
    if status in (Status.CUDA_ERROR, Status.NO_DEVICE):
        cuda_error = lib.ck_last_cuda_error()
    raise CKError(status, message, cuda_error, func.__name__)


def load_library():
    """Loads (once) and returns the ctypes.CDLL of libcuda_kernels.so, declared per
    DECLARATIONS. Raises LibraryNotFoundError with what to do when it is missing."""
    global _lib
    if _lib is not None:
        return _lib
    with _lib_lock:
        if _lib is not None:
            return _lib
        path = library_path()
        where = "CK_LIBRARY_PATH=%s" % os.environ["CK_LIBRARY_PATH"] \
            if os.environ.get("CK_LIBRARY_PATH") else "next to %s" % __file__
        if not os.path.isfile(path):
            raise LibraryNotFoundError(
                "%s not found (%s): run `make` in %s, or set CK_LIBRARY_PATH to the library "
                "file or its directory" % (path, where, _HERE))
        try:
            lib = ctypes.CDLL(path)
        except OSError as e:
            raise LibraryNotFoundError("cannot load %s: %s (run `make` to rebuild it)"
                                       % (path, e)) from e
        for name, (restype, params) in DECLARATIONS.items():
            try:
                fn = getattr(lib, name)
            except AttributeError as e:
                raise LibraryNotFoundError("%s does not export %s: it is older than "
                                           "cuda_kernels.h (run `make`)" % (path, name)) from e
            fn.argtypes = [param[1] for param in params]
            if restype is _STATUS:
                fn.restype = ctypes.c_int
                fn.errcheck = _raise_for_status
            else:
                fn.restype = restype
        _lib = lib
        return _lib


class _Entries:
    """The exports returning ck_status_t as ctypes functions that return the status as an int
    (no errcheck): what the raw level (_entries) and the fast paths (_fast_entries) call,
    checking the status themselves (`if status: _raise_for_status(status, function, args)`),
    which saves the Python call of an errcheck on every launch. Each is made on its first use
    (lib[name], a function object of its own: load_library()'s keep their errcheck) and is
    then a plain attribute.

    words=True declares every integer argument (pointer, int64_t, size_t, enum, int flag) as
    c_void_p: ctypes converts an int to c_void_p in less than half the time it takes for
    c_int64 or c_int (0.13 against 0.34 us per argument, benchmarks/bench_python_steps.py), a
    microsecond per launch. The ABI is the same where every integer argument is passed in a
    64-bit register or an 8-byte stack slot of which a 32-bit parameter reads the low half: the
    64-bit little-endian Linux ABIs (x86-64, AArch64), _WORD_ARGUMENTS. What ctypes no longer
    checks there (an int argument's range, a NumPy integer, bytes taken for a pointer) is why
    only the fast paths call these, with integers they made themselves: sizes of validated
    shapes, enum values from the wrapper's tables, pointers read from arrays."""

    def __init__(self, words=False):
        self._words = words and _WORD_ARGUMENTS

    def __getattr__(self, name):
        if not name.startswith("ck_"):
            raise AttributeError(name)
        lib = load_library()
        function = lib[name]
        declared = getattr(lib, name).argtypes
        function.argtypes = [_VOIDP if self._words and t in _WORD_TYPES else t
                             for t in declared]
        function.restype = ctypes.c_int
        setattr(self, name, function)
        return function


# The C integer types that _Entries(words=True) passes as c_void_p, and whether this platform's
# calling convention allows it (see _Entries).
_WORD_TYPES = (ctypes.c_int, ctypes.c_int64, ctypes.c_size_t, ctypes.c_void_p)
_WORD_ARGUMENTS = ctypes.sizeof(ctypes.c_void_p) == 8 and sys.byteorder == "little" and \
    sys.platform.startswith("linux") and os.uname().machine in ("x86_64", "aarch64")
_entries = _Entries()
_fast_entries = _Entries(words=True)


def version():
    """Version of the loaded library as "major.minor.patch" (ck_version())."""
    v = load_library().ck_version()
    return "%d.%d.%d" % (v // 10000, v // 100 % 100, v % 100)


def device_count():
    """Number of CUDA devices the library sees; 0 where it says CK_STATUS_NO_DEVICE."""
    count = ctypes.c_int(0)
    try:
        load_library().ck_device_count(ctypes.byref(count))
    except CKError as e:
        if e.status == Status.NO_DEVICE:
            return 0
        raise
    return count.value


def status_string(status):
    """ck_status_string(status): the status's name, e.g. "CK_STATUS_MISALIGNED"."""
    return load_library().ck_status_string(int(status)).decode()


def last_error_message():
    """ck_last_error_message() of the calling thread ("" after a successful call)."""
    return (load_library().ck_last_error_message() or b"").decode("utf-8", "replace")


# ------------------------------------------------------------------------------------------------
# Raw level: one function per entry point; ints for device pointers and streams
# ------------------------------------------------------------------------------------------------
class _Raw:
    """The entry points as they are: device pointers and streams are ints (0 = NULL / the
    legacy default stream), enums are ints, sizes are ints. Failures raise CKError.

    One function per export of DECLARATIONS, named without its ck_ prefix and taking the
    table's arguments (stream=0 by default): those returning ck_status_t return None, the others
    their result. The functions written out here are the exports that are not pass-throughs."""

    @staticmethod
    def device_count():
        """ck_device_count (raises CKError with Status.NO_DEVICE where there is none)."""
        count = ctypes.c_int(0)
        load_library().ck_device_count(ctypes.byref(count))
        return count.value

    @staticmethod
    def moe_workspace_size(params):
        """ck_moe_workspace_size(params, &bytes): the workspace bytes ck_moe_forward needs for
        params (a MoeParams), returned (raises CKError where params are invalid)."""
        nbytes = ctypes.c_size_t(0)
        load_library().ck_moe_workspace_size(params, ctypes.byref(nbytes))
        return nbytes.value

    @staticmethod
    def attention_decode_workspace_size(params):
        """ck_attention_decode_workspace_size(params, &bytes): the workspace bytes
        ck_attention_decode needs for params (an AttentionDecodeParams), returned (raises
        CKError where params are invalid)."""
        nbytes = ctypes.c_size_t(0)
        load_library().ck_attention_decode_workspace_size(params, ctypes.byref(nbytes))
        return nbytes.value

    status_string = staticmethod(status_string)
    last_error_message = staticmethod(last_error_message)


def _pass_through(name, restype, params):
    """The raw-level function of the export `name` (a DECLARATIONS entry): the table's
    arguments, by position or by name, stream=0 by default."""
    signature = inspect.Signature([
        inspect.Parameter(param[0], inspect.Parameter.POSITIONAL_OR_KEYWORD,
                          default=0 if param[0] == "stream" else inspect.Parameter.empty)
        for param in params])
    count = len(params)
    returns_status = restype is _STATUS

    def call(*args, **kwargs):
        if kwargs or len(args) != count:
            try:
                bound = signature.bind(*args, **kwargs)
            except TypeError as e:
                raise TypeError("raw.%s%s: %s" % (call.__name__, signature, e)) from None
            bound.apply_defaults()
            args = bound.args
        if not returns_status:
            return getattr(load_library(), name)(*args)
        # The status as an int, checked here (one Python call less than an errcheck). The
        # function is looked up on each call (an attribute read), so that a test's spy that
        # replaces it sees the call.
        function = getattr(_entries, name)
        status = function(*args)
        if status:
            _raise_for_status(status, function, args)
        return None

    renamed = ["%s is its %s" % (param[0], param[2]) for param in params if len(param) > 2]
    call.__name__ = name[len("ck_"):]
    call.__qualname__ = "_Raw." + call.__name__
    call.__module__ = __name__
    call.__signature__ = signature
    call.__doc__ = "%s%s: the entry point of cuda_kernels.h%s; %s." % (
        name, signature, " (%s)" % ", ".join(renamed) if renamed else "",
        "a failure raises CKError" if returns_status else "returns its result")
    return call


for _name, (_restype, _params) in DECLARATIONS.items():
    if _name[len("ck_"):] not in vars(_Raw):   # the ones written out above stay
        setattr(_Raw, _name[len("ck_"):], staticmethod(_pass_through(_name, _restype, _params)))
del _name, _restype, _params

raw = _Raw()


# ------------------------------------------------------------------------------------------------
# libcudart, the few calls this module needs
# ------------------------------------------------------------------------------------------------
_MEMCPY_HTOD, _MEMCPY_DTOH, _MEMCPY_DTOD = 1, 2, 3          # cudaMemcpyKind
_CAPTURE_MODES = {"global": 0, "thread_local": 1, "relaxed": 2}  # cudaStreamCaptureMode
_STREAM_NON_BLOCKING = 0x01                                 # cudaStreamNonBlocking
_EVENT_DISABLE_TIMING = 0x02                                # cudaEventDisableTiming
_ERROR_MEMORY_ALLOCATION = 2                                # cudaErrorMemoryAllocation
_ERROR_NOT_READY = 600                                      # cudaErrorNotReady
_ATTR_CC_MAJOR, _ATTR_CC_MINOR = 75, 76     # cudaDevAttrComputeCapabilityMajor / Minor

_PVOIDP = ctypes.POINTER(ctypes.c_void_p)
_CUDART_DECLARATIONS = {
    "cudaGetErrorString": (ctypes.c_char_p, (ctypes.c_int,)),
    "cudaGetLastError": (ctypes.c_int, ()),
    "cudaRuntimeGetVersion": (ctypes.c_int, (ctypes.POINTER(ctypes.c_int),)),
    "cudaMalloc": (ctypes.c_int, (_PVOIDP, ctypes.c_size_t)),
    "cudaFree": (ctypes.c_int, (_VOIDP,)),
    "cudaMemcpy": (ctypes.c_int, (_VOIDP, _VOIDP, ctypes.c_size_t, ctypes.c_int)),
    "cudaMemcpyAsync": (ctypes.c_int, (_VOIDP, _VOIDP, ctypes.c_size_t, ctypes.c_int, _VOIDP)),
    "cudaMemset": (ctypes.c_int, (_VOIDP, ctypes.c_int, ctypes.c_size_t)),
    "cudaStreamCreateWithFlags": (ctypes.c_int, (_PVOIDP, ctypes.c_uint)),
    "cudaStreamDestroy": (ctypes.c_int, (_VOIDP,)),
    "cudaStreamSynchronize": (ctypes.c_int, (_VOIDP,)),
    "cudaDeviceSynchronize": (ctypes.c_int, ()),
    "cudaGetDevice": (ctypes.c_int, (ctypes.POINTER(ctypes.c_int),)),
    "cudaDeviceGetAttribute": (ctypes.c_int, (ctypes.POINTER(ctypes.c_int), ctypes.c_int,
                                              ctypes.c_int)),
    "cudaStreamBeginCapture": (ctypes.c_int, (_VOIDP, ctypes.c_int)),
    "cudaStreamEndCapture": (ctypes.c_int, (_VOIDP, _PVOIDP)),
    # CUDA 12+: (cudaGraphExec_t*, cudaGraph_t, unsigned long long flags)
    "cudaGraphInstantiate": (ctypes.c_int, (_PVOIDP, _VOIDP, ctypes.c_ulonglong)),
    "cudaGraphLaunch": (ctypes.c_int, (_VOIDP, _VOIDP)),
    "cudaGraphExecDestroy": (ctypes.c_int, (_VOIDP,)),
    "cudaGraphDestroy": (ctypes.c_int, (_VOIDP,)),
    "cudaEventCreateWithFlags": (ctypes.c_int, (_PVOIDP, ctypes.c_uint)),
    "cudaEventDestroy": (ctypes.c_int, (_VOIDP,)),
    "cudaEventRecord": (ctypes.c_int, (_VOIDP, _VOIDP)),
    "cudaEventQuery": (ctypes.c_int, (_VOIDP,)),
}

# Frees that arrive while a stream capture forbids cudaFree wait here until it ends (the pool
# keeps its own list of the blocks released during a capture).
_capture_local = threading.local()
_capture_global = [0]
_deferred_frees = []
_shutting_down = [False]


@atexit.register
def _at_exit():
    # The process is ending: the driver takes back device memory; calling into cudart while
    # it unloads is what could go wrong.
    _shutting_down[0] = True


def _capture_in_progress():
    return getattr(_capture_local, "depth", 0) > 0 or _capture_global[0] > 0


class _CudaRuntime:
    """libcudart through ctypes: what tests, benchmarks and the NumPy level need. Pointers and
    streams are ints. Failures raise CUDAError."""

    def __init__(self):
        self._rt = None
        self._lock = threading.Lock()

    # -- loading -----------------------------------------------------------------------------
    @staticmethod
    def _candidates():
        # After libcuda_kernels.so is loaded, its libcudart (by soname) is already in the process:
        # dlopen of the soname returns that very copy.
        names = ["libcudart.so.13", "libcudart.so.12"]
        found = ctypes.util.find_library("cudart")
        if found:
            names.append(found)
        for home in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"):
            if home:
                names += [os.path.join(home, "lib64", "libcudart.so"),
                          os.path.join(home, "lib", "libcudart.so")]
        return names

    def _load(self):
        if self._rt is not None:
            return self._rt
        with self._lock:
            if self._rt is not None:
                return self._rt
            try:
                load_library()
            except LibraryNotFoundError:
                pass  # the runtime is still useful without the library
            errors = []
            for name in self._candidates():
                try:
                    rt = ctypes.CDLL(name)
                    break
                except OSError as e:
                    errors.append(str(e))
            else:
                raise LibraryNotFoundError("libcudart not found (tried %s); set CUDA_HOME"
                                           % "; ".join(errors))
            for fname, (restype, argtypes) in _CUDART_DECLARATIONS.items():
                fn = getattr(rt, fname)
                fn.restype, fn.argtypes = restype, argtypes
            self._rt = rt
            return rt

    def _call(self, fname, *args):
        err = getattr(self._load(), fname)(*args)
        if err != 0:
            self._raise(err, fname)

    def _raise(self, err, fname):
        """Raises CUDAError for err, first clearing the runtime's record of it
        (cudaGetLastError), which would otherwise surface again at the next check of another
        library in the process (torch, CuPy)."""
        self._load().cudaGetLastError()
        raise CUDAError(err, fname, self.error_string(err))

    def get_last_error(self):
        """cudaGetLastError(): the calling thread's pending CUDA error code (0: none), cleared."""
        return self._load().cudaGetLastError()

    def current_device(self):
        """cudaGetDevice(): the calling thread's current device."""
        device = ctypes.c_int(0)
        self._call("cudaGetDevice", ctypes.byref(device))
        return device.value

    def error_string(self, code):
        """cudaGetErrorString(code)."""
        try:
            return self._load().cudaGetErrorString(code).decode()
        except Exception:  # noqa: BLE001 - used while reporting another error
            return "(cudaGetErrorString unavailable)"

    def runtime_version(self):
        """cudaRuntimeGetVersion(), e.g. 13000."""
        v = ctypes.c_int(0)
        self._call("cudaRuntimeGetVersion", ctypes.byref(v))
        return v.value

    # -- memory ------------------------------------------------------------------------------
    def malloc(self, nbytes):
        """cudaMalloc: a device pointer (int); 0 for nbytes == 0."""
        p = ctypes.c_void_p()
        self._call("cudaMalloc", ctypes.byref(p), nbytes)
        return p.value or 0

    def free(self, ptr):
        """cudaFree."""
        self._call("cudaFree", ptr)

    @staticmethod
    def _host_buffer(a, name, writeable=False):
        if not isinstance(a, np.ndarray):
            raise TypeError("%s must be a numpy.ndarray, not %s" % (name, type(a).__name__))
        if not a.flags.c_contiguous:
            raise ValueError("%s must be C-contiguous" % name)
        if writeable and not a.flags.writeable:
            raise ValueError("%s must be writeable" % name)
        return a.ctypes.data, a.nbytes

    def memcpy_htod(self, dst, a, stream=None):
        """Copies the C-contiguous ndarray a to device pointer dst. Without a stream the copy
        has completed on return; with one it is enqueued there (a may be reused at once)."""
        src, nbytes = self._host_buffer(a, "a")
        if nbytes == 0:
            return
        if stream is None:
            self._call("cudaMemcpy", dst, src, nbytes, _MEMCPY_HTOD)
            # cudaMemcpy from pageable memory may return before the DMA lands.
            self._call("cudaStreamSynchronize", None)
        else:
            self._call("cudaMemcpyAsync", dst, src, nbytes, _MEMCPY_HTOD, stream)

    def memcpy_dtoh(self, out, src, stream=None):
        """Copies out.nbytes from device pointer src into the C-contiguous ndarray out (after
        the work already on `stream`, or on the legacy default stream); complete on return."""
        dst, nbytes = self._host_buffer(out, "out", writeable=True)
        if nbytes == 0:
            return
        if stream is None:
            self._call("cudaMemcpy", dst, src, nbytes, _MEMCPY_DTOH)
        else:
            self._call("cudaMemcpyAsync", dst, src, nbytes, _MEMCPY_DTOH, stream)
            self._call("cudaStreamSynchronize", stream)

    def memcpy_dtod(self, dst, src, nbytes, stream=None):
        """Device-to-device copy of nbytes (on `stream` if given)."""
        if stream is None:
            self._call("cudaMemcpy", dst, src, nbytes, _MEMCPY_DTOD)
        else:
            self._call("cudaMemcpyAsync", dst, src, nbytes, _MEMCPY_DTOD, stream)

    def memset(self, ptr, byte, nbytes):
        """cudaMemset(ptr, byte, nbytes)."""
        self._call("cudaMemset", ptr, byte, nbytes)

    # -- streams and synchronization -------------------------------------------------------
    def stream_create(self, non_blocking=False):
        """A new stream (int). non_blocking: does not synchronize with the legacy stream."""
        s = ctypes.c_void_p()
        self._call("cudaStreamCreateWithFlags", ctypes.byref(s),
                   _STREAM_NON_BLOCKING if non_blocking else 0)
        return s.value

    def stream_destroy(self, stream):
        self._call("cudaStreamDestroy", stream)

    def stream_synchronize(self, stream=0):
        self._call("cudaStreamSynchronize", stream)

    def device_synchronize(self):
        self._call("cudaDeviceSynchronize")

    # -- events (what the DeviceArray pool orders reuse with) -------------------------------
    def event_create(self):
        """A new event without timing (cudaEventDisableTiming), on the current device."""
        e = ctypes.c_void_p()
        self._call("cudaEventCreateWithFlags", ctypes.byref(e), _EVENT_DISABLE_TIMING)
        return e.value

    def event_destroy(self, event):
        self._call("cudaEventDestroy", event)

    def event_record(self, event, stream=0):
        """cudaEventRecord(event, stream): the event completes once the work enqueued on
        `stream` so far has."""
        self._call("cudaEventRecord", event, stream)

    def event_done(self, event):
        """True once the event's work has completed (cudaEventQuery; never waits)."""
        err = self._load().cudaEventQuery(event)
        if err == 0:
            return True
        if err != _ERROR_NOT_READY:
            self._raise(err, "cudaEventQuery")
        return False

    # -- the DeviceArray pool ----------------------------------------------------------------
    def memory_stats(self):
        """The counters of the pool that DeviceArray memory comes from (see _BlockPool): mallocs
        and frees (cudaMalloc / cudaFree calls), reuses (allocations served from the pool),
        releases, deferred (releases that waited for a stream capture to end), in_use and
        cached (blocks, and their bytes: in_use_bytes, cached_bytes)."""
        return _pool.stats()

    def empty_cache(self):
        """cudaFree's the pool's cached blocks, giving their memory back to CUDA (cudaFree waits
        for the device: not for a hot path, nor during a stream capture). Returns the number of
        blocks freed."""
        return _pool.trim()

    def set_pool_limit(self, nbytes):
        """The most bytes of released blocks the pool keeps cached (default 2 GiB, or
        $CK_POOL_CACHE_BYTES); past it, the next cudaMalloc first gives back the least recently
        released ones. Returns the previous limit."""
        previous, _pool.limit = _pool.limit, int(nbytes)
        return previous

    # -- device properties -------------------------------------------------------------------
    def compute_capability(self, device=None):
        """(major, minor) of `device` (default: the current device), e.g. (9, 0) on an H100."""
        if device is None:
            current = ctypes.c_int(0)
            self._call("cudaGetDevice", ctypes.byref(current))
            device = current.value
        major, minor = ctypes.c_int(0), ctypes.c_int(0)
        self._call("cudaDeviceGetAttribute", ctypes.byref(major), _ATTR_CC_MAJOR, device)
        self._call("cudaDeviceGetAttribute", ctypes.byref(minor), _ATTR_CC_MINOR, device)
        return major.value, minor.value

    # -- graphs ------------------------------------------------------------------------------
    @contextlib.contextmanager
    def graph_capture(self, stream, mode="thread_local"):
        """Captures the work enqueued on `stream` (not the legacy stream 0) inside the block
        into a CUDA graph. Yields a CUDAGraph that is ready after the block: g.launch(stream),
        g.close(). mode: "thread_local" (default), "global" or "relaxed"."""
        if mode not in _CAPTURE_MODES:
            raise ValueError("mode must be one of %s" % ", ".join(_CAPTURE_MODES))
        graph = CUDAGraph()
        self._call("cudaStreamBeginCapture", stream, _CAPTURE_MODES[mode])
        _capture_local.depth = getattr(_capture_local, "depth", 0) + 1
        if mode == "global":
            _capture_global[0] += 1
        completed = False
        try:
            yield graph
            completed = True
        finally:
            handle = ctypes.c_void_p()
            err = self._load().cudaStreamEndCapture(stream, ctypes.byref(handle))
            _capture_local.depth -= 1
            if mode == "global":
                _capture_global[0] -= 1
            if not _capture_in_progress():
                _flush_deferred_frees()
            if not completed:  # an exception is on its way out: drop the partial graph
                if handle.value:
                    self._load().cudaGraphDestroy(handle)
            else:
                if err != 0:
                    self._raise(err, "cudaStreamEndCapture")
                graph._graph = handle.value
                exec_handle = ctypes.c_void_p()
                self._call("cudaGraphInstantiate", ctypes.byref(exec_handle), handle.value, 0)
                graph._exec = exec_handle.value


cuda = _CudaRuntime()


class CUDAGraph:
    """An instantiated CUDA graph made by cuda.graph_capture()."""

    def __init__(self):
        self._graph = None
        self._exec = None

    def launch(self, stream=0):
        if not self._exec:
            raise RuntimeError("the graph is not instantiated: launch it after the "
                               "`with cuda.graph_capture(...)` block, and before close()")
        cuda._call("cudaGraphLaunch", self._exec, stream)

    def close(self):
        """Destroys the executable graph and the graph (idempotent)."""
        exec_handle, graph_handle = self._exec, self._graph
        self._exec = self._graph = None
        if exec_handle:
            cuda._call("cudaGraphExecDestroy", exec_handle)
        if graph_handle:
            cuda._call("cudaGraphDestroy", graph_handle)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        if _shutting_down[0]:
            return
        try:
            self.close()
        except Exception:  # noqa: BLE001 - never raise from a finalizer
            pass


def _flush_deferred_frees():
    while _deferred_frees:
        ptr = _deferred_frees.pop()
        try:
            cuda.free(ptr)
        except CUDAError:
            pass
    _pool.flush()


_torch_capture_query = [None]   # torch's C query of its current stream's capture, once bound


def _foreign_capture():
    """True while torch captures a CUDA graph on its current stream of this thread (its
    torch.cuda.graph runs in the global capture mode, where a cudaMalloc or an event record on
    the legacy stream, from any thread, would invalidate the capture). Cheap: the torch query is
    bound once torch's CUDA is initialized (one C call afterwards; a dict lookup before torch is
    imported)."""
    query = _torch_capture_query[0]
    if query is None:
        torch = sys.modules.get("torch")
        if torch is None:
            return False
        try:
            if not torch.cuda.is_initialized():
                return False
            query = getattr(torch._C, "_cuda_isCurrentStreamCapturing", None) or \
                torch.cuda.is_current_stream_capturing
        except Exception:  # noqa: BLE001 - a torch without CUDA, or one still importing
            return False
        _torch_capture_query[0] = query
    try:
        return bool(query())
    except Exception:  # noqa: BLE001
        return False


def _any_capture():
    return _capture_in_progress() or _foreign_capture()


# ------------------------------------------------------------------------------------------------
# The DeviceArray pool
# ------------------------------------------------------------------------------------------------
# Size classes: powers of two from 512 bytes to 1 MiB, then multiples of 2 MiB (at most 2 MiB
# or 2x of slack per block). 512 keeps cudaMalloc's 256-byte alignment for every block.
_POOL_MIN_BLOCK = 512
_POOL_POWER_OF_TWO_UP_TO = 1 << 20
_POOL_LARGE_ROUND = 2 << 20
# The most bytes of released blocks the pool keeps: past it, a cudaMalloc first gives the least
# recently released blocks back to CUDA (CK_POOL_CACHE_BYTES overrides; cuda.set_pool_limit).
_POOL_CACHE_BYTES = int(os.environ.get("CK_POOL_CACHE_BYTES") or (2 << 30))
# At most this many cached blocks of a size class are asked (cudaEventQuery) per allocation.
_POOL_MAX_QUERIES = 4


def _size_class(nbytes):
    """The block size that serves an allocation of nbytes (> 0) bytes."""
    if nbytes <= _POOL_MIN_BLOCK:
        return _POOL_MIN_BLOCK
    if nbytes <= _POOL_POWER_OF_TWO_UP_TO:
        return 1 << (nbytes - 1).bit_length()
    return -(-nbytes // _POOL_LARGE_ROUND) * _POOL_LARGE_ROUND


def _stream_key(stream):
    """One int per stream: None (not known) and cudaStreamLegacy (1) are the legacy stream, 0."""
    stream = int(stream or 0)
    return 0 if stream == 1 else stream


class _Block:
    """A cudaMalloc'd block of the pool, with its own event.

    `stream`: None while no work is known to use the block (idle); else the stream where
    `event` was recorded at its last use (by a call, when the call was enqueued: the stream was
    alive then). `extra`: None, or {stream: event} of the other streams whose calls used it
    since. `untracked`: its address went where the pool cannot follow (a layer's weights read by
    the framework fast path, a torch view): on release it is cudaFree'd (which waits for the
    whole device), not cached."""

    __slots__ = ("ptr", "size", "device", "event", "stream", "extra", "untracked")

    def __init__(self, ptr, size, device, event):
        self.ptr, self.size, self.device, self.event = ptr, size, device, event
        self.stream, self.extra, self.untracked = None, None, False


class _BlockPool:
    """The device memory of DeviceArray.empty: blocks that free() returns are kept, binned by
    device and size class, and handed out again, so that once the pool is warm a call costs no
    cudaMalloc or cudaFree (both of which synchronize the device).

    Reuse never overtakes the work of a call that used a block. When a call is enqueued, the
    event of every pool block it uses (inputs, outputs, temporaries, workspace) is recorded on
    the call's stream (record(): the stream is alive then); release (free, garbage collection)
    is pure bookkeeping and makes no CUDA call, so it is safe after the stream is destroyed. An
    allocation on the stream of a block's last use takes it at once (stream order puts the new
    work after the old), one on another stream (or on streams not known) only once the event has
    completed (cudaEventQuery, a few blocks per allocation: the pool never waits). A block that
    calls on other streams also used has an event on each of them, and is reused only once all
    have completed (or, on one of its streams, once the others have). A block never used by a
    call since it was allocated (or one whose work is known done: the NumPy path ends with a
    download that waits for its stream) is idle: any stream takes it. Work that the pool does
    not see (raw calls on .ptr) must be finished before free(), or reported with
    DeviceArray.record_stream.
    While a stream capture is in progress, releases wait in a list until it ends, allocations
    take idle blocks only (what a captured graph replays must not depend on work outside it),
    and nothing is recorded. Released blocks are kept up to a cap in bytes (limit): past it, a
    cudaMalloc first cudaFree's the least recently released blocks; a cudaMalloc that runs out
    of memory frees every cached block (trim) and tries once more.

    runtime: what it calls (current_device, malloc, free, event_create, event_destroy,
    event_record, event_done: the _CudaRuntime methods); capturing: () -> True while a capture
    is in progress.
    """

    def __init__(self, runtime, capturing, limit=None):
        self._rt = runtime
        self._capturing = capturing
        self.limit = _POOL_CACHE_BYTES if limit is None else int(limit)
        self._lock = threading.Lock()
        self._cached = {}      # (device, size) -> [_Block], the most recently released last
        self._lru = {}         # ptr -> _Block of every cached block, least recently released first
        self._cached_bytes = 0
        self._deferred = []    # blocks released during a capture
        self._spare = {}       # device -> [events] for the streams of `extra`
        self._counts = dict(mallocs=0, frees=0, reuses=0, releases=0, deferred=0, records=0,
                            queries=0, evictions=0)
        self._in_use = [0, 0]  # blocks, bytes

    # -- allocation ---------------------------------------------------------------------------
    def allocate(self, nbytes, stream=None):
        """A _Block of at least nbytes (> 0) on the current device, for work on `stream`
        (None: on streams not known, so only a block whose work is done will do)."""
        size = _size_class(nbytes)
        stream = None if stream is None else _stream_key(stream)
        capturing = self._capturing()
        if self._deferred and not capturing:
            self.flush()
        device = self._rt.current_device()
        with self._lock:
            blocks = self._cached.get((device, size))
            block = self._take(blocks, stream, capturing) if blocks else None
            if block is not None:
                self._counts["reuses"] += 1
                self._in_use[0] += 1
                self._in_use[1] += size
                return block
        if not capturing and self._cached_bytes + size > self.limit:
            self.trim(max(self.limit - size, 0))
        block = self._malloc(size, device)
        with self._lock:
            self._in_use[0] += 1
            self._in_use[1] += size
        return block

    def _take(self, blocks, stream, capturing):
        for i in range(len(blocks) - 1, -1, -1):   # the most recently released first
            block = blocks[i]
            if block.stream is None or (block.stream == stream and block.extra is None and
                                        not capturing):
                return self._handed_out(blocks.pop(i), stream)
        if capturing:   # an event query is one of the calls a global-mode capture forbids
            return None
        asked = 0
        for i, block in enumerate(blocks):   # the oldest first: the likeliest to be done
            if asked >= _POOL_MAX_QUERIES:
                break
            asked += 1
            if self._done(block, skip=stream):
                return self._handed_out(blocks.pop(i), stream)
        return None

    def _done(self, block, skip=None):
        """True when every event of the block has completed, but the one on `skip` (stream
        order covers it)."""
        self._counts["queries"] += 1
        if block.stream != skip and not self._rt.event_done(block.event):
            return False
        if block.extra:
            for other, event in block.extra.items():
                if other != skip and not self._rt.event_done(event):
                    return False
        return True

    def _handed_out(self, block, stream):
        del self._lru[block.ptr]
        self._cached_bytes -= block.size
        if block.extra:
            self._spare.setdefault(block.device, []).extend(block.extra.values())
            block.extra = None
        if block.stream != stream:
            # Taken because its work is done (or idle): nothing of it is pending any more. On
            # its own stream it keeps the event, still ordered before the new work.
            block.stream = None
        return block

    def _malloc(self, size, device):
        try:
            ptr = self._rt.malloc(size)
        except CUDAError as e:
            if e.code != _ERROR_MEMORY_ALLOCATION or self._capturing():
                raise
            self.trim()
            ptr = self._rt.malloc(size)
        try:
            event = self._rt.event_create()
        except CUDAError:
            self._rt.free(ptr)
            raise
        with self._lock:
            self._counts["mallocs"] += 1
        return _Block(ptr, size, device, event)

    # -- use and release ----------------------------------------------------------------------
    def record(self, block, stream):
        """Notes that work just enqueued on `stream` (alive now) uses the block: its event
        there is recorded. Not during a capture (the caller checks)."""
        stream = _stream_key(stream)
        try:
            if block.stream is None or block.stream == stream:
                self._rt.event_record(block.event, stream)
                block.stream = stream
            else:
                extra = block.extra
                if extra is None:
                    extra = block.extra = {}
                event = extra.get(stream)
                if event is None:
                    with self._lock:
                        spare = self._spare.get(block.device)
                        event = spare.pop() if spare else None
                    if event is None:
                        event = self._rt.event_create()
                    extra[stream] = event
                self._rt.event_record(event, stream)
            self._counts["records"] += 1
        except CUDAError:
            block.untracked = True   # (a stream of another device): freed, not reused

    def release(self, block, idle=False):
        """Returns a block: bookkeeping only (no CUDA call; an untracked block is cudaFree'd).
        idle: the work that used it is known to be done."""
        if self._capturing():
            with self._lock:
                self._deferred.append((block, idle))
                self._counts["deferred"] += 1
            return
        self._release(block, idle)

    def _release(self, block, idle):
        if block.untracked:
            self._free_blocks([block])
            with self._lock:
                self._counts["releases"] += 1
                self._in_use[0] -= 1
                self._in_use[1] -= block.size
            return
        with self._lock:
            if idle:
                if block.extra:
                    self._spare.setdefault(block.device, []).extend(block.extra.values())
                block.stream, block.extra = None, None
            self._cached.setdefault((block.device, block.size), []).append(block)
            self._lru[block.ptr] = block
            self._cached_bytes += block.size
            self._counts["releases"] += 1
            self._in_use[0] -= 1
            self._in_use[1] -= block.size

    def flush(self):
        """Releases the blocks that waited for a capture to end."""
        with self._lock:
            deferred, self._deferred = self._deferred, []
        for block, idle in deferred:
            self._release(block, idle)

    def _free_blocks(self, blocks):
        for block in blocks:
            for event in [block.event] + list((block.extra or {}).values()):
                self._rt.event_destroy(event)
            self._rt.free(block.ptr)
        with self._lock:
            self._counts["frees"] += len(blocks)

    def trim(self, keep=0):
        """cudaFree's the least recently released cached blocks until at most `keep` bytes stay
        cached (all of them by default; cudaFree waits for the device's work, so no block is
        freed under work that still uses it). Returns the number of blocks freed."""
        with self._lock:
            blocks = []
            for ptr, block in list(self._lru.items()):
                if self._cached_bytes <= keep:
                    break
                del self._lru[ptr]
                self._cached[(block.device, block.size)].remove(block)
                self._cached_bytes -= block.size
                blocks.append(block)
            spare = []
            if not self._lru:
                spare = [e for events in self._spare.values() for e in events]
                self._cached, self._spare = {}, {}
            if keep:
                self._counts["evictions"] += len(blocks)
        for event in spare:
            self._rt.event_destroy(event)
        self._free_blocks(blocks)
        return len(blocks)

    def stats(self):
        with self._lock:
            return dict(self._counts, in_use=self._in_use[0], in_use_bytes=self._in_use[1],
                        cached=len(self._lru), cached_bytes=self._cached_bytes,
                        limit=self.limit)


_pool = _BlockPool(cuda, _any_capture)


# ------------------------------------------------------------------------------------------------
# DeviceArray
# ------------------------------------------------------------------------------------------------
def _as_dtype_enum(value, name="dtype"):
    """A DType from a DType/int, a name ("fp32", "fp16", "bf16") or a NumPy dtype."""
    if value is None:
        return None
    if isinstance(value, DType):
        return value
    if isinstance(value, str):
        found = _DTYPE_NAMES.get(value)
        if found is None:
            found = _DTYPE_NAMES.get(value.lower())
        if found is not None:
            return found
    if isinstance(value, numbers.Integral) and not isinstance(value, bool):
        return DType(value)
    try:
        dt = np.dtype(value)
    except TypeError:
        dt = None
    if dt is not None and dt in _DTYPE_OF:
        return _DTYPE_OF[dt]
    raise ValueError("%s=%r: use 'fp32', 'fp16', 'bf16' or a DType" % (name, value))


class DeviceArray:
    """A C-contiguous device buffer with a shape and a NumPy dtype.

    ck_dtype is the library dtype of the data: taken from the NumPy dtype, or the override given
    (DType.BF16 for np.uint16 bit patterns). An owning array frees its memory on free() or when
    collected. __cuda_array_interface__ (version 3) lets torch/cupy/numba use it in place.
    """

    def __init__(self, ptr, shape, dtype, ck_dtype=None, owner=False, stream=None, base=None):
        self.ptr = int(ptr or 0)
        self.shape = tuple(int(s) for s in shape)
        self.dtype = np.dtype(dtype)
        self._ck_dtype = None
        if ck_dtype is not None:
            ck = _as_dtype_enum(ck_dtype, "ck_dtype")
            if _NUMPY_OF[ck].itemsize != self.dtype.itemsize:
                raise ValueError("ck_dtype %s does not fit dtype %s" % (ck.name, self.dtype))
            self._ck_dtype = ck
        self.stream = stream     # the stream the data was last written on, if known
        self._owner = owner
        self._base = base        # keeps what this array depends on alive
        self._block = None       # the pool block of an array made by empty()

    @classmethod
    def empty(cls, shape, dtype, ck_dtype=None, stream=None):
        """An uninitialized array from the pool (cudaMalloc only when it has no free block of
        the size). stream: the stream the array is written on, which may take memory whose
        earlier work was enqueued there (None: not known; only memory whose work is done).
        Calls of this module that use the array record that use (see free)."""
        if isinstance(shape, numbers.Integral):
            shape = (shape,)
        shape = tuple(int(s) for s in shape)
        if any(s < 0 for s in shape):
            raise ValueError("negative dimension in shape %s" % (shape,))
        nbytes = math.prod(shape) * np.dtype(dtype).itemsize
        arr = cls(0, shape, dtype, ck_dtype, stream=stream)   # validates dtype/ck_dtype first
        if nbytes:
            arr._block = _pool.allocate(nbytes, stream)
            arr.ptr = arr._block.ptr
        arr._owner = True
        return arr

    @classmethod
    def from_numpy(cls, a, ck_dtype=None):
        """A device copy of a (complete on return)."""
        a = np.ascontiguousarray(a)
        arr = cls.empty(a.shape, a.dtype, ck_dtype)
        cuda.memcpy_htod(arr.ptr, a)
        return arr

    @property
    def ck_dtype(self):
        """The library dtype (a DType) or None when it is unknown (uint16 without override)."""
        return self._ck_dtype if self._ck_dtype is not None else _DTYPE_OF.get(self.dtype)

    @property
    def ndim(self):
        return len(self.shape)

    @property
    def size(self):
        return math.prod(self.shape)

    @property
    def itemsize(self):
        return self.dtype.itemsize

    @property
    def nbytes(self):
        return self.size * self.dtype.itemsize

    def __len__(self):
        return self.shape[0] if self.shape else 0

    def to_numpy(self):
        """A host copy (waits for the stream that wrote the data, if one is recorded)."""
        out = np.empty(self.shape, self.dtype)
        if self.nbytes:
            if not self.ptr:
                raise ValueError("the array has been freed")
            cuda.memcpy_dtoh(out, self.ptr, stream=self._sync_stream())
        return out

    def _sync_stream(self):
        # A copy on the legacy stream orders after blocking streams, not after non-blocking
        # ones: then it has to go on the writer's stream.
        return None if self.stream in (None, 0, 1) else self.stream

    def fill_byte(self, byte):
        """Sets every byte to `byte` (cudaMemset, on the legacy stream), e.g. to poison an
        output."""
        cuda.memset(self.ptr, byte, self.nbytes)
        _record_use(self, 0)
        return self

    def record_stream(self, stream=None):
        """Tells the pool that work enqueued on `stream` (default: the array's stream; it must
        be alive now) uses the memory, so that free() does not hand it to another stream before
        that work is done: what a raw call on .ptr needs when the array may be freed before the
        stream is synchronized. Returns self."""
        _record_use(self, self.stream if stream is None else _stream_handle(stream))
        return self

    def reshape(self, *shape):
        """A view with another shape of the same size (no copy)."""
        if len(shape) == 1 and not isinstance(shape[0], numbers.Integral):
            shape = tuple(shape[0])
        if math.prod(shape) != self.size:
            raise ValueError("cannot reshape %s into %s" % (self.shape, shape))
        return DeviceArray(self.ptr, shape, self.dtype, self._ck_dtype, owner=False,
                           stream=self.stream, base=self)

    def free(self):
        """Releases the memory of an owning array (idempotent; no CUDA call, so it is safe after
        the array's stream was destroyed). Memory from empty() goes back to the pool, reused
        after the work of the calls of this module that used it (each records an event on its
        stream when it is enqueued): at once on the stream of the last use, elsewhere once that
        work is done. Work the pool does not see (raw calls on .ptr, other libraries) must be
        finished first (synchronize its stream), or reported with record_stream(stream) before
        the array is dropped. Other owned memory is cudaFree'd (deferred while a stream capture
        forbids it)."""
        self._free(idle=False)

    def _free(self, idle):
        # idle: the caller knows that the work using the memory is done.
        ptr, owner, block = self.ptr, self._owner, self._block
        self.ptr, self._owner, self._base, self._block = 0, False, None, None
        if not (owner and ptr) or _shutting_down[0]:
            return
        if block is not None:
            _pool.release(block, idle)
        elif _capture_in_progress():
            _deferred_frees.append(ptr)
        else:
            cuda.free(ptr)

    def __del__(self):
        try:
            self.free()
        except Exception:  # noqa: BLE001 - never raise from a finalizer (or at exit)
            pass

    @property
    def __cuda_array_interface__(self):
        cai = {
            "shape": self.shape,
            "typestr": self.dtype.str,
            "data": (self.ptr, False),
            "strides": None,
            "version": 3,
        }
        if self.stream is not None:
            cai["stream"] = 1 if self.stream == 0 else self.stream   # 0 is not allowed: 1 is legacy
        return cai

    def __repr__(self):
        ck = self.ck_dtype.name if self.ck_dtype is not None else "?"
        return "DeviceArray(shape=%s, dtype=%s, ck_dtype=%s, ptr=0x%x%s)" % (
            self.shape, self.dtype, ck, self.ptr, "" if self._owner else ", view")


def _owner_block(array):
    """The pool block under a DeviceArray (or a view of one), or None."""
    owner = array
    while owner._block is None:
        owner = owner._base
        if not isinstance(owner, DeviceArray):
            return None
    return owner._block


def _record_use(array, stream):
    """Records that work just enqueued on `stream` uses the DeviceArray's pool memory."""
    block = _owner_block(array)
    if block is not None and not _any_capture():
        _pool.record(block, stream)


def _untrack(array):
    """The DeviceArray's memory goes where the pool cannot follow its use: on release it is
    cudaFree'd (which waits for the device) rather than cached."""
    if isinstance(array, DeviceArray):
        block = _owner_block(array)
        if block is not None:
            block.untracked = True


# ------------------------------------------------------------------------------------------------
# Array kinds: torch and CuPy arrays are read directly and get results made by their framework
# ------------------------------------------------------------------------------------------------
class _FrameworkKind:
    """What the torch and CuPy kinds share: a call on their arrays runs on the array's device
    and on the framework's current stream of that device, or on a stream= the caller gives."""

    def prepare(self, call, stream):
        """Makes the call's device current and, for a stream= other than the framework's
        current one, that stream the framework's current stream for the call (so that its
        allocations are ordered on it); returns the call's stream."""
        if self.current_device() != call.index:
            call.enter(self.device_context(call.index))
        current = self.stream(call.index)
        if stream is None or int(stream) == current:
            return current
        stream = int(stream)
        self.enter_stream(call, stream)
        return stream


class _TorchKind(_FrameworkKind):
    """torch tensors. A CUDA tensor is read through data_ptr(), shape and dtype (no
    __cuda_array_interface__ dict, which torch builds slowly and refuses for bfloat16); the
    results of a call on one are torch.empty tensors on its device (torch's caching allocator),
    and the call runs on torch's current stream of that device. A CPU tensor is host data."""

    name = "torch"

    def __init__(self, torch):
        self.torch = torch
        # The NumPy storage of each torch dtype (bfloat16 as its bits, as everywhere here).
        pairs = [("float32", np.float32), ("float16", np.float16), ("bfloat16", np.uint16),
                 ("int8", np.int8), ("uint8", np.uint8), ("int16", np.int16),
                 ("uint16", np.uint16), ("int32", np.int32), ("int64", np.int64),
                 ("float64", np.float64), ("bool", np.bool_)]
        self.numpy_of = {getattr(torch, name): np.dtype(np_type) for name, np_type in pairs
                         if hasattr(torch, name)}
        self.torch_of = {np.dtype(np_type): getattr(torch, name) for name, np_type in pairs
                         if name not in ("bfloat16", "uint16") and hasattr(torch, name)}
        self.bfloat16 = torch.bfloat16
        # The torch dtype of each library dtype (what fast_empty allocates).
        self.torch_of_ck = {ck: self.dtype(np_dtype, ck) for ck, np_dtype in _NUMPY_OF.items()}
        # The current device, and the raw cudaStream_t of a device's current stream without a
        # torch.cuda.Stream object (what torch's own compiled code calls): torch's C functions
        # themselves where this torch has them, no Python call around them. Both are asked on
        # every call (a stream or device changed between calls is followed; the two C calls
        # are as cheap as a cache lookup would be).
        self.current_device = getattr(torch._C, "_cuda_getDevice", None) or \
            torch.cuda.current_device
        self.stream = getattr(torch._C, "_cuda_getCurrentRawStream", None) or self._stream
        self._empty = torch.empty
        self._empty_like = torch.empty_like
        self._devices = {}   # index -> torch.device("cuda", index) (immutable): made once
        self._one_float = {}   # index -> a float32 tensor of one value there (fast_scales)
        self.float_of = {torch.float32: DType.FP32, torch.float16: DType.FP16,
                         torch.bfloat16: DType.BF16}
        _is_compiling[0] = getattr(getattr(torch, "compiler", None), "is_compiling", None)
        # The custom operators are registered now, outside any torch.compile trace (which
        # cannot register them); torch_ops() raises what fails here when asked.
        try:
            torch_ops()
        except Exception:  # noqa: BLE001 - optional: eager calls do not need them
            pass

    @staticmethod
    def on_device(t):
        return t.is_cuda

    @staticmethod
    def device_index(t):
        return t.get_device()

    def view(self, t, name):
        """(ptr, shape, NumPy dtype) of a CUDA tensor."""
        np_dtype = self.numpy_of.get(t.dtype)
        if np_dtype is None:
            raise TypeError("%s has dtype %s, which the library does not take" % (name, t.dtype))
        if not t.is_contiguous():
            raise ValueError("%s must be C-contiguous (shape %s, strides %s): use .contiguous()"
                             % (name, tuple(t.shape), tuple(t.stride())))
        return t.data_ptr(), tuple(t.shape), np_dtype

    def _stream(self, index):
        """The raw cudaStream_t of torch's current stream on device `index` (self.stream where
        torch has no _cuda_getCurrentRawStream)."""
        return self.torch.cuda.current_stream(index).cuda_stream

    def dtype(self, np_dtype, ck_dtype):
        return self.bfloat16 if ck_dtype == DType.BF16 else self.torch_of[np.dtype(np_dtype)]

    def fast_view(self, t, index, np_dtype=None):
        """(ptr, shape, NumPy dtype) of t when it is a C-contiguous CUDA tensor on device
        `index` held as np_dtype (when given; bfloat16 as uint16), else None: the general path
        then takes the call and says what is wrong. The kind comes from the type cache alone
        (a tensor type not seen yet takes the general path once, which enters it there)."""
        if _KIND_OF_TYPE.get(type(t)) is not self or not t.is_cuda or \
                t.get_device() != index or not t.is_contiguous():
            return None
        stored = self.numpy_of.get(t.dtype)
        if stored is None or (np_dtype is not None and stored != np_dtype):
            return None
        return t.data_ptr(), t.shape, stored   # the shape a torch.Size, which is a tuple

    def fast_float_input(self, t):
        """(device index, address, library dtype, shape) of a CUDA tensor t (_fast_kind's
        primary array) when it is C-contiguous, fp32, fp16 or bf16, on the current device, else
        None: fast_view and the float dtype rule in one step."""
        index = self.current_device()
        x_dtype = self.float_of.get(t.dtype)
        if x_dtype is None or t.get_device() != index or not t.is_contiguous():
            return None
        return index, t.data_ptr(), x_dtype, t.shape

    def _device(self, index):
        device = self._devices.get(index)
        if device is None:
            device = self._devices.setdefault(index, self.torch.device("cuda", index))
        return device

    def fast_empty(self, shape, ck_dtype, index):
        """(tensor, its address): uninitialized, of library dtype ck_dtype, on device `index`
        (the current device), from torch's caching allocator for the current stream:
        torch.empty with a cached torch.device and the sizes as separate arguments (a size
        tuple costs more; benchmarks/bench_python_steps.py times the alternatives)."""
        t = self._empty(*shape, dtype=self.torch_of_ck[ck_dtype], device=self._device(index))
        return t, t.data_ptr()

    def fast_scales(self, n, index):
        """(tensor, its address): n uninitialized float32 values on device `index` (the current
        device). One value (a per-tensor scale, or one row's) is torch.empty_like of a kept
        one-value tensor, which parses no size, dtype or device: about 0.4 us less than
        torch.empty (benchmarks/bench_python_steps.py)."""
        if n != 1:
            return self.fast_empty((n,), DType.FP32, index)
        one = self._one_float.get(index)
        if one is None:
            one = self._one_float.setdefault(index, self.fast_empty((1,), DType.FP32, index)[0])
        t = self._empty_like(one)
        return t, t.data_ptr()

    def fast_empty_like(self, t, ck_dtype):
        """(tensor, its address): uninitialized, t's shape in library dtype ck_dtype, on t's
        device (a contiguous t, as fast_view accepts): torch.empty_like, which skips the size
        and device arguments that fast_empty parses (0.3 us less per result on the H100 host)."""
        e = self._empty_like(t, dtype=self.torch_of_ck[ck_dtype])
        return e, e.data_ptr()

    def empty(self, shape, np_dtype, ck_dtype, like):
        """(tensor, its address): uninitialized, on the device of `like` (Tensor.new_empty:
        a microsecond less than torch.empty(device=like.device), which builds a device)."""
        t = like.new_empty(shape, dtype=self.dtype(np_dtype, ck_dtype))
        return t, t.data_ptr()

    def fill(self, value, np_dtype, like):
        """(tensor, its address) of one value, written by a fill kernel on the current stream
        (no host copy, so a CUDA graph can capture it)."""
        t = self.torch.full((1,), value, dtype=self.torch_of[np.dtype(np_dtype)],
                            device=like.device)
        return t, t.data_ptr()

    def device_context(self, index):
        return self.torch.cuda.device(index)

    def enter_stream(self, call, stream):
        torch = self.torch
        if stream in (0, 1):   # the legacy default stream (0, or cudaStreamLegacy)
            target = torch.cuda.default_stream(call.index)
        else:
            target = torch.cuda.ExternalStream(stream, device=torch.device("cuda", call.index))
        call.enter(torch.cuda.stream(target))
        # The caller's tensors were allocated for their own stream: record this one on them,
        # so that torch does not hand their memory out again before this call's work is done.
        call.record = target

    def host_array(self, t, name):
        """A NumPy view of a CPU tensor (bfloat16 as uint16 bits)."""
        if t.device.type != "cpu":
            raise TypeError("%s is a torch tensor on %s: CUDA or CPU tensors only"
                            % (name, t.device))
        t = t.detach()
        if t.dtype == self.bfloat16:
            return t.view(self.torch.int16).numpy().view(np.uint16)
        return t.numpy()

    def host_empty(self, shape, np_dtype, ck_dtype):
        """(CPU tensor, its NumPy view)."""
        t = self.torch.empty(shape, dtype=self.dtype(np_dtype, ck_dtype))
        return t, self.host_array(t, "out")

    def from_host(self, a, ck_dtype):
        """A CPU tensor holding the NumPy array a (bf16 bits as bfloat16)."""
        if ck_dtype == DType.BF16:
            return self.torch.from_numpy(a.view(np.int16)).view(self.bfloat16)
        return self.torch.from_numpy(a)


class _CupyKind(_FrameworkKind):
    """CuPy arrays: read through .data.ptr, shape and dtype; the results of a call on one are
    cupy.empty arrays (CuPy's memory pool) on its device, and the call runs on CuPy's current
    stream. bfloat16 data is uint16 with dtype="bf16" (CuPy has no bfloat16)."""

    name = "cupy"

    def __init__(self, cupy):
        self.cupy = cupy
        # CuPy's own functions, bound once (asked on every call, as in _TorchKind).
        self.current_device = cupy.cuda.runtime.getDevice
        self._current_stream = cupy.cuda.get_current_stream
        self._empty = cupy.empty
        self._ndarray = cupy.ndarray
        # An ndarray keeps its C-contiguity as the readonly _c_contiguous (every CuPy since
        # v7), which a.flags copies into a new object on each read (0.2 us); flags where not.
        self._is_c_contiguous = operator.attrgetter(
            "_c_contiguous" if hasattr(cupy.ndarray, "_c_contiguous") else "flags.c_contiguous")
        self.float_of = {np.dtype(np.float32): DType.FP32, np.dtype(np.float16): DType.FP16}

    @staticmethod
    def on_device(a):
        return True

    @staticmethod
    def device_index(a):
        return a.data.device_id

    @staticmethod
    def view(a, name):
        if not a.flags.c_contiguous:
            raise ValueError("%s must be C-contiguous (shape %s, strides %s): use "
                             "cupy.ascontiguousarray" % (name, a.shape, a.strides))
        return a.data.ptr, a.shape, a.dtype

    def fast_view(self, a, index, np_dtype=None):
        """(ptr, shape, NumPy dtype) of a when it is a C-contiguous CuPy array on device `index`
        of dtype np_dtype (when given), else None (as _TorchKind.fast_view)."""
        if _KIND_OF_TYPE.get(type(a)) is not self:
            return None
        data, dtype = a.data, a.dtype
        if data.device_id != index or (np_dtype is not None and dtype != np_dtype) or \
                not self._is_c_contiguous(a):
            return None
        return data.ptr, a.shape, dtype

    def fast_float_input(self, a):
        """(device index, address, library dtype, shape) of a when it is C-contiguous,
        float32 or float16, on the current device, else None (as _TorchKind.fast_float_input;
        bf16 data, uint16 here, says so with dtype=)."""
        index = self.current_device()
        data = a.data
        x_dtype = self.float_of.get(a.dtype)
        if x_dtype is None or data.device_id != index or not self._is_c_contiguous(a):
            return None
        return index, data.ptr, x_dtype, a.shape

    def stream(self, index):
        """The raw cudaStream_t of CuPy's current stream (of the current device, `index`)."""
        return self._current_stream().ptr

    def empty(self, shape, np_dtype, ck_dtype, like):
        a = self._empty(shape, np_dtype)
        return a, a.data.ptr

    def fast_empty(self, shape, ck_dtype, index):
        """(array, its address) of library dtype ck_dtype (bf16 as uint16) on the current
        device (`index`), from CuPy's pool: the ndarray constructor, which cupy.empty calls
        (without memptr it allocates), less cupy.empty's Python frame."""
        a = self._ndarray(shape, _NUMPY_OF[ck_dtype])
        return a, a.data.ptr

    def fast_empty_like(self, a, ck_dtype):
        """(array, its address): uninitialized, a's shape in library dtype ck_dtype, on the
        current device (where fast_view found a): as fast_empty, one frame less."""
        b = self._ndarray(a.shape, _NUMPY_OF[ck_dtype])
        return b, b.data.ptr

    def fast_scales(self, n, index):
        """(array, its address): n uninitialized float32 values on the current device."""
        a = self._ndarray((n,), _FP32)
        return a, a.data.ptr

    def fill(self, value, np_dtype, like):
        a = self.cupy.full((1,), value, np_dtype)
        return a, a.data.ptr

    def device_context(self, index):
        return self.cupy.cuda.Device(index)

    def enter_stream(self, call, stream):
        cupy = self.cupy
        call.enter(cupy.cuda.Stream.null if stream == 0 else cupy.cuda.ExternalStream(stream))


_KIND_OF_TYPE = {}   # type -> its kind (_TorchKind, _CupyKind) or None: decided once per type
_KINDS = {}          # "torch" / "cupy" -> its kind, made when the first of its arrays is seen
_FRAMEWORKS = (("torch", "Tensor", _TorchKind), ("cupy", "ndarray", _CupyKind))


def _kind(obj):
    """The kind of obj: a _TorchKind or _CupyKind, or None for everything else (NumPy, other
    __cuda_array_interface__ objects, DeviceArray). A framework is looked for only where it is
    already imported (sys.modules): none is ever imported here."""
    cls = type(obj)
    try:
        return _KIND_OF_TYPE[cls]
    except KeyError:
        pass
    kind = None
    for module_name, base_name, make in _FRAMEWORKS:
        module = sys.modules.get(module_name)
        base = getattr(module, base_name, None) if module is not None else None
        if isinstance(base, type) and issubclass(cls, base):
            kind = _KINDS.get(module_name)
            if kind is None:
                kind = _KINDS.setdefault(module_name, make(module))
            break
    _KIND_OF_TYPE[cls] = kind
    return kind


_is_compiling = [None]   # torch.compiler.is_compiling, bound when the torch kind is made


def _torch_compiling():
    """True while torch.compile traces the caller (which must then call the custom ops)."""
    is_compiling = _is_compiling[0]
    if is_compiling is None:
        torch = sys.modules.get("torch")
        if torch is None:
            return False
        is_compiling = getattr(getattr(torch, "compiler", None), "is_compiling", None)
        if is_compiling is None:
            return False
    return is_compiling()


# ------------------------------------------------------------------------------------------------
# NumPy / __cuda_array_interface__ level
# ------------------------------------------------------------------------------------------------
class _Arg:
    """One array argument resolved for a launch."""

    def __init__(self, ptr, shape, dtype, ck_dtype, result, stream=None):
        self.ptr, self.shape, self.dtype, self.ck_dtype = ptr, shape, dtype, ck_dtype
        self.result = result   # what to hand back when it is also returned
        self.stream = stream   # a CAI's stream, if it said one

    @property
    def size(self):
        return math.prod(self.shape)


def _is_device(obj):
    kind = _kind(obj)
    if kind is not None:
        return kind.on_device(obj)
    if type(obj) is np.ndarray:
        return False
    if type(obj) is DeviceArray:   # (its interface is a dict built on every read)
        return True
    try:
        return hasattr(obj, "__cuda_array_interface__")
    except Exception:  # noqa: BLE001 - it has one but will not give it: _cai says why
        return True


def _c_contiguous(shape, strides, itemsize):
    expected = itemsize
    for dim, stride in zip(reversed(shape), reversed(strides)):
        if dim != 1 and stride != expected:
            return False
        expected *= dim
    return True


def _cai(obj, name):
    """(ptr, shape, dtype, readonly, stream) of a CUDA array: a DeviceArray, a torch or CuPy
    array (read directly), or any object with __cuda_array_interface__."""
    if type(obj) is DeviceArray:
        if obj.dtype.byteorder == ">":
            raise ValueError("%s must be little-endian" % name)
        stream = obj.stream
        return obj.ptr, obj.shape, obj.dtype, False, (1 if stream == 0 else stream)
    kind = _kind(obj)
    if kind is not None and kind.on_device(obj):
        ptr, shape, dtype = kind.view(obj, name)
        return ptr, shape, dtype, False, None
    try:
        cai = obj.__cuda_array_interface__
    except TypeError as e:
        raise TypeError("%s: %s" % (name, e)) from e
    shape = tuple(int(s) for s in cai["shape"])
    dtype = np.dtype(cai["typestr"])
    ptr, readonly = cai["data"]
    if cai.get("mask") is not None:
        raise ValueError("%s: masked arrays are not supported" % name)
    strides = cai.get("strides")
    if strides is not None and not _c_contiguous(shape, strides, dtype.itemsize):
        raise ValueError("%s must be C-contiguous (shape %s, strides %s)"
                         % (name, shape, tuple(strides)))
    if dtype.byteorder == ">":
        raise ValueError("%s must be little-endian" % name)
    return int(ptr or 0), shape, dtype, bool(readonly), cai.get("stream")


def _is_torch_bfloat16(obj):
    kind = _kind(obj)
    return kind is not None and kind.name == "torch" and obj.dtype == kind.bfloat16


def _ck_dtype(obj, dtype, override, name):
    """The library dtype of an argument: the explicit override, a DeviceArray's ck_dtype, a
    torch bfloat16 tensor's, or the NumPy dtype (uint16 only with an explicit bf16)."""
    if override == DType.BF16:
        if dtype.itemsize != 2 or dtype.kind not in "uiV":
            raise TypeError("%s has dtype %s: bf16 data is held as uint16 bit patterns"
                            % (name, dtype))
        return override
    if override is not None:
        if dtype != _NUMPY_OF[override]:
            raise TypeError("%s has dtype %s, not %s" % (
                name, "bfloat16" if _is_torch_bfloat16(obj) else dtype, override.name.lower()))
        return override
    if isinstance(obj, DeviceArray) and obj.ck_dtype is not None:
        return obj.ck_dtype
    if dtype.itemsize == 2 and dtype.kind in "uV":
        # ml_dtypes.bfloat16 (dtype.name is slow: asked only here), or a torch bfloat16 tensor
        if (dtype.kind == "V" and dtype.name == "bfloat16") or _is_torch_bfloat16(obj):
            return DType.BF16
    return _DTYPE_OF.get(dtype)


def _matrix(shape, name):
    """(rows, cols) of a 1-D ([1, n]) or 2-D shape with at least one element."""
    if len(shape) == 1:
        rows, cols = 1, shape[0]
    elif len(shape) == 2:
        rows, cols = shape
    else:
        raise ValueError("%s must be 1-D or 2-D, not of shape %s" % (name, shape))
    if rows == 0 or cols == 0:
        raise ValueError("%s is empty (shape %s): rows and cols must be >= 1" % (name, shape))
    return rows, cols


_FLOAT_INPUT = "fp32, fp16 or bf16"


def _check_input(shape, dtype, ck, name, matrix, need):
    """The host-side checks of an input, made before anything is allocated or copied."""
    if matrix:
        _matrix(shape, name)
    if need is _FLOAT_INPUT:
        if ck is None:
            raise TypeError("%s has dtype %s: use float32, float16 or bfloat16 (uint16 bit "
                            "patterns with dtype='bf16')" % (name, dtype))
    elif need is not None and dtype != np.dtype(need):
        raise TypeError("%s has dtype %s, needs %s" % (name, dtype, np.dtype(need)))


def _split_out(out, count, names):
    """out= is either the main output or a tuple with one entry (or None) per output."""
    if isinstance(out, (tuple, list)):
        if len(out) != count:
            raise ValueError("out must hold %d arrays (%s)" % (count, ", ".join(names)))
        return list(out)
    return [out] + [None] * (count - 1)


def _stream_handle(stream):
    """The cudaStream_t (an int) of a stream= argument: an int, a torch.cuda.Stream
    (.cuda_stream) or a CuPy stream (.ptr)."""
    for attribute in ("cuda_stream", "ptr"):
        handle = getattr(stream, attribute, None)
        if isinstance(handle, int):
            return handle
    try:
        return int(stream)
    except (TypeError, ValueError):
        raise TypeError("stream=%r: an int (a cudaStream_t), a torch.cuda.Stream or a CuPy "
                        "stream" % (stream,)) from None


class _Call:
    """Resolves the arrays of one convenience call to device pointers, allocates the outputs,
    and after the launch returns results in the caller's kind, the kind of the first array:

    * a torch CUDA tensor: torch tensors (torch.empty on its device), the call on torch's
      current stream there; a CuPy array: CuPy arrays (cupy.empty), on CuPy's current stream.
      Their temporaries come from the same allocator and are dropped after the launch: both
      allocators reuse memory in the order of the stream it was allocated for.
    * another __cuda_array_interface__ object: DeviceArrays (the pool), on the stream its
      interface names (else the legacy stream).
    * NumPy (or a torch CPU tensor): copies up, results copied back (NumPy, or CPU tensors).

    stream= overrides the stream (an int, or a torch or CuPy stream object); torch and CuPy
    then allocate for it (it is made their current stream for the call), and torch tensors of
    the caller are recorded on it (Tensor.record_stream). out= arrays are used as they are."""

    def __init__(self, primary, stream):
        self.like = primary       # what device results are made like
        self.kind = None          # the framework of device results (None: DeviceArray)
        self.host_kind = None     # the framework of host results (None: NumPy)
        self.record = None        # torch: the stream= to record the caller's tensors on
        self._contexts = []       # framework contexts entered for the call (device, stream)
        self._temps = []          # pool buffers made here that no result owns
        self._blocks = {}         # id -> pool block the call uses: its event is recorded after
        self._keep = []           # framework buffers made here, alive until the launch
        self._downloads = []      # (device buffer, host array)
        if stream is not None and not isinstance(stream, int):
            stream = _stream_handle(stream)
        kind = _kind(primary)
        if kind is None:
            self.device = _is_device(primary)
            if stream is None and self.device:
                stream = _cai(primary, "the first array")[4]
        elif kind.on_device(primary):
            self.device = True
            self.kind = kind
            self.index = kind.device_index(primary)
            try:
                stream = kind.prepare(self, stream)
            except BaseException:
                self._leave()
                raise
        else:
            self.device = False
            self.host_kind = kind
        self.stream = int(stream or 0)

    def enter(self, context):
        """Enters a framework context (a device or a stream) for the rest of the call."""
        context.__enter__()
        self._contexts.append(context)

    def _leave(self):
        while self._contexts:
            self._contexts.pop().__exit__(None, None, None)

    def __enter__(self):
        return self

    def __exit__(self, exc_type, *rest):
        if exc_type is not None:
            self._record()   # an upload may have been enqueued before the failure
            self._release(idle=False)
        self._keep = []
        if self._contexts:
            self._leave()
        return False

    def input(self, obj, name, dtype=None, scalar_dtype=None, matrix=False, need=None):
        """An input array; host data is uploaded on the call's stream. matrix: must be a
        non-empty 1-D or 2-D array; need: its NumPy dtype, or _FLOAT_INPUT."""
        override = _as_dtype_enum(dtype, name + " dtype") if dtype is not None else None
        kind = _kind(obj)
        if kind is not None and kind.on_device(obj):
            ptr, shape, np_dtype = kind.view(obj, name)
            ck = _ck_dtype(obj, np_dtype, override, name)
            _check_input(shape, np_dtype, ck, name, matrix, need)
            if kind is self.kind:
                self._same_device(obj, name)
            return _Arg(ptr, shape, np_dtype, ck, obj)
        if kind is None and _is_device(obj):
            ptr, shape, np_dtype, _, stream = _cai(obj, name)
            ck = _ck_dtype(obj, np_dtype, override, name)
            _check_input(shape, np_dtype, ck, name, matrix, need)
            if isinstance(obj, DeviceArray):
                self._use(obj)
            return _Arg(ptr, shape, np_dtype, ck, obj, stream)
        scalar = False
        if kind is not None:
            a = kind.host_array(obj, name)
        elif scalar_dtype is not None and isinstance(obj, numbers.Real) \
                and not isinstance(obj, (bool, np.ndarray)):
            a = np.array([obj], dtype=scalar_dtype)   # a Python float becomes one float32
            scalar = True
        elif isinstance(obj, np.ndarray):
            a = obj
        else:
            a = np.asarray(obj)
        if not a.flags.c_contiguous:
            raise ValueError("%s must be C-contiguous (use np.ascontiguousarray)" % name)
        if a.dtype.byteorder == ">":
            raise ValueError("%s must be in native byte order" % name)
        ck = _ck_dtype(obj, a.dtype, override, name)
        _check_input(a.shape, a.dtype, ck, name, matrix, need)
        if a.dtype.kind == "V" and a.dtype.name == "bfloat16":
            a = a.view(np.uint16)
        if self.kind is not None:   # in the framework's memory: returned as it is (scales)
            if scalar:
                buffer, ptr = self.kind.fill(obj, a.dtype, self.like)
            else:
                buffer, ptr = self.kind.empty(a.shape, a.dtype, ck, self.like)
                cuda.memcpy_htod(ptr, a, stream=self.stream)
            return _Arg(ptr, a.shape, a.dtype, ck, buffer)
        dev = DeviceArray.empty(a.shape, a.dtype, ck if ck == DType.BF16 else None,
                                stream=self.stream)
        self._temps.append(dev)
        self._use(dev)
        cuda.memcpy_htod(dev.ptr, a, stream=self.stream)
        if self.device:   # returned (static scales): hand back the uploaded copy
            return _Arg(dev.ptr, a.shape, a.dtype, ck, dev)
        return _Arg(dev.ptr, a.shape, a.dtype, ck, obj if kind is not None else a)

    def _use(self, array):
        """A pool DeviceArray (or a view of one) used by the call: its block's event is
        recorded on the call's stream after the launch (once per block)."""
        block = array._block
        if block is None:
            block = _owner_block(array)
            if block is None:
                return
        self._blocks[id(block)] = block

    def _record(self):
        """After the launch (the stream is alive): records each used block's event there."""
        blocks = self._blocks
        if blocks:
            self._blocks = {}
            if not _any_capture():
                record, stream = _pool.record, self.stream
                for block in blocks.values():
                    record(block, stream)

    def _same_device(self, obj, name):
        """A framework array of the call's kind must be on the call's device; torch tensors
        of the caller are recorded on a stream= that is not their current stream."""
        if self.kind.device_index(obj) != self.index:
            raise ValueError("%s is on device %d, the call's first array on device %d"
                             % (name, self.kind.device_index(obj), self.index))
        if self.record is not None:
            obj.record_stream(self.record)

    def optional_input(self, obj, name, size, dtype=None, need=None):
        """The device address of an optional input of `size` values (a bias, zero points): 0 for
        None. dtype: its ck dtype; need: its NumPy dtype (else the one it comes with)."""
        if obj is None:
            return 0
        a = self.input(obj, name, dtype, need=need)
        _check_array(a, name, a.dtype if need is None else need, size)
        return a.ptr

    def workspace(self, given, nbytes):
        """(device address, bytes) of scratch memory for the launch: `given` (a CUDA array of at
        least nbytes bytes), or a new buffer for the call (from the call's allocator, reused
        only after the call's work)."""
        if given is not None:
            ptr, shape, dtype, readonly, _ = _cai(given, "workspace")
            have = math.prod(shape) * dtype.itemsize
            if have < nbytes:
                raise ValueError("workspace has %d bytes; the call needs %d" % (have, nbytes))
            if readonly:
                raise ValueError("workspace is read-only")
            if self.kind is not None and _kind(given) is self.kind:
                self._same_device(given, "workspace")
            elif isinstance(given, DeviceArray):
                self._use(given)
            return ptr, have
        # Both the pool's blocks and torch's and CuPy's allocations are 256-byte aligned.
        if self.kind is not None:
            buffer, ptr = self.kind.empty((max(nbytes, 1),), np.uint8, None, self.like)
            self._keep.append(buffer)
            return ptr, nbytes
        dev = DeviceArray.empty((max(nbytes, 1),), np.uint8, stream=self.stream)
        self._temps.append(dev)
        self._use(dev)
        return dev.ptr, nbytes

    def output(self, shape, np_dtype, ck_dtype, out, name):
        """An output: out= if given (checked), else a new array of the call's kind."""
        np_dtype = np.dtype(np_dtype)
        if out is None:
            if self.kind is not None:
                result, ptr = self.kind.empty(shape, np_dtype, ck_dtype, self.like)
                return _Arg(ptr, shape, np_dtype, ck_dtype, result)
            want_ck = ck_dtype if ck_dtype == DType.BF16 else None
            if self.device:
                dev = DeviceArray.empty(shape, np_dtype, want_ck, stream=self.stream)
                self._use(dev)
                return _Arg(dev.ptr, shape, np_dtype, ck_dtype, dev)
            if self.host_kind is not None:
                result, host = self.host_kind.host_empty(shape, np_dtype, ck_dtype)
            else:
                result = host = np.empty(shape, np_dtype)
        elif _is_device(out):
            ptr, oshape, odtype, readonly, _ = _cai(out, "out " + name)
            self._check_out(name, oshape, odtype, shape, np_dtype)
            if readonly:
                raise ValueError("out %s is read-only" % name)
            if self.kind is not None and _kind(out) is self.kind:
                self._same_device(out, "out " + name)
            elif isinstance(out, DeviceArray):
                self._use(out)
            return _Arg(ptr, shape, np_dtype, ck_dtype, out)
        else:
            result = out
            out_kind = _kind(out)
            if out_kind is not None:
                host = out_kind.host_array(out, "out " + name)
            elif isinstance(out, np.ndarray):
                host = out
            else:
                raise TypeError("out %s must be a numpy.ndarray or a CUDA array, not %s"
                                % (name, type(out).__name__))
            self._check_out(name, host.shape, host.dtype, shape, np_dtype)
            if not host.flags.c_contiguous or not host.flags.writeable:
                raise ValueError("out %s must be C-contiguous and writeable" % name)
        dev = DeviceArray.empty(shape, np_dtype, ck_dtype if ck_dtype == DType.BF16 else None,
                                stream=self.stream)
        self._temps.append(dev)
        self._downloads.append((dev, host))
        return _Arg(dev.ptr, shape, np_dtype, ck_dtype, result)

    @staticmethod
    def _check_out(name, shape, dtype, want_shape, want_dtype):
        if dtype != want_dtype:
            raise TypeError("out %s has dtype %s, needs %s" % (name, dtype, want_dtype))
        if math.prod(shape) != math.prod(want_shape):
            raise ValueError("out %s has shape %s, needs %s" % (name, shape, want_shape))

    def finish(self, *args):
        """Records the use of pool blocks (or, after downloads, which wait for the stream,
        nothing), downloads host results, releases temporaries, returns each argument's
        result."""
        if self._downloads:
            self._blocks = {}   # memcpy_dtoh waits for the stream: their work will be done
            for dev, host in self._downloads:
                cuda.memcpy_dtoh(host, dev.ptr, stream=self.stream)
        elif self._blocks:
            self._record()
        results = [a.result if a is not None else None for a in args]
        if self._temps:
            self._temps = [t for t in self._temps if not any(t is r for r in results)]
            keeper = next((r for r in results if isinstance(r, DeviceArray) and r._owner), None)
            if self._temps and keeper is not None and _any_capture():
                # A captured graph reads them at every replay: they live as long as the result.
                keeper._base = (keeper._base, self._temps)
                self._temps = []
            else:
                # After a download the stream's work is done: the buffers are idle at once.
                # Otherwise the pool reuses them in the stream's order.
                self._release(idle=bool(self._downloads))
        return results[0] if len(results) == 1 else tuple(results)

    def _release(self, idle):
        temps, self._temps = self._temps, []
        for dev in temps:
            dev._free(idle)


# ------------------------------------------------------------------------------------------------
# Framework fast paths: the common call on torch or CuPy arrays without _Call
# ------------------------------------------------------------------------------------------------
# A convenience function first tries its fast path where every array is a C-contiguous CUDA
# array of one framework on the current device, and neither out= nor stream= is given; the
# path reads each array once (kind.fast_view), allocates the results from the framework
# (kind.fast_empty) and calls the entry point (_fast_entries) on the framework's current
# stream.
# Anything it does not expect (another kind, dtype or shape, a Python scalar, a second device)
# makes it return None, and the general path takes the call: the same checks, in the same
# order, with the same messages. The results are the general path's, bit for bit. Every step
# is one call into the framework or the library where one will do: at M = 1 the host time of a
# call is its cost (benchmarks/bench_python_overhead.py).
_INT8 = np.dtype(np.int8)
_UINT8 = np.dtype(np.uint8)
_FP32 = np.dtype(np.float32)
_FLOAT_DTYPES = (DType.FP32, DType.FP16, DType.BF16)
_CK_INT8 = DType.INT8   # a global: reading an enum member from its class costs more


def _fast_kind(primary, out, stream):
    """The kind (torch or CuPy) of a call that may take its fast path, or None. (Its first
    array must be on a CUDA device before the framework is asked for the current one: asking
    torch for it would initialize CUDA.)"""
    if out is not None or stream is not None:
        return None
    kind = _KIND_OF_TYPE.get(type(primary)) or _kind(primary)   # _kind: a type not seen yet
    if kind is None or not kind.on_device(primary):
        return None
    return kind


def _fast_matrix(shape):
    """(rows, cols) of a non-empty 1-D or 2-D shape, else None."""
    if len(shape) == 2:
        rows, cols = shape
    elif len(shape) == 1:
        rows, cols = 1, shape[0]
    else:
        return None
    return (rows, cols) if rows and cols else None


def _fast_float_dtype(x, np_dtype, dtype):
    """The library dtype of a float input x held as np_dtype with a dtype= given (the general
    rule, _ck_dtype), or None where it is not fp32, fp16 or bf16."""
    try:
        x_dtype = _ck_dtype(x, np_dtype, _as_dtype_enum(dtype, "x dtype"), "x")
    except (TypeError, ValueError):
        return None
    return x_dtype if x_dtype in _FLOAT_DTYPES else None


def _fast_float_matrix(kind, x, dtype):
    """(device index, address, library dtype, shape, rows, cols) of x when it is a float
    matrix (1-D or 2-D, not empty) the fast paths take, else None."""
    if dtype is None:
        view = kind.fast_float_input(x)
        if view is None:
            return None
        index, ptr, x_dtype, shape = view
    else:
        index = kind.current_device()
        view = kind.fast_view(x, index)
        if view is None:
            return None
        ptr, shape, np_dtype = view
        x_dtype = _fast_float_dtype(x, np_dtype, dtype)
        if x_dtype is None:
            return None
    matrix = _fast_matrix(shape)
    return (index, ptr, x_dtype, shape) + matrix if matrix is not None else None


def _fast_granularity(size, count):
    """PER_TENSOR for one scale, PER_ROW for `count` of them (as _scale_granularity), or None."""
    return PER_TENSOR if size == 1 else PER_ROW if size == count else None


def _quantize_int8_fast(kind, x, gran, scales, dtype):
    """quantize_int8's fast path (see above): x, and static scales when given, of one kind."""
    x_matrix = _fast_float_matrix(kind, x, dtype)
    if x_matrix is None:
        return None
    index, ptr, x_dtype, _, rows, cols = x_matrix
    n_scales = 1 if gran == PER_TENSOR else rows
    if scales is not None:
        s_view = kind.fast_view(scales, index, _FP32)
        if s_view is None or math.prod(s_view[1]) != n_scales:
            return None
    q, q_ptr = kind.fast_empty_like(x, _CK_INT8)
    if scales is None:
        s, s_ptr = kind.fast_scales(n_scales, index)
    else:
        s, s_ptr = scales, s_view[0]
    entry = _fast_entries.ck_quantize_int8
    status = entry(ptr, x_dtype, rows, cols, gran, DYNAMIC if scales is None else STATIC, s_ptr,
                   q_ptr, kind.stream(index))
    if status:
        _raise_for_status(status, entry, ())
    return q, s


def _gemm_int8_scaled_fast(kind, a, b, scale_a, scale_b, bias, lay, act, ck_out):
    """gemm_int8_scaled's fast path (see above): a, b, the scales and the bias of one kind."""
    index = kind.current_device()
    view = kind.fast_view
    a_view = view(a, index, _INT8)
    b_view = view(b, index, _INT8)
    sa_view = view(scale_a, index, _FP32)
    sb_view = view(scale_b, index, _FP32)
    bias_view = view(bias, index, _NUMPY_OF[ck_out]) if bias is not None else None
    if a_view is None or b_view is None or sa_view is None or sb_view is None or \
            (bias is not None and bias_view is None):
        return None
    a_shape, b_shape = a_view[1], b_view[1]
    matrix = _fast_matrix(a_shape)
    if matrix is None or len(b_shape) != 2:
        return None
    m, k = matrix
    n, k_b = b_shape if lay == LAYOUT_NK else b_shape[::-1]
    a_gran = _fast_granularity(math.prod(sa_view[1]), m)
    b_gran = _fast_granularity(math.prod(sb_view[1]), n)
    if k_b != k or n == 0 or a_gran is None or b_gran is None or \
            (bias is not None and math.prod(bias_view[1]) != n):
        return None
    stream = kind.stream(index)
    out, out_ptr = kind.fast_empty((n,) if len(a_shape) == 1 else (m, n), ck_out, index)
    entry = _fast_entries.ck_gemm_int8_scaled
    status = entry(a_view[0], b_view[0], lay, m, n, k, sa_view[0], a_gran, sb_view[0], b_gran,
                   bias_view[0] if bias is not None else 0, act, out_ptr, ck_out, stream)
    if status:
        _raise_for_status(status, entry, ())
    return out


# (bytes_of, groups_of, n, k, group_size) -> (the prepacked weight's bytes, its scales' values):
# two calls into the library that a layer's every call would repeat.
_PREPACKED_SIZES = {}


def _prepacked_sizes(bytes_of, groups_of, n, k, group_size):
    key = (bytes_of, groups_of, n, k, group_size)
    sizes = _PREPACKED_SIZES.get(key)
    if sizes is None:
        if len(_PREPACKED_SIZES) >= 1024:
            _PREPACKED_SIZES.clear()
        sizes = (max(bytes_of(n, k), 0), max(groups_of(n, k, group_size), 0))
        _PREPACKED_SIZES[key] = sizes
    return sizes


def _gemm_prepacked_fast(kind, x, w, scales, zeros, n, group_size, bias, act, mode, dtype,
                         bytes_of, groups_of, entry):
    """_gemm_prepacked's fast path (see above): x, the prepacked arrays and the bias of one
    kind, with the general path's sizes and dtypes (scales and bias stored as x is)."""
    x_matrix = _fast_float_matrix(kind, x, dtype) if type(group_size) is int else None
    if x_matrix is None:
        return None
    index, ptr, x_dtype, shape, m, k = x_matrix
    np_dtype = _NUMPY_OF[x_dtype]
    view = kind.fast_view
    nbytes, nvalues = _prepacked_sizes(bytes_of, groups_of, n, k, group_size)
    w_view = view(w, index, _UINT8)
    s_view = view(scales, index, np_dtype)
    z_view = view(zeros, index, _UINT8) if zeros is not None else None
    bias_view = view(bias, index, np_dtype) if bias is not None else None
    if w_view is None or s_view is None or math.prod(w_view[1]) != nbytes or \
            math.prod(s_view[1]) != nvalues or \
            (zeros is not None and (z_view is None or math.prod(z_view[1]) != nvalues)) or \
            (bias is not None and (bias_view is None or math.prod(bias_view[1]) != n)):
        return None
    stream = kind.stream(index)
    out, out_ptr = kind.fast_empty((n,) if len(shape) == 1 else (m, n), x_dtype, index)
    function = getattr(_fast_entries, entry)
    status = function(ptr, x_dtype, w_view[0], s_view[0], z_view[0] if z_view else 0,
                      group_size, mode, bias_view[0] if bias_view else 0, act, m, n, k, out_ptr,
                      stream)
    if status:
        _raise_for_status(status, function, ())
    return out


def _granularity(value, scales_size=None, rows=None):
    if value is None:   # inferred from the number of scales
        if scales_size == 1:
            return PER_TENSOR
        if scales_size == rows:
            return PER_ROW
        raise ValueError("scales has %s values: 1 (per tensor) or rows=%s (per row) expected"
                         % (scales_size, rows))
    return _named_enum(value, "granularity", "'tensor' or 'row'", _GRANULARITIES)


# The names of the enum arguments (made once: these are parsed on every call).
_GRANULARITIES = {"tensor": PER_TENSOR, "per_tensor": PER_TENSOR, "row": PER_ROW,
                  "per_row": PER_ROW}
_LAYOUTS = {"nk": LAYOUT_NK, "kn": LAYOUT_KN}
_ACTIVATIONS = {"none": ACTIVATION_NONE, "relu": ACTIVATION_RELU}


def _named_enum(value, what, choices, names):
    """An enum value from one of its `names` (case-insensitive) or the int itself; an unknown
    name raises ValueError saying `what` takes `choices`."""
    if isinstance(value, str):
        found = names.get(value)
        if found is None:
            found = names.get(value.lower())
        if found is None:
            raise ValueError("%s=%r: use %s" % (what, value, choices))
        return found
    return int(value)


def _check_array(arg, name, dtype, size):
    if arg.dtype != np.dtype(dtype):
        raise TypeError("%s has dtype %s, needs %s" % (name, arg.dtype, np.dtype(dtype)))
    if arg.size != size:
        raise ValueError("%s has %d values (shape %s), needs %d" % (name, arg.size, arg.shape,
                                                                     size))


def _groups(cols, group_size):
    groups = raw.int4_groups_per_row(cols, group_size)
    if groups <= 0:
        raise ValueError("group_size=%r is not valid for cols=%d (cuda_kernels.h: 32, 64, 128 "
                         "or GROUP_ROW=-1)" % (group_size, cols))
    return groups


def quantize_int8(x, granularity="tensor", scales=None, dtype=None, stream=None, out=None):
    """Symmetric INT8 quantization of x [rows, cols] (fp32, fp16, or bf16 with dtype="bf16").

    granularity: "tensor" (one scale) or "row" (one per row). scales: None computes them on
    the device (dynamic); given (float32, 1 or rows values, or one Python float) they are
    used as they are (static). out: q, or (q, scales). Returns (q int8 like x, scales float32
    of shape (1,) or (rows,)).
    """
    # The names first, as one lookup: at M = 1 the host time of this call is its cost.
    gran = _GRANULARITIES.get(granularity) if type(granularity) is str else None
    if gran is None:
        gran = _granularity(granularity)
    kind = _fast_kind(x, out, stream)
    if kind is not None:
        result = _quantize_int8_fast(kind, x, gran, scales, dtype)
        if result is not None:
            return result
    with _Call(x, stream) as call:
        xa = call.input(x, "x", dtype, matrix=True, need=_FLOAT_INPUT)
        rows, cols = _matrix(xa.shape, "x")
        q_out, s_out = _split_out(out, 2, ("q", "scales"))
        n_scales = 1 if gran == PER_TENSOR else rows
        q = call.output(xa.shape, np.int8, DType.INT8, q_out, "q")
        if scales is None:
            mode = DYNAMIC
            s = call.output((n_scales,), np.float32, DType.FP32, s_out, "scales")
        else:
            mode = STATIC
            s = call.input(scales, "scales", scalar_dtype=np.float32)
            _check_array(s, "scales", np.float32, n_scales)
        raw.quantize_int8(xa.ptr, xa.ck_dtype, rows, cols, gran, mode, s.ptr, q.ptr,
                          call.stream)
        return call.finish(q, s)


def dequantize_int8(q, scales, granularity=None, out_dtype="fp32", stream=None, out=None):
    """out = q * scale of int8 q [rows, cols] with float32 scales (1 value or `rows` values, or
    one Python float). granularity: "tensor", "row", or None to infer it from the number of
    scales. out_dtype: "fp32", "fp16" or "bf16" (returned as uint16 bit patterns)."""
    ck_out = _as_dtype_enum(out_dtype, "out_dtype")
    with _Call(q, stream) as call:
        qa = call.input(q, "q", matrix=True, need=np.int8)
        rows, cols = _matrix(qa.shape, "q")
        s = call.input(scales, "scales", scalar_dtype=np.float32)
        gran = _granularity(granularity, s.size, rows)
        _check_array(s, "scales", np.float32, 1 if gran == PER_TENSOR else rows)
        o = call.output(qa.shape, _NUMPY_OF[ck_out], ck_out, out, "out")
        raw.dequantize_int8(qa.ptr, s.ptr, rows, cols, gran, o.ptr, ck_out, call.stream)
        return call.finish(o)


_FP8_FORMATS = {"e4m3": FP8_E4M3, "e5m2": FP8_E5M2}
_FP8_GRANULARITIES = dict(_GRANULARITIES, block1x128=PER_BLOCK_1X128,
                          block128x128=PER_BLOCK_128X128)
_FP8_GRANULARITY_NAMES = "'tensor', 'row', 'block1x128' or 'block128x128'"


def _fp8_format(value):
    fmt = _named_enum(value, "format", "'e4m3' or 'e5m2'", _FP8_FORMATS)
    if fmt not in (FP8_E4M3, FP8_E5M2):
        raise ValueError("format=%r: use 'e4m3' or 'e5m2'" % (value,))
    return fmt


def _fp8_granularity(value):
    gran = _named_enum(value, "granularity", _FP8_GRANULARITY_NAMES, _FP8_GRANULARITIES)
    if gran not in (PER_TENSOR, PER_ROW, PER_BLOCK_1X128, PER_BLOCK_128X128):
        raise ValueError("granularity=%r: use %s" % (value, _FP8_GRANULARITY_NAMES))
    return gran


def _fp8_scale_shape(rows, cols, gran, one_d=False):
    """The scales' shape of a [rows, cols] FP8 tensor (cuda_kernels.h); a 1-D tensor (one row)
    has 1-D block scales."""
    blocks_r, blocks_c = -(-rows // FP8_BLOCK), -(-cols // FP8_BLOCK)
    if gran == PER_TENSOR:
        return (1,)
    if gran == PER_ROW:
        return (rows,)
    if one_d:
        return (blocks_c,)
    return (rows, blocks_c) if gran == PER_BLOCK_1X128 else (blocks_r, blocks_c)


def _fp8_inferred_granularity(shape, rows, cols):
    """The granularity of FP8 scales of this shape: 1 value per tensor, (rows,) per row,
    (rows, ceil(cols / 128)) per 1 x 128 block, (ceil(rows / 128), ceil(cols / 128)) per tile
    (where two fit, they hold the same numbers)."""
    size = math.prod(shape)
    blocks_r, blocks_c = -(-rows // FP8_BLOCK), -(-cols // FP8_BLOCK)
    if size == 1:
        return PER_TENSOR
    if len(shape) == 2 and tuple(shape) == (rows, blocks_c):
        return PER_BLOCK_1X128
    if len(shape) == 2 and tuple(shape) == (blocks_r, blocks_c):
        return PER_BLOCK_128X128
    if len(shape) == 1 and size == rows:
        return PER_ROW
    if len(shape) == 1 and rows == 1 and size == blocks_c:
        return PER_BLOCK_1X128
    raise ValueError("scales of shape %s: 1 value (per tensor), (%d,) (per row), (%d, %d) "
                     "(per 1 x 128 block) or (%d, %d) (per 128 x 128 tile) expected, or say "
                     "granularity=" % (tuple(shape), rows, rows, blocks_c, blocks_r, blocks_c))


def quantize_fp8(x, format="e4m3", granularity="tensor", scales=None, dtype=None, stream=None,
                 out=None):
    """FP8 quantization of x [rows, cols] (fp32, fp16, or bf16 with dtype="bf16").

    format: "e4m3" (max 448) or "e5m2" (max 57344). granularity: "tensor", "row", "block1x128"
    (one scale per row per 128 columns) or "block128x128" (one per 128 x 128 tile). scales: None
    computes them on the device (dynamic: amax / max of the format); given (float32, as many as
    the granularity has, or one Python float) they are used as they are (static). out: q, or
    (q, scales). Returns (q uint8 FP8 bytes like x, scales float32 of shape (1,), (rows,),
    (rows, ceil(cols / 128)) or (ceil(rows / 128), ceil(cols / 128)); a 1-D x has 1-D block
    scales).
    """
    fmt = _fp8_format(format)
    gran = _fp8_granularity(granularity)
    with _Call(x, stream) as call:
        xa = call.input(x, "x", dtype, matrix=True, need=_FLOAT_INPUT)
        rows, cols = _matrix(xa.shape, "x")
        shape = _fp8_scale_shape(rows, cols, gran, len(xa.shape) == 1)
        q_out, s_out = _split_out(out, 2, ("q", "scales"))
        if scales is not None:   # the inputs' checks before any output is allocated
            s = call.input(scales, "scales", scalar_dtype=np.float32)
            _check_array(s, "scales", np.float32, math.prod(shape))
        q = call.output(xa.shape, np.uint8, DType.UINT8, q_out, "q")
        if scales is None:
            s = call.output(shape, np.float32, DType.FP32, s_out, "scales")
        mode = DYNAMIC if scales is None else STATIC
        raw.quantize_fp8(xa.ptr, xa.ck_dtype, rows, cols, fmt, gran, mode, s.ptr, q.ptr,
                         call.stream)
        return call.finish(q, s)


def dequantize_fp8(q, scales, format="e4m3", granularity=None, out_dtype="fp32", stream=None,
                   out=None):
    """out = fp8_value(q) * scale of FP8 bytes q [rows, cols] (uint8, in `format`: "e4m3" or
    "e5m2") with float32 scales. granularity: "tensor", "row", "block1x128", "block128x128", or
    None to infer it from the scales' shape (as quantize_fp8 returns them). out_dtype: "fp32",
    "fp16" or "bf16" (returned as uint16 bit patterns)."""
    fmt = _fp8_format(format)
    ck_out = _as_dtype_enum(out_dtype, "out_dtype")
    with _Call(q, stream) as call:
        qa = call.input(q, "q", matrix=True, need=np.uint8)
        rows, cols = _matrix(qa.shape, "q")
        s = call.input(scales, "scales", scalar_dtype=np.float32)
        if granularity is None:
            gran = _fp8_inferred_granularity(s.shape, rows, cols)
        else:
            gran = _fp8_granularity(granularity)
        _check_array(s, "scales", np.float32, math.prod(_fp8_scale_shape(rows, cols, gran)))
        o = call.output(qa.shape, _NUMPY_OF[ck_out], ck_out, out, "out")
        raw.dequantize_fp8(qa.ptr, fmt, s.ptr, rows, cols, gran, o.ptr, ck_out, call.stream)
        return call.finish(o)


def quantize_int4(x, group_size=128, symmetric=True, dtype=None, stream=None, out=None):
    """Group-wise packed INT4 quantization of x [rows, cols] (fp32, fp16, or bf16 with
    dtype="bf16"); group_size 32, 64, 128 or GROUP_ROW (-1).

    Returns (packed uint8 [rows, (cols + 1) // 2], scales [rows, groups] in the dtype of x,
    zeros uint8 [rows, groups] or None when symmetric). out: packed or a tuple of three.
    """
    mode = INT4_SYMMETRIC if symmetric else INT4_ASYMMETRIC
    with _Call(x, stream) as call:
        xa = call.input(x, "x", dtype, matrix=True, need=_FLOAT_INPUT)
        rows, cols = _matrix(xa.shape, "x")
        groups = _groups(cols, group_size)
        one_d = len(xa.shape) == 1
        packed_shape = ((cols + 1) // 2,) if one_d else (rows, (cols + 1) // 2)
        group_shape = (groups,) if one_d else (rows, groups)
        p_out, s_out, z_out = _split_out(out, 3, ("packed", "scales", "zeros"))
        p = call.output(packed_shape, np.uint8, DType.UINT8, p_out, "packed")
        s = call.output(group_shape, _NUMPY_OF[xa.ck_dtype], xa.ck_dtype, s_out, "scales")
        z = None if symmetric else call.output(group_shape, np.uint8, DType.UINT8, z_out, "zeros")
        raw.quantize_int4(xa.ptr, xa.ck_dtype, rows, cols, group_size, mode, p.ptr, s.ptr,
                          z.ptr if z is not None else 0, call.stream)
        return call.finish(p, s, z)


def dequantize_int4(packed, scales, zeros, cols, group_size=128, out_dtype=None, stream=None,
                    out=None):
    """Unpacks and dequantizes packed int4 [rows, (cols + 1) // 2]: out [rows, cols].

    scales [rows, groups] are read in the output dtype, so out_dtype defaults to theirs ("bf16"
    marks uint16 scales as bfloat16); zeros uint8 [rows, groups] for asymmetric data, None for
    symmetric.
    """
    with _Call(packed, stream) as call:
        pa = call.input(packed, "packed", matrix=True, need=np.uint8)
        rows, packed_cols = _matrix(pa.shape, "packed")
        if cols < 1 or packed_cols != (cols + 1) // 2:
            raise ValueError("packed has %d bytes per row; cols=%d needs %d"
                             % (packed_cols, cols, (cols + 1) // 2))
        groups = _groups(cols, group_size)
        want = _as_dtype_enum(out_dtype, "out_dtype")
        s = call.input(scales, "scales", want)
        ck_out = s.ck_dtype
        if ck_out not in (DType.FP32, DType.FP16, DType.BF16):
            raise TypeError("scales have dtype %s: fp32, fp16 or bf16 (uint16 with "
                            "out_dtype='bf16') expected" % s.dtype)
        _check_array(s, "scales", s.dtype, rows * groups)
        mode = INT4_SYMMETRIC
        z_ptr = 0
        if zeros is not None:
            mode = INT4_ASYMMETRIC
            z = call.input(zeros, "zeros")
            _check_array(z, "zeros", np.uint8, rows * groups)
            z_ptr = z.ptr
        out_shape = (cols,) if len(pa.shape) == 1 else (rows, cols)
        o = call.output(out_shape, _NUMPY_OF[ck_out], ck_out, out, "out")
        raw.dequantize_int4(pa.ptr, s.ptr, z_ptr, rows, cols, group_size, mode, o.ptr, ck_out,
                            call.stream)
        return call.finish(o)


# Block 4-bit formats (cuda_kernels.h: "Block 4-bit formats"): elements per block.
NF4_BLOCK_SIZES = (32, 64, 128, 256, 512, 1024, 2048, 4096)
MXFP4_BLOCK = 32
NVFP4_BLOCK = 16


def _block4_shapes(shape, rows, cols, block):
    """(packed shape, scales shape) of a [rows, cols] block 4-bit tensor: a 1-D input (one row)
    gives 1-D outputs."""
    blocks = -(-cols // block)
    if len(shape) == 1:
        return ((cols + 1) // 2,), (blocks,)
    return (rows, (cols + 1) // 2), (rows, blocks)


def _nf4_blocksize(blocksize):
    if blocksize not in NF4_BLOCK_SIZES:
        raise ValueError("blocksize=%r is not an NF4 block size (cuda_kernels.h: %s)"
                         % (blocksize, ", ".join(map(str, NF4_BLOCK_SIZES))))
    return blocksize


def _block4_quantize_input(call, x, dtype, block):
    """x of a block 4-bit quantizer: (its _Arg, rows, cols, packed shape, scales shape)."""
    xa = call.input(x, "x", dtype, matrix=True, need=_FLOAT_INPUT)
    rows, cols = _matrix(xa.shape, "x")
    return (xa, rows, cols) + _block4_shapes(xa.shape, rows, cols, block)


def _block4_dequantize_inputs(call, packed, scales, scales_name, scales_dtype, cols, block,
                              out_dtype, out):
    """packed [rows, (cols + 1) // 2] uint8 and its scales [rows, blocks] of a block 4-bit
    dequantizer, and its output: (packed _Arg, scales _Arg, rows, output _Arg, out dtype)."""
    pa = call.input(packed, "packed", matrix=True, need=np.uint8)
    rows, packed_cols = _matrix(pa.shape, "packed")
    if cols < 1 or packed_cols != (cols + 1) // 2:
        raise ValueError("packed has %d bytes per row; cols=%d needs %d"
                         % (packed_cols, cols, (cols + 1) // 2))
    sa = call.input(scales, scales_name, need=scales_dtype)
    _check_array(sa, scales_name, scales_dtype, rows * -(-cols // block))
    ck_out = _as_dtype_enum(out_dtype, "out_dtype")
    out_shape = (cols,) if len(pa.shape) == 1 else (rows, cols)
    o = call.output(out_shape, _NUMPY_OF[ck_out], ck_out, out, "out")
    return pa, sa, rows, o, ck_out


def quantize_nf4(x, blocksize=64, dtype=None, stream=None, out=None):
    """NF4 (bitsandbytes) quantization of x [rows, cols] (fp32, fp16, or bf16 with dtype="bf16")
    in blocks of `blocksize` (32 .. 4096, a power of two; 64 is bitsandbytes' default) along
    each row. Returns (packed uint8 [rows, (cols + 1) // 2], element 2i in the high nibble,
    absmax float32 [rows, ceil(cols / blocksize)]). out: packed or (packed, absmax)."""
    block = _nf4_blocksize(blocksize)
    with _Call(x, stream) as call:
        xa, rows, cols, packed_shape, scales_shape = _block4_quantize_input(call, x, dtype, block)
        p_out, s_out = _split_out(out, 2, ("packed", "absmax"))
        p = call.output(packed_shape, np.uint8, DType.UINT8, p_out, "packed")
        s = call.output(scales_shape, np.float32, DType.FP32, s_out, "absmax")
        raw.quantize_nf4(xa.ptr, xa.ck_dtype, rows, cols, block, p.ptr, s.ptr, call.stream)
        return call.finish(p, s)


def dequantize_nf4(packed, absmax, cols, blocksize=64, out_dtype="fp32", stream=None, out=None):
    """NF4 packed [rows, (cols + 1) // 2] with float32 absmax [rows, ceil(cols / blocksize)]
    -> out [rows, cols] of out_dtype ("fp32", "fp16" or "bf16": uint16 bit patterns)."""
    block = _nf4_blocksize(blocksize)
    with _Call(packed, stream) as call:
        pa, sa, rows, o, ck_out = _block4_dequantize_inputs(
            call, packed, absmax, "absmax", np.float32, cols, block, out_dtype, out)
        raw.dequantize_nf4(pa.ptr, sa.ptr, rows, cols, block, o.ptr, ck_out, call.stream)
        return call.finish(o)


def quantize_mxfp4(x, dtype=None, stream=None, out=None):
    """MXFP4 (OCP Microscaling) quantization of x [rows, cols] (fp32, fp16, or bf16 with
    dtype="bf16"): E2M1 codes in blocks of 32 along each row. Returns (packed uint8
    [rows, (cols + 1) // 2], element 2i in the low nibble, scales uint8 E8M0
    [rows, ceil(cols / 32)]). out: packed or (packed, scales)."""
    with _Call(x, stream) as call:
        xa, rows, cols, packed_shape, scales_shape = _block4_quantize_input(call, x, dtype,
                                                                            MXFP4_BLOCK)
        p_out, s_out = _split_out(out, 2, ("packed", "scales"))
        p = call.output(packed_shape, np.uint8, DType.UINT8, p_out, "packed")
        s = call.output(scales_shape, np.uint8, DType.UINT8, s_out, "scales")
        raw.quantize_mxfp4(xa.ptr, xa.ck_dtype, rows, cols, p.ptr, s.ptr, call.stream)
        return call.finish(p, s)


def dequantize_mxfp4(packed, scales, cols, out_dtype="fp32", stream=None, out=None):
    """MXFP4 packed [rows, (cols + 1) // 2] with E8M0 scales uint8 [rows, ceil(cols / 32)]
    -> out [rows, cols] of out_dtype ("fp32", "fp16" or "bf16": uint16 bit patterns)."""
    with _Call(packed, stream) as call:
        pa, sa, rows, o, ck_out = _block4_dequantize_inputs(
            call, packed, scales, "scales", np.uint8, cols, MXFP4_BLOCK, out_dtype, out)
        raw.dequantize_mxfp4(pa.ptr, sa.ptr, rows, cols, o.ptr, ck_out, call.stream)
        return call.finish(o)


def quantize_nvfp4(x, global_scale=None, dtype=None, stream=None, out=None):
    """NVFP4 quantization of x [rows, cols] (fp32, fp16, or bf16 with dtype="bf16"): E2M1 codes
    in blocks of 16 along each row under E4M3 block scales and one float32 global scale.

    global_scale: None computes it on the device (2688 / amax(|x|), dynamic); given (one
    float32, or a Python float: a calibrated scale, positive and finite) it is used as it is
    (static). Returns (packed uint8 [rows, (cols + 1) // 2], element 2i in the low nibble,
    scales uint8 E4M3 [rows, ceil(cols / 16)], global_scale float32 (1,)). out: packed or a
    tuple of three."""
    with _Call(x, stream) as call:
        xa, rows, cols, packed_shape, scales_shape = _block4_quantize_input(call, x, dtype,
                                                                            NVFP4_BLOCK)
        p_out, s_out, g_out = _split_out(out, 3, ("packed", "scales", "global_scale"))
        p = call.output(packed_shape, np.uint8, DType.UINT8, p_out, "packed")
        s = call.output(scales_shape, np.uint8, DType.UINT8, s_out, "scales")
        if global_scale is None:
            mode = DYNAMIC
            g = call.output((1,), np.float32, DType.FP32, g_out, "global_scale")
        else:
            mode = STATIC
            g = call.input(global_scale, "global_scale", scalar_dtype=np.float32)
            _check_array(g, "global_scale", np.float32, 1)
        raw.quantize_nvfp4(xa.ptr, xa.ck_dtype, rows, cols, mode, g.ptr, p.ptr, s.ptr,
                           call.stream)
        return call.finish(p, s, g)


def dequantize_nvfp4(packed, scales, global_scale, cols, out_dtype="fp32", stream=None, out=None):
    """NVFP4 packed [rows, (cols + 1) // 2] with E4M3 scales uint8 [rows, ceil(cols / 16)] and
    the float32 global_scale (one value, or a Python float) -> out [rows, cols] of out_dtype
    ("fp32", "fp16" or "bf16": uint16 bit patterns)."""
    with _Call(packed, stream) as call:
        pa, sa, rows, o, ck_out = _block4_dequantize_inputs(
            call, packed, scales, "scales", np.uint8, cols, NVFP4_BLOCK, out_dtype, out)
        g = call.input(global_scale, "global_scale", scalar_dtype=np.float32)
        _check_array(g, "global_scale", np.float32, 1)
        raw.dequantize_nvfp4(pa.ptr, sa.ptr, g.ptr, rows, cols, o.ptr, ck_out, call.stream)
        return call.finish(o)


def _layout(value):
    """LAYOUT_NK / LAYOUT_KN from "nk" / "kn" (or the int itself)."""
    return _named_enum(value, "layout", "'nk' (b is [N, K]) or 'kn' (b is [K, N])", _LAYOUTS)


def _activation(value):
    """ACTIVATION_NONE / ACTIVATION_RELU from None, "none" or "relu" (or the int itself)."""
    if value is None:
        return ACTIVATION_NONE
    return _named_enum(value, "activation", "None, 'none' or 'relu'", _ACTIVATIONS)


def _gemm_shape(a, b, layout, a_name="a", b_name="b"):
    """(m, n, k, out shape) of a [M, K] (1-D: [K], one row) times b ([N, K] for LAYOUT_NK,
    [K, N] for LAYOUT_KN); the output is [M, N], or [N] for a 1-D a."""
    m, k = _matrix(a.shape, a_name)
    if len(b.shape) != 2:
        raise ValueError("%s must be 2-D, not of shape %s" % (b_name, b.shape))
    n, k_b = (b.shape if layout == LAYOUT_NK else b.shape[::-1])
    if k_b != k or n == 0:
        want = "[N, K]" if layout == LAYOUT_NK else "[K, N]"
        raise ValueError("%s has shape %s: with %s of shape %s it must be %s with K=%d"
                         % (b_name, b.shape, a_name, a.shape, want, k))
    return m, n, k, ((n,) if len(a.shape) == 1 else (m, n))


def _scale_granularity(arg, name, count, per):
    """PER_TENSOR for 1 float32 value, PER_ROW for `count` values (1 value when count is 1
    reads as per tensor: the same numbers)."""
    if arg.dtype != np.float32:
        raise TypeError("%s has dtype %s, needs float32" % (name, arg.dtype))
    if arg.size == 1:
        return PER_TENSOR
    if arg.size == count:
        return PER_ROW
    raise ValueError("%s has %d values: 1 (per tensor) or %d (one per %s) expected"
                     % (name, arg.size, count, per))


def _epilogue_args(call, scale_a, scale_b, bias, m, n, ck_out, out, out_shape):
    """The scaled GEMMs' epilogue inputs and output: (scale_a arg, its granularity, scale_b arg,
    its granularity, bias pointer or 0, output arg)."""
    sa = call.input(scale_a, "scale_a", scalar_dtype=np.float32)
    a_gran = _scale_granularity(sa, "scale_a", m, "row of a")
    sb = call.input(scale_b, "scale_b", scalar_dtype=np.float32)
    b_gran = _scale_granularity(sb, "scale_b", n, "output column")
    bias_ptr = call.optional_input(bias, "bias", n, ck_out)
    o = call.output(out_shape, _NUMPY_OF[ck_out], ck_out, out, "out")
    return sa, a_gran, sb, b_gran, bias_ptr, o


def gemm_int8(a, b, layout="nk", out=None, stream=None):
    """INT8 matrix product with exact int32 results (ck_gemm_int8).

    a: int8 [M, K] (or [K]); b: int8 [N, K] for layout "nk" (nn.Linear weights: a @ b.T) or
    [K, N] for "kn" (a @ b). Returns int32 [M, N] (or [N]). The library's rules apply: K a
    multiple of 16, and N too for "kn".
    """
    lay = _layout(layout)
    with _Call(a, stream) as call:
        aa = call.input(a, "a", matrix=True, need=np.int8)
        ba = call.input(b, "b", need=np.int8)
        m, n, k, out_shape = _gemm_shape(aa, ba, lay)
        c = call.output(out_shape, np.int32, DType.INT32, out, "c")
        raw.gemm_int8(aa.ptr, ba.ptr, lay, m, n, k, c.ptr, call.stream)
        return call.finish(c)


def int8_prepack(b_kn, out=None, stream=None):
    """A [K, N] int8 weight (layout "kn") as [N, K] (layout "nk"), bit for bit (ck_int8_prepack):
    the layout the fast INT8 kernels read. K and N multiples of 16."""
    with _Call(b_kn, stream) as call:
        ba = call.input(b_kn, "b_kn", matrix=True, need=np.int8)
        k, n = ba.shape
        o = call.output((n, k), np.int8, DType.INT8, out, "b_nk")
        raw.int8_prepack(ba.ptr, k, n, o.ptr, call.stream)
        return call.finish(o)


def gemm_int8_scaled(a, b, scale_a, scale_b, bias=None, activation=None, out_dtype="fp32",
                     layout="nk", out=None, stream=None):
    """INT8 matrix product with a fused epilogue (ck_gemm_int8_scaled), a W8A8 linear layer:

        out[m, n] = act(float(acc[m, n]) * scale_a[m or 0] * scale_b[n or 0] + bias[n])

    a: int8 [M, K] (or [K]); b: int8 [N, K] ("nk") or [K, N] ("kn"); acc is their exact int32
    product. scale_a: a Python float or float32 values, 1 (per tensor) or M (per row of a);
    scale_b: a float or float32 values, 1 (per tensor) or N (per output channel). The
    granularity follows from the number of values. bias: None or N values of out_dtype
    (uint16 bit patterns for "bf16"). activation: None/"none" or "relu". out_dtype: "fp32",
    "fp16" or "bf16" (returned as uint16 bit patterns).
    """
    lay = _layout(layout)
    act = _activation(activation)
    ck_out = _as_dtype_enum(out_dtype, "out_dtype")
    kind = _fast_kind(a, out, stream)
    if kind is not None:
        result = _gemm_int8_scaled_fast(kind, a, b, scale_a, scale_b, bias, lay, act, ck_out)
        if result is not None:
            return result
    with _Call(a, stream) as call:
        aa = call.input(a, "a", matrix=True, need=np.int8)
        ba = call.input(b, "b", need=np.int8)
        m, n, k, out_shape = _gemm_shape(aa, ba, lay)
        sa, a_gran, sb, b_gran, bias_ptr, o = _epilogue_args(call, scale_a, scale_b, bias, m, n,
                                                             ck_out, out, out_shape)
        raw.gemm_int8_scaled(aa.ptr, ba.ptr, lay, m, n, k, sa.ptr, a_gran, sb.ptr, b_gran,
                             bias_ptr, act, o.ptr, ck_out, call.stream)
        return call.finish(o)


def gemm_fp8_scaled(a, b, scale_a, scale_b, bias=None, activation=None, out_dtype="fp32",
                    out=None, stream=None):
    """FP8 matrix product with the fused epilogue of :func:`gemm_int8_scaled`
    (ck_gemm_fp8_scaled), a W8A8 FP8 linear layer:

        out[m, n] = act(acc[m, n] * scale_a[m or 0] * scale_b[n or 0] + bias[n])

    a: uint8 FP8 E4M3 bit patterns [M, K] (or [K]); b: uint8 E4M3 [N, K] (the nn.Linear
    weight); acc = sum_k e4m3(a) e4m3(b) in float32. Scales, bias, activation and out_dtype as
    gemm_int8_scaled; or block scales (2-D, as quantize_fp8 writes them): scale_a
    [M, ceil(K / 128)] ("block1x128") with scale_b [ceil(N / 128), ceil(K / 128)]
    ("block128x128"), each 128-wide k-block's sums scaled by scale_a[m, kb] scale_b[n // 128, kb].
    Needs FP8 tensor cores (compute capability 8.9+).
    """
    act = _activation(activation)
    ck_out = _as_dtype_enum(out_dtype, "out_dtype")
    if ck_out not in _FLOAT_DTYPES:
        raise ValueError("out_dtype must be fp32, fp16 or bf16, not %r" % (out_dtype,))
    with _Call(a, stream) as call:
        aa = call.input(a, "a", matrix=True, need=np.uint8)
        ba = call.input(b, "b", need=np.uint8)
        m, n, k, out_shape = _gemm_shape(aa, ba, LAYOUT_NK)
        if len(getattr(scale_a, "shape", ())) == 2 or len(getattr(scale_b, "shape", ())) == 2:
            sa, a_gran, sb, b_gran = _fp8_block_scales(call, scale_a, scale_b, m, n, k)
            bias_ptr = call.optional_input(bias, "bias", n, ck_out)
            o = call.output(out_shape, _NUMPY_OF[ck_out], ck_out, out, "out")
        else:
            sa, a_gran, sb, b_gran, bias_ptr, o = _epilogue_args(
                call, scale_a, scale_b, bias, m, n, ck_out, out, out_shape)
        raw.gemm_fp8_scaled(aa.ptr, ba.ptr, m, n, k, sa.ptr, a_gran, sb.ptr, b_gran, bias_ptr,
                            act, o.ptr, ck_out, call.stream)
        return call.finish(o)


def _fp8_block_scales(call, scale_a, scale_b, m, n, k):
    """gemm_fp8_scaled's block scales: (scale_a arg, PER_BLOCK_1X128, scale_b arg,
    PER_BLOCK_128X128), their shapes checked: quantize_fp8's of a [M, K] and of b [N, K]."""
    sa = call.input(scale_a, "scale_a", need=np.float32)
    sb = call.input(scale_b, "scale_b", need=np.float32)
    for arr, name, want in ((sa, "scale_a", _fp8_scale_shape(m, k, PER_BLOCK_1X128)),
                            (sb, "scale_b", _fp8_scale_shape(n, k, PER_BLOCK_128X128))):
        # (a 1-D a, one row, has the 1-D block scales quantize_fp8 gives it)
        if tuple(arr.shape) != want and not (want[0] == 1 and tuple(arr.shape) == want[1:]):
            raise ValueError("block scales: %s has shape %s, it must be %s (scale_a [M, "
                             "ceil(K / 128)], scale_b [ceil(N / 128), ceil(K / 128)])"
                             % (name, tuple(arr.shape), want))
    return sa, PER_BLOCK_1X128, sb, PER_BLOCK_128X128


def _packed_weight_rows(wa, k, act_shape, act_name):
    """N of a packed INT4 weight wa [N, K / 2] that multiplies activations of K columns (shape
    act_shape, named act_name), or ValueError."""
    if len(wa.shape) != 2 or wa.shape[0] == 0 or wa.shape[1] != (k + 1) // 2:
        raise ValueError("w_packed has shape %s: with %s of shape %s it must be [N, %d] "
                         "(K=%d values packed two per byte)"
                         % (wa.shape, act_name, act_shape, (k + 1) // 2, k))
    return wa.shape[0]


def gemm_w4a8(a, scale_a, w_packed, w_scales, group_size=128, bias=None, activation=None,
              out_dtype="fp16", scale_dtype=None, out=None, stream=None):
    """W4A8 linear layer (ck_gemm_w4a8): symmetric INT4 weights times FP8 E4M3 activations on
    FP8 tensor cores,

        acc[m, n] = sum_kb w_scales[n, g(kb)] * sum_{k in kb} e4m3(a[m, k]) * q[n, k]
        out[m, n] = act(acc[m, n] * scale_a[m or 0] + bias[n])

    over the 128-wide k-blocks kb (g(kb) = kb for group_size 128, 0 for GROUP_ROW), float32
    sums, one rounding to out_dtype. a: uint8 FP8 E4M3 bit patterns [M, K] (or [K]), as
    :func:`quantize_fp8` writes them; scale_a: a Python float or float32 values, 1 (per tensor)
    or M (per row of a: quantize_fp8's granularity "row"), the granularity following from the
    number of values. w_packed: uint8 [N, K // 2] and w_scales [N, groups] in fp16 or bf16, as
    :func:`quantize_int4` writes them for an [N, K] weight with symmetric=True (the codes q in
    -8 .. 7); scale_dtype: "fp16" or "bf16", needed only for uint16 bf16 bits (the scales'
    dtype says it otherwise); group_size 128 or GROUP_ROW (-1). bias: None or N values of
    out_dtype; activation None/"none" or "relu"; out_dtype "fp32", "fp16" or "bf16" (returned
    as uint16 bit patterns). The library's rules apply: K a multiple of 32. Needs FP8 tensor
    cores (compute capability 8.9+). Returns [M, N] (or [N]) of out_dtype.
    """
    act = _activation(activation)
    ck_out = _as_dtype_enum(out_dtype, "out_dtype")
    if ck_out not in _FLOAT_DTYPES:
        raise ValueError("out_dtype must be fp32, fp16 or bf16, not %r" % (out_dtype,))
    with _Call(a, stream) as call:
        aa = call.input(a, "a", matrix=True, need=np.uint8)
        m, k = _matrix(aa.shape, "a")
        wa = call.input(w_packed, "w_packed", need=np.uint8)
        n = _packed_weight_rows(wa, k, aa.shape, "a")
        out_shape = (n,) if len(aa.shape) == 1 else (m, n)
        groups = _groups(k, group_size)
        sa = call.input(scale_a, "scale_a", scalar_dtype=np.float32)
        a_gran = _scale_granularity(sa, "scale_a", m, "row of a")
        ws = call.input(w_scales, "w_scales", scale_dtype)
        if ws.ck_dtype not in (DType.FP16, DType.BF16):
            raise TypeError("w_scales have dtype %s: fp16 or bf16 (uint16 with "
                            "scale_dtype='bf16') expected" % ws.dtype)
        _check_array(ws, "w_scales", ws.dtype, n * groups)
        bias_ptr = call.optional_input(bias, "bias", n, ck_out)
        o = call.output(out_shape, _NUMPY_OF[ck_out], ck_out, out, "out")
        raw.gemm_w4a8(aa.ptr, sa.ptr, a_gran, wa.ptr, ws.ptr, ws.ck_dtype, group_size, bias_ptr,
                      act, m, n, k, o.ptr, ck_out, call.stream)
        return call.finish(o)


def linear(x, w, bias=None, activation=None, dtype=None, out=None, stream=None):
    """Floating-point linear layer (ck_linear): out = act(x @ w.T + bias).

    x [M, K] (or [K]) and w [N, K] (nn.Linear layout) in fp32, fp16 or bf16 (uint16 bit patterns
    with dtype="bf16"), both of one dtype; bias None or N values of that dtype; activation
    None/"none" or "relu". Products accumulate in float32 (no TF32). The library's rules apply:
    K and N multiples of 16 / itemsize. Returns [M, N] (or [N]) in the dtype of x.
    """
    act = _activation(activation)
    with _Call(x, stream) as call:
        xa = call.input(x, "x", dtype, matrix=True, need=_FLOAT_INPUT)
        wa = call.input(w, "w", xa.ck_dtype)
        m, n, k, out_shape = _gemm_shape(xa, wa, LAYOUT_NK, "x", "w")
        bias_ptr = call.optional_input(bias, "bias", n, xa.ck_dtype)
        o = call.output(out_shape, _NUMPY_OF[xa.ck_dtype], xa.ck_dtype, out, "out")
        raw.linear(xa.ptr, wa.ptr, bias_ptr, xa.ck_dtype, m, n, k, act, o.ptr, call.stream)
        return call.finish(o)


def gemm_w4a16(x, w_packed, scales, zeros=None, group_size=128, bias=None, activation=None,
               out=None, dtype=None, stream=None):
    """Weight-only INT4 linear layer (ck_gemm_w4a16): out = act(x @ w'.T + bias), where w' is
    the packed weight dequantized as :func:`dequantize_int4` does (rounded to the dtype of x).

    x [M, K] (or [K]) in fp16 or bf16 (uint16 bit patterns with dtype="bf16"); w_packed uint8
    [N, K // 2] as :func:`quantize_int4` writes it for an [N, K] weight; scales [N, groups] in
    the dtype of x; zeros uint8 [N, groups] for an asymmetric weight, None for a symmetric one
    (the mode follows); group_size 32, 64, 128 or GROUP_ROW (-1); bias None or N values of the
    dtype of x; activation None/"none" or "relu". The library's rules apply: K a multiple of
    32. Returns [M, N] (or [N]) in the dtype of x.
    """
    act = _activation(activation)
    mode = INT4_SYMMETRIC if zeros is None else INT4_ASYMMETRIC
    with _Call(x, stream) as call:
        xa = call.input(x, "x", dtype, matrix=True, need=_FLOAT_INPUT)
        wa = call.input(w_packed, "w_packed", need=np.uint8)
        m, k = _matrix(xa.shape, "x")
        n = _packed_weight_rows(wa, k, xa.shape, "x")
        out_shape = (n,) if len(xa.shape) == 1 else (m, n)
        groups = _groups(k, group_size)
        s = call.input(scales, "scales", xa.ck_dtype)
        _check_array(s, "scales", s.dtype, n * groups)
        z_ptr = call.optional_input(zeros, "zeros", n * groups, need=np.uint8)
        bias_ptr = call.optional_input(bias, "bias", n, xa.ck_dtype)
        o = call.output(out_shape, _NUMPY_OF[xa.ck_dtype], xa.ck_dtype, out, "out")
        raw.gemm_w4a16(xa.ptr, xa.ck_dtype, wa.ptr, s.ptr, z_ptr, group_size, mode, bias_ptr,
                       act, m, n, k, o.ptr, call.stream)
        return call.finish(o)


def _packed_weight(call, w_packed, name="w_packed", cols="K"):
    """(arg, n, k) of a packed 4-bit weight uint8 [N, K // 2] (`cols`: what the messages call
    K)."""
    wa = call.input(w_packed, name, need=np.uint8)
    if len(wa.shape) != 2 or wa.shape[0] == 0 or wa.shape[1] == 0:
        raise ValueError("%s must be a non-empty uint8 [N, %s // 2], not of shape %s"
                         % (name, cols, wa.shape))
    return wa, wa.shape[0], 2 * wa.shape[1]


def w4a16_prepack(w_packed, scales, zeros=None, group_size=128, dtype=None, stream=None):
    """Converts an INT4 weight in the interchange format (w_packed uint8 [N, K // 2], scales
    [N, groups] fp16/bf16, zeros uint8 [N, groups] or None) into the layout the W4A16 kernels
    read fastest (ck_w4a16_prepack). Returns (w_prepacked uint8, scales_prepacked, zeros_prepacked
    or None), flat arrays sized by ck_w4a16_prepacked_bytes / _groups, for
    :func:`gemm_w4a16_prepacked` (with the same N, group_size and mode).
    """
    mode = INT4_SYMMETRIC if zeros is None else INT4_ASYMMETRIC
    with _Call(w_packed, stream) as call:
        wa, n, k = _packed_weight(call, w_packed)
        groups = _groups(k, group_size)
        sa = call.input(scales, "scales", dtype)
        if sa.ck_dtype not in (DType.FP16, DType.BF16):
            raise TypeError("scales have dtype %s: fp16 or bf16 (uint16 with dtype='bf16') "
                            "expected" % sa.dtype)
        _check_array(sa, "scales", sa.dtype, n * groups)
        z_ptr = call.optional_input(zeros, "zeros", n * groups, need=np.uint8)
        nbytes = raw.w4a16_prepacked_bytes(n, k)
        nvalues = raw.w4a16_prepacked_groups(n, k, group_size)
        if nbytes <= 0 or nvalues <= 0:
            raise ValueError("n=%d, k=%d, group_size=%r cannot be prepacked (K a multiple of 32)"
                             % (n, k, group_size))
        w_out = call.output((nbytes,), np.uint8, DType.UINT8, None, "w_prepacked")
        s_out = call.output((nvalues,), sa.dtype, sa.ck_dtype, None, "scales_prepacked")
        z_out = (call.output((nvalues,), np.uint8, DType.UINT8, None, "zeros_prepacked")
                 if zeros is not None else None)
        raw.w4a16_prepack(wa.ptr, sa.ptr, z_ptr, sa.ck_dtype, n, k, group_size, mode, w_out.ptr,
                          s_out.ptr, z_out.ptr if z_out is not None else 0, call.stream)
        return call.finish(w_out, s_out, z_out)


def gemm_w4a16_prepacked(x, w_prepacked, scales_prepacked, zeros_prepacked=None, n=None,
                         group_size=128, bias=None, activation=None, out=None, dtype=None,
                         stream=None):
    """:func:`gemm_w4a16` on a weight prepared by :func:`w4a16_prepack`
    (ck_gemm_w4a16_prepacked): out = act(x @ w'.T + bias), the same bits as gemm_w4a16 on the
    original weight. n: the weight's N (the prepacked arrays are padded, so it must be given).
    Returns [M, N] (or [N]) in the dtype of x.
    """
    return _gemm_prepacked(x, w_prepacked, scales_prepacked, zeros_prepacked, n, group_size, bias,
                           activation, out, dtype, stream, raw.w4a16_prepacked_bytes,
                           raw.w4a16_prepacked_groups, "ck_gemm_w4a16_prepacked")


def _gemm_prepacked(x, w_prepacked, scales_prepacked, zeros_prepacked, n, group_size, bias,
                    activation, out, dtype, stream, bytes_of, groups_of, entry):
    """What the GEMMs on a prepacked INT4 weight (dense or 2:4) share: the arrays checked
    against the layout's sizes (bytes_of(n, k), groups_of(n, k, group_size)), the output, and
    the entry point `entry` (gemm_w4a16_prepacked's arguments)."""
    if n is None or int(n) < 1:
        raise ValueError("n (the weight's number of rows) must be given and >= 1")
    n = int(n)
    act = _activation(activation)
    mode = INT4_SYMMETRIC if zeros_prepacked is None else INT4_ASYMMETRIC
    kind = _fast_kind(x, out, stream)
    if kind is not None:
        result = _gemm_prepacked_fast(kind, x, w_prepacked, scales_prepacked, zeros_prepacked,
                                      n, group_size, bias, act, mode, dtype, bytes_of, groups_of,
                                      entry)
        if result is not None:
            return result
    launch = getattr(raw, entry[len("ck_"):])
    with _Call(x, stream) as call:
        xa = call.input(x, "x", dtype, matrix=True, need=_FLOAT_INPUT)
        m, k = _matrix(xa.shape, "x")
        wa = call.input(w_prepacked, "w_prepacked", need=np.uint8)
        _check_array(wa, "w_prepacked", np.uint8, max(bytes_of(n, k), 0))
        nvalues = max(groups_of(n, k, group_size), 0)
        sa = call.input(scales_prepacked, "scales_prepacked", xa.ck_dtype)
        _check_array(sa, "scales_prepacked", sa.dtype, nvalues)
        z_ptr = call.optional_input(zeros_prepacked, "zeros_prepacked", nvalues, need=np.uint8)
        bias_ptr = call.optional_input(bias, "bias", n, xa.ck_dtype)
        out_shape = (n,) if len(xa.shape) == 1 else (m, n)
        o = call.output(out_shape, _NUMPY_OF[xa.ck_dtype], xa.ck_dtype, out, "out")
        launch(xa.ptr, xa.ck_dtype, wa.ptr, sa.ptr, z_ptr, group_size, mode, bias_ptr, act, m, n,
               k, o.ptr, call.stream)
        return call.finish(o)


# The block each format's GEMM reads (cuda_kernels.h): NF4 32, 64 or 128, MXFP4 32, NVFP4 16.
_BLOCK4_FORMATS = {"nf4": BLOCK4_NF4, "mxfp4": BLOCK4_MXFP4, "nvfp4": BLOCK4_NVFP4}
_BLOCK4_DEFAULT_BLOCK = {BLOCK4_NF4: 64, BLOCK4_MXFP4: MXFP4_BLOCK, BLOCK4_NVFP4: NVFP4_BLOCK}


def _block4_format(value, blocksize):
    """(format enum, blocksize) from "nf4" / "mxfp4" / "nvfp4" (or the int itself) and a
    blocksize (None: the format's, 64 for NF4)."""
    fmt = _named_enum(value, "format", "'nf4', 'mxfp4' or 'nvfp4'", _BLOCK4_FORMATS)
    if blocksize is None:
        blocksize = _BLOCK4_DEFAULT_BLOCK.get(fmt, 0)
    return fmt, int(blocksize)


def block4_prepack(format, packed, scales, blocksize=None, stream=None):
    """Converts a block 4-bit weight as :func:`quantize_nf4` / :func:`quantize_mxfp4` /
    :func:`quantize_nvfp4` write it for an [N, K] matrix (packed uint8 [N, K // 2]; scales
    [N, K // blocksize]: float32 absmax for NF4, uint8 for MXFP4 and NVFP4) into the layout of
    :func:`gemm_block4_prepacked` (ck_block4_prepack). format: "nf4", "mxfp4" or "nvfp4";
    blocksize: NF4's (32, 64 or 128; default 64), None for the others. Returns (w_prepacked
    uint8, scales_prepacked uint8), flat arrays sized by ck_w4a16_prepacked_bytes and
    ck_block4_prepacked_scales_bytes. NVFP4's global scale stays with the caller.
    """
    fmt, block = _block4_format(format, blocksize)
    scales_dtype = np.float32 if fmt == BLOCK4_NF4 else np.uint8
    with _Call(packed, stream) as call:
        pa, n, k = _packed_weight(call, packed, "packed")
        sa = call.input(scales, "scales", need=scales_dtype)
        if block > 0:
            _check_array(sa, "scales", scales_dtype, n * (k // block))
        w_bytes = raw.w4a16_prepacked_bytes(n, k)
        s_bytes = raw.block4_prepacked_scales_bytes(fmt, n, k, block)
        if w_bytes <= 0 or s_bytes <= 0:
            raise ValueError("n=%d, k=%d, format=%r, blocksize=%r cannot be prepacked (K a "
                             "multiple of 32 and of the blocksize; cuda_kernels.h)"
                             % (n, k, format, blocksize))
        w_out = call.output((w_bytes,), np.uint8, DType.UINT8, None, "w_prepacked")
        s_out = call.output((s_bytes,), np.uint8, DType.UINT8, None, "scales_prepacked")
        raw.block4_prepack(fmt, pa.ptr, sa.ptr, n, k, block, w_out.ptr, s_out.ptr, call.stream)
        return call.finish(w_out, s_out)


def gemm_block4_prepacked(x, format, w_prepacked, scales_prepacked, n, blocksize=None,
                          global_scale=None, bias=None, activation=None, out=None, dtype=None,
                          stream=None):
    """Weight-only GEMM on a block 4-bit weight prepared by :func:`block4_prepack`
    (ck_gemm_block4_prepacked): out = act(x @ w'.T + bias), w' the weight as the format's
    dequantizer writes it in the dtype of x. x [M, K] (or [K]) fp16 or bf16 (uint16 with
    dtype="bf16"); n: the weight's N; global_scale: NVFP4's float32 (one value or a Python
    float), None for NF4 and MXFP4. Returns [M, N] (or [N]) in the dtype of x.
    """
    if n is None or int(n) < 1:
        raise ValueError("n (the weight's number of rows) must be given and >= 1")
    n = int(n)
    fmt, block = _block4_format(format, blocksize)
    act = _activation(activation)
    with _Call(x, stream) as call:
        xa = call.input(x, "x", dtype, matrix=True, need=_FLOAT_INPUT)
        m, k = _matrix(xa.shape, "x")
        wa = call.input(w_prepacked, "w_prepacked", need=np.uint8)
        _check_array(wa, "w_prepacked", np.uint8, max(raw.w4a16_prepacked_bytes(n, k), 0))
        sa = call.input(scales_prepacked, "scales_prepacked", need=np.uint8)
        _check_array(sa, "scales_prepacked", np.uint8,
                     max(raw.block4_prepacked_scales_bytes(fmt, n, k, block), 0))
        g_ptr = 0
        if global_scale is not None:
            g = call.input(global_scale, "global_scale", scalar_dtype=np.float32)
            _check_array(g, "global_scale", np.float32, 1)
            g_ptr = g.ptr
        bias_ptr = call.optional_input(bias, "bias", n, xa.ck_dtype)
        out_shape = (n,) if len(xa.shape) == 1 else (m, n)
        o = call.output(out_shape, _NUMPY_OF[xa.ck_dtype], xa.ck_dtype, out, "out")
        raw.gemm_block4_prepacked(xa.ptr, xa.ck_dtype, fmt, wa.ptr, sa.ptr, g_ptr, block,
                                  bias_ptr, act, m, n, k, o.ptr, call.stream)
        return call.finish(o)


_WEIGHT4_FORMATS = {"int4": WEIGHT4_INT4, "nf4": WEIGHT4_NF4, "mxfp4": WEIGHT4_MXFP4,
                    "nvfp4": WEIGHT4_NVFP4}
_WEIGHT4_DEFAULT_GROUP = {"int4": 128, "nf4": 64, "mxfp4": 32, "nvfp4": 16}
_ROPE_STYLES = {None: ROPE_NONE, "none": ROPE_NONE, "neox": ROPE_NEOX,
                "interleaved": ROPE_INTERLEAVED}


def _qkv_layer(format, num_heads_q, num_heads_kv, head_dim, hidden, dtype, group_size, asym,
               rope, rotary_dim):
    """A QkvParams holding one layer's description (the [prepack] fields of ck_qkv_params_t)."""
    if format not in _WEIGHT4_FORMATS:
        raise ValueError("format=%r: one of %s" % (format, sorted(_WEIGHT4_FORMATS)))
    if rope not in _ROPE_STYLES:
        raise ValueError("rope=%r: None, 'neox' or 'interleaved'" % (rope,))
    style = _ROPE_STYLES[rope]
    return QkvParams(
        hidden=hidden, num_heads_q=int(num_heads_q), num_heads_kv=int(num_heads_kv),
        head_dim=int(head_dim), dtype=dtype, format=_WEIGHT4_FORMATS[format],
        group_size=_WEIGHT4_DEFAULT_GROUP[format] if group_size is None else int(group_size),
        mode=INT4_ASYMMETRIC if asym else INT4_SYMMETRIC, rope_style=style,
        rotary_dim=(int(head_dim) if rotary_dim is None else int(rotary_dim)) if style else 0)


def _qkv_rows(params):
    return (params.num_heads_q + 2 * params.num_heads_kv) * params.head_dim


def qkv_prepack(packed, scales, num_heads_q, num_heads_kv, head_dim, format="int4", zeros=None,
                group_size=None, rope=None, rotary_dim=None, dtype=None, stream=None):
    """Prepares the stacked [Wq | Wk | Wv] weight of one attention layer for
    :func:`qkv_projection` (ck_qkv_prepack). packed uint8 [N, H // 2] and scales as the format's
    quantizer writes them for the [N, H] weight, N = (num_heads_q + 2 num_heads_kv) head_dim:
    format "int4" (:func:`quantize_int4`: scales fp16/bf16 [N, groups], zeros or None),
    "nf4" (float32 absmax), "mxfp4" or "nvfp4" (uint8 scales). group_size: INT4's group (default
    128) or NF4's blocksize (default 64). rope: None, "neox" or "interleaved" and rotary_dim
    (default head_dim), as the projection will be called. dtype: the layer's activation dtype
    (INT4: the scales'). Returns (w_prepacked uint8, scales_prepacked uint8 bytes,
    zeros_prepacked uint8 or None).
    """
    with _Call(packed, stream) as call:
        pa, n, k = _packed_weight(call, packed, "packed", "H")
        int4 = format == "int4"
        need = None if int4 else np.float32 if format == "nf4" else np.uint8
        sa = call.input(scales, "scales", dtype if int4 else None, need=need)
        layer_dtype = sa.ck_dtype if int4 else _as_dtype_enum(dtype or "fp16", "dtype")
        params = _qkv_layer(format, num_heads_q, num_heads_kv, head_dim, k, layer_dtype,
                            group_size, zeros is not None, rope, rotary_dim)
        if _qkv_rows(params) != n:
            raise ValueError("packed has %d rows; the layer's (num_heads_q + 2 num_heads_kv) "
                             "head_dim is %d" % (n, _qkv_rows(params)))
        z_ptr = 0
        if zeros is not None:
            z_ptr = call.input(zeros, "zeros", need=np.uint8).ptr
        w_bytes = raw.w4a16_prepacked_bytes(n, k)
        if int4:
            values = raw.w4a16_prepacked_groups(n, k, params.group_size)
            s_bytes = values * 2
        else:
            values = s_bytes = raw.block4_prepacked_scales_bytes(params.format - 1, n, k,
                                                                 params.group_size)
        if w_bytes <= 0 or values <= 0:
            raise ValueError("n=%d, hidden=%d, format=%r, group_size=%r cannot be prepacked "
                             "(cuda_kernels.h)" % (n, k, format, params.group_size))
        w_out = call.output((w_bytes,), np.uint8, DType.UINT8, None, "w_prepacked")
        s_out = call.output((s_bytes,), np.uint8, DType.UINT8, None, "scales_prepacked")
        z_out = (call.output((values,), np.uint8, DType.UINT8, None, "zeros_prepacked")
                 if zeros is not None else None)
        raw.qkv_prepack(params, pa.ptr, sa.ptr, z_ptr, w_out.ptr, s_out.ptr,
                        z_out.ptr if z_out is not None else 0, call.stream)
        return call.finish(w_out, s_out, z_out)


def qkv_projection(x, w_prepacked, scales_prepacked, num_heads_q, num_heads_kv, head_dim,
                   format="int4", zeros_prepacked=None, group_size=None, global_scale=None,
                   bias=None, rope=None, rotary_dim=None, positions=None, cos_sin=None,
                   dtype=None, stream=None):
    """The fused projection (ck_qkv_projection) on a weight from :func:`qkv_prepack` (the same
    layer arguments): x [T, H] (or [H]) fp16 or bf16 (uint16 with dtype="bf16") ->
    (q [T, Hq, D], k [T, Hkv, D], v [T, Hkv, D]) in the dtype of x. bias: N values in W's row
    order or None; global_scale: NVFP4's float32. With rope: positions int32 [T] and cos_sin
    float32 [max_position, rotary_dim] (cos(p theta_i) for i < R / 2, then sin).
    """
    with _Call(x, stream) as call:
        xa = call.input(x, "x", dtype, matrix=True, need=_FLOAT_INPUT)
        t, k = _matrix(xa.shape, "x")
        params = _qkv_layer(format, num_heads_q, num_heads_kv, head_dim, k, xa.ck_dtype,
                            group_size, zeros_prepacked is not None, rope, rotary_dim)
        n = _qkv_rows(params)
        params.tokens = t
        params.x = xa.ptr
        params.w_prepacked = call.input(w_prepacked, "w_prepacked", need=np.uint8).ptr
        params.scales_prepacked = call.input(scales_prepacked, "scales_prepacked").ptr
        if zeros_prepacked is not None:
            params.zeros_prepacked = call.input(zeros_prepacked, "zeros_prepacked",
                                                need=np.uint8).ptr
        if global_scale is not None:
            g = call.input(global_scale, "global_scale", scalar_dtype=np.float32)
            _check_array(g, "global_scale", np.float32, 1)
            params.global_scale = g.ptr
        params.bias = call.optional_input(bias, "bias", n, xa.ck_dtype)
        if params.rope_style != ROPE_NONE:
            if positions is None or cos_sin is None:
                raise ValueError("rope=%r needs positions and cos_sin" % (rope,))
            pos = call.input(positions, "positions", need=np.int32)
            _check_array(pos, "positions", np.int32, t)
            table = call.input(cos_sin, "cos_sin", need=np.float32)
            if len(table.shape) != 2 or table.shape[1] != params.rotary_dim:
                raise ValueError("cos_sin must be float32 [max_position, rotary_dim=%d], not of "
                                 "shape %s" % (params.rotary_dim, table.shape))
            params.positions, params.cos_sin = pos.ptr, table.ptr
            params.max_position = table.shape[0]
        np_dtype = _NUMPY_OF[xa.ck_dtype]
        hq, hkv, d = params.num_heads_q, params.num_heads_kv, params.head_dim
        q = call.output((t, hq, d), np_dtype, xa.ck_dtype, None, "q")
        kk = call.output((t, hkv, d), np_dtype, xa.ck_dtype, None, "k")
        v = call.output((t, hkv, d), np_dtype, xa.ck_dtype, None, "v")
        params.q, params.k, params.v = q.ptr, kk.ptr, v.ptr
        raw.qkv_projection(params, call.stream)
        return call.finish(q, kk, v)


class QkvProjection:
    """The fused Q/K/V projection of one attention layer, its weight on the GPU, prepacked:
    (q, k, v) = split(x @ [Wq | Wk | Wv].T + bias), RoPE on q and k (ck_qkv_projection).

    Build it from a float weight (:meth:`from_float`: quantized on the device in `format`,
    "int4", "nf4", "mxfp4" or "nvfp4") or from the format's quantized storage (the
    constructor). Call it on NumPy data (NumPy results) or on CUDA arrays (results of their
    kind); positions: int32 [T] when the layer rotates. The weight is the checkpoint's q_proj,
    k_proj and v_proj stacked in that order ([N, hidden], N = (num_heads_q + 2 num_heads_kv)
    head_dim); cos_sin: float32 [max_position, rotary_dim] (cos, then sin; see cuda_kernels.h).
    """

    def __init__(self, packed, scales, num_heads_q, num_heads_kv, head_dim, format="int4",
                 zeros=None, group_size=None, global_scale=None, bias=None, rope=None,
                 rotary_dim=None, cos_sin=None, dtype=None):
        like = next((a for a in (packed, scales) if _is_device(a)), None)
        packed, scales = (_to_device(a, None, like) for a in (packed, scales))
        zeros = None if zeros is None else _to_device(zeros, None, like)
        if format == "int4":
            self.dtype = _device_ck_dtype(scales, dtype, "scales")
        else:
            self.dtype = _as_dtype_enum(dtype or "fp16", "dtype")
        if self.dtype not in (DType.FP16, DType.BF16):
            raise TypeError("QkvProjection runs in fp16 or bf16, not %s" % self.dtype.name)
        if rope is not None and cos_sin is None:
            raise ValueError("rope=%r needs the cos_sin table" % (rope,))
        self.layer = dict(num_heads_q=num_heads_q, num_heads_kv=num_heads_kv,
                          head_dim=head_dim, format=format, group_size=group_size, rope=rope,
                          rotary_dim=rotary_dim)
        self.prepacked = qkv_prepack(packed, scales, zeros=zeros, dtype=self.dtype,
                                     **self.layer)
        like = self.prepacked[0]
        self.global_scale = None if global_scale is None else _to_device(
            np.asarray(global_scale, np.float32).reshape(1) if not _is_device(global_scale)
            else global_scale, None, like)
        self.bias = None if bias is None else _to_device(_layer_host_cast(bias, self.dtype),
                                                         self.dtype, like)
        self.cos_sin = None if cos_sin is None else _to_device(
            cos_sin if _is_device(cos_sin) else np.asarray(cos_sin, np.float32), None, like)

    @classmethod
    def from_float(cls, weight, num_heads_q, num_heads_kv, format="int4", group_size=None,
                   bias=None, rope=None, rotary_dim=None, cos_sin=None, dtype=None):
        """weight [N, hidden] fp16 or bf16 (uint16 bit patterns with dtype="bf16"; float32 NumPy
        weights are converted to fp16 first), quantized on the device: INT4 symmetric groups
        (default 128), NF4 blocks (default 64), MXFP4 or NVFP4 (its own global scale)."""
        wd, layer_dtype = _float_weight_on_device(weight, dtype)
        rows = _cai(wd, "weight")[1][0]
        if rows % (num_heads_q + 2 * num_heads_kv):
            raise ValueError("weight has %d rows, not a multiple of num_heads_q + 2 num_heads_kv"
                             % rows)
        head_dim = rows // (num_heads_q + 2 * num_heads_kv)
        group = _WEIGHT4_DEFAULT_GROUP.get(format) if group_size is None else group_size
        zeros = g = None
        if format == "int4":
            packed, scales, zeros = quantize_int4(wd, group_size=group, dtype=layer_dtype)
        elif format == "nf4":
            packed, scales = quantize_nf4(wd, blocksize=group, dtype=layer_dtype)
        elif format == "mxfp4":
            packed, scales = quantize_mxfp4(wd, dtype=layer_dtype)
        elif format == "nvfp4":
            packed, scales, g = quantize_nvfp4(wd, dtype=layer_dtype)
        else:
            raise ValueError("format=%r: one of %s" % (format, sorted(_WEIGHT4_FORMATS)))
        return cls(packed, scales, num_heads_q, num_heads_kv, head_dim, format=format,
                   zeros=zeros, group_size=group, global_scale=g, bias=bias, rope=rope,
                   rotary_dim=rotary_dim, cos_sin=cos_sin, dtype=layer_dtype)

    def __call__(self, x, positions=None, stream=None):
        """x [T, hidden] (or [hidden]) in the layer's dtype -> (q, k, v)."""
        xd, on_host, host_kind = _layer_input(x, self.dtype)
        if positions is not None and not _is_device(positions):
            positions = _to_device(np.asarray(positions, np.int32), None)
        w, s, z = self.prepacked
        q, k, v = qkv_projection(xd, w, s, zeros_prepacked=z, global_scale=self.global_scale,
                                 bias=self.bias, positions=positions, cos_sin=self.cos_sin,
                                 dtype=self.dtype, stream=stream, **self.layer)
        if on_host:
            return tuple(_layer_host_result(a, None, host_kind) for a in (q, k, v))
        return q, k, v


def _checkpoint_int32(call, obj, name):
    a = call.input(obj, name, need=np.int32)
    if len(a.shape) != 2 or 0 in a.shape:
        raise ValueError("%s must be a non-empty int32 matrix, not of shape %s" % (name, a.shape))
    return a


def _import_outputs(call, sa, n, k, group_size, qz, scales_name="scales"):
    groups = _groups(k, group_size)
    if sa.ck_dtype not in (DType.FP16, DType.BF16):
        raise TypeError("%s have dtype %s: fp16 or bf16 (uint16 with dtype='bf16') expected"
                        % (scales_name, sa.dtype))
    _check_array(sa, scales_name, sa.dtype, groups * n)
    if tuple(qz.shape) != (groups, n // 8):
        raise ValueError("qzeros has shape %s, needs (%d, %d)" % (qz.shape, groups, n // 8))
    w = call.output((n, k // 2), np.uint8, DType.UINT8, None, "w_packed")
    s = call.output((n, groups), sa.dtype, sa.ck_dtype, None, "scales")
    z = call.output((n, groups), np.uint8, DType.UINT8, None, "zeros")
    return w, s, z


def import_gptq(qweight, qzeros, scales, g_idx=None, group_size=128, dtype=None, stream=None):
    """Imports a 4-bit GPTQ weight (ck_import_gptq): qweight int32 [K / 8, N], qzeros int32
    [groups, N / 8] (zero points stored minus one, as GPTQ writes them), scales [groups, N]
    fp16 (or bf16), g_idx int32 [K] or None. Returns (w_packed uint8 [N, K / 2], scales
    [N, groups], zeros uint8 [N, groups], perm int32 [K] or None): an asymmetric weight in the
    interchange format. With perm, the layer's input columns must be gathered first:
    x[:, perm] (:func:`permute_columns`). An act-order g_idx must give every group but the last
    exactly group_size rows (checked here on the host).
    """
    with _Call(qweight, stream) as call:
        qw = _checkpoint_int32(call, qweight, "qweight")
        k, n = 8 * qw.shape[0], qw.shape[1]
        qz = _checkpoint_int32(call, qzeros, "qzeros")
        sa = call.input(scales, "scales", dtype)
        w, s, z = _import_outputs(call, sa, n, k, group_size, qz)
        g_ptr, perm = 0, None
        if g_idx is not None:
            _check_act_order(g_idx, k, group_size)
            ga = call.input(g_idx, "g_idx", need=np.int32)
            _check_array(ga, "g_idx", np.int32, k)
            g_ptr = ga.ptr
            perm = call.output((k,), np.int32, DType.INT32, None, "perm")
        raw.import_gptq(qw.ptr, qz.ptr, sa.ptr, g_ptr, sa.ck_dtype, n, k, group_size, w.ptr,
                        s.ptr, z.ptr, perm.ptr if perm is not None else 0, call.stream)
        return call.finish(w, s, z, perm)


def _check_act_order(g_idx, k, group_size):
    """The importer's rule for g_idx: each group but the last holds exactly group_size rows."""
    g = g_idx.to_numpy() if isinstance(g_idx, DeviceArray) else (
        None if _is_device(g_idx) else np.asarray(g_idx))
    if g is None:   # a foreign device array: the caller vouches for it
        return
    size = k if group_size == GROUP_ROW else group_size
    groups = _groups(k, group_size)
    g = g.reshape(-1)
    if g.size != k or g.min() < 0 or g.max() >= groups:
        raise ValueError("g_idx must hold K=%d group indices in [0, %d)" % (k, groups))
    counts = np.bincount(g, minlength=groups)
    expected = np.full(groups, size)
    expected[-1] = k - size * (groups - 1)
    if not np.array_equal(counts, expected):
        raise ValueError("g_idx puts %s rows in the groups; the library needs %d per group "
                         "(the last: %d)" % (counts.tolist()[:8], size, expected[-1]))


def import_awq(qweight, qzeros, scales, group_size=128, dtype=None, stream=None):
    """Imports a 4-bit AWQ weight (ck_import_awq, GEMM layout): qweight int32 [K, N / 8] and
    qzeros int32 [groups, N / 8], both packed along N in AWQ's nibble order 0, 2, 4, 6, 1, 3, 5,
    7; scales [groups, N] fp16 (or bf16). Returns (w_packed uint8 [N, K / 2], scales
    [N, groups], zeros uint8 [N, groups]): an asymmetric weight in the interchange format.
    """
    with _Call(qweight, stream) as call:
        qw = _checkpoint_int32(call, qweight, "qweight")
        k, n = qw.shape[0], 8 * qw.shape[1]
        qz = _checkpoint_int32(call, qzeros, "qzeros")
        sa = call.input(scales, "scales", dtype)
        w, s, z = _import_outputs(call, sa, n, k, group_size, qz)
        raw.import_awq(qw.ptr, qz.ptr, sa.ptr, sa.ck_dtype, n, k, group_size, w.ptr, s.ptr,
                       z.ptr, call.stream)
        return call.finish(w, s, z)


def permute_columns(x, perm, dtype=None, out=None, stream=None):
    """out[r, j] = x[r, perm[j]] (ck_permute_columns): x [rows, cols] (or [cols]) fp32, fp16 or
    bf16; perm int32 [cols]. Returns an array like x."""
    with _Call(x, stream) as call:
        xa = call.input(x, "x", dtype, matrix=True, need=_FLOAT_INPUT)
        rows, cols = _matrix(xa.shape, "x")
        pa = call.input(perm, "perm", need=np.int32)
        _check_array(pa, "perm", np.int32, cols)
        o = call.output(xa.shape, _NUMPY_OF[xa.ck_dtype], xa.ck_dtype, out, "out")
        raw.permute_columns(xa.ptr, xa.ck_dtype, rows, cols, pa.ptr, o.ptr, call.stream)
        return call.finish(o)


def _int4_gemm_shape(aa, ba):
    m, half_k = _matrix(aa.shape, "a_packed")
    if len(ba.shape) != 2 or ba.shape[0] == 0 or ba.shape[1] != half_k:
        raise ValueError("b_packed has shape %s: with a_packed of shape %s it must be [N, %d]"
                         % (ba.shape, aa.shape, half_k))
    n = ba.shape[0]
    return m, n, 2 * half_k, ((n,) if len(aa.shape) == 1 else (m, n))


def gemm_int4(a_packed, b_packed, out=None, stream=None):
    """INT4 x INT4 matrix product with exact int32 results (ck_gemm_int4): a_packed uint8
    [M, K / 2] and b_packed uint8 [N, K / 2], signed int4 two per byte (element 2i in the low
    nibble, as :func:`quantize_int4` packs symmetric codes); out = a @ b.T, int32 [M, N]. The
    library's rules apply: K a multiple of 32."""
    with _Call(a_packed, stream) as call:
        aa = call.input(a_packed, "a_packed", matrix=True, need=np.uint8)
        ba = call.input(b_packed, "b_packed", need=np.uint8)
        m, n, k, out_shape = _int4_gemm_shape(aa, ba)
        c = call.output(out_shape, np.int32, DType.INT32, out, "c")
        raw.gemm_int4(aa.ptr, ba.ptr, m, n, k, c.ptr, call.stream)
        return call.finish(c)


def gemm_int4_scaled(a_packed, b_packed, scale_a, scale_b, bias=None, activation=None,
                     out_dtype="fp32", out=None, stream=None):
    """INT4 x INT4 product with the fused epilogue of :func:`gemm_int8_scaled`
    (ck_gemm_int4_scaled): out = act(float(acc) * scale_a * scale_b + bias), same conventions."""
    act = _activation(activation)
    ck_out = _as_dtype_enum(out_dtype, "out_dtype")
    with _Call(a_packed, stream) as call:
        aa = call.input(a_packed, "a_packed", matrix=True, need=np.uint8)
        ba = call.input(b_packed, "b_packed", need=np.uint8)
        m, n, k, out_shape = _int4_gemm_shape(aa, ba)
        sa, a_gran, sb, b_gran, bias_ptr, o = _epilogue_args(call, scale_a, scale_b, bias, m, n,
                                                             ck_out, out, out_shape)
        raw.gemm_int4_scaled(aa.ptr, ba.ptr, m, n, k, sa.ptr, a_gran, sb.ptr, b_gran, bias_ptr,
                             act, o.ptr, ck_out, call.stream)
        return call.finish(o)


def _layer_host_cast(a, dtype):
    """Host data for a layer of `dtype`: float32 NumPy data for an fp16 layer becomes fp16 (bf16
    data must come as uint16); anything else as it is."""
    if not _is_device(a) and dtype == DType.FP16:
        a = _host_data(a, "x")
        if a.dtype == np.float32:
            return a.astype(np.float16)
    return a


def _layer_input(x, dtype):
    """A layer's input on the device: (xd, on_host, host_kind). A CUDA array is used as it is;
    host data (NumPy, or a CPU tensor of host_kind's framework) is uploaded in the layer's dtype
    (float32 NumPy for an fp16 layer converted first), and its result goes back the host way
    (_layer_host_result)."""
    kind = _kind(x)
    host_kind = None
    if kind is not None and not kind.on_device(x):
        host_kind, x = kind, kind.host_array(x, "x")
    on_host = not _is_device(x)
    return (_to_device(_layer_host_cast(x, dtype), dtype) if on_host else x), on_host, host_kind


def _layer_host_result(y, out, host_kind=None):
    """A layer's host result of its device result y: downloaded into `out` when given (NumPy or
    a CPU tensor), else a NumPy array, or a CPU array of host_kind's framework when the input
    was one."""
    result = y.to_numpy()
    if out is not None:
        out_kind = _kind(out)
        host_out = out_kind.host_array(out, "out") if out_kind is not None else out
        host_out[...] = result.reshape(host_out.shape)
        return out
    return host_kind.from_host(result, y.ck_dtype) if host_kind is not None else result


class Fp8Linear:
    """A W8A8 FP8 linear layer: y = act(x @ w.T + bias), the weight held on the GPU as FP8 E4M3
    with float32 scales per output channel (or per 128 x 128 block with blocks=True, DeepSeek-V3's
    scheme); each call quantizes x to E4M3 on the device with dynamic scales per token (per
    1 x 128 block with blocks=True), then runs :func:`gemm_fp8_scaled`. dtype: the activations'
    and the output's, fp16 or bf16. Inputs and results as :class:`QuantizedLinear`'s (NumPy in,
    NumPy out; torch or CuPy device arrays in, theirs out). Needs FP8 tensor cores (8.9+).
    """

    def __init__(self, weight, scales, dtype="fp16", bias=None, activation=None, blocks=False):
        """From an FP8 weight: weight uint8 E4M3 [out_features, in_features] and its float32
        scales ([out_features], or [ceil(out / 128), ceil(in / 128)] with blocks=True), as
        :func:`quantize_fp8` writes them; host data is uploaded once."""
        self.dtype = _as_dtype_enum(dtype, "dtype")
        if self.dtype not in (DType.FP16, DType.BF16):
            raise TypeError("Fp8Linear runs in fp16 or bf16, not %s" % self.dtype.name)
        self.weight = _to_device(weight, None)
        self.out_features, self.in_features = _cai(self.weight, "weight")[1]
        self.scales = _to_device(scales, None, self.weight)
        self.blocks = bool(blocks)
        self.activation = _activation(activation)
        self.bias = None if bias is None else _to_device(_layer_host_cast(bias, self.dtype),
                                                         self.dtype, self.weight)

    @classmethod
    def from_float(cls, weight, bias=None, dtype=None, activation=None, blocks=False):
        """weight [out_features, in_features] (nn.Linear layout) in fp16 or bf16 (uint16 bit
        patterns with dtype="bf16"; float32 NumPy weights become fp16 first), quantized on the
        device: E4M3 with a dynamic scale per output channel, or per 128 x 128 block."""
        wd, layer_dtype = _float_weight_on_device(weight, dtype)
        wq, ws = quantize_fp8(wd, granularity="block128x128" if blocks else "row",
                              dtype=layer_dtype)
        return cls(wq, ws, layer_dtype, bias=bias, activation=activation, blocks=blocks)

    def __call__(self, x, stream=None):
        """x [M, in_features] (or [in_features]) in the layer's dtype -> [M, out_features]."""
        xd, on_host, host_kind = _layer_input(x, self.dtype)
        q, s = quantize_fp8(xd, granularity="block1x128" if self.blocks else "row",
                            dtype=self.dtype, stream=stream)
        y = gemm_fp8_scaled(q, self.weight, s, self.scales, bias=self.bias,
                            activation=self.activation, out_dtype=self.dtype, stream=stream)
        return _layer_host_result(y, None, host_kind) if on_host else y


_W4A8_GROUP_SIZES = (128, GROUP_ROW)   # ck_gemm_w4a8's groups: a 128-wide k-block, or the row


class W4A8Linear:
    """A W4A8 linear layer: y = act(x @ w'.T + bias), the weight held on the GPU as symmetric
    INT4 codes (w' = q * scale, a scale per 128 input features, or per output channel with
    group_size=GROUP_ROW, in the layer's dtype) as :func:`quantize_int4` writes them; each call
    quantizes x to FP8 E4M3 on the device with a dynamic scale per token (:func:`quantize_fp8`,
    granularity "row"), then runs :func:`gemm_w4a8` on the FP8 tensor cores. Made by
    ``QuantizedLinear.from_float(weight, ..., activations="fp8")`` or :meth:`from_float`.
    dtype: the activations' and the output's, fp16 or bf16; in_features a multiple of 32.
    Inputs and results as :class:`QuantizedLinear`'s (NumPy in, NumPy out; torch or CuPy
    device arrays in, theirs out, on their current stream; other CUDA arrays: DeviceArrays).
    Not captured by torch.compile (no custom operator). Needs FP8 tensor cores (8.9+).
    """

    def __init__(self, w_packed, w_scales, group_size, dtype, bias=None, activation=None):
        """From a symmetric INT4 weight already on the device (DeviceArrays or CUDA arrays):
        w_packed uint8 [out_features, in_features / 2] and w_scales [out_features, groups] of
        dtype, group_size 128 or GROUP_ROW. A host bias is uploaded into an array of the
        weight's kind."""
        self.dtype = _as_dtype_enum(dtype, "dtype")
        if self.dtype not in (DType.FP16, DType.BF16):
            raise TypeError("W4A8Linear runs in fp16 or bf16, not %s" % self.dtype.name)
        if group_size not in _W4A8_GROUP_SIZES:
            raise ValueError("W4A8Linear takes group_size 128 or GROUP_ROW (-1), not %r"
                             % (group_size,))
        shape = _cai(w_packed, "w_packed")[1]
        self.out_features, self.in_features = shape[0], 2 * shape[1]
        self.group_size = group_size
        self.activation = _activation(activation)
        self.weight = w_packed, w_scales   # the interchange format (dequantize_int4 reads it)
        self.bias = None if bias is None else _to_device(_layer_host_cast(bias, self.dtype),
                                                         self.dtype, w_packed)

    @classmethod
    def from_float(cls, weight, bias=None, group_size=128, dtype=None, activation=None):
        """weight [out_features, in_features] (nn.Linear layout) in fp16 or bf16 (uint16 bit
        patterns with dtype="bf16"; float32 NumPy weights become fp16 first), quantized on the
        device to symmetric INT4 (:func:`quantize_int4`), group_size 128 or GROUP_ROW."""
        if group_size not in _W4A8_GROUP_SIZES:
            raise ValueError("W4A8Linear takes group_size 128 or GROUP_ROW (-1), not %r"
                             % (group_size,))
        wd, layer_dtype = _float_weight_on_device(weight, dtype)
        w, s, _ = quantize_int4(wd, group_size=group_size, symmetric=True, dtype=layer_dtype)
        return cls(w, s, group_size, layer_dtype, bias=bias, activation=activation)

    def __call__(self, x, out=None, stream=None):
        """x [M, in_features] (or [in_features]) in the layer's dtype -> [M, out_features]."""
        xd, on_host, host_kind = _layer_input(x, self.dtype)
        q, s = quantize_fp8(xd, granularity="row", dtype=self.dtype, stream=stream)
        w, ws = self.weight
        y = gemm_w4a8(q, s, w, ws, group_size=self.group_size, bias=self.bias,
                      activation=self.activation, out_dtype=self.dtype, scale_dtype=self.dtype,
                      out=None if on_host else out, stream=stream)
        return _layer_host_result(y, out, host_kind) if on_host else y

    def __repr__(self):
        return ("W4A8Linear(in_features=%d, out_features=%d, group_size=%d, dtype=%s)"
                % (self.in_features, self.out_features, self.group_size,
                   self.dtype.name.lower()))


class QuantizedLinear:
    """A W4A16 linear layer whose weight lives on the GPU, prepacked: y = act(x @ w'.T + bias).

    Build it from a float weight (:meth:`from_float`, quantized on the device with
    :func:`quantize_int4`) or from checkpoint tensors (:meth:`from_gptq`, :meth:`from_awq`);
    the layer's arrays are of the kind of the weight given (torch tensors for torch tensors,
    DeviceArrays for NumPy data). Call it on NumPy arrays (NumPy out), torch or CuPy arrays
    (a tensor or array of theirs out, on their current stream) or other CUDA arrays
    (DeviceArray out). dtype is the layer's activation dtype, fp16 or bf16; in_features must be
    a multiple of 32. Under torch.compile a call is the custom operator
    cuda_kernels::w4a16_linear (:func:`torch_ops`). ``from_float(..., activations="fp8")``
    makes the W4A8 layer instead (:class:`W4A8Linear`: the activations quantized to FP8 E4M3
    per token on each call).
    """

    def __init__(self, w_packed, scales, zeros, group_size, dtype, bias=None, activation=None,
                 perm=None):
        """From an interchange-format weight already on the device (DeviceArrays or CUDA
        arrays): w_packed [N, K / 2], scales [N, groups], zeros or None; perm from GPTQ. A host
        bias or perm is uploaded into an array of the weight's kind."""
        self.dtype = _as_dtype_enum(dtype, "dtype")
        if self.dtype not in (DType.FP16, DType.BF16):
            raise TypeError("QuantizedLinear runs in fp16 or bf16, not %s" % self.dtype.name)
        shape = _cai(w_packed, "w_packed")[1]
        self.out_features, self.in_features = shape[0], 2 * shape[1]
        self.group_size = group_size
        self.activation = _activation(activation)
        self.weight = w_packed, scales, zeros   # the interchange format (dequantize_int4 reads it)
        self.prepacked = w4a16_prepack(w_packed, scales, zeros, group_size, dtype=self.dtype)
        like = self.prepacked[0]
        self.bias = None if bias is None else _to_device(_layer_host_cast(bias, self.dtype),
                                                         self.dtype, like)
        self.perm = None if perm is None else _to_device(perm, None, like)
        self._launch = None          # what every call passes the library (_launch_arguments)
        self._torch_tensors = None   # the custom operator and its tensors (_torch_arguments)
        if getattr(_kind(like), "name", None) == "torch":
            self._torch_arguments()

    @classmethod
    def from_float(cls, weight, bias=None, group_size=128, symmetric=True, dtype=None,
                   activation=None, sparsity=None, prune=True, activations=None):
        """weight [out_features, in_features] (nn.Linear layout) in fp16 or bf16 (uint16 bit
        patterns with dtype="bf16"); float32 NumPy weights are converted to fp16 first. bias:
        None or out_features values. sparsity "2:4" or "16:32": a SparseQuantizedLinear on the
        weight pruned to that pattern (prune=False: the weight must keep it already, else
        ValueError), group_size 64 or 128. activations: None, the activations in the layer's
        fp16 or bf16 (W4A16: this class); "fp8", a :class:`W4A8Linear` (W4A8: each call's
        activations quantized per token to FP8 E4M3, the product on the FP8 tensor cores,
        compute capability 8.9+), which takes a symmetric weight (symmetric=False: ValueError),
        group_size 128 or GROUP_ROW, and no sparsity (ValueError)."""
        if activations is not None:
            if activations != "fp8":
                raise ValueError("activations=%r: use None (fp16/bf16 activations, W4A16) or "
                                 "'fp8' (FP8 E4M3 activations, W4A8)" % (activations,))
            if not symmetric:
                raise ValueError("activations='fp8' needs a symmetric weight (ck_gemm_w4a8 "
                                 "takes no zero points): symmetric=True")
            if sparsity is not None:
                raise ValueError("activations='fp8' has no structured-sparse kernel: "
                                 "sparsity=None")
            return W4A8Linear.from_float(weight, bias=bias, group_size=group_size, dtype=dtype,
                                         activation=activation)
        wd, layer_dtype = _float_weight_on_device(weight, dtype)
        if sparsity is not None:
            if prune:
                wd = sparse_prune(wd, sparsity, dtype=layer_dtype)
            codes, meta, scales, zeros = sparse_quantize_int4(
                wd, sparsity, group_size=group_size, symmetric=symmetric, dtype=layer_dtype)
            return SparseQuantizedLinear(codes, meta, scales, zeros, sparsity, group_size,
                                         layer_dtype, bias=bias, activation=activation)
        w, s, z = quantize_int4(wd, group_size=group_size, symmetric=symmetric,
                                dtype=layer_dtype)
        return cls(w, s, z, group_size, layer_dtype, bias=bias, activation=activation)

    @classmethod
    def from_gptq(cls, qweight, qzeros, scales, g_idx=None, bias=None, group_size=128,
                  dtype=None, activation=None):
        """From GPTQ tensors (see :func:`import_gptq`); an act-order g_idx is honoured by
        gathering the input columns before each product."""
        like = next((a for a in (qweight, qzeros, scales) if _is_device(a)), None)
        dev = [_to_device(a, None, like) for a in (qweight, qzeros)]
        sd = _to_device(scales, dtype, like)
        gd = None if g_idx is None else _host_data(g_idx, "g_idx") if not _is_device(g_idx) \
            else g_idx
        w, s, z, perm = import_gptq(dev[0], dev[1], sd, g_idx=gd, group_size=group_size,
                                    dtype=dtype)
        return cls(w, s, z, group_size, _device_ck_dtype(sd, dtype, "scales"), bias=bias,
                   activation=activation, perm=perm)

    @classmethod
    def from_awq(cls, qweight, qzeros, scales, bias=None, group_size=128, dtype=None,
                 activation=None):
        """From AWQ tensors (see :func:`import_awq`)."""
        like = next((a for a in (qweight, qzeros, scales) if _is_device(a)), None)
        dev = [_to_device(a, None, like) for a in (qweight, qzeros)]
        sd = _to_device(scales, dtype, like)
        w, s, z = import_awq(dev[0], dev[1], sd, group_size=group_size, dtype=dtype)
        return cls(w, s, z, group_size, _device_ck_dtype(sd, dtype, "scales"), bias=bias,
                   activation=activation)

    def __call__(self, x, out=None, stream=None):
        """x [M, in_features] (or [in_features]) in the layer's dtype -> [M, out_features]."""
        if _torch_compiling():
            return self._torch_call(x, out, stream)
        kind = _kind(x)
        host_kind = None
        if kind is not None:
            if kind.on_device(x):
                if self._torch_tensors is None and kind.name == "torch":
                    self._torch_arguments()
                if out is None and stream is None:
                    y = self._fast_call(kind, x)
                    if y is not None:
                        return y
            else:   # a CPU tensor: its data goes the NumPy way, the result comes back a tensor
                host_kind, x = kind, kind.host_array(x, "x")
        on_host = not _is_device(x)
        xd = _to_device(_layer_host_cast(x, self.dtype), self.dtype) if on_host else x
        if self.perm is not None:
            xd = permute_columns(xd, self.perm, dtype=self.dtype, stream=stream)
        w, s, z = self.prepacked
        y = gemm_w4a16_prepacked(xd, w, s, z, n=self.out_features, group_size=self.group_size,
                                 bias=self.bias, activation=self.activation,
                                 out=None if on_host else out, dtype=self.dtype, stream=stream)
        return _layer_host_result(y, out, host_kind) if on_host else y

    def _launch_arguments(self):
        """What every call of _fast_call passes the library, read once (again only where one
        of the attributes it comes from is replaced): (those attributes: prepacked, bias, perm,
        dtype, group_size, activation; the device of the weight or None when not known; the
        NumPy storage of x; the address of perm (0: none); and the launch's constant arguments:
        dtype, the addresses of w, scales, zeros, group_size, the int4 mode, the address of
        bias, activation, N, K, as the ints that _fast_entries takes)."""
        w, s, z = self.prepacked
        arrays = ((w, "w_prepacked"), (s, "scales_prepacked"), (z, "zeros_prepacked"),
                  (self.bias, "bias"), (self.perm, "perm"))
        w_ptr, s_ptr, z_ptr, bias_ptr, perm_ptr = [0 if a is None else _cai(a, name)[0]
                                                   for a, name in arrays]
        mode = INT4_SYMMETRIC if z is None else INT4_ASYMMETRIC
        for a in (w, s, z, self.bias, self.perm):   # read by _fast_call, which records nothing
            _untrack(a)
        constants = (int(self.dtype), w_ptr, s_ptr, z_ptr, int(self.group_size), int(mode),
                     bias_ptr, int(self.activation), int(self.out_features),
                     int(self.in_features))
        self._launch = (self.prepacked, self.bias, self.perm, self.dtype, self.group_size,
                        self.activation, _device_of(w), _NUMPY_OF[self.dtype], perm_ptr,
                        constants)
        return self._launch

    def _fast_call(self, kind, x):
        """The common call without _Call: a C-contiguous CUDA array of the layer's dtype with
        in_features columns, on the weight's device (the current device), on its framework's
        current stream; the result (and a permuted copy of x) from its framework. None where
        any of that does not hold: the general path takes the call (and says what is wrong)."""
        launch = self._launch
        if launch is None or launch[0] is not self.prepacked or launch[1] is not self.bias or \
                launch[2] is not self.perm or launch[3] is not self.dtype or \
                launch[4] is not self.group_size or launch[5] is not self.activation:
            launch = self._launch_arguments()
        device, np_dtype, perm, (dtype, w, s, z, group_size, mode, bias, activation, n, k) = \
            launch[6:]
        index = kind.current_device()
        view = kind.fast_view(x, index, np_dtype)
        if view is None or (device is not None and index != device):
            return None
        ptr, shape, _ = view
        if len(shape) == 2:
            m, out_shape = shape[0], (shape[0], self.out_features)
        elif len(shape) == 1:
            m, out_shape = 1, (self.out_features,)
        else:
            return None
        if shape[-1] != self.in_features or m == 0:
            return None
        stream = kind.stream(index)
        y, y_ptr = kind.fast_empty(out_shape, self.dtype, index)
        if perm:
            permuted, permuted_ptr = kind.fast_empty(shape, self.dtype, index)
            entry = _fast_entries.ck_permute_columns
            status = entry(ptr, dtype, m, k, perm, permuted_ptr, stream)
            if status:
                _raise_for_status(status, entry, ())
            ptr = permuted_ptr
        entry = _fast_entries.ck_gemm_w4a16_prepacked
        status = entry(ptr, dtype, w, s, z, group_size, mode, bias, activation, m, n, k, y_ptr,
                       stream)
        if status:
            _raise_for_status(status, entry, ())
        return y

    def _torch_arguments(self):
        """Sets _torch_tensors to (the custom operator, w, scales, zeros, bias, perm as torch
        tensors): what a call under torch.compile passes cuda_kernels::w4a16_linear. Made
        outside the trace: when the layer is built from torch tensors, or at its first call on
        one (False where this torch has no custom operators, or cannot view the arrays)."""
        w, s, z = self.prepacked
        try:
            self._torch_tensors = (torch_ops().w4a16_linear,) + tuple(
                None if a is None else
                _as_torch(a, self.dtype if a is s or a is self.bias else None)
                for a in (w, s, z, self.bias, self.perm))
        except (RuntimeError, TypeError, ValueError):   # eager calls do not need them
            self._torch_tensors = False

    def _torch_call(self, x, out, stream):
        """A call while torch.compile traces: the custom operator, one node of the graph."""
        if out is not None or stream is not None:
            raise ValueError("QuantizedLinear under torch.compile takes no out= or stream= "
                             "(the operator returns a new tensor on the current stream)")
        if not self._torch_tensors:
            raise RuntimeError("QuantizedLinear under torch.compile needs its weights as torch "
                               "tensors and torch 2.4 or later: build the layer from torch "
                               "tensors, or call it once on a torch tensor before compiling")
        op, w, s, z, bias, perm = self._torch_tensors
        return op(x, w, s, z, bias, perm, self.out_features, self.group_size, self.activation)

    def __repr__(self):
        return ("QuantizedLinear(in_features=%d, out_features=%d, group_size=%d, dtype=%s%s)"
                % (self.in_features, self.out_features, self.group_size,
                   self.dtype.name.lower(), ", act-order" if self.perm is not None else ""))


# ------------------------------------------------------------------------------------------------
# Structured-sparse INT4 weights (2:4, 16:32 along K)
# ------------------------------------------------------------------------------------------------
_SPARSITIES = {"2:4": SPARSITY_2_4, "16:32": SPARSITY_16_32}
_SPARSE_PACK_K = 128   # the prepacked 2:4 layout's chunk of K


def _sparsity(value):
    return _named_enum(value, "sparsity", "'2:4' or '16:32'", _SPARSITIES)


def sparse_prune(w, sparsity="2:4", dtype=None, stream=None, out=None):
    """Prunes w [N, K] (fp32, fp16, or bf16 with dtype="bf16") to the pattern along K
    (ck_sparse_prune): in every block of 4 ("2:4") or 32 ("16:32") the half of largest |w|
    keeps its bits, the others become +0 (ties: the lower k; NaN ranks lowest). Returns the
    pruned [N, K] in the dtype of w."""
    sp = _sparsity(sparsity)
    with _Call(w, stream) as call:
        wa = call.input(w, "w", dtype, matrix=True, need=_FLOAT_INPUT)
        n, k = _matrix(wa.shape, "w")
        o = call.output(wa.shape, wa.dtype, wa.ck_dtype, out, "out")
        raw.sparse_prune(wa.ptr, wa.ck_dtype, sp, n, k, o.ptr, call.stream)
        return call.finish(o)


def sparse_quantize_int4(w, sparsity="2:4", group_size=128, symmetric=True, dtype=None,
                         stream=None, check=True):
    """Compresses and INT4-quantizes a weight w [N, K] that keeps the pattern
    (ck_sparse_quantize_int4). Returns (codes uint8 [N, K / 4], meta [N, K / 32] (uint32 words,
    held as int32 bit patterns in torch and CuPy), scales [N, K / group_size] in the dtype of w,
    zeros uint8 or None). group_size 64 or 128, in dense k. check: read back the number of
    blocks that break the pattern and raise ValueError if there are any (this waits for the
    stream); prune first (:func:`sparse_prune`) to make any weight fit."""
    sp = _sparsity(sparsity)
    mode = INT4_SYMMETRIC if symmetric else INT4_ASYMMETRIC
    with _Call(w, stream) as call:
        wa = call.input(w, "w", dtype, matrix=True, need=_FLOAT_INPUT)
        n, k = _matrix(wa.shape, "w")
        groups = max(k // group_size, 1) if group_size in (64, 128) else 1
        meta_np = np.uint32 if call.kind is None else np.int32
        c = call.output((n, max(k // 4, 1)), np.uint8, DType.UINT8, None, "codes")
        m = call.output((n, max(k // 32, 1)), meta_np, DType.INT32, None, "meta")
        sc = call.output((n, groups), wa.dtype, wa.ck_dtype, None, "scales")
        z = None if symmetric else call.output((n, groups), np.uint8, DType.UINT8, None, "zeros")
        count = DeviceArray.empty((1,), np.int32, stream=call.stream) if check else None
        raw.sparse_quantize_int4(wa.ptr, wa.ck_dtype, sp, n, k, group_size, mode, c.ptr, m.ptr,
                                 sc.ptr, z.ptr if z is not None else 0,
                                 count.ptr if count is not None else 0, call.stream)
        result = call.finish(c, m, sc, z)
    if count is not None:
        violations = int(count.to_numpy()[0])
        if violations:
            raise ValueError("w breaks the %s pattern in %d blocks (more than half of a block "
                             "non-zero): prune it first (sparse_prune)"
                             % (sparsity if isinstance(sparsity, str) else
                                ("2:4", "16:32")[sp], violations))
    return result


def sparse_1632_to_24(masks, stream=None):
    """The 2:4 metadata [N, K / 32] of a 16:32 weight's masks (ck_sparse_1632_to_24), for a
    weight whose every block of 4 k keeps exactly 2 positions: its codes, scales and zeros then
    serve as a 2:4 weight's (:func:`sparse_w4a16_prepack`). ValueError where a block keeps
    another count (this reads the count back: it waits for the stream)."""
    with _Call(masks, stream) as call:
        ma = call.input(masks, "masks", matrix=True)
        if ma.dtype.itemsize != 4:
            raise TypeError("masks must be 32-bit words ([N, K / 32]), not %s" % ma.dtype)
        n, words = _matrix(ma.shape, "masks")
        meta_np = np.uint32 if call.kind is None else np.int32
        m = call.output((n, words), meta_np, DType.INT32, None, "meta_24")
        count = DeviceArray.empty((1,), np.int32, stream=call.stream)
        raw.sparse_1632_to_24(ma.ptr, n, 32 * words, m.ptr, count.ptr, call.stream)
        result = call.finish(m)
    bad = int(count.to_numpy()[0])
    if bad:
        raise ValueError("%d blocks of 4 keep other than 2 positions: the 16:32 weight is not "
                         "a 2:4 one" % bad)
    return result


def _sparse_weight(call, codes, meta, scales, zeros, group_size, dtype):
    """The device arrays of a sparse weight in the format of cuda_kernels.h: (codes, meta,
    scales, zeros pointer, N, K)."""
    ca = call.input(codes, "codes", matrix=True, need=np.uint8)
    n, k = ca.shape[0], 4 * ca.shape[1]
    ma = call.input(meta, "meta")
    if ma.size != n * (k // 32) or ma.dtype.itemsize != 4:
        raise ValueError("meta must hold %d 32-bit words ([N, K / 32]), not %s %s"
                         % (n * (k // 32), ma.shape, ma.dtype))
    sa = call.input(scales, "scales", dtype)
    groups = k // group_size if group_size in (64, 128) else 0
    _check_array(sa, "scales", sa.dtype, n * groups)
    z_ptr = call.optional_input(zeros, "zeros", n * groups, need=np.uint8)
    return ca, ma, sa, z_ptr, n, k


def sparse_dequantize_int4(codes, meta, scales, zeros=None, sparsity="2:4", group_size=128,
                           out_dtype=None, stream=None):
    """The dense weight [N, K] of a sparse INT4 weight (ck_sparse_dequantize_int4), in the
    dtype of its scales (out_dtype="bf16" marks uint16 scales as bfloat16)."""
    sp = _sparsity(sparsity)
    mode = INT4_SYMMETRIC if zeros is None else INT4_ASYMMETRIC
    with _Call(codes, stream) as call:
        ca, ma, sa, z_ptr, n, k = _sparse_weight(call, codes, meta, scales, zeros, group_size,
                                                 out_dtype)
        o = call.output((n, k), sa.dtype, sa.ck_dtype, None, "out")
        raw.sparse_dequantize_int4(ca.ptr, ma.ptr, sa.ptr, z_ptr, sp, n, k, group_size, mode,
                                   o.ptr, sa.ck_dtype, call.stream)
        return call.finish(o)


def sparse_w4a16_prepack(codes, meta, scales, zeros=None, group_size=128, dtype=None,
                         stream=None):
    """Converts a 2:4 weight (the arrays of :func:`sparse_quantize_int4`, fp16 or bf16 scales)
    into the layout of the sparse tensor-core kernel (ck_sparse_w4a16_prepack; K a multiple of
    128). Returns (w_prepacked uint8, scales_prepacked, zeros_prepacked or None), flat."""
    def launch(ca, ma, sa, z_ptr, mode, n, k, w_ptr, s_ptr, z_out_ptr, stream):
        raw.sparse_w4a16_prepack(ca.ptr, ma.ptr, sa.ptr, z_ptr, sa.ck_dtype, n, k, group_size,
                                 mode, w_ptr, s_ptr, z_out_ptr, stream)
    return _sparse_prepack(codes, meta, scales, zeros, group_size, dtype, stream,
                           raw.sparse_w4a16_prepacked_bytes, raw.sparse_w4a16_prepacked_groups,
                           launch, "K a multiple of 128, group_size 64 or 128")


def sparse_w4a16_prepack_dense(codes, meta, scales, zeros=None, sparsity="16:32",
                               group_size=128, dtype=None, stream=None):
    """A sparse weight of either pattern (the arrays of :func:`sparse_quantize_int4`, fp16 or
    bf16 scales) as a dense INT4 weight in the layout of :func:`w4a16_prepack`, pruned positions
    holding the code of 0 (ck_sparse_w4a16_prepack_dense), for :func:`gemm_w4a16_prepacked`:
    the fast path of a 16:32 weight. Returns (w_prepacked uint8, scales_prepacked,
    zeros_prepacked or None), flat."""
    sp = _sparsity(sparsity)

    def launch(ca, ma, sa, z_ptr, mode, n, k, w_ptr, s_ptr, z_out_ptr, stream):
        raw.sparse_w4a16_prepack_dense(ca.ptr, ma.ptr, sa.ptr, z_ptr, sp, sa.ck_dtype, n, k,
                                       group_size, mode, w_ptr, s_ptr, z_out_ptr, stream)
    return _sparse_prepack(codes, meta, scales, zeros, group_size, dtype, stream,
                           raw.w4a16_prepacked_bytes, raw.w4a16_prepacked_groups, launch,
                           "group_size 64 or 128")


def _sparse_prepack(codes, meta, scales, zeros, group_size, dtype, stream, bytes_of, groups_of,
                    launch, requirement):
    """What the prepacks of a sparse weight share: the weight's arrays checked, the outputs
    sized by bytes_of(n, k) and groups_of(n, k, group_size), then launch."""
    mode = INT4_SYMMETRIC if zeros is None else INT4_ASYMMETRIC
    with _Call(codes, stream) as call:
        ca, ma, sa, z_ptr, n, k = _sparse_weight(call, codes, meta, scales, zeros, group_size,
                                                 dtype)
        nbytes = bytes_of(n, k)
        nvalues = groups_of(n, k, group_size) if group_size in (64, 128) else 0
        if nbytes <= 0 or nvalues <= 0:
            raise ValueError("n=%d, k=%d, group_size=%r cannot be prepacked (%s)"
                             % (n, k, group_size, requirement))
        w_out = call.output((nbytes,), np.uint8, DType.UINT8, None, "w_prepacked")
        s_out = call.output((nvalues,), sa.dtype, sa.ck_dtype, None, "scales_prepacked")
        z_out = (call.output((nvalues,), np.uint8, DType.UINT8, None, "zeros_prepacked")
                 if zeros is not None else None)
        launch(ca, ma, sa, z_ptr, mode, n, k, w_out.ptr, s_out.ptr,
               z_out.ptr if z_out is not None else 0, call.stream)
        return call.finish(w_out, s_out, z_out)


def gemm_sparse_w4a16(x, codes, meta, scales, zeros=None, sparsity="2:4", group_size=128,
                      bias=None, activation=None, out=None, dtype=None, stream=None):
    """out = act(x @ w'.T + bias) on a sparse INT4 weight in the format of
    :func:`sparse_quantize_int4` (ck_gemm_sparse_w4a16: either pattern, a simple tiled kernel;
    prepack a 2:4 weight for the tensor cores). Returns [M, N] (or [N]) in the dtype of x."""
    sp = _sparsity(sparsity)
    act = _activation(activation)
    mode = INT4_SYMMETRIC if zeros is None else INT4_ASYMMETRIC
    with _Call(x, stream) as call:
        xa = call.input(x, "x", dtype, matrix=True, need=_FLOAT_INPUT)
        m, k = _matrix(xa.shape, "x")
        ca, ma, sa, z_ptr, n, wk = _sparse_weight(call, codes, meta, scales, zeros, group_size,
                                                  xa.ck_dtype)
        if wk != k:
            raise ValueError("x has K=%d, the weight K=%d" % (k, wk))
        bias_ptr = call.optional_input(bias, "bias", n, xa.ck_dtype)
        out_shape = (n,) if len(xa.shape) == 1 else (m, n)
        o = call.output(out_shape, _NUMPY_OF[xa.ck_dtype], xa.ck_dtype, out, "out")
        raw.gemm_sparse_w4a16(xa.ptr, xa.ck_dtype, sp, ca.ptr, ma.ptr, sa.ptr, z_ptr, group_size,
                              mode, bias_ptr, act, m, n, k, o.ptr, call.stream)
        return call.finish(o)


def gemm_sparse_w4a16_prepacked(x, w_prepacked, scales_prepacked, zeros_prepacked=None, n=None,
                                group_size=128, bias=None, activation=None, out=None, dtype=None,
                                stream=None):
    """:func:`gemm_sparse_w4a16` on a 2:4 weight prepared by :func:`sparse_w4a16_prepack`
    (ck_gemm_sparse_w4a16_prepacked: the sparse tensor cores). n: the weight's N (the
    prepacked arrays are padded)."""
    return _gemm_prepacked(x, w_prepacked, scales_prepacked, zeros_prepacked, n, group_size, bias,
                           activation, out, dtype, stream, raw.sparse_w4a16_prepacked_bytes,
                           raw.sparse_w4a16_prepacked_groups, "ck_gemm_sparse_w4a16_prepacked")


class SparseQuantizedLinear(QuantizedLinear):
    """A W4A16 linear layer on a structured-sparse INT4 weight (2:4 or 16:32 along K), made by
    QuantizedLinear.from_float(..., sparsity=...). A 2:4 weight with in_features a multiple of
    128 runs prepacked on the sparse tensor cores; a 16:32 weight, and a 2:4 one of another
    width, runs prepacked as a dense INT4 weight (its pruned positions the code of 0) on the
    dense W4A16 kernels. Called as QuantizedLinear is, on NumPy, torch, CuPy or other CUDA
    arrays (not captured by torch.compile: no custom operator)."""

    def __init__(self, codes, meta, scales, zeros, sparsity, group_size, dtype, bias=None,
                 activation=None):
        self.dtype = _as_dtype_enum(dtype, "dtype")
        if self.dtype not in (DType.FP16, DType.BF16):
            raise TypeError("QuantizedLinear runs in fp16 or bf16, not %s" % self.dtype.name)
        shape = _cai(codes, "codes")[1]
        self.out_features, self.in_features = shape[0], 4 * shape[1]
        self.sparsity = ("2:4", "16:32")[_sparsity(sparsity)]
        self.group_size = group_size
        self.activation = _activation(activation)
        self.weight = codes, meta, scales, zeros
        # The sparse tensor cores read 2:4 in 128-k chunks; everything else runs dense.
        self.dense = self.sparsity == "16:32" or self.in_features % _SPARSE_PACK_K != 0
        if self.dense:
            self.prepacked = sparse_w4a16_prepack_dense(codes, meta, scales, zeros,
                                                        self.sparsity, group_size,
                                                        dtype=self.dtype)
        else:
            self.prepacked = sparse_w4a16_prepack(codes, meta, scales, zeros, group_size,
                                                  dtype=self.dtype)
        self.bias = None if bias is None else _to_device(_layer_host_cast(bias, self.dtype),
                                                         self.dtype, codes)
        self.perm = None
        self._launch = None
        self._torch_tensors = None

    def __call__(self, x, out=None, stream=None):
        """x [M, in_features] (or [in_features]) in the layer's dtype -> [M, out_features]."""
        xd, on_host, host_kind = _layer_input(x, self.dtype)
        common = dict(group_size=self.group_size, bias=self.bias, activation=self.activation,
                      out=None if on_host else out, dtype=self.dtype, stream=stream)
        gemm = gemm_w4a16_prepacked if self.dense else gemm_sparse_w4a16_prepacked
        y = gemm(xd, *self.prepacked, n=self.out_features, **common)
        return _layer_host_result(y, out, host_kind) if on_host else y

    def __repr__(self):
        return ("SparseQuantizedLinear(in_features=%d, out_features=%d, sparsity=%s, "
                "group_size=%d, dtype=%s)" % (self.in_features, self.out_features, self.sparsity,
                                              self.group_size, self.dtype.name.lower()))


def _host_data(a, name):
    """Host data as NumPy: a torch CPU tensor's (bfloat16 as uint16 bits), or np.asarray."""
    kind = _kind(a)
    return kind.host_array(a, name) if kind is not None else np.asarray(a)


def _device_of(a):
    """The device index of a CUDA array where it is known (framework arrays, pool arrays)."""
    kind = _kind(a)
    if kind is not None:
        return kind.device_index(a)
    block = getattr(a, "_block", None)
    return block.device if isinstance(block, _Block) else None


def _device_ck_dtype(a, dtype, name):
    """The library dtype of a CUDA array (dtype: the override given, if any)."""
    override = _as_dtype_enum(dtype, "dtype") if dtype is not None else None
    return _ck_dtype(a, _cai(a, name)[2], override, name)


def _float_weight_on_device(weight, dtype):
    """A layer's float weight on the device, with its library dtype: a device array as it is,
    host data uploaded (float32 NumPy converted to fp16 first unless dtype says otherwise)."""
    if not _is_device(weight):
        weight = _host_data(weight, "weight")
        if weight.dtype == np.float32 and dtype is None:
            weight = weight.astype(np.float16)
    wd = _to_device(weight, dtype)
    return wd, _device_ck_dtype(wd, dtype, "weight")


def _to_device(a, dtype, like=None):
    """A CUDA array as it is; host data (NumPy, a torch CPU tensor) uploaded with ck dtype
    `dtype`: into an array of the kind of `like` (a torch or CuPy array: on its device, on its
    framework's current stream) when one is given, else into a DeviceArray."""
    if _is_device(a):
        return a
    a = np.ascontiguousarray(_host_data(a, "data"))
    ck_dtype = _as_dtype_enum(dtype, "dtype") if dtype is not None else None
    if ck_dtype == DType.BF16 and a.dtype != np.uint16:
        raise TypeError("bf16 data is held as uint16 bit patterns, not %s" % a.dtype)
    kind = _kind(like) if like is not None else None
    if kind is not None and kind.on_device(like):
        buffer, ptr = kind.empty(a.shape, a.dtype, ck_dtype, like)
        cuda.memcpy_htod(ptr, a, stream=kind.stream(kind.device_index(like)))
        return buffer
    return DeviceArray.from_numpy(a, ck_dtype=ck_dtype)


def _as_torch(a, ck_dtype):
    """A torch CUDA tensor of the device array a (itself if it is one; else a view of its
    memory that keeps it alive); bf16 data (ck_dtype BF16, or a DeviceArray's) as bfloat16."""
    kind = _kind(a)
    if kind is not None and kind.name == "torch":
        return a
    torch = _torch_module()
    ptr, shape, dtype, _, _ = _cai(a, "array")
    _untrack(a)   # torch uses it on its streams, which the pool does not see
    bf16 = ck_dtype == DType.BF16 or getattr(a, "ck_dtype", None) == DType.BF16
    # torch reads every integer typestr of the interface; bfloat16 travels as int16 bits.
    view = _InterfaceView(ptr, shape, np.dtype(np.int16) if bf16 else dtype, a)
    t = torch.as_tensor(view)   # on the device that holds the memory
    return t.view(torch.bfloat16) if bf16 else t


class _InterfaceView:
    """A bare __cuda_array_interface__ over another array's memory (owner: kept alive)."""

    def __init__(self, ptr, shape, dtype, owner):
        self.__cuda_array_interface__ = dict(shape=tuple(shape), typestr=dtype.str,
                                             data=(ptr, False), strides=None, version=2)
        self.owner = owner


# ------------------------------------------------------------------------------------------------
# torch custom operators (torch.compile, CUDA graphs)
# ------------------------------------------------------------------------------------------------
_TORCH_OPS = []   # torch.ops.cuda_kernels, once registered
_TORCH_LIBRARY = []   # the torch.library.Library that holds their registrations


def _torch_module():
    """torch (imported here only on a path that asked for torch)."""
    torch = sys.modules.get("torch")
    if torch is None:
        import torch  # noqa: PLC0415 - never at import: torch is no dependency of this module
    return torch


def torch_ops():
    """Registers (once) the library's layers as torch custom operators and returns their
    namespace, torch.ops.cuda_kernels. torch.compile traces each as one node, with the output
    shape from its fake implementation, and CUDA graphs (torch.cuda.graph, mode="reduce-
    overhead") capture it: the operators allocate through torch on the current stream.

    * w4a16_linear(x, w_prepacked, scales_prepacked, zeros_prepacked, bias, perm, n,
      group_size, activation) -> Tensor: QuantizedLinear's forward (perm: a GPTQ act-order
      gather of x's columns, or None; activation: ACTIVATION_NONE / ACTIVATION_RELU).
    * moe_forward(x, w13, w13_scales, w13_zeros, w2, w2_scales, w2_zeros, experts,
      intermediate, group_size, router_logits, top_k, renormalize, topk_ids, topk_weights)
      -> Tensor: :func:`moe_forward` (w13, w2: the moe_prepack triples, spelled out).

    QuantizedLinear and moe_forward call them by themselves while torch.compile traces them.
    They are registered the first time a torch tensor reaches this module, or here; this
    imports torch (nothing else in the module does). Needs torch 2.4 or later.
    """
    if _TORCH_OPS:
        return _TORCH_OPS[0]
    torch = _torch_module()
    with _lib_lock:
        if not _TORCH_OPS:
            if not hasattr(torch.library, "register_fake"):
                raise RuntimeError("torch %s has no torch.library.register_fake: the operators "
                                   "need torch 2.4 or later" % torch.__version__)
            try:   # registered already by another copy of this module (a reload)
                torch.ops.cuda_kernels.w4a16_linear
                torch.ops.cuda_kernels.moe_forward
            except (AttributeError, RuntimeError):
                _register_torch_ops(torch)
            _TORCH_OPS.append(torch.ops.cuda_kernels)
    return _TORCH_OPS[0]


# The torch operators' schemas (what torch.library.custom_op would infer from annotations).
_TORCH_OP_SCHEMAS = {
    "w4a16_linear": "w4a16_linear(Tensor x, Tensor w_prepacked, Tensor scales_prepacked, "
                    "Tensor? zeros_prepacked, Tensor? bias, Tensor? perm, int n, int group_size, "
                    "int activation) -> Tensor",
    "moe_forward": "moe_forward(Tensor x, Tensor w13, Tensor w13_scales, Tensor? w13_zeros, "
                   "Tensor w2, Tensor w2_scales, Tensor? w2_zeros, int experts, int intermediate, "
                   "int group_size, Tensor? router_logits, int? top_k, bool renormalize, "
                   "Tensor? topk_ids, Tensor? topk_weights) -> Tensor",
}


def _w4a16_linear_op(x, w_prepacked, scales_prepacked, zeros_prepacked, bias, perm, n, group_size,
                     activation):
    if perm is not None:
        x = permute_columns(x, perm)
    return gemm_w4a16_prepacked(x, w_prepacked, scales_prepacked, zeros_prepacked, n=n,
                                group_size=group_size, bias=bias, activation=activation)


def _moe_forward_op(x, w13, w13_scales, w13_zeros, w2, w2_scales, w2_zeros, experts,
                    intermediate, group_size, router_logits, top_k, renormalize, topk_ids,
                    topk_weights):
    return moe_forward(x, (w13, w13_scales, w13_zeros), (w2, w2_scales, w2_zeros), experts,
                       intermediate, group_size=group_size, router_logits=router_logits,
                       top_k=top_k, renormalize=renormalize, topk_ids=topk_ids,
                       topk_weights=topk_weights)


def _register_torch_ops(torch):
    """Defines the operators through torch.library.Library: a schema, one implementation for
    every device (CompositeExplicitAutograd: CUDA tensors, and CPU ones as host data) and a
    fake one for tracing. torch.library.custom_op would wrap the same in Python layers of its
    own (an autograd kernel, output checks) that cost 7 us per eager call on the H200 host
    (benchmarks/bench_python_steps.py: 11.2 us for an operator that only allocates, 3.9 us
    this way). No autograd formula: these are inference operators."""
    lib = torch.library.Library("cuda_kernels", "FRAGMENT")
    for schema in _TORCH_OP_SCHEMAS.values():
        lib.define(schema)
    lib.impl("w4a16_linear", _w4a16_linear_op, "CompositeExplicitAutograd")
    lib.impl("moe_forward", _moe_forward_op, "CompositeExplicitAutograd")

    def w4a16_linear_fake(x, w_prepacked, scales_prepacked, zeros_prepacked, bias, perm, n,
                          group_size, activation):
        return x.new_empty(tuple(x.shape[:-1]) + (n,))

    def moe_forward_fake(x, *args):
        return x.new_empty(x.shape)

    torch.library.register_fake("cuda_kernels::w4a16_linear", w4a16_linear_fake, lib=lib)
    torch.library.register_fake("cuda_kernels::moe_forward", moe_forward_fake, lib=lib)
    _TORCH_LIBRARY.append(lib)   # the registrations last as long as the Library object


def _registered_op(name):
    """torch.ops.cuda_kernels.<name>, for a call while torch.compile traces (registration
    itself must happen before: it cannot be traced)."""
    if not _TORCH_OPS:
        raise RuntimeError("the cuda_kernels torch operators are not registered: call "
                           "cuda_wrapper.torch_ops() before torch.compile")
    return getattr(_TORCH_OPS[0], name)


# ------------------------------------------------------------------------------------------------
# Mixture of experts
# ------------------------------------------------------------------------------------------------
def moe_route(logits, top_k, renormalize=False, dtype=None, out=None, stream=None):
    """The routing of a Mixture-of-experts layer (ck_moe_route): router logits [T, E] (or [E],
    one token) in fp32, fp16 or bf16 (uint16 bit patterns with dtype="bf16") -> (ids int32
    [T, top_k], weights float32 [T, top_k]): the top_k experts of each token's softmax in
    descending order of probability (ties: the lower expert index first) and their
    probabilities, divided by their sum when renormalize. out: ids, or (ids, weights). The
    library's rules apply: E <= 1024, top_k <= min(E, 32).
    """
    k = int(top_k)
    if k < 1:
        raise ValueError("top_k=%d must be >= 1" % k)
    with _Call(logits, stream) as call:
        la = call.input(logits, "logits", dtype, matrix=True, need=_FLOAT_INPUT)
        tokens, experts = _matrix(la.shape, "logits")
        shape = (k,) if len(la.shape) == 1 else (tokens, k)
        ids_out, weights_out = _split_out(out, 2, ("ids", "weights"))
        ids = call.output(shape, np.int32, DType.INT32, ids_out, "ids")
        weights = call.output(shape, np.float32, DType.FP32, weights_out, "weights")
        raw.moe_route(la.ptr, la.ck_dtype, tokens, experts, k, int(bool(renormalize)), ids.ptr,
                      weights.ptr, call.stream)
        return call.finish(ids, weights)


def moe_prepack(w_packed, scales, zeros=None, group_size=128, gate_up=False, dtype=None,
                stream=None):
    """Prepacks the INT4 weights of E experts for :func:`moe_forward` (ck_moe_prepack).

    w_packed uint8 [E, n, k // 2], scales [E, n, groups] fp16 or bf16 (uint16 with
    dtype="bf16") and zeros uint8 [E, n, groups] (None for a symmetric weight): each expert's
    [n, k] weight in the interchange format (:func:`quantize_int4` of it). gate_up: True for
    the gate+up weight w13 ([E, 2I, H]: rows 0 .. I-1 the gate, I .. 2I-1 the up projection),
    False for the down weight w2 ([E, H, I]). Returns (w_prepacked uint8, scales_prepacked,
    zeros_prepacked or None), flat arrays sized by ck_moe_prepacked_bytes / _groups.
    """
    mode = INT4_SYMMETRIC if zeros is None else INT4_ASYMMETRIC
    with _Call(w_packed, stream) as call:
        wa = call.input(w_packed, "w_packed", need=np.uint8)
        if len(wa.shape) != 3 or 0 in wa.shape:
            raise ValueError("w_packed must be a non-empty uint8 [E, n, k // 2], not of shape %s"
                             % (wa.shape,))
        experts, n, k = wa.shape[0], wa.shape[1], 2 * wa.shape[2]
        values = experts * n * _groups(k, group_size)
        sa = call.input(scales, "scales", dtype)
        if sa.ck_dtype not in (DType.FP16, DType.BF16):
            raise TypeError("scales have dtype %s: fp16 or bf16 (uint16 with dtype='bf16') "
                            "expected" % sa.dtype)
        _check_array(sa, "scales", sa.dtype, values)
        z_ptr = call.optional_input(zeros, "zeros", values, need=np.uint8)
        nbytes = raw.moe_prepacked_bytes(experts, n, k)
        nvalues = raw.moe_prepacked_groups(experts, n, k, group_size)
        if nbytes <= 0 or nvalues <= 0:
            raise ValueError("experts=%d, n=%d, k=%d, group_size=%r cannot be prepacked (K a "
                             "multiple of 32)" % (experts, n, k, group_size))
        w_out = call.output((nbytes,), np.uint8, DType.UINT8, None, "w_prepacked")
        s_out = call.output((nvalues,), sa.dtype, sa.ck_dtype, None, "scales_prepacked")
        z_out = (call.output((nvalues,), np.uint8, DType.UINT8, None, "zeros_prepacked")
                 if zeros is not None else None)
        raw.moe_prepack(wa.ptr, sa.ptr, z_ptr, sa.ck_dtype, experts, n, k, group_size, mode,
                        int(bool(gate_up)), w_out.ptr, s_out.ptr,
                        z_out.ptr if z_out is not None else 0, call.stream)
        return call.finish(w_out, s_out, z_out)


def moe_workspace_size(tokens, hidden, intermediate, experts, top_k, dtype="fp16",
                       group_size=128):
    """The workspace bytes :func:`moe_forward` needs for a layer of these sizes
    (ck_moe_workspace_size; it depends on T, H, I, E, k and dtype only). A workspace of this
    size, passed as moe_forward's workspace=, serves every call up to `tokens` tokens."""
    params = MoeParams(tokens=tokens, hidden=hidden, intermediate=intermediate, experts=experts,
                       top_k=top_k, dtype=_as_dtype_enum(dtype, "dtype"), group_size=group_size,
                       mode=INT4_SYMMETRIC)
    return raw.moe_workspace_size(params)


def _moe_weight(call, weight, name, experts, n, k, group_size, ck_dtype):
    """(w, scales, zeros) device addresses (zeros 0 for None) of a prepacked expert weight,
    a triple from :func:`moe_prepack`; the sizes are checked where the library calls them
    valid (otherwise its own validation says what is wrong)."""
    if not isinstance(weight, (tuple, list)) or len(weight) != 3:
        raise TypeError("%s must be the (w_prepacked, scales_prepacked, zeros_prepacked) triple "
                        "of moe_prepack" % name)
    w, scales, zeros = weight
    wa = call.input(w, name, need=np.uint8)
    sa = call.input(scales, name + " scales", ck_dtype)
    nbytes = raw.moe_prepacked_bytes(experts, n, k)
    nvalues = raw.moe_prepacked_groups(experts, n, k, group_size)
    if nbytes > 0 and nvalues > 0:
        _check_array(wa, name, np.uint8, nbytes)
        _check_array(sa, name + " scales", sa.dtype, nvalues)
    z_ptr = 0
    if zeros is not None:
        za = call.input(zeros, name + " zeros", need=np.uint8)
        if nvalues > 0:
            _check_array(za, name + " zeros", np.uint8, nvalues)
        z_ptr = za.ptr
    return wa.ptr, sa.ptr, z_ptr


def moe_forward(x, w13, w2, experts, intermediate, group_size=128, router_logits=None,
                top_k=None, renormalize=False, topk_ids=None, topk_weights=None,
                router_dtype=None, dtype=None, workspace=None, out=None, stream=None):
    """One Mixture-of-experts feed-forward layer with INT4 experts (ck_moe_forward): for each
    token t and each of its k experts e, y = (silu(x W1_e^T) * (x W3_e^T)) W2_e^T, and
    out[t] = sum_j w[t, j] y(t, j) (cuda_kernels.h gives the roundings).

    x [T, H] (or [H], one token) in fp16 or bf16 (uint16 bit patterns with dtype="bf16").
    w13, w2: the (w_prepacked, scales_prepacked, zeros_prepacked) triples that
    :func:`moe_prepack` made of the gate+up weights [E, 2I, H] (gate_up=True) and the down
    weights [E, H, I], with scales in the dtype of x; experts (E) and intermediate (I) must be
    given (the prepacked arrays are padded); group_size and the mode (zeros given or None) as
    they were prepacked.
    Routing, one of: router_logits [T, E] (fp32, fp16 or bf16; router_dtype="bf16" for uint16
    bit patterns) with top_k and renormalize, routed on the device as :func:`moe_route` does;
    or topk_ids int32 [T, k] and topk_weights float32 [T, k] (an id outside [0, E) is a
    pair that contributes nothing).
    workspace: None allocates :func:`moe_workspace_size` bytes for the call, from the
    allocator of x's kind (torch's, CuPy's or the DeviceArray pool: reused only after the
    call's work); a CUDA array of at least that many bytes, 256-byte aligned (as cudaMalloc
    returns), is used instead (no allocation: what a capture by cuda.graph_capture needs).
    Returns [T, H] (or [H]) in the dtype of x. Under torch.compile a call is the custom
    operator cuda_kernels::moe_forward (:func:`torch_ops`).
    """
    if _torch_compiling():
        if workspace is not None or out is not None or stream is not None:
            raise ValueError("moe_forward under torch.compile takes no workspace=, out= or "
                             "stream= (the operator allocates through torch)")
        return _registered_op("moe_forward")(
            x, w13[0], w13[1], w13[2], w2[0], w2[1], w2[2], int(experts), int(intermediate),
            int(group_size), router_logits, top_k, bool(renormalize), topk_ids, topk_weights)
    if (router_logits is None) == (topk_ids is None and topk_weights is None):
        raise ValueError("give router_logits (with top_k), or topk_ids and topk_weights: "
                         "exactly one routing")
    if router_logits is None and (topk_ids is None or topk_weights is None):
        raise ValueError("topk_ids and topk_weights go together")
    experts, intermediate = int(experts), int(intermediate)
    with _Call(x, stream) as call:
        xa = call.input(x, "x", dtype, matrix=True, need=_FLOAT_INPUT)
        tokens, hidden = _matrix(xa.shape, "x")
        one_d = len(xa.shape) == 1
        w13_ptrs = _moe_weight(call, w13, "w13", experts, 2 * intermediate, hidden, group_size,
                               xa.ck_dtype)
        w2_ptrs = _moe_weight(call, w2, "w2", experts, hidden, intermediate, group_size,
                              xa.ck_dtype)
        if (w13[2] is None) != (w2[2] is None):
            raise ValueError("w13 and w2 must both be symmetric or both asymmetric")
        params = MoeParams(
            tokens=tokens, hidden=hidden, intermediate=intermediate, experts=experts,
            dtype=xa.ck_dtype, group_size=group_size,
            mode=INT4_SYMMETRIC if w13[2] is None else INT4_ASYMMETRIC, x=xa.ptr,
            renormalize=int(bool(renormalize)), w13=w13_ptrs[0], w13_scales=w13_ptrs[1],
            w13_zeros=w13_ptrs[2], w2=w2_ptrs[0], w2_scales=w2_ptrs[1], w2_zeros=w2_ptrs[2],
            activation=MOE_SWIGLU)
        if router_logits is not None:
            if top_k is None:
                raise ValueError("top_k must be given with router_logits")
            la = call.input(router_logits, "router_logits", router_dtype, need=_FLOAT_INPUT)
            want = (experts,) if one_d else (tokens, experts)
            if tuple(la.shape) != want:
                raise ValueError("router_logits has shape %s, needs %s" % (la.shape, want))
            params.router_logits, params.router_dtype = la.ptr, la.ck_dtype
            params.top_k = int(top_k)
        else:
            ia = call.input(topk_ids, "topk_ids", need=np.int32)
            wa = call.input(topk_weights, "topk_weights", need=np.float32)
            k = ia.shape[-1] if ia.shape else 0
            want = (k,) if one_d else (tokens, k)
            if tuple(ia.shape) != want or tuple(wa.shape) != want or k < 1:
                raise ValueError("topk_ids %s and topk_weights %s must both be [T=%d, k]"
                                 % (ia.shape, wa.shape, tokens))
            if top_k is not None and int(top_k) != k:
                raise ValueError("top_k=%d, but topk_ids has k=%d" % (top_k, k))
            params.topk_ids, params.topk_weights, params.top_k = ia.ptr, wa.ptr, k
        ws_ptr, ws_bytes = call.workspace(workspace, raw.moe_workspace_size(params))
        o = call.output(xa.shape, _NUMPY_OF[xa.ck_dtype], xa.ck_dtype, out, "out")
        params.out = o.ptr
        raw.moe_forward(params, ws_ptr, ws_bytes, call.stream)
        return call.finish(o)


def attention(q, k, v, cu_seqlens_q=None, cu_seqlens_k=None, max_seqlen_q=None,
              max_seqlen_k=None, softmax_scale=None, causal=False, return_lse=False, dtype=None,
              out=None, stream=None):
    """Prefill attention (ck_attention_forward): per query head h and query i, O = softmax(
    scale q_i k^T over the keys it sees) v, with kv head h // (Hq / Hkv) (cuda_kernels.h gives
    the mask and the roundings; tests/reference.py attention_forward_f64 is the spec).

    q [total_q, Hq, D], k and v [total_k, Hkv, D] in fp16 or bf16 (uint16 bit patterns with
    dtype="bf16"), contiguous, D 64 or 128. A batch: cu_seqlens_q and cu_seqlens_k int32
    [B + 1] (both or neither; neither is one sequence), with max_seqlen_q and max_seqlen_k
    (None: taken from host offsets, or the totals for device offsets, which the host never
    reads). softmax_scale: None for 1 / sqrt(D); any other finite value but 0 (the library
    reads 0 as the default). causal: the bottom-right aligned mask.
    Returns O like q, and with return_lse also lse float32 [total_q, Hq] (-inf and O = 0 for a
    query that sees no key).
    """
    if softmax_scale is not None and float(softmax_scale) == 0.0:
        raise ValueError("softmax_scale=0 is not expressible (the library reads 0 as "
                         "1 / sqrt(D)); pass a tiny scale, or None for the default")
    if (cu_seqlens_q is None) != (cu_seqlens_k is None):
        raise ValueError("give both cu_seqlens_q and cu_seqlens_k, or neither (one sequence)")
    with _Call(q, stream) as call:
        qa = call.input(q, "q", dtype, need=_FLOAT_INPUT)
        ka = call.input(k, "k", dtype, need=_FLOAT_INPUT)
        va = call.input(v, "v", dtype, need=_FLOAT_INPUT)
        if len(qa.shape) != 3 or len(ka.shape) != 3 or tuple(ka.shape) != tuple(va.shape):
            raise ValueError("q must be [total_q, Hq, D] and k, v [total_k, Hkv, D]; got q %s, "
                             "k %s, v %s" % (qa.shape, ka.shape, va.shape))
        if qa.shape[2] != ka.shape[2]:
            raise ValueError("q's head dim %d differs from k's and v's, %d"
                             % (qa.shape[2], ka.shape[2]))
        if not qa.ck_dtype == ka.ck_dtype == va.ck_dtype:
            raise TypeError("q, k and v must have one dtype")
        params = AttentionParams(
            dtype=qa.ck_dtype, q=qa.ptr, k=ka.ptr, v=va.ptr, total_q=qa.shape[0],
            total_k=ka.shape[0], num_heads_q=qa.shape[1], num_heads_kv=ka.shape[1],
            head_dim=qa.shape[2], softmax_scale=0.0 if softmax_scale is None else softmax_scale,
            causal=int(bool(causal)))
        if cu_seqlens_q is not None:
            lengths = []
            for name, cu, given in (("cu_seqlens_q", cu_seqlens_q, max_seqlen_q),
                                    ("cu_seqlens_k", cu_seqlens_k, max_seqlen_k)):
                ca = call.input(cu, name, need=np.int32)
                if len(ca.shape) != 1 or ca.shape[0] < 2:
                    raise ValueError("%s must be int32 [B + 1], got shape %s" % (name, ca.shape))
                setattr(params, name, ca.ptr)
                if given is None and isinstance(cu, np.ndarray):
                    given = int(np.diff(cu.astype(np.int64)).max(initial=0))
                lengths.append(ca.shape[0] - 1)
                setattr(params, "max_seqlen_" + name[-1], 0 if given is None else int(given))
            if lengths[0] != lengths[1]:
                raise ValueError("cu_seqlens_q has %d sequences, cu_seqlens_k %d" % tuple(lengths))
            params.batch = lengths[0]
        o = call.output(qa.shape, _NUMPY_OF[qa.ck_dtype], qa.ck_dtype, out, "out")
        params.out = o.ptr
        lse = None
        if return_lse:
            lse = call.output((qa.shape[0], qa.shape[1]), np.float32, DType.FP32, None, "lse")
            params.lse = lse.ptr
        raw.attention_forward(params, call.stream)
        return call.finish(o, lse) if return_lse else call.finish(o)


def _decode_params(q_shape, k_shape, seqlens_shape, table_shape, max_seqlen_k, softmax_scale,
                   num_splits):
    """The sizes of an AttentionDecodeParams from the shapes of a decode call's arrays (checked
    as far as the library cannot: it sees no shapes), pointers left 0."""
    if softmax_scale is not None and float(softmax_scale) == 0.0:
        raise ValueError("softmax_scale=0 is not expressible (the library reads 0 as "
                         "1 / sqrt(D)); pass a tiny scale, or None for the default")
    if len(q_shape) != 4 or len(k_shape) != 4:
        raise ValueError("q must be [batch, seqlen_q, Hq, D] and the cache [batch, max_seqlen_k, "
                         "Hkv, D] or pages [num_pages, page_size, Hkv, D]; got q %s, k_cache %s"
                         % (tuple(q_shape), tuple(k_shape)))
    batch, seqlen_q, heads_q, head_dim = q_shape
    if k_shape[3] != head_dim:
        raise ValueError("q's head dim %d differs from the cache's, %d" % (head_dim, k_shape[3]))
    if tuple(seqlens_shape) != (batch,):
        raise ValueError("seqlens_k must be int32 [batch=%d], got shape %s"
                         % (batch, tuple(seqlens_shape)))
    params = AttentionDecodeParams(
        batch=batch, seqlen_q=seqlen_q, num_heads_q=heads_q, num_heads_kv=k_shape[2],
        head_dim=head_dim, softmax_scale=0.0 if softmax_scale is None else softmax_scale,
        num_splits=int(num_splits or 0))
    if table_shape is None:
        if k_shape[0] != batch:
            raise ValueError("q has batch=%d sequences, the contiguous cache %d"
                             % (batch, k_shape[0]))
        if max_seqlen_k is not None and int(max_seqlen_k) != k_shape[1]:
            raise ValueError("a contiguous cache's max_seqlen_k is its second dimension, %d "
                             "(got %d)" % (k_shape[1], max_seqlen_k))
        params.max_seqlen_k = k_shape[1]
    else:
        if len(table_shape) != 2 or table_shape[0] != batch:
            raise ValueError("block_table must be int32 [batch=%d, max_blocks_per_seq], got "
                             "shape %s" % (batch, tuple(table_shape)))
        params.num_pages, params.page_size = k_shape[0], k_shape[1]
        params.max_blocks_per_seq = table_shape[1]
        params.max_seqlen_k = (table_shape[1] * k_shape[1] if max_seqlen_k is None
                               else int(max_seqlen_k))
    return params


def attention_decode_workspace_size(q_shape, k_cache_shape, block_table_shape=None,
                                    max_seqlen_k=None, num_splits=None, dtype="fp16"):
    """The workspace bytes :func:`attention_decode` needs (ck_attention_decode_workspace_size)
    for q of shape q_shape, a cache of shape k_cache_shape (contiguous, or pages with a block
    table of block_table_shape) and these declared sizes; 0 where one split serves the call."""
    batch = tuple(q_shape)[0] if len(tuple(q_shape)) == 4 else 0
    params = _decode_params(tuple(q_shape), tuple(k_cache_shape), (batch,),
                            None if block_table_shape is None else tuple(block_table_shape),
                            max_seqlen_k, None, num_splits)
    params.dtype = _as_dtype_enum(dtype, "dtype")
    params.block_table = 0 if block_table_shape is None else 1   # a flag here, never read
    return raw.attention_decode_workspace_size(params)


# A quantized KV cache's formats by name, and the code type each stores.
_KV_FORMATS = {"fp8_e4m3": KV_FP8_E4M3, "int8": KV_INT8}
_KV_CODES = {KV_FP8_E4M3: np.uint8, KV_INT8: np.int8}


def _kv_format(kv_format, cache_dtype, name):
    """The ck_kv_format_t of a cache: kv_format by name ('fp8_e4m3', 'int8') or None, which
    reads the cache's element type (uint8: E4M3 bytes, int8: int8 codes, else its values)."""
    if kv_format is None:
        return {np.dtype(np.uint8): KV_FP8_E4M3, np.dtype(np.int8): KV_INT8}.get(
            np.dtype(cache_dtype), KV_DTYPE)
    if kv_format not in _KV_FORMATS:
        raise ValueError("kv_format=%r: use one of %s, or None" % (kv_format, sorted(_KV_FORMATS)))
    fmt = _KV_FORMATS[kv_format]
    if np.dtype(cache_dtype) != np.dtype(_KV_CODES[fmt]):
        raise TypeError("%s has dtype %s; a %s cache holds %s" % (
            name, np.dtype(cache_dtype), kv_format, np.dtype(_KV_CODES[fmt])))
    return fmt


def _shape_dtype(obj, name):
    """(shape, NumPy dtype) of an array of any kind the wrapper takes, without copying it."""
    kind = _kind(obj)
    if kind is not None:
        a = kind.view(obj, name) if kind.on_device(obj) else (0,) + _shape_dtype(
            kind.host_array(obj, name), name)
        return tuple(a[1]), np.dtype(a[2])
    if _is_device(obj):
        _, shape, np_dtype = _cai(obj, name)[:3]
        return tuple(shape), np.dtype(np_dtype)
    a = np.asarray(obj)
    return a.shape, a.dtype


def _kv_scales(call, k_scale, v_scale, row_shape, heads_kv):
    """(kv_scaling, k_scale address, v_scale address) of a quantized cache whose rows have the
    shape row_shape (the cache's without D): per-head scales float32 [Hkv] or per-token ones
    of row_shape, both alike."""
    if k_scale is None or v_scale is None:
        raise ValueError("a quantized cache needs k_scale and v_scale (float32 [Hkv] per head, "
                         "or the cache's shape without D per token)")
    ks = call.input(k_scale, "k_scale", need=np.float32)
    vs = call.input(v_scale, "v_scale", need=np.float32)
    if tuple(ks.shape) != tuple(vs.shape):
        raise ValueError("k_scale %s and v_scale %s must have one shape"
                         % (tuple(ks.shape), tuple(vs.shape)))
    if tuple(ks.shape) == (heads_kv,):
        return KV_SCALE_PER_HEAD, ks.ptr, vs.ptr
    if tuple(ks.shape) == tuple(row_shape):
        return KV_SCALE_PER_TOKEN, ks.ptr, vs.ptr
    raise ValueError("k_scale has shape %s: per head it is (%d,), per token %s"
                     % (tuple(ks.shape), heads_kv, tuple(row_shape)))


def kv_cache_append(k, v, slot_mapping, k_cache, v_cache, k_scale=None, v_scale=None,
                    kv_format=None, dtype=None, stream=None):
    """Writes the keys and values of new positions into a KV cache, in place
    (ck_kv_cache_append): token i's k[i], v[i] ([tokens, Hkv, D], fp16 or bf16, uint16 bit
    patterns with dtype="bf16") go to cache slot slot_mapping[i] (int64 [tokens]; a slot
    outside the cache is skipped), copied, or quantized row by row (cuda_kernels.h, "Quantized
    KV cache"; tests/reference.py kv_cache_quantize).

    k_cache, v_cache: device arrays, [slots, Hkv, D], or a contiguous cache [batch,
    max_seqlen_k, Hkv, D] (slot b * max_seqlen_k + pos) or pages [num_pages, page_size, Hkv, D]
    (slot page * page_size + pos % page_size): the dtype's values, or uint8 E4M3 bytes
    (kv_format "fp8_e4m3") or int8 codes ("int8"); kv_format None reads the cache's dtype.
    A quantized cache needs k_scale and v_scale, float32 device arrays: [Hkv] per head (read),
    or the cache's shape without D per token (the slots' rows written). Returns None."""
    with _Call(k, stream) as call:
        ka = call.input(k, "k", dtype, need=_FLOAT_INPUT)
        va = call.input(v, "v", dtype, need=_FLOAT_INPUT)
        if len(ka.shape) != 3 or tuple(ka.shape) != tuple(va.shape):
            raise ValueError("k and v must be [tokens, Hkv, D] of one shape; got %s and %s"
                             % (tuple(ka.shape), tuple(va.shape)))
        if ka.ck_dtype != va.ck_dtype:
            raise TypeError("k and v must have one dtype")
        tokens, heads_kv, head_dim = ka.shape
        sa = call.input(slot_mapping, "slot_mapping", need=np.int64)
        if tuple(sa.shape) != (tokens,):
            raise ValueError("slot_mapping must be int64 [tokens=%d], got shape %s"
                             % (tokens, tuple(sa.shape)))
        caches = []
        for name, cache in (("k_cache", k_cache), ("v_cache", v_cache)):
            if not _is_device(cache):
                raise TypeError("%s must be a device array (the cache is written in place)"
                                % name)
            shape, np_dtype = _shape_dtype(cache, name)
            if len(shape) not in (3, 4) or tuple(shape[-2:]) != (heads_kv, head_dim):
                raise ValueError("%s has shape %s: it needs [slots, Hkv=%d, D=%d] or [.., .., "
                                 "Hkv, D]" % (name, tuple(shape), heads_kv, head_dim))
            caches.append((name, cache, tuple(shape), np_dtype))
        if caches[0][2:] != caches[1][2:]:
            raise ValueError("k_cache and v_cache must have one shape and dtype")
        shape, np_dtype = caches[0][2:]
        fmt = _kv_format(kv_format, np_dtype, "k_cache")
        params = KvCacheAppendParams(
            dtype=ka.ck_dtype, kv_format=fmt, k=ka.ptr, v=va.ptr, slot_mapping=sa.ptr,
            num_tokens=tokens, num_heads_kv=heads_kv, head_dim=head_dim,
            num_slots=math.prod(shape[:-2]))
        want = _NUMPY_OF[ka.ck_dtype] if fmt == KV_DTYPE else _KV_CODES[fmt]
        for name, cache, _, _ in caches:
            arg = call.output(shape, want, ka.ck_dtype, cache, name)
            setattr(params, name, arg.ptr)
        if fmt != KV_DTYPE:
            params.kv_scaling, params.k_scale, params.v_scale = _kv_scales(
                call, k_scale, v_scale, shape[:-1], heads_kv)
        raw.kv_cache_append(params, call.stream)
        call.finish()


def attention_decode(q, k_cache, v_cache, seqlens_k, block_table=None, softmax_scale=None,
                     max_seqlen_k=None, num_splits=None, return_lse=False, dtype=None,
                     workspace=None, out=None, stream=None, k_scale=None, v_scale=None,
                     kv_format=None):
    """Decode attention over a KV cache (ck_attention_decode): for the seqlen_q new tokens of
    each sequence (its last positions) and each query head h, O = softmax(scale q k^T over the
    sequence's keys up to the token's position) v, kv head h // (Hq / Hkv) (cuda_kernels.h gives
    the split-KV plan and the roundings; tests/reference.py attention_decode_f64 is the spec).

    q [batch, seqlen_q, Hq, D] (seqlen_q 1 .. 16) in fp16 or bf16 (uint16 bit patterns with
    dtype="bf16"), D 64 or 128; seqlens_k int32 [batch] (keys per sequence, read on the
    device). The cache: contiguous k_cache, v_cache [batch, max_seqlen_k, Hkv, D] (block_table
    None), or pages [num_pages, page_size, Hkv, D] with block_table int32 [batch,
    max_blocks_per_seq] (page_size a power of two). max_seqlen_k: the declared longest sequence
    (None: the cache's capacity, max_blocks_per_seq * page_size when paged); lengths past it are
    clamped to it. softmax_scale: None for 1 / sqrt(D), else any finite value but 0.
    num_splits: None for the library's rule, or 1 .. 64. workspace: None allocates
    :func:`attention_decode_workspace_size` bytes for the call; a CUDA array of at least that
    many bytes, 256-byte aligned, is used instead (what a graph capture needs).
    A quantized cache (cuda_kernels.h, "Quantized KV cache", as kv_cache_append writes it):
    uint8 E4M3 bytes or int8 codes (kv_format None reads the cache's dtype; or "fp8_e4m3",
    "int8"), with k_scale and v_scale float32, [Hkv] per head or the cache's shape without D
    per token.
    Returns O like q, and with return_lse also lse float32 [batch, seqlen_q, Hq] (-inf and
    O = 0 for a token that sees no key).
    """
    with _Call(q, stream) as call:
        qa = call.input(q, "q", dtype, need=_FLOAT_INPUT)
        fmt = _kv_format(kv_format, _shape_dtype(k_cache, "k_cache")[1], "k_cache")
        codes = None if fmt == KV_DTYPE else _KV_CODES[fmt]
        ka = call.input(k_cache, "k_cache", None if codes else dtype,
                        need=codes or _FLOAT_INPUT)
        va = call.input(v_cache, "v_cache", None if codes else dtype,
                        need=codes or _FLOAT_INPUT)
        if tuple(ka.shape) != tuple(va.shape):
            raise ValueError("k_cache %s and v_cache %s must have the same shape"
                             % (tuple(ka.shape), tuple(va.shape)))
        if codes is None and not qa.ck_dtype == ka.ck_dtype == va.ck_dtype:
            raise TypeError("q, k_cache and v_cache must have one dtype")
        sa = call.input(seqlens_k, "seqlens_k", need=np.int32)
        ta = None if block_table is None else call.input(block_table, "block_table",
                                                         need=np.int32)
        params = _decode_params(tuple(qa.shape), tuple(ka.shape), tuple(sa.shape),
                                None if ta is None else tuple(ta.shape), max_seqlen_k,
                                softmax_scale, num_splits)
        params.dtype = qa.ck_dtype
        params.q, params.k_cache, params.v_cache, params.seqlens_k = qa.ptr, ka.ptr, va.ptr, sa.ptr
        params.block_table = 0 if ta is None else ta.ptr
        if codes is not None:
            params.kv_format = fmt
            params.kv_scaling, params.k_scale, params.v_scale = _kv_scales(
                call, k_scale, v_scale, tuple(ka.shape[:3]), ka.shape[2])
        o = call.output(qa.shape, _NUMPY_OF[qa.ck_dtype], qa.ck_dtype, out, "out")
        params.out = o.ptr
        lse = None
        if return_lse:
            lse = call.output(tuple(qa.shape[:3]), np.float32, DType.FP32, None, "lse")
            params.lse = lse.ptr
        need = raw.attention_decode_workspace_size(params)
        ws_ptr, ws_bytes = (0, 0) if need == 0 and workspace is None else \
            call.workspace(workspace, need)
        raw.attention_decode(params, ws_ptr, ws_bytes, call.stream)
        return call.finish(o, lse) if return_lse else call.finish(o)


def _stacked(a, name, dtype):
    """(a device view [E * n, k] of expert weights a [E, n, k], what ck_quantize_int4 quantizes
    row by row; the shape (E, n, k)). NumPy data is uploaded."""
    shape = tuple(_cai(a, name)[1] if _is_device(a) else np.shape(a))
    if len(shape) != 3 or 0 in shape:
        raise ValueError("%s must be a non-empty [E, n, k] array, not of shape %s"
                         % (name, shape))
    device = _to_device(a, dtype)
    ptr, _, np_dtype, _, _ = _cai(device, name)
    override = _as_dtype_enum(dtype, "dtype") if dtype is not None else None
    ck_dtype = _ck_dtype(device, np_dtype, override, name)
    view = DeviceArray(ptr, (shape[0] * shape[1], shape[2]), np_dtype, ck_dtype, base=device)
    return view, shape


# The projections of one expert, by the names checkpoints give them: Hugging Face's
# (experts.<e>.gate_proj / up_proj / down_proj: Qwen-MoE, DeepSeek, OLMoE) or Mixtral's
# (experts.<e>.w1 the gate, w3 the up, w2 the down projection).
_MOE_PROJECTIONS = (("gate_proj", "w1"), ("up_proj", "w3"), ("down_proj", "w2"))
_CHECKPOINT_TENSORS = {"gptq": ("qweight", "qzeros", "scales", "g_idx"),
                       "awq": ("qweight", "qzeros", "scales")}


def _checkpoint_projection(tensors, fmt, where):
    """(qweight, qzeros, scales, g_idx or None) of one projection's checkpoint tensors: a
    mapping by the checkpoint's names (g_idx optional) or a sequence in that order."""
    names = _CHECKPOINT_TENSORS[fmt]
    if hasattr(tensors, "keys"):
        # Strict: a tensor the layer would leave out (a bias, AWQ with a g_idx) is an error.
        unknown = [str(key) for key in tensors.keys() if key not in names]
        if unknown:
            raise ValueError("%s: unexpected %s (a %s projection holds %s)"
                             % (where, ", ".join(unknown), fmt.upper(), ", ".join(names)))
        missing = [name for name in names[:3] if name not in tensors]
        if missing:
            raise ValueError("%s has no %s" % (where, ", ".join(missing)))
        found = [tensors.get(name) for name in names]
    elif isinstance(tensors, (tuple, list)) and len(tensors) in (3, len(names)):
        found = list(tensors)
    else:
        raise TypeError("%s must map %s to the checkpoint's tensors, or hold them in that order"
                        % (where, ", ".join(names)))
    return tuple(found) + (None,) * (4 - len(found))


def _checkpoint_expert(expert, fmt, e):
    """The (gate, up, down) projections of expert e: from a mapping by projection name
    (_MOE_PROJECTIONS) or a (gate, up, down) sequence."""
    where = "expert %d" % e
    if hasattr(expert, "keys"):
        known = {name for names in _MOE_PROJECTIONS for name in names}
        unknown = [str(key) for key in expert.keys() if key not in known]
        if unknown:
            raise ValueError("%s: unexpected %s (an expert holds gate_proj, up_proj and "
                             "down_proj, or Mixtral's w1, w3 and w2)"
                             % (where, ", ".join(unknown)))
        projections = []
        for names in _MOE_PROJECTIONS:
            present = [name for name in names if name in expert]
            if len(present) != 1:
                raise ValueError("%s needs exactly one of %s" % (where, " / ".join(names)))
            projections.append((present[0], expert[present[0]]))
    elif isinstance(expert, (tuple, list)) and len(expert) == 3:
        projections = [(names[0], p) for names, p in zip(_MOE_PROJECTIONS, expert)]
    else:
        raise TypeError("%s must map gate_proj, up_proj and down_proj to their checkpoint "
                        "tensors, or be a (gate, up, down) sequence" % where)
    return [(where + " " + name, _checkpoint_projection(p, fmt, where + " " + name))
            for name, p in projections]


def _checkpoint_kn(qweight, fmt, where):
    """(K, N) of a projection from its qweight's shape: GPTQ's [K / 8, N], AWQ's [K, N / 8]."""
    shape = tuple(_cai(qweight, where + " qweight")[1] if _is_device(qweight)
                  else np.shape(qweight))
    if len(shape) != 2 or 0 in shape:
        raise ValueError("%s qweight must be a non-empty int32 matrix, not of shape %s"
                         % (where, shape))
    return (8 * shape[0], shape[1]) if fmt == "gptq" else (shape[0], 8 * shape[1])


def _scales_dtype(scales, dtype, where):
    """The library dtype the importer will see in a projection's scales (None: not a float)."""
    name = where + " scales"
    override = _as_dtype_enum(dtype, "dtype") if dtype is not None else None
    np_dtype = _cai(scales, name)[2] if _is_device(scales) else np.asarray(scales).dtype
    return _ck_dtype(scales, np_dtype, override, name)


def _host_copy(a, name):
    """A NumPy copy of a host or device array (a small one: it is read on the host)."""
    if isinstance(a, DeviceArray):
        return a.to_numpy()
    if _is_device(a):
        ptr, shape, dtype, _, stream = _cai(a, name)
        return DeviceArray(ptr, shape, dtype, stream=stream, base=a).to_numpy()
    return np.asarray(a)


def _check_trivial_g_idx(g_idx, k, group_size, where):
    """A GPTQ g_idx the fused layer can take: the groups of consecutive rows (k // group_size)
    that GPTQ stores without act-order, which says nothing the group size does not."""
    _groups(k, group_size)   # a valid group size
    g = _host_copy(g_idx, where + " g_idx").reshape(-1)
    if g.size != k:
        raise ValueError("%s g_idx has %d entries, needs K=%d" % (where, g.size, k))
    width = k if group_size == GROUP_ROW else int(group_size)
    if np.array_equal(g, np.arange(k) // width):
        return
    if g[0] == 0 and (np.diff(g) >= 0).all():   # consecutive rows, another group size
        raise ValueError("%s g_idx groups the rows in runs of %d, not group_size=%r: pass the "
                         "checkpoint's group_size" % (where, int((g == 0).sum()), group_size))
    raise ValueError(
        "%s has an act-order g_idx (GPTQ desc_act: its groups are not runs of consecutive "
        "rows). QuantizedMoE cannot take it: the importer would give that expert a permutation "
        "of its input (x, or h for down_proj) that the fused layer, whose experts share one "
        "input, cannot apply. Use a checkpoint quantized without desc_act, or that expert's "
        "projections as QuantizedLinear.from_gptq layers" % where)


def _expert_stack(a, experts, rows):
    """An uninitialized DeviceArray [experts, rows, ...] for E experts' copies of a [n, ...]."""
    return DeviceArray.empty((experts, rows) + a.shape[1:], a.dtype,
                             a.ck_dtype if a.ck_dtype == DType.BF16 else None)


def _copy_into(dst, offset, src):
    """Copies the whole device array src into dst's bytes from `offset` on (device to device,
    on the stream that wrote src)."""
    if offset < 0 or offset + src.nbytes > dst.nbytes:
        raise ValueError("%d bytes at offset %d do not fit in %d" % (src.nbytes, offset,
                                                                    dst.nbytes))
    cuda.memcpy_dtod(dst.ptr + offset, src.ptr, src.nbytes, stream=src.stream or None)
    for array in (dst, src):
        _record_use(array, src.stream)


def _device_view(a, dtype):
    """A DeviceArray of a: host data uploaded, a DeviceArray itself, any other CUDA array a
    view of its memory that keeps it alive."""
    a = _to_device(a, dtype)
    if type(a) is DeviceArray:
        return a
    ptr, shape, np_dtype, _, _ = _cai(a, "checkpoint tensor")
    override = _as_dtype_enum(dtype, "dtype") if dtype is not None else None
    ck_dtype = _ck_dtype(a, np_dtype, override, "checkpoint tensor")
    return DeviceArray(ptr, shape, np_dtype, ck_dtype, base=a)


def _moe_from_checkpoint(experts, fmt, group_size, dtype):
    """(w13 triple, w2 triple): the stacked interchange tensors of E experts' GPTQ or AWQ
    tensors (see QuantizedMoE.from_gptq), imported expert by expert and copied on the device
    into one allocation per tensor."""
    if hasattr(experts, "keys") or isinstance(experts, (str, bytes)):
        raise TypeError("experts must be a sequence of E experts (entry e: expert e)")
    parsed = [_checkpoint_expert(expert, fmt, e) for e, expert in enumerate(experts)]
    if not parsed:
        raise ValueError("experts is empty: a layer needs at least one expert")
    # Everything the host can check is checked before anything is uploaded or launched.
    first, first_tensors = parsed[0][0]
    hidden, inter = _checkpoint_kn(first_tensors[0], fmt, first)
    layer_dtype = _scales_dtype(first_tensors[2], dtype, first)
    wanted = ((hidden, inter), (hidden, inter), (inter, hidden))   # (K, N) of gate, up, down
    for projections in parsed:
        for (where, tensors), (k, n) in zip(projections, wanted):
            got = _checkpoint_kn(tensors[0], fmt, where)
            if got != (k, n):
                raise ValueError("%s is a [N=%d, K=%d] weight; expert 0's gate_proj makes the "
                                 "layer H=%d, I=%d, so it must be [N=%d, K=%d] (every expert "
                                 "of one shape: gate_proj and up_proj [I, H], down_proj [H, I])"
                                 % (where, got[1], got[0], hidden, inter, n, k))
            scales_dtype = _scales_dtype(tensors[2], dtype, where)
            if scales_dtype != layer_dtype:
                raise TypeError("%s has %s scales, %s %s: the layer has one dtype" % (
                    where, getattr(scales_dtype, "name", "non-float"), first,
                    getattr(layer_dtype, "name", "non-float")))
            if tensors[3] is not None:
                _check_trivial_g_idx(tensors[3], k, group_size, where)
    count = len(parsed)
    w13 = w2 = None
    cuda.device_synchronize()   # the checkpoint's device tensors were written on any stream
    for e, projections in enumerate(parsed):
        uploaded, imported = [], []
        for _, (qweight, qzeros, scales, _) in projections:
            # DeviceArray views of framework tensors: the import and the stacking stay in
            # DeviceArrays (a layer's weights), whatever framework the checkpoint came in.
            qw, qz, sd = _device_view(qweight, None), _device_view(qzeros, None), \
                _device_view(scales, dtype)
            uploaded += [qw, qz, sd]
            # A trivial g_idx (checked above) imports as no g_idx: the same groups, no perm.
            imported.append(import_gptq(qw, qz, sd, group_size=group_size, dtype=dtype)[:3]
                            if fmt == "gptq" else
                            import_awq(qw, qz, sd, group_size=group_size, dtype=dtype))
        if w13 is None:   # [E, rows, ...] of each interchange tensor, in its dtype
            w13 = [_expert_stack(a, count, 2 * inter) for a in imported[0]]
            w2 = [_expert_stack(a, count, hidden) for a in imported[2]]
        gate, up, down = imported
        for j in range(3):   # w_packed, scales, zeros: per expert, the gate rows, then the up
            block = w13[j].nbytes // count
            _copy_into(w13[j], e * block, gate[j])
            _copy_into(w13[j], e * block + gate[j].nbytes, up[j])
            _copy_into(w2[j], e * (w2[j].nbytes // count), down[j])
        # The next iteration frees this expert's uploads and imports: their work must be done.
        for stream in {a.stream or 0 for triple in imported for a in triple}:
            cuda.stream_synchronize(stream)
    return tuple(w13), tuple(w2)


class QuantizedMoE:
    """A Mixture-of-experts feed-forward layer (Mixtral / Qwen-MoE / DeepSeek style) whose INT4
    experts live on the GPU, prepacked: out[t] = sum over the top_k experts e of token t of
    w[t, e] * (silu(x W1_e^T) * (x W3_e^T)) W2_e^T (:func:`moe_forward`).

    Build it from float weights (:meth:`from_float`, quantized on the device with
    :func:`quantize_int4`), from each expert's GPTQ or AWQ checkpoint tensors
    (:meth:`from_gptq`, :meth:`from_awq`, imported on the device and stacked there) or from
    interchange-format weights on the device; call it on NumPy arrays (NumPy out) or CUDA
    arrays (DeviceArray out) with router logits or with the caller's expert ids and weights.
    dtype is the layer's activation dtype, fp16 or bf16; hidden and intermediate sizes must be
    multiples of 32. Checkpoint layers are asymmetric (zero points from the checkpoint), and
    GPTQ act-order checkpoints are refused (see :meth:`from_gptq`).
    """

    def __init__(self, w13_packed, w13_scales, w13_zeros, w2_packed, w2_scales, w2_zeros,
                 group_size, dtype, top_k=2, renormalize=False):
        """From interchange-format weights already on the device (DeviceArrays or CUDA arrays):
        w13_packed uint8 [E, 2I, H / 2] (rows 0 .. I-1 the gate, I .. 2I-1 the up projection)
        with scales [E, 2I, groups] and zeros (None: symmetric), w2_packed uint8 [E, H, I / 2]
        with its scales and zeros. top_k and renormalize: the routing's defaults."""
        self.dtype = _as_dtype_enum(dtype, "dtype")
        if self.dtype not in (DType.FP16, DType.BF16):
            raise TypeError("QuantizedMoE runs in fp16 or bf16, not %s" % self.dtype.name)
        shape = _cai(w13_packed, "w13_packed")[1]
        if len(shape) != 3:
            raise ValueError("w13_packed must be [E, 2I, H / 2], not of shape %s" % (shape,))
        self.experts, self.intermediate, self.hidden = shape[0], shape[1] // 2, 2 * shape[2]
        self.group_size = group_size
        self.top_k, self.renormalize = top_k, renormalize
        # The interchange format (dequantize_int4 reads it, expert by expert).
        self.w13 = w13_packed, w13_scales, w13_zeros
        self.w2 = w2_packed, w2_scales, w2_zeros
        self.w13_prepacked = moe_prepack(*self.w13, group_size=group_size, gate_up=True,
                                         dtype=self.dtype)
        self.w2_prepacked = moe_prepack(*self.w2, group_size=group_size, gate_up=False,
                                        dtype=self.dtype)

    @classmethod
    def from_float(cls, w13, w2, group_size=128, symmetric=True, dtype=None, top_k=2,
                   renormalize=False):
        """w13 [E, 2I, H] (each expert's gate rows, then its up rows) and w2 [E, H, I] (nn.Linear
        layouts) in fp16 or bf16 (uint16 bit patterns with dtype="bf16"); float32 NumPy
        weights are converted to fp16 first. Each expert's rows are quantized on the device
        (one ck_quantize_int4 call per projection: the experts' rows stacked)."""
        quantized = []
        for w, name in ((w13, "w13"), (w2, "w2")):
            if not _is_device(w) and np.asarray(w).dtype == np.float32 and dtype is None:
                w = np.asarray(w).astype(np.float16)
            stacked, (experts, n, _) = _stacked(w, name, dtype)
            packed, scales, zeros = quantize_int4(stacked, group_size=group_size,
                                                  symmetric=symmetric, dtype=stacked.ck_dtype)
            quantized += [None if a is None else a.reshape(experts, n, a.shape[1])
                          for a in (packed, scales, zeros)]
        layer_dtype = quantized[1].ck_dtype   # w13's scales: the dtype of its weights
        return cls(*quantized, group_size, layer_dtype, top_k=top_k, renormalize=renormalize)

    @classmethod
    def from_gptq(cls, experts, group_size=128, dtype=None, top_k=2, renormalize=False):
        """From E experts' 4-bit GPTQ tensors (:func:`import_gptq`), as a checkpoint holds
        them under ``mlp.experts.<e>``.

        experts: a sequence, entry e for expert e, each a mapping from projection name to its
        tensors, ``{"gate_proj": ..., "up_proj": ..., "down_proj": ...}`` (Mixtral's names
        ``w1`` gate, ``w3`` up, ``w2`` down are accepted too), or a (gate, up, down) sequence.
        A projection's tensors: a mapping ``{"qweight", "qzeros", "scales"}`` with an optional
        ``"g_idx"``, or a (qweight, qzeros, scales[, g_idx]) sequence; NumPy arrays or CUDA
        arrays. gate_proj and up_proj are [I, H] weights (qweight int32 [H / 8, I]), down_proj
        an [H, I] one (qweight [I / 8, H]); every expert has the same shapes, scales of one
        dtype (fp16, or bf16: uint16 NumPy bit patterns with dtype="bf16"), which is the
        layer's. For example, from a state dict ``sd`` and a layer prefix ``p``::

            experts = [{proj: {t: sd[f"{p}.experts.{e}.{proj}.{t}"]
                               for t in ("qweight", "qzeros", "scales")}
                        for proj in ("gate_proj", "up_proj", "down_proj")}
                       for e in range(num_experts)]

        Zero points follow :func:`import_gptq`: GPTQ's v1 convention (AutoGPTQ,
        GPTQ-for-LLaMa), stored minus one and imported as stored + 1, in 1 .. 16. A symmetric
        checkpoint (sym=True) stores 7 everywhere, zero point 8; it imports like any other, so
        the layer is always asymmetric (zeros given), with exactly the checkpoint's values
        w = (q - zero) * scale. (A checkpoint in the v2 convention, zeros stored as they are,
        must be converted to v1 first.)

        g_idx: None, or the trivial k // group_size that GPTQ stores without act-order (then
        the same groups: it is not needed). An act-order g_idx (desc_act) raises ValueError:
        it makes the importer permute that expert's input (x for gate/up, h for down), which
        the fused layer, whose experts share one input, cannot apply. Everything checkable on
        the host (the shapes, g_idx) is checked before anything is uploaded.

        Each expert is imported on the device, then copied device to device into one [E, ...]
        allocation per interchange tensor (w13: per expert the gate rows, then the up rows),
        which :meth:`__init__` prepacks.
        """
        w13, w2 = _moe_from_checkpoint(experts, "gptq", group_size, dtype)
        return cls(*w13, *w2, group_size, w13[1].ck_dtype, top_k=top_k,
                   renormalize=renormalize)

    @classmethod
    def from_awq(cls, experts, group_size=128, dtype=None, top_k=2, renormalize=False):
        """From E experts' 4-bit AWQ tensors, GEMM layout (:func:`import_awq`): the same
        calling convention as :meth:`from_gptq`, with the tensors qweight int32 [K, N / 8],
        qzeros and scales (no g_idx: AWQ's groups are always consecutive rows). gate_proj and
        up_proj have qweight [H, I / 8], down_proj [I, H / 8]. AWQ stores the zero points
        themselves (0 .. 15); the layer is asymmetric.
        """
        w13, w2 = _moe_from_checkpoint(experts, "awq", group_size, dtype)
        return cls(*w13, *w2, group_size, w13[1].ck_dtype, top_k=top_k,
                   renormalize=renormalize)

    def __call__(self, x, router_logits=None, topk_ids=None, topk_weights=None, top_k=None,
                 renormalize=None, router_dtype=None, workspace=None, out=None, stream=None):
        """x [T, hidden] (or [hidden]) in the layer's dtype -> [T, hidden]. Routing: router
        logits [T, E] (top_k and renormalize default to the layer's), or topk_ids int32
        [T, k] with topk_weights float32 [T, k]. workspace: see :func:`moe_forward`."""
        on_host = not _is_device(x)
        xd = _to_device(_layer_host_cast(x, self.dtype), self.dtype) if on_host else x
        if router_logits is not None:
            top_k = self.top_k if top_k is None else top_k
        renormalize = self.renormalize if renormalize is None else renormalize
        y = moe_forward(xd, self.w13_prepacked, self.w2_prepacked, self.experts,
                        self.intermediate, group_size=self.group_size,
                        router_logits=router_logits, top_k=top_k, renormalize=renormalize,
                        topk_ids=topk_ids, topk_weights=topk_weights, router_dtype=router_dtype,
                        dtype=self.dtype, workspace=workspace, out=None if on_host else out,
                        stream=stream)
        return _layer_host_result(y, out) if on_host else y

    def workspace_size(self, tokens, top_k=None):
        """The workspace bytes a call on `tokens` tokens needs (:func:`moe_workspace_size`)."""
        return moe_workspace_size(tokens, self.hidden, self.intermediate, self.experts,
                                  self.top_k if top_k is None else top_k, self.dtype,
                                  self.group_size)

    def __repr__(self):
        return ("QuantizedMoE(experts=%d, hidden=%d, intermediate=%d, top_k=%d, group_size=%d, "
                "dtype=%s%s)" % (self.experts, self.hidden, self.intermediate, self.top_k,
                                 self.group_size, self.dtype.name.lower(),
                                 "" if self.w13[2] is None else ", asymmetric"))


def quantize_tensor(x):
    """Seed API: per-tensor dynamic INT8 quantization. Returns (q int8, scale as a float)."""
    q, scales = quantize_int8(x, granularity="tensor")
    if isinstance(scales, DeviceArray):
        scales = scales.to_numpy()
    return q, float(scales[0])   # a torch or CuPy scale: read after the stream's work


def dequantize_tensor(q, scale):
    """Seed API: q * scale as float32 (scale: a float, or one float32 value)."""
    return dequantize_int8(q, scale, granularity="tensor", out_dtype="fp32")


def int8_matmul(A, B, scale_a=1.0, scale_b=1.0, scale_c=None, stream=None):
    """Seed API: INT8 matrix product of A int8 [M, K] and B int8 [K, N] (the seed's layout).

    Returns C = (A @ B) * scale_a * scale_b as float32 [M, N]: one library call,
    ck_gemm_int8_scaled with LAYOUT_KN (exact int32 sums, then the float32 epilogue). scale_a
    is a float or 1 / M float32 values (per row of A), scale_b a float or 1 / N values (per
    column of B).

    With scale_c (a float: a static per-tensor scale), C is requantized to int8 and the int8
    [M, N] codes are returned: q = clamp(rint(C * (1 / scale_c)), -127, 127), as
    ck_quantize_int8 computes it. That is two library calls, ck_gemm_int8_scaled then
    ck_quantize_int8, with C as a float32 temporary on the device in between (never copied to
    the host).

    The library's rules apply: K and N multiples of 16. NumPy in, NumPy out; CUDA arrays in,
    DeviceArray out.
    """
    if scale_c is None:
        return gemm_int8_scaled(A, B, scale_a, scale_b, out_dtype="fp32", layout="kn",
                                stream=stream)
    on_host = not _is_device(A)
    if on_host:   # one upload each, then both calls work on device memory
        A, B = (b if _is_device(b) else DeviceArray.from_numpy(_host_int8(b, name))
                for b, name in ((A, "A"), (B, "B")))
    # C may be freed while the quantization still reads it: its memory (the pool's, torch's or
    # CuPy's) is reused only after the work on the stream. A DeviceArray q keeps it all the
    # same, for a CUDA graph that captured the two calls and reads C at every replay.
    c = gemm_int8_scaled(A, B, scale_a, scale_b, out_dtype="fp32", layout="kn", stream=stream)
    q, _ = quantize_int8(c, granularity="tensor", scales=scale_c, stream=stream)
    if isinstance(q, DeviceArray):
        q._base = (q._base, c)
    return q.to_numpy() if on_host else q


def _host_int8(a, name):
    a = np.asarray(a)
    if a.dtype != np.int8:
        raise TypeError("%s has dtype %s, needs int8" % (name, a.dtype))
    if not a.flags.c_contiguous:
        raise ValueError("%s must be C-contiguous (use np.ascontiguousarray)" % name)
    return a
