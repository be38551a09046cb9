"""The fuzzer's description of the C ABI: what each argument of each export of cuda_kernels.h is,
the values Hypothesis draws for it, and the header's validation rules as an executable model.

The wrapper's DECLARATIONS table gives every export's arguments (names and ctypes types); the
ctypes type alone does not say which int is an enum and which a size, which pointer is a device
buffer (and how it must be aligned) and which a handle, so DESCRIPTIONS gives each argument a
kind:

    Pointer(align)       a device buffer the entry point requires (NULL: CK_STATUS_INVALID_VALUE),
                         aligned to `align` bytes, or to the element size of a dtype argument
                         (misaligned: CK_STATUS_MISALIGNED); optional=True allows NULL (bias)
    ZeroPoints(mode)     given exactly for CK_INT4_ASYMMETRIC (else CK_STATUS_INVALID_VALUE)
    PairedPointer(p)     given exactly when pointer p is (GPTQ's perm, with g_idx)
    Size(multiple)       int64_t >= 1 (else CK_STATUS_INVALID_VALUE); `multiple` only steers the
                         valid draws towards the export's multiple-of rules, which RULES check
    Enum(count)          a C enum with the values 0 .. count - 1 (else CK_STATUS_INVALID_VALUE)
    DTypeArg(accepted)   a ck_dtype_t: not one (CK_STATUS_INVALID_VALUE), or one the export does
                         not take (CK_STATUS_UNSUPPORTED)
    GroupSize()          32, 64, 128 or CK_GROUP_ROW (else CK_STATUS_UNSUPPORTED)
    Stream()             the stream: a handle, drawn among the ones CUDA defines (0, the legacy
                         and the per-thread default streams); never garbage, which a launch
                         would dereference
    HostInt()            ck_device_count's int*: NULL or a real host int
    AnyInt(bits)         any value of the type (ck_status_string's status)

and each status-returning export a list of cross-argument rules (shape multiples, overflowing
byte counts, layouts): `violations(name, args)` lists every rule a call breaks, each as the
status the header documents for it and the arguments a message must name. A call without
violations is valid: where no CUDA device is visible, the library must pass it to its launch,
which answers CK_STATUS_NO_DEVICE.

Draws: every argument has a strategy for valid values (sizes on the export's multiples, aligned
pointers, enums in range) and one over the whole range of its C type (any int64, any 32-bit
enum value, NULL, misaligned, host and wild pointers). A drawn call changes a few of its
arguments (none, one, two, three or all) to the whole-range strategy, so that valid calls, calls
with exactly one defect (whose status and message are then exactly predicted) and calls with
many defects all occur.

The pointers are never dereferenced by validation: fake device addresses are unmapped here,
HOST_NOACCESS is a mapped page that any access faults on, and HOST_BUFFER is a host buffer whose
bytes the tests check after every call.

Hypothesis profiles (CK_FUZZ_PROFILE): "ci", the default, 200 examples per export, derandomized
(every run draws the same calls) and without a deadline; "long", CK_FUZZ_EXAMPLES (default 5000)
examples per export, freshly random on each run.
"""
import ctypes
import mmap
import os
import re
import typing

import numpy as np
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

import cuda_wrapper as ck
from cuda_wrapper import DType, Status

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HEADER = os.path.join(REPO_ROOT, "cuda_kernels.h")

# ---------------------------------------------------------------------------------------------
# Hypothesis profiles
# ---------------------------------------------------------------------------------------------
CI_EXAMPLES = 200
_HEALTH = [HealthCheck.too_slow, HealthCheck.data_too_large]
settings.register_profile("ci", max_examples=CI_EXAMPLES, deadline=None, derandomize=True,
                          database=None, suppress_health_check=_HEALTH)
settings.register_profile("long", max_examples=int(os.environ.get("CK_FUZZ_EXAMPLES", "5000")),
                          deadline=None, derandomize=False, database=None,
                          suppress_health_check=_HEALTH)
PROFILE = os.environ.get("CK_FUZZ_PROFILE", "ci")
settings.load_profile(PROFILE)

# ---------------------------------------------------------------------------------------------
# Ranges of the C types
# ---------------------------------------------------------------------------------------------
INT64_MIN, INT64_MAX = -2**63, 2**63 - 1
INT32_MIN, INT32_MAX = -2**31, 2**31 - 1
UINT64_MAX = 2**64 - 1

# Sizes that break 32- and 64-bit arithmetic alone or as products of two: around 2^31 and 2^32,
# around sqrt(2^63) (a square just past INT64_MAX) and 2^32 + 1 (a square that wraps modulo 2^64
# to a small positive number), the prepacked layout's 2^40, 2^61 .. 2^63 - 1.
SPECIAL_SIZES = (
    INT64_MIN, INT64_MIN + 1, -2**32, INT32_MIN - 1, INT32_MIN, -4097, -256, -32, -16, -2, -1,
    0, 1, 2, 3, 7, 8, 15, 16, 17, 24, 31, 32, 33, 48, 63, 64, 65, 96, 100, 127, 128, 129, 255,
    256, 257, 4095, 4096, 4097, 14336, 65535, 65536, 65537,
    INT32_MAX - 1, INT32_MAX, 2**31, 2**31 + 1, 2**32 - 1, 2**32, 2**32 + 1, 2**32 + 32,
    3037000499, 3037000500, 3037000512, 2**40 - 32, 2**40, 2**40 + 32, 2**41, 2**48,
    2**61 - 32, 2**61, 2**62, 2**62 + 32, INT64_MAX - 31, INT64_MAX - 1, INT64_MAX,
)
SPECIAL_ENUMS = (INT32_MIN, INT32_MIN + 1, -99, -2, -1, 0, 1, 2, 3, 5, 6, 7, 8, 99, 255, 256,
                 INT32_MAX - 1, INT32_MAX)

# ---------------------------------------------------------------------------------------------
# The pointers a call can be given
# ---------------------------------------------------------------------------------------------
FAKE_DEVICE = 0x7F0000100000   # unmapped on the host, 256-byte aligned, like cudaMalloc's
HIGH_ADDRESS = 0xFFFFFFFFFFFF0000   # near the top of the address space: base + bytes wraps
_SPAN = 1 << 16


def _host_noaccess_page():
    """The address of a mapped, inaccessible region (PROT_NONE): a read or write faults."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                          ctypes.c_int, ctypes.c_long]
    address = libc.mmap(None, _SPAN, 0, mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS, -1, 0)
    if address in (None, ctypes.c_void_p(-1).value):
        raise OSError(ctypes.get_errno(), "mmap of an inaccessible page failed")
    return address


HOST_BUFFER_BYTE = 0xA5
_host_storage = np.full(_SPAN + 256, HOST_BUFFER_BYTE, np.uint8)
HOST_BUFFER = -(-_host_storage.ctypes.data // 256) * 256
HOST_NOACCESS = _host_noaccess_page()
POINTER_BASES = (FAKE_DEVICE, HOST_BUFFER, HOST_NOACCESS, HIGH_ADDRESS)


def host_buffer_intact():
    """True when no call wrote into HOST_BUFFER's bytes."""
    return bool((_host_storage == HOST_BUFFER_BYTE).all())


# ---------------------------------------------------------------------------------------------
# Violations: what the header says a broken rule returns
# ---------------------------------------------------------------------------------------------
class Violation(typing.NamedTuple):
    status: Status
    names: tuple       # the arguments (the header's names): the message names one of them
    values: tuple = ()  # the offending integers: a message about this violation states them


def _element_size(dtype):
    """Bytes of a ck_dtype_t value, or None for a value that is none."""
    try:
        return ck._NUMPY_OF[DType(dtype)].itemsize
    except ValueError:
        return None


FLOAT_DTYPES = (DType.FP32, DType.FP16, DType.BF16)
HALF_DTYPES = (DType.FP16, DType.BF16)


# ---------------------------------------------------------------------------------------------
# Argument kinds
# ---------------------------------------------------------------------------------------------
class Kind:
    """An argument kind: strategies for valid and for any values, `settle` (a valid value once
    the other arguments are known, for arguments whose validity depends on them) and the
    violations of the value in a call."""

    corruptible = True   # drawn from any() when the call changes this argument

    def example(self):
        raise NotImplementedError

    def valid(self):
        raise NotImplementedError

    def any(self):
        return self.valid()

    def settle(self, name, args):
        return args[name]

    def violations(self, name, label, args):
        return []

    def strategy(self, whole_range):
        """any() or valid(), built once (Hypothesis validates a strategy on its first draw)."""
        key = "_any_strategy" if whole_range else "_valid_strategy"
        if key not in self.__dict__:
            self.__dict__[key] = self.any() if whole_range else self.valid()
        return self.__dict__[key]


def _valid_pointers():
    return st.builds(lambda base, k: base + 256 * k, st.sampled_from(POINTER_BASES[:3]),
                     st.integers(0, 64))


def _any_pointers():
    misaligned = st.builds(lambda base, d: (base + d) % 2**64, st.sampled_from(POINTER_BASES),
                           st.sampled_from((1, 2, 3, 4, 6, 8, 12, 15, 16, 20, 32, 48, 255)))
    return st.one_of(st.just(0), _valid_pointers(), misaligned, st.integers(1, UINT64_MAX))


class Pointer(Kind):
    """A device buffer; align: bytes, or the name of the dtype argument whose element size it
    takes; optional: NULL allowed (and then no alignment)."""

    def __init__(self, align=1, optional=False):
        self.align, self.optional = align, optional

    def alignment(self, args):
        if isinstance(self.align, int):
            return self.align
        return _element_size(args[self.align])

    def example(self):
        return 0 if self.optional else FAKE_DEVICE

    def valid(self):
        return st.one_of(st.just(0), _valid_pointers()) if self.optional else _valid_pointers()

    def any(self):
        return _any_pointers()

    def _required(self, args):
        return not self.optional

    def violations(self, name, label, args):
        pointer = args[name]
        if pointer == 0:
            return [Violation(Status.INVALID_VALUE, (label,))] if self._required(args) else []
        align = self.alignment(args)
        if align and pointer % align:
            return [Violation(Status.MISALIGNED, (label,))]
        return []


class ZeroPoints(Pointer):
    """The zero points of a packed INT4 tensor: required for CK_INT4_ASYMMETRIC, NULL for
    CK_INT4_SYMMETRIC (the mode argument `mode`). said_as: the name the library's messages give
    the argument where it is not the header's."""

    def __init__(self, mode="mode", align=1, said_as=None):
        super().__init__(align)
        self.mode, self.said_as = mode, said_as

    def example(self):
        return 0

    def settle(self, name, args):
        return 0 if args[self.mode] == ck.INT4_SYMMETRIC else args[name]

    def violations(self, name, label, args):
        mode, said = args[self.mode], self.said_as or label
        if mode == ck.INT4_SYMMETRIC and args[name]:
            return [Violation(Status.INVALID_VALUE, (said,))]
        if mode == ck.INT4_ASYMMETRIC and not args[name]:
            return [Violation(Status.INVALID_VALUE, (said,))]
        if mode == ck.INT4_ASYMMETRIC:
            return super().violations(name, label, args)
        return []   # an invalid mode is the mode's violation


class PairedPointer(Pointer):
    """Given exactly when the pointer argument `partner` is (GPTQ's perm goes with g_idx)."""

    def __init__(self, partner, partner_label, align=1):
        super().__init__(align)
        self.partner, self.partner_label = partner, partner_label

    def example(self):
        return 0

    def settle(self, name, args):
        return args[name] if args[self.partner] else 0

    def violations(self, name, label, args):
        if args[self.partner]:
            return super().violations(name, label, args)
        if args[name]:
            return [Violation(Status.INVALID_VALUE, (label, self.partner_label))]
        return []


def _round_up(value, multiple):
    rounded = -(-value // multiple) * multiple
    return rounded if rounded <= INT64_MAX else value // multiple * multiple


class Size(Kind):
    """An int64_t size: >= 1. Valid draws are multiples of `multiple`."""

    def __init__(self, multiple=1):
        self.multiple = multiple

    def example(self):
        return 256

    def valid(self):
        base = st.one_of(st.integers(1, 300), st.sampled_from([v for v in SPECIAL_SIZES if v >= 1]),
                         st.integers(1, 2**40))
        return base.map(lambda v: _round_up(v, self.multiple))

    def any(self):
        return st.one_of(st.sampled_from(SPECIAL_SIZES), st.integers(INT64_MIN, INT64_MAX),
                         st.integers(-300, 300))

    def violations(self, name, label, args):
        value = args[name]
        if value < 1:
            return [Violation(Status.INVALID_VALUE, (label,), (value,))]
        return []


class Enum(Kind):
    """A C enum with the values 0 .. count - 1 (an int: any 32-bit value can arrive)."""

    def __init__(self, count):
        self.count = count

    def example(self):
        return 0

    def valid(self):
        return st.integers(0, self.count - 1)

    def any(self):
        return st.one_of(st.sampled_from(SPECIAL_ENUMS), st.integers(INT32_MIN, INT32_MAX),
                         st.integers(-3, self.count + 3))

    def violations(self, name, label, args):
        value = args[name]
        if not 0 <= value < self.count:
            return [Violation(Status.INVALID_VALUE, (label,), (value,))]
        return []


class DTypeArg(Kind):
    """A ck_dtype_t argument; `accepted`: the dtypes the export takes."""

    def __init__(self, accepted):
        self.accepted = tuple(accepted)

    def example(self):
        return self.accepted[0]

    def valid(self):
        return st.sampled_from(self.accepted)

    def any(self):
        return st.one_of(st.integers(-1, 7), st.sampled_from(SPECIAL_ENUMS),
                         st.integers(INT32_MIN, INT32_MAX))

    def violations(self, name, label, args):
        value = args[name]
        if _element_size(value) is None:
            return [Violation(Status.INVALID_VALUE, (label,), (value,))]
        if value not in self.accepted:
            return [Violation(Status.UNSUPPORTED, (label,))]
        return []


GROUP_SIZES = (32, 64, 128, ck.GROUP_ROW)


class GroupSize(Kind):
    def example(self):
        return 128

    def valid(self):
        return st.sampled_from(GROUP_SIZES)

    def any(self):
        odd = (0, 1, 2, 16, 31, 33, 48, 96, 127, 129, 256, 4096, -2, -32, -128)
        return st.one_of(st.sampled_from(odd + GROUP_SIZES), st.sampled_from(SPECIAL_SIZES),
                         st.integers(INT64_MIN, INT64_MAX))

    def violations(self, name, label, args):
        value = args[name]
        if value not in GROUP_SIZES:
            return [Violation(Status.UNSUPPORTED, (label,), (value,))]
        return []


# cudaStreamLegacy and cudaStreamPerThread: handles that CUDA defines besides 0.
STREAM_HANDLES = (0, 1, 2)


class Stream(Kind):
    corruptible = False

    def example(self):
        return 0

    def valid(self):
        return st.sampled_from(STREAM_HANDLES)


class HostInt(Kind):
    """ck_device_count's int*: NULL, or a real int the call writes (never garbage: a host
    out-parameter is the caller's to get right)."""

    def example(self):
        return "int"

    def valid(self):
        return st.just("int")

    def any(self):
        return st.sampled_from(("int", None))


class AnyInt(Kind):
    """Any value of a C int (ck_status_string's status)."""

    def example(self):
        return 0

    def valid(self):
        return st.one_of(st.integers(0, 7), st.sampled_from(SPECIAL_ENUMS),
                         st.integers(INT32_MIN, INT32_MAX))


# ---------------------------------------------------------------------------------------------
# Cross-argument rules of the status-returning exports
# ---------------------------------------------------------------------------------------------
def _positive(args, *names):
    return all(isinstance(args[n], int) and args[n] >= 1 for n in names)


def matrix_bytes(rows, cols, dtype_arg):
    """rows * cols elements of the dtype argument's size: the byte count fits in int64_t."""
    def rule(args):
        size = _element_size(args[dtype_arg])
        if size is None or not _positive(args, rows, cols):
            return []
        if args[rows] * args[cols] * size > INT64_MAX:
            return [Violation(Status.INVALID_VALUE, (rows, cols), (args[rows], args[cols]))]
        return []
    return rule


def gemm_bytes(m, n, k, out_size):
    """The GEMMs' operands [M, K], [N, K] and [M, N], each counted at max(4, the output
    element's size) bytes (int32 accumulators): each byte count fits in int64_t. m: an argument
    name or 1 (a single row, for the weight conversions); out_size: bytes, or the name of the
    output's dtype argument."""
    def rule(args):
        size = out_size if isinstance(out_size, int) else _element_size(args[out_size])
        names = [name for name in (m, n, k) if isinstance(name, str)]
        if size is None or not _positive(args, *names):
            return []
        mv = args[m] if isinstance(m, str) else m
        nv, kv = args[n], args[k]
        elem = max(size, 4)
        if max(mv * kv, nv * kv, mv * nv) * elem > INT64_MAX:
            return [Violation(Status.INVALID_VALUE, tuple(names), tuple(args[x] for x in names))]
        return []
    return rule


def multiple_of(arg, divisor, when=None):
    """arg a multiple of divisor (CK_STATUS_UNSUPPORTED), for a positive arg; when(args): the
    calls the rule applies to."""
    def rule(args):
        value = args[arg]
        if not _positive(args, arg) or (when and not when(args)) or value % divisor == 0:
            return []
        return [Violation(Status.UNSUPPORTED, (arg,), (value,))]
    return rule


def linear_multiples(args):
    """ck_linear: K and N multiples of 16 / sizeof(dtype), so that rows start 16-byte aligned."""
    if args["dtype"] not in FLOAT_DTYPES:
        return []
    per_vector = 16 // _element_size(args["dtype"])
    return (multiple_of("k", per_vector)(args) + multiple_of("n", per_vector)(args))


# ck_w4a16_prepacked_bytes returns 0 (and ck_w4a16_prepack refuses the call) beyond N or K of
# 2^40: the library's limit, which cuda_kernels.h does not state (see the xfail test
# test_prepacked_layout_has_no_undocumented_limit).
PREPACK_LIMIT = 2**40


def prepacked_bytes(n, k):
    """ck_w4a16_prepacked_bytes: ceil(N / 8) * 8 * ceil(K / 128) * 128 / 2 for K a multiple of
    32, 0 when an argument is invalid (or past PREPACK_LIMIT) or the count overflows."""
    if n < 1 or k < 32 or k % 32 or n > PREPACK_LIMIT or k > PREPACK_LIMIT:
        return 0
    nbytes = -(-n // 8) * 8 * (-(-k // 128) * 128 // 2)
    return nbytes if nbytes <= INT64_MAX else 0


def groups_per_row(cols, group_size):
    """ck_int4_groups_per_row: ceil(cols / group_size), 1 for CK_GROUP_ROW, 0 when invalid."""
    if cols < 1 or group_size not in GROUP_SIZES:
        return 0
    return 1 if group_size == ck.GROUP_ROW else -(-cols // group_size)


def prepacked_groups(n, k, group_size):
    """ck_w4a16_prepacked_groups: ceil(N / 8) * 8 * groups per row, 0 when invalid."""
    groups = groups_per_row(k, group_size)
    if groups == 0 or prepacked_bytes(n, k) == 0:
        return 0
    values = -(-n // 8) * 8 * groups
    return values if values <= INT64_MAX else 0


def prepack_size_rule(args):
    """ck_w4a16_prepack: the prepacked weight must have a byte count (ck_w4a16_prepacked_bytes
    not 0), once N and K pass the other rules."""
    n, k = args["n"], args["k"]
    if not _positive(args, "n", "k") or k % 32 or n * k * 4 > INT64_MAX:
        return []
    if prepacked_bytes(n, k) == 0:
        return [Violation(Status.INVALID_VALUE, ("n", "k"), (n, k))]
    return []


def kn_layout(args):
    return args["b_layout"] == ck.LAYOUT_KN


# ---------------------------------------------------------------------------------------------
# The table: every export of cuda_kernels.h
# ---------------------------------------------------------------------------------------------
class Description(typing.NamedTuple):
    arguments: dict     # DECLARATIONS' argument name -> Kind, in the declaration's order
    rules: tuple = ()   # cross-argument rules (status exports)
    drive: str = "validated"   # the property test that drives it (test_fuzz_abi.py)


FLOATS = DTypeArg(FLOAT_DTYPES)
HALVES = DTypeArg(HALF_DTYPES)
GRANULARITY, SCALE_MODE, INT4_MODE = Enum(2), Enum(2), Enum(2)
LAYOUT, ACTIVATION = Enum(2), Enum(2)


def _int8_gemm_shape():
    return {"a_ptr": Pointer(16), "b_ptr": Pointer(16), "b_layout": LAYOUT, "m": Size(),
            "n": Size(16), "k": Size(16)}


def _epilogue(out_dtype="out_dtype"):
    return {"scale_a_ptr": Pointer(4), "a_granularity": GRANULARITY, "scale_b_ptr": Pointer(4),
            "b_granularity": GRANULARITY, "bias_ptr": Pointer(out_dtype, optional=True),
            "activation": ACTIVATION}


def _w4a16(prepacked):
    align = 16 if prepacked else "dtype"
    # ck_gemm_w4a16_prepacked's messages about a missing or superfluous zeros_prepacked call it
    # "zeros" (test_fuzz_abi.py: test_prepacked_zero_points_are_named_as_in_the_header, xfail).
    zeros = ZeroPoints(align=16, said_as="zeros") if prepacked else ZeroPoints()
    return {"x_ptr": Pointer(16), "dtype": HALVES, "w_ptr": Pointer(16),
            "scales_ptr": Pointer(align), "zeros_ptr": zeros,
            "group_size": GroupSize(), "mode": INT4_MODE,
            "bias_ptr": Pointer("dtype", optional=True), "activation": ACTIVATION, "m": Size(),
            "n": Size(), "k": Size(32), "out_ptr": Pointer("dtype"), "stream": Stream()}


def _import(gptq):
    arguments = {"qweight_ptr": Pointer(4), "qzeros_ptr": Pointer(4), "scales_ptr": Pointer("dtype")}
    if gptq:
        arguments["g_idx_ptr"] = Pointer(4, optional=True)
    arguments.update({"dtype": HALVES, "n": Size(8), "k": Size(32), "group_size": GroupSize(),
                      "w_ptr": Pointer(1), "scales_out_ptr": Pointer("dtype"),
                      "zeros_out_ptr": Pointer(1)})
    if gptq:
        arguments["perm_ptr"] = PairedPointer("g_idx_ptr", "g_idx", 4)
    arguments["stream"] = Stream()
    return arguments


_IMPORT_RULES = (gemm_bytes(1, "n", "k", 4), multiple_of("n", 8), multiple_of("k", 32))

# Exports whose fuzz description is still to be written (their struct argument needs a kind of
# its own); test_abi.py's bad-argument tables cover them meanwhile. The list may only shrink.
UNDESCRIBED = {"ck_moe_forward", "ck_moe_prepack", "ck_moe_prepacked_bytes",
               "ck_moe_prepacked_groups", "ck_moe_route", "ck_moe_workspace_size"}

DESCRIPTIONS = {
    "ck_version": Description({}, drive="state"),
    "ck_status_string": Description({"status": AnyInt()}, drive="status_string"),
    "ck_last_error_message": Description({}, drive="state"),
    "ck_last_cuda_error": Description({}, drive="state"),
    "ck_device_count": Description({"count": HostInt()}, drive="device_count"),
    "ck_quantize_int8": Description(
        {"x_ptr": Pointer("x_dtype"), "x_dtype": FLOATS, "rows": Size(), "cols": Size(),
         "granularity": GRANULARITY, "scale_mode": SCALE_MODE, "scales_ptr": Pointer(4),
         "q_ptr": Pointer(1), "stream": Stream()},
        (matrix_bytes("rows", "cols", "x_dtype"),)),
    "ck_dequantize_int8": Description(
        {"q_ptr": Pointer(1), "scales_ptr": Pointer(4), "rows": Size(), "cols": Size(),
         "granularity": GRANULARITY, "out_ptr": Pointer("out_dtype"), "out_dtype": FLOATS,
         "stream": Stream()},
        (matrix_bytes("rows", "cols", "out_dtype"),)),
    "ck_int4_groups_per_row": Description({"cols": Size(), "group_size": GroupSize()},
                                          drive="pure"),
    "ck_quantize_int4": Description(
        {"x_ptr": Pointer("x_dtype"), "x_dtype": FLOATS, "rows": Size(), "cols": Size(),
         "group_size": GroupSize(), "mode": INT4_MODE, "q_ptr": Pointer(1),
         "scales_ptr": Pointer("x_dtype"), "zeros_ptr": ZeroPoints(), "stream": Stream()},
        (matrix_bytes("rows", "cols", "x_dtype"),)),
    "ck_dequantize_int4": Description(
        {"q_ptr": Pointer(1), "scales_ptr": Pointer("out_dtype"), "zeros_ptr": ZeroPoints(),
         "rows": Size(), "cols": Size(), "group_size": GroupSize(), "mode": INT4_MODE,
         "out_ptr": Pointer("out_dtype"), "out_dtype": FLOATS, "stream": Stream()},
        (matrix_bytes("rows", "cols", "out_dtype"),)),
    "ck_gemm_int8": Description(
        dict(_int8_gemm_shape(), c_ptr=Pointer(4), stream=Stream()),
        (gemm_bytes("m", "n", "k", 4), multiple_of("k", 16), multiple_of("n", 16, kn_layout))),
    "ck_gemm_int8_scaled": Description(
        dict(_int8_gemm_shape(), **_epilogue(), out_ptr=Pointer("out_dtype"), out_dtype=FLOATS,
             stream=Stream()),
        (gemm_bytes("m", "n", "k", "out_dtype"), multiple_of("k", 16),
         multiple_of("n", 16, kn_layout))),
    "ck_linear": Description(
        {"x_ptr": Pointer(16), "w_ptr": Pointer(16), "bias_ptr": Pointer(16, optional=True),
         "dtype": FLOATS, "m": Size(), "n": Size(8), "k": Size(8), "activation": ACTIVATION,
         "out_ptr": Pointer(16), "stream": Stream()},
        (gemm_bytes("m", "n", "k", "dtype"), linear_multiples)),
    "ck_gemm_w4a16": Description(
        _w4a16(prepacked=False), (gemm_bytes("m", "n", "k", "dtype"), multiple_of("k", 32))),
    "ck_w4a16_prepacked_bytes": Description({"n": Size(), "k": Size(32)}, drive="pure"),
    "ck_w4a16_prepacked_groups": Description(
        {"n": Size(), "k": Size(32), "group_size": GroupSize()}, drive="pure"),
    "ck_w4a16_prepack": Description(
        {"w_ptr": Pointer(16), "scales_ptr": Pointer("dtype"), "zeros_ptr": ZeroPoints(),
         "dtype": HALVES, "n": Size(), "k": Size(32), "group_size": GroupSize(),
         "mode": INT4_MODE, "w_out_ptr": Pointer(16), "scales_out_ptr": Pointer(16),
         "zeros_out_ptr": ZeroPoints(align=16), "stream": Stream()},
        (gemm_bytes(1, "n", "k", 2), multiple_of("k", 32), prepack_size_rule)),
    "ck_gemm_w4a16_prepacked": Description(
        _w4a16(prepacked=True), (gemm_bytes("m", "n", "k", "dtype"), multiple_of("k", 32))),
    "ck_import_gptq": Description(_import(gptq=True), _IMPORT_RULES),
    "ck_import_awq": Description(_import(gptq=False), _IMPORT_RULES),
    "ck_permute_columns": Description(
        {"x_ptr": Pointer("dtype"), "dtype": FLOATS, "rows": Size(), "cols": Size(),
         "perm_ptr": Pointer(4), "out_ptr": Pointer("dtype"), "stream": Stream()},
        (matrix_bytes("rows", "cols", "dtype"),)),
    "ck_gemm_int4": Description(
        {"a_ptr": Pointer(16), "b_ptr": Pointer(16), "m": Size(), "n": Size(), "k": Size(32),
         "c_ptr": Pointer(4), "stream": Stream()},
        (gemm_bytes("m", "n", "k", 4), multiple_of("k", 32))),
    "ck_gemm_int4_scaled": Description(
        {"a_ptr": Pointer(16), "b_ptr": Pointer(16), "m": Size(), "n": Size(), "k": Size(32),
         **_epilogue(), "out_ptr": Pointer("out_dtype"), "out_dtype": FLOATS,
         "stream": Stream()},
        (gemm_bytes("m", "n", "k", "out_dtype"), multiple_of("k", 32))),
}

VALIDATED = sorted(name for name, d in DESCRIPTIONS.items() if d.drive == "validated")


def header_label(name, arg):
    """The header's name of a DECLARATIONS argument: its third field, else its name less the
    "_ptr" of a device pointer."""
    for param in ck.DECLARATIONS[name][1]:
        if param[0] == arg:
            if len(param) == 3:
                return param[2]
            return arg[:-len("_ptr")] if arg.endswith("_ptr") else arg
    raise KeyError("%s has no argument %s" % (name, arg))


def violations(name, args):
    """Every rule of cuda_kernels.h that the call name(**args) breaks."""
    description = DESCRIPTIONS[name]
    found = []
    for arg, kind in description.arguments.items():
        found += kind.violations(arg, header_label(name, arg), args)
    for rule in description.rules:
        found += rule(args)
    return found


def example_call(name):
    """A valid call of a status-returning export (its arguments by name)."""
    arguments = DESCRIPTIONS[name].arguments
    args = {arg: kind.example() for arg, kind in arguments.items()}
    pointers = iter(range(1, 64))
    for arg, kind in arguments.items():   # each buffer at its own fake address
        if isinstance(kind, Pointer) and args[arg]:
            args[arg] = FAKE_DEVICE + next(pointers) * 0x100000
    for arg, kind in arguments.items():
        args[arg] = kind.settle(arg, args)
    return args


# How many arguments a drawn call takes from the whole-range strategies: none (a valid call, up
# to the cross-argument rules), one (the status and message are then predicted exactly), a few,
# or all of them.
CORRUPTION_COUNTS = (0, 1, 1, 1, 2, 2, 3, None)


_COUNTS = st.sampled_from(CORRUPTION_COUNTS)
_ORDERS = {name: st.permutations([arg for arg, kind in d.arguments.items() if kind.corruptible])
           for name, d in DESCRIPTIONS.items()}


def draw_call(data, name):
    """Draws the arguments of a call of `name` (a DESCRIPTIONS export) from Hypothesis' `data`."""
    arguments = DESCRIPTIONS[name].arguments
    count = data.draw(_COUNTS, label="corrupted arguments")
    order = data.draw(_ORDERS[name], label="corruption order")
    changed = set(order if count is None else order[:count])
    args = {arg: data.draw(kind.strategy(arg in changed), label=arg)
            for arg, kind in arguments.items()}
    for arg, kind in arguments.items():
        if arg not in changed:
            args[arg] = kind.settle(arg, args)
    return args


# ---------------------------------------------------------------------------------------------
# The library, called as C sees it: raw statuses, no exceptions
# ---------------------------------------------------------------------------------------------
def bare_library():
    """A CDLL of the library whose functions return raw values (ck_status_t as an int), with
    the argument types of DECLARATIONS; its function objects are its own (the wrapper's raise)."""
    lib = ctypes.CDLL(ck.library_path())
    for name, (restype, params) in ck.DECLARATIONS.items():
        function = getattr(lib, name)
        function.argtypes = [param[1] for param in params]
        function.restype = ctypes.c_int if restype is ck._STATUS else restype
    return lib


def call(lib, name, args):
    """name(**args) in the declaration's order; a HostInt argument becomes a real int (or NULL).
    Returns (result, the int written through a HostInt argument or None)."""
    values, out = [], None
    for param in ck.DECLARATIONS[name][1]:
        value = args[param[0]]
        if isinstance(DESCRIPTIONS[name].arguments[param[0]], HostInt):
            out = ctypes.c_int(-1) if value == "int" else None
            value = None if out is None else ctypes.byref(out)
        values.append(value)
    result = getattr(lib, name)(*values)
    return result, None if out is None else out.value


# ---------------------------------------------------------------------------------------------
# The header, read as text
# ---------------------------------------------------------------------------------------------
def header_text(strip_comments=True):
    text = open(HEADER).read()
    if strip_comments:
        text = re.sub(r"/\*.*?\*/", " ", text, flags=re.S)
    return text


def header_exports():
    """The names of every CK_API function of cuda_kernels.h."""
    return set(re.findall(r"\bCK_API\s+[^;(]*?\b(ck_\w+)\s*\(", header_text()))


def header_statuses():
    """{value: name} of ck_status_t's enumerators."""
    return {int(value): "CK_STATUS_" + name
            for name, value in re.findall(r"\bCK_STATUS_(\w+)\s*=\s*(\d+)", header_text())}


def header_version():
    text = header_text(strip_comments=False)
    major, minor, patch = (int(re.search(r"#define CK_VERSION_%s (\d+)" % part, text).group(1))
                           for part in ("MAJOR", "MINOR", "PATCH"))
    return major * 10000 + minor * 100 + patch


def header_comment_of(name):
    """The words cuda_kernels.h says about an export: the opening comment of its section (the
    block that starts with a row of dashes) and the comment right above its declaration."""
    text = header_text(strip_comments=False)
    at = re.search(r"\bCK_API\s+[^;(]*?\b%s\s*\(" % re.escape(name), text).start()
    before = text[:at]
    comments = list(re.finditer(r"/\*.*?\*/", before, flags=re.S))
    own = comments[-1].group(0) if comments and not before[comments[-1].end():].strip(" \n;") \
        else ""
    sections = [c.group(0) for c in comments if re.match(r"/\*\s*-{20,}", c.group(0))]
    return (sections[-1] if sections else "") + "\n" + own


def mentions(message, word):
    """word appears in message as a whole identifier or number."""
    return re.search(r"(?<![\w-])%s(?![\w])" % re.escape(str(word)), message) is not None
