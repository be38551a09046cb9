"""Python bindings for libcuda_kernels.so (ctypes; the C ABI is cuda_kernels.h).

Three levels, from convenient to exact:

* NumPy / ``__cuda_array_interface__`` functions: :func:`quantize_int8`,
  :func:`dequantize_int8`, :func:`quantize_int4`, :func:`dequantize_int4`, the matrix products
  :func:`gemm_int8` (int32 out), :func:`gemm_int8_scaled` (W8A8 with a fused scale/bias/ReLU
  epilogue), :func:`linear` (fp32/fp16/bf16), :func:`gemm_w4a16` (fp16/bf16 activations
  times a packed INT4 weight, W4A16) with :func:`w4a16_prepack` / :func:`gemm_w4a16_prepacked`
  (its fast path), :func:`gemm_int4` / :func:`gemm_int4_scaled` (INT4 x INT4), the checkpoint
  importers :func:`import_gptq` / :func:`import_awq` with :func:`permute_columns`, the layer
  :class:`QuantizedLinear`, the Mixture-of-experts layer (:func:`moe_route`,
  :func:`moe_prepack`, :func:`moe_forward`, :class:`QuantizedMoE`), and the seed API
  :func:`quantize_tensor` /
  :func:`dequantize_tensor` / :func:`int8_matmul`. NumPy inputs are copied to the GPU and the
  results come back as NumPy arrays. Objects with ``__cuda_array_interface__`` (torch, cupy,
  numba, :class:`DeviceArray`) are used in place, zero-copy; their results are
  :class:`DeviceArray` objects (or go into ``out=``).
* :data:`raw`: one function per C entry point, taking ints for device pointers and streams.
* :data:`cuda`: a small libcudart binding (malloc, memcpy, streams, CUDA graph capture) and
  :class:`DeviceArray`, a typed device buffer.

bfloat16 data is held as ``np.uint16`` bit patterns; ``dtype="bf16"`` (inputs),
``out_dtype="bf16"`` (outputs) or ``DeviceArray.ck_dtype == DType.BF16`` says so.
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

    xd = ck.DeviceArray.from_numpy(x)                        # or a torch/cupy CUDA tensor
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
import os
import threading

import numpy as np

__all__ = [
    "DType", "Status", "CKError", "CUDAError", "LibraryNotFoundError",
    "PER_TENSOR", "PER_ROW", "STATIC", "DYNAMIC", "INT4_SYMMETRIC", "INT4_ASYMMETRIC",
    "GROUP_ROW", "LAYOUT_NK", "LAYOUT_KN", "ACTIVATION_NONE", "ACTIVATION_RELU", "MOE_SWIGLU",
    "version", "device_count", "library_path", "load_library",
    "cuda", "CUDAGraph", "DeviceArray", "raw",
    "quantize_int8", "dequantize_int8", "quantize_int4", "dequantize_int4",
    "gemm_int8", "gemm_int8_scaled", "linear", "gemm_w4a16", "w4a16_prepack",
    "gemm_w4a16_prepacked", "import_gptq", "import_awq", "permute_columns", "gemm_int4",
    "gemm_int4_scaled", "QuantizedLinear", "MoeParams", "moe_route", "moe_prepack",
    "moe_workspace_size", "moe_forward", "QuantizedMoE",
    "quantize_tensor", "dequantize_tensor", "int8_matmul",
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


class MoeParams(ctypes.Structure):
    """ck_moe_params_t, field for field in the header's order: the arguments of
    ck_moe_workspace_size and ck_moe_forward (the raw level passes an instance by reference).

    Device pointers are ints (0 for NULL), enums and flags ints. struct_size defaults to
    ctypes.sizeof(MoeParams), what this module was written against; every other field to 0,
    which is the header's default where it has one (fp32 router logits, no renormalization,
    CK_MOE_SWIGLU). tests/test_abi.py checks the layout against the header's.
    """
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

    def __init__(self, **fields):
        fields.setdefault("struct_size", ctypes.sizeof(MoeParams))
        super().__init__(**fields)

    def __repr__(self):
        return "MoeParams(%s)" % ", ".join(
            "%s=%s" % (name, hex(getattr(self, name) or 0) if ctype is _VOIDP else
                       getattr(self, name)) for name, ctype in self._fields_)

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
    "ck_int4_groups_per_row": (_I64, (("cols", _I64), ("group_size", _I64))),
    "ck_quantize_int4": (_STATUS, (
        ("x_ptr", _PTR), ("x_dtype", _ENUM), ("rows", _I64), ("cols", _I64),
        ("group_size", _I64), ("mode", _ENUM), ("q_ptr", _PTR, "q_packed"), ("scales_ptr", _PTR),
        ("zeros_ptr", _PTR), _STREAM)),
    "ck_dequantize_int4": (_STATUS, (
        ("q_ptr", _PTR, "q_packed"), ("scales_ptr", _PTR), ("zeros_ptr", _PTR), ("rows", _I64),
        ("cols", _I64), ("group_size", _I64), ("mode", _ENUM), ("out_ptr", _PTR),
        ("out_dtype", _ENUM), _STREAM)),
    "ck_gemm_int8": (_STATUS, (
        ("a_ptr", _PTR), ("b_ptr", _PTR), ("b_layout", _ENUM), ("m", _I64), ("n", _I64),
        ("k", _I64), ("c_ptr", _PTR), _STREAM)),
    "ck_gemm_int8_scaled": (_STATUS, (
        ("a_ptr", _PTR), ("b_ptr", _PTR), ("b_layout", _ENUM), ("m", _I64), ("n", _I64),
        ("k", _I64), ("scale_a_ptr", _PTR), ("a_granularity", _ENUM), ("scale_b_ptr", _PTR),
        ("b_granularity", _ENUM), ("bias_ptr", _PTR), ("activation", _ENUM), ("out_ptr", _PTR),
        ("out_dtype", _ENUM), _STREAM)),
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
        result = getattr(load_library(), name)(*args)
        return None if returns_status else result

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
_ATTR_CC_MAJOR, _ATTR_CC_MINOR = 75, 76     # cudaDevAttrComputeCapabilityMajor / Minor

_PVOIDP = ctypes.POINTER(ctypes.c_void_p)
_CUDART_DECLARATIONS = {
    "cudaGetErrorString": (ctypes.c_char_p, (ctypes.c_int,)),
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
}

# Frees that arrive while a stream capture forbids cudaFree wait here until it ends.
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
            raise CUDAError(err, fname, self.error_string(err))

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
                    raise CUDAError(err, "cudaStreamEndCapture", self.error_string(err))
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


# ------------------------------------------------------------------------------------------------
# DeviceArray
# ------------------------------------------------------------------------------------------------
def _as_dtype_enum(value, name="dtype"):
    """A DType from a DType/int, a name ("fp32", "fp16", "bf16") or a NumPy dtype."""
    if value is None:
        return None
    if isinstance(value, DType):
        return value
    if isinstance(value, str) and value.lower() in _DTYPE_NAMES:
        return _DTYPE_NAMES[value.lower()]
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

    @classmethod
    def empty(cls, shape, dtype, ck_dtype=None):
        """An uninitialized array (cudaMalloc)."""
        if isinstance(shape, numbers.Integral):
            shape = (shape,)
        shape = tuple(int(s) for s in shape)
        if any(s < 0 for s in shape):
            raise ValueError("negative dimension in shape %s" % (shape,))
        nbytes = math.prod(shape) * np.dtype(dtype).itemsize
        arr = cls(0, shape, dtype, ck_dtype)   # validates dtype/ck_dtype before allocating
        arr.ptr = cuda.malloc(nbytes)
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
        """Sets every byte to `byte` (cudaMemset), e.g. to poison an output."""
        cuda.memset(self.ptr, byte, self.nbytes)
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
        """Releases the memory of an owning array (idempotent; deferred while a stream capture
        forbids cudaFree)."""
        ptr, owner = self.ptr, self._owner
        self.ptr, self._owner, self._base = 0, False, None
        if not (owner and ptr) or _shutting_down[0]:
            return
        if _capture_in_progress():
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
    try:
        return hasattr(obj, "__cuda_array_interface__")
    except Exception:  # noqa: BLE001 - it has one but will not give it (torch bf16): _cai says
        return True


def _c_contiguous(shape, strides, itemsize):
    expected = itemsize
    for dim, stride in zip(reversed(shape), reversed(strides)):
        if dim != 1 and stride != expected:
            return False
        expected *= dim
    return True


def _cai(obj, name):
    """(ptr, shape, dtype, readonly, stream) of an object with __cuda_array_interface__."""
    try:
        cai = obj.__cuda_array_interface__
    except TypeError as e:   # torch has no typestr for bfloat16
        raise TypeError("%s: %s (pass bfloat16 tensors as x.view(torch.int16) with dtype='bf16')"
                        % (name, e)) from e
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


def _ck_dtype(obj, dtype, override, name):
    """The library dtype of an argument: the explicit override, a DeviceArray's ck_dtype, or
    the NumPy dtype (uint16 only with an explicit bf16)."""
    if override == DType.BF16:
        if dtype.itemsize != 2 or dtype.kind not in "uiV":
            raise TypeError("%s has dtype %s: bf16 data is held as uint16 bit patterns"
                            % (name, dtype))
        return override
    if override is not None:
        if dtype != _NUMPY_OF[override]:
            raise TypeError("%s has dtype %s, not %s" % (name, dtype, override.name.lower()))
        return override
    if isinstance(obj, DeviceArray) and obj.ck_dtype is not None:
        return obj.ck_dtype
    if dtype.name == "bfloat16":   # ml_dtypes.bfloat16
        return DType.BF16
    if dtype.kind == "V" and dtype.itemsize == 2 and str(getattr(obj, "dtype", "")) == \
            "torch.bfloat16":   # torch exports bfloat16 as the opaque typestr "|V2"
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


class _Call:
    """Resolves the arrays of one convenience call to device pointers, allocates the outputs,
    and after the launch returns results in the caller's kind: NumPy in, NumPy out (copies);
    __cuda_array_interface__ in, DeviceArray out (or out=, in place)."""

    def __init__(self, primary, stream):
        self.device = _is_device(primary)
        if stream is None and self.device:
            stream = _cai(primary, "the first array")[4]
        self.stream = int(stream or 0)
        self._temps = []       # device buffers made here that no result owns
        self._downloads = []   # (device buffer, host array)
        self._launched = False

    def __enter__(self):
        return self

    def __exit__(self, exc_type, *rest):
        if exc_type is not None:
            self._release(sync=bool(self._temps))
        return False

    def input(self, obj, name, dtype=None, scalar_dtype=None, matrix=False, need=None):
        """An input array; host data is uploaded on the call's stream. matrix: must be a
        non-empty 1-D or 2-D array; need: its NumPy dtype, or _FLOAT_INPUT."""
        override = _as_dtype_enum(dtype, name + " dtype") if dtype is not None else None
        if _is_device(obj):
            ptr, shape, np_dtype, _, stream = _cai(obj, name)
            ck = _ck_dtype(obj, np_dtype, override, name)
            _check_input(shape, np_dtype, ck, name, matrix, need)
            return _Arg(ptr, shape, np_dtype, ck, obj, stream)
        if scalar_dtype is not None and isinstance(obj, numbers.Real) \
                and not isinstance(obj, (bool, np.ndarray)):
            a = np.array([obj], dtype=scalar_dtype)   # a Python float becomes one float32
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
        if a.dtype.name == "bfloat16":
            a = a.view(np.uint16)
        dev = DeviceArray.empty(a.shape, a.dtype, ck if ck == DType.BF16 else None)
        self._temps.append(dev)
        cuda.memcpy_htod(dev.ptr, a, stream=self.stream)
        if self.device:   # returned (static scales): hand back the uploaded copy
            return _Arg(dev.ptr, a.shape, a.dtype, ck, dev)
        return _Arg(dev.ptr, a.shape, a.dtype, ck, a)

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
        least nbytes bytes), or a new buffer that lives as long as the temporaries do (until the
        call's work is done)."""
        if given is not None:
            ptr, shape, dtype, readonly, _ = _cai(given, "workspace")
            have = math.prod(shape) * dtype.itemsize
            if have < nbytes:
                raise ValueError("workspace has %d bytes; the call needs %d" % (have, nbytes))
            if readonly:
                raise ValueError("workspace is read-only")
            return ptr, have
        dev = DeviceArray.empty((max(nbytes, 1),), np.uint8)   # cudaMalloc: 256-byte aligned
        self._temps.append(dev)
        return dev.ptr, nbytes

    def output(self, shape, np_dtype, ck_dtype, out, name):
        """An output: out= if given (checked), else a new DeviceArray or NumPy array."""
        np_dtype = np.dtype(np_dtype)
        want_ck = ck_dtype if ck_dtype == DType.BF16 else None
        if out is None:
            if self.device:
                dev = DeviceArray.empty(shape, np_dtype, want_ck)
                dev.stream = self.stream
                return _Arg(dev.ptr, shape, np_dtype, ck_dtype, dev)
            host = np.empty(shape, np_dtype)
        elif _is_device(out):
            ptr, oshape, odtype, readonly, _ = _cai(out, "out " + name)
            self._check_out(name, oshape, odtype, shape, np_dtype)
            if readonly:
                raise ValueError("out %s is read-only" % name)
            return _Arg(ptr, shape, np_dtype, ck_dtype, out)
        else:
            host = out
            if not isinstance(host, np.ndarray):
                raise TypeError("out %s must be a numpy.ndarray or a CUDA array, not %s"
                                % (name, type(out).__name__))
            self._check_out(name, host.shape, host.dtype, shape, np_dtype)
            if not host.flags.c_contiguous or not host.flags.writeable:
                raise ValueError("out %s must be C-contiguous and writeable" % name)
        dev = DeviceArray.empty(shape, np_dtype, want_ck)
        self._temps.append(dev)
        self._downloads.append((dev, host))
        return _Arg(dev.ptr, shape, np_dtype, ck_dtype, host)

    @staticmethod
    def _check_out(name, shape, dtype, want_shape, want_dtype):
        if dtype != want_dtype:
            raise TypeError("out %s has dtype %s, needs %s" % (name, dtype, want_dtype))
        if math.prod(shape) != math.prod(want_shape):
            raise ValueError("out %s has shape %s, needs %s" % (name, shape, want_shape))

    def finish(self, *args):
        """Downloads host results, releases temporaries, returns each argument's result."""
        for dev, host in self._downloads:
            cuda.memcpy_dtoh(host, dev.ptr, stream=self.stream)
        results = [a.result if a is not None else None for a in args]
        returned = [t for t in self._temps if any(t is r for r in results)]
        self._temps = [t for t in self._temps if not any(t is r for r in returned)]
        keeper = next((r for r in results if isinstance(r, DeviceArray) and r._owner), None)
        if self._downloads or keeper is None:
            self._release(sync=bool(self._temps) and not self._downloads)
        else:
            # Device results: the work may still be in flight, so what it reads lives as long
            # as the first result does.
            extra = self._temps + [r for r in returned if r is not keeper]
            if extra:
                keeper._base = (keeper._base, extra)
            self._temps = []
        return results[0] if len(results) == 1 else tuple(results)

    def _release(self, sync):
        if sync:
            try:
                cuda.stream_synchronize(self.stream)
            except CUDAError:
                pass
        temps, self._temps = self._temps, []
        for dev in temps:
            dev.free()


def _granularity(value, scales_size=None, rows=None):
    if value is None:   # inferred from the number of scales
        if scales_size == 1:
            return PER_TENSOR
        if scales_size == rows:
            return PER_ROW
        raise ValueError("scales has %s values: 1 (per tensor) or rows=%s (per row) expected"
                         % (scales_size, rows))
    return _named_enum(value, "granularity", "'tensor' or 'row'",
                       {"tensor": PER_TENSOR, "per_tensor": PER_TENSOR, "row": PER_ROW,
                        "per_row": PER_ROW})


def _named_enum(value, what, choices, names):
    """An enum value from one of its `names` (case-insensitive) or the int itself; an unknown
    name raises ValueError saying `what` takes `choices`."""
    if isinstance(value, str):
        if value.lower() not in names:
            raise ValueError("%s=%r: use %s" % (what, value, choices))
        return names[value.lower()]
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
    gran = _granularity(granularity)
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


def _layout(value):
    """LAYOUT_NK / LAYOUT_KN from "nk" / "kn" (or the int itself)."""
    return _named_enum(value, "layout", "'nk' (b is [N, K]) or 'kn' (b is [K, N])",
                       {"nk": LAYOUT_NK, "kn": LAYOUT_KN})


def _activation(value):
    """ACTIVATION_NONE / ACTIVATION_RELU from None, "none" or "relu" (or the int itself)."""
    if value is None:
        return ACTIVATION_NONE
    return _named_enum(value, "activation", "None, 'none' or 'relu'",
                       {"none": ACTIVATION_NONE, "relu": ACTIVATION_RELU})


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
    with _Call(a, stream) as call:
        aa = call.input(a, "a", matrix=True, need=np.int8)
        ba = call.input(b, "b", need=np.int8)
        m, n, k, out_shape = _gemm_shape(aa, ba, lay)
        sa, a_gran, sb, b_gran, bias_ptr, o = _epilogue_args(call, scale_a, scale_b, bias, m, n,
                                                             ck_out, out, out_shape)
        raw.gemm_int8_scaled(aa.ptr, ba.ptr, lay, m, n, k, sa.ptr, a_gran, sb.ptr, b_gran,
                             bias_ptr, act, o.ptr, ck_out, call.stream)
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
        if len(wa.shape) != 2 or wa.shape[0] == 0 or wa.shape[1] != (k + 1) // 2:
            raise ValueError("w_packed has shape %s: with x of shape %s it must be [N, %d] "
                             "(K=%d values packed two per byte)"
                             % (wa.shape, xa.shape, (k + 1) // 2, k))
        n = wa.shape[0]
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


def _packed_weight(call, w_packed, k_name="x"):
    """(arg, n, k) of a packed int4 weight uint8 [N, K // 2]."""
    wa = call.input(w_packed, "w_packed", need=np.uint8)
    if len(wa.shape) != 2 or wa.shape[0] == 0 or wa.shape[1] == 0:
        raise ValueError("w_packed must be a non-empty uint8 [N, K // 2], not of shape %s"
                         % (wa.shape,))
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
    if n is None or int(n) < 1:
        raise ValueError("n (the weight's number of rows) must be given and >= 1")
    n = int(n)
    act = _activation(activation)
    mode = INT4_SYMMETRIC if zeros_prepacked is None else INT4_ASYMMETRIC
    with _Call(x, stream) as call:
        xa = call.input(x, "x", dtype, matrix=True, need=_FLOAT_INPUT)
        m, k = _matrix(xa.shape, "x")
        wa = call.input(w_prepacked, "w_prepacked", need=np.uint8)
        _check_array(wa, "w_prepacked", np.uint8, max(raw.w4a16_prepacked_bytes(n, k), 0))
        nvalues = max(raw.w4a16_prepacked_groups(n, k, group_size), 0)
        sa = call.input(scales_prepacked, "scales_prepacked", xa.ck_dtype)
        _check_array(sa, "scales_prepacked", sa.dtype, nvalues)
        z_ptr = call.optional_input(zeros_prepacked, "zeros_prepacked", nvalues, need=np.uint8)
        bias_ptr = call.optional_input(bias, "bias", n, xa.ck_dtype)
        out_shape = (n,) if len(xa.shape) == 1 else (m, n)
        o = call.output(out_shape, _NUMPY_OF[xa.ck_dtype], xa.ck_dtype, out, "out")
        raw.gemm_w4a16_prepacked(xa.ptr, xa.ck_dtype, wa.ptr, sa.ptr, z_ptr, group_size, mode,
                                 bias_ptr, act, m, n, k, o.ptr, call.stream)
        return call.finish(o)


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
    if not _is_device(a) and dtype == DType.FP16 and np.asarray(a).dtype == np.float32:
        return np.asarray(a).astype(np.float16)
    return a


def _layer_host_result(y, out):
    """A layer's NumPy result of its device result y: downloaded, into `out` when given."""
    result = y.to_numpy()
    if out is None:
        return result
    out[...] = result.reshape(out.shape)
    return out


class QuantizedLinear:
    """A W4A16 linear layer whose weight lives on the GPU, prepacked: y = act(x @ w'.T + bias).

    Build it from a float weight (:meth:`from_float`, quantized on the device with
    :func:`quantize_int4`) or from checkpoint tensors (:meth:`from_gptq`, :meth:`from_awq`);
    call it on NumPy arrays (NumPy out) or CUDA arrays (DeviceArray out). dtype is the layer's
    activation dtype, fp16 or bf16; in_features must be a multiple of 32.
    """

    def __init__(self, w_packed, scales, zeros, group_size, dtype, bias=None, activation=None,
                 perm=None):
        """From an interchange-format weight already on the device (DeviceArrays or CUDA
        arrays): w_packed [N, K / 2], scales [N, groups], zeros or None; perm from GPTQ."""
        self.dtype = _as_dtype_enum(dtype, "dtype")
        if self.dtype not in (DType.FP16, DType.BF16):
            raise TypeError("QuantizedLinear runs in fp16 or bf16, not %s" % self.dtype.name)
        shape = _cai(w_packed, "w_packed")[1]
        self.out_features, self.in_features = shape[0], 2 * shape[1]
        self.group_size = group_size
        self.activation = _activation(activation)
        self.weight = w_packed, scales, zeros   # the interchange format (dequantize_int4 reads it)
        self.prepacked = w4a16_prepack(w_packed, scales, zeros, group_size, dtype=self.dtype)
        self.bias = None if bias is None else _to_device(_layer_host_cast(bias, self.dtype),
                                                         self.dtype)
        self.perm = None if perm is None else _to_device(perm, None)

    @classmethod
    def from_float(cls, weight, bias=None, group_size=128, symmetric=True, dtype=None,
                   activation=None):
        """weight [out_features, in_features] (nn.Linear layout) in fp16 or bf16 (uint16 bit
        patterns with dtype="bf16"); float32 NumPy weights are converted to fp16 first. bias:
        None or out_features values."""
        if not _is_device(weight) and np.asarray(weight).dtype == np.float32 and dtype is None:
            weight = np.asarray(weight).astype(np.float16)
        wd = _to_device(weight, dtype)
        layer_dtype = wd.ck_dtype
        w, s, z = quantize_int4(wd, group_size=group_size, symmetric=symmetric,
                                dtype=layer_dtype)
        return cls(w, s, z, group_size, layer_dtype, bias=bias, activation=activation)

    @classmethod
    def from_gptq(cls, qweight, qzeros, scales, g_idx=None, bias=None, group_size=128,
                  dtype=None, activation=None):
        """From GPTQ tensors (see :func:`import_gptq`); an act-order g_idx is honoured by
        gathering the input columns before each product."""
        dev = [_to_device(a, None) for a in (qweight, qzeros)]
        sd = _to_device(scales, dtype)
        gd = None if g_idx is None else np.asarray(g_idx) if not _is_device(g_idx) else g_idx
        w, s, z, perm = import_gptq(dev[0], dev[1], sd, g_idx=gd, group_size=group_size)
        return cls(w, s, z, group_size, sd.ck_dtype, bias=bias, activation=activation,
                   perm=perm)

    @classmethod
    def from_awq(cls, qweight, qzeros, scales, bias=None, group_size=128, dtype=None,
                 activation=None):
        """From AWQ tensors (see :func:`import_awq`)."""
        dev = [_to_device(a, None) for a in (qweight, qzeros)]
        sd = _to_device(scales, dtype)
        w, s, z = import_awq(dev[0], dev[1], sd, group_size=group_size)
        return cls(w, s, z, group_size, sd.ck_dtype, bias=bias, activation=activation)

    def __call__(self, x, out=None, stream=None):
        """x [M, in_features] (or [in_features]) in the layer's dtype -> [M, out_features]."""
        on_host = not _is_device(x)
        xd = _to_device(_layer_host_cast(x, self.dtype), self.dtype) if on_host else x
        if self.perm is not None:
            xd = permute_columns(xd, self.perm, dtype=self.dtype, stream=stream)
        w, s, z = self.prepacked
        y = gemm_w4a16_prepacked(xd, w, s, z, n=self.out_features, group_size=self.group_size,
                                 bias=self.bias, activation=self.activation,
                                 out=None if on_host else out, dtype=self.dtype, stream=stream)
        return _layer_host_result(y, out) if on_host else y

    def __repr__(self):
        return ("QuantizedLinear(in_features=%d, out_features=%d, group_size=%d, dtype=%s%s)"
                % (self.in_features, self.out_features, self.group_size,
                   self.dtype.name.lower(), ", act-order" if self.perm is not None else ""))


def _to_device(a, dtype):
    """A CUDA array as it is, or a NumPy array uploaded to a DeviceArray (ck dtype `dtype`)."""
    if _is_device(a):
        return a
    a = np.ascontiguousarray(a)
    ck_dtype = _as_dtype_enum(dtype, "dtype") if dtype is not None else None
    if ck_dtype == DType.BF16 and a.dtype != np.uint16:
        raise TypeError("bf16 data is held as uint16 bit patterns, not %s" % a.dtype)
    return DeviceArray.from_numpy(a, ck_dtype=ck_dtype)


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
    workspace: None allocates :func:`moe_workspace_size` bytes for the call (kept until its
    work is done); a CUDA array of at least that many bytes, 256-byte aligned (as cudaMalloc
    returns), is used instead (no allocation: what CUDA graph capture needs).
    Returns [T, H] (or [H]) in the dtype of x.
    """
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


class QuantizedMoE:
    """A Mixture-of-experts feed-forward layer (Mixtral / Qwen-MoE / DeepSeek style) whose INT4
    experts live on the GPU, prepacked: out[t] = sum over the top_k experts e of token t of
    w[t, e] * (silu(x W1_e^T) * (x W3_e^T)) W2_e^T (:func:`moe_forward`).

    Build it from float weights (:meth:`from_float`, quantized on the device with
    :func:`quantize_int4`) or from interchange-format weights on the device; call it on NumPy
    arrays (NumPy out) or CUDA arrays (DeviceArray out) with router logits or with the caller's
    expert ids and weights. dtype is the layer's activation dtype, fp16 or bf16; hidden and
    intermediate sizes must be multiples of 32.
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
    elif _is_device(scales):
        raise TypeError("unexpected scales type %s" % type(scales).__name__)
    return q, float(scales[0])


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
    c = gemm_int8_scaled(A, B, scale_a, scale_b, out_dtype="fp32", layout="kn", stream=stream)
    q, _ = quantize_int8(c, granularity="tensor", scales=scale_c, stream=stream)
    q._base = (q._base, c)   # C is read by work that may still be in flight
    return q.to_numpy() if on_host else q


def _host_int8(a, name):
    a = np.asarray(a)
    if a.dtype != np.int8:
        raise TypeError("%s has dtype %s, needs int8" % (name, a.dtype))
    if not a.flags.c_contiguous:
        raise ValueError("%s must be C-contiguous (use np.ascontiguousarray)" % name)
    return a
