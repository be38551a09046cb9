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
    Size(multiple, most) int64_t >= 1, and <= most where the export bounds it alone (else
                         CK_STATUS_INVALID_VALUE); `multiple` only steers the valid draws
                         towards the export's multiple-of rules, which RULES check; label: the
                         name its messages give it where not the header's (a sparse weight's
                         n and k, checked as a matrix's rows and cols)
    TopK()               the MoE top_k: 1 .. min(experts, 32) (else CK_STATUS_INVALID_VALUE)
    Enum(count)          a C enum with the values 0 .. count - 1 (else CK_STATUS_INVALID_VALUE)
    DTypeArg(accepted)   a ck_dtype_t: not one (CK_STATUS_INVALID_VALUE), or one the export does
                         not take (CK_STATUS_UNSUPPORTED)
    GroupSize(sizes)     one of `sizes`: 32, 64, 128 or CK_GROUP_ROW by default, NF4's block
                         sizes for its blocksize, 64 or 128 for a sparse weight (else
                         CK_STATUS_UNSUPPORTED)
    Stream()             the stream: a handle, drawn among the ones CUDA defines (0, the legacy
                         and the per-thread default streams); never garbage, which a launch
                         would dereference
    HostInt(ctype)       a host integer out-parameter (ck_device_count's int*,
                         ck_moe_workspace_size's size_t*): NULL or a real one
    AnyInt()             any value of a C int (ck_status_string's status)
    Flag()               a C int read as a boolean (renormalize): any value
    Alternative(p)       given exactly when pointer p is not (the MoE routing: router_logits,
                         or topk_ids and topk_weights)
    Disjoint(align, s)   a buffer the export checks against others for overlap
                         (CK_STATUS_INVALID_VALUE): valid draws are moved clear of them
    Struct(ctype, ...)   a parameter struct passed by const pointer (ck_moe_params_t): a dict of
                         its fields, each with a kind of its own, or None for NULL; a
                         struct_size of no known version is CK_STATUS_INVALID_VALUE, one of an
                         earlier version leaves the fields appended since then unread (zero)
    When(inner, when)    a field read, and checked as `inner`, only where when(args) holds (a paged
                         cache's sizes, with block_table; max_position, with RoPE)
    KvScales(spans)      a quantized KV cache's k_scale or v_scale: read (required, 4-byte
                         aligned) only with a quantized kv_format; a Disjoint where the call
                         writes them (per-token scales of ck_kv_cache_append)
    LayerPointer(inner)  a pointer argument of ck_qkv_prepack: checked as `inner` over the fields
                         of its params (mode, dtype, format), once they pass
    WorkspaceBytes()     ck_moe_forward's size_t workspace_bytes: at least ck_moe_workspace_size

and each status-returning export a list of cross-argument rules (shape multiples, overflowing
byte counts, layouts): `violations(name, args)` lists every rule a call breaks, each as the
status the header documents for it and the arguments a message must name (a struct's field by
its own name: "tokens" for params->tokens). A call without violations is valid: where no CUDA
device is visible, the library must pass it to its launch, which answers CK_STATUS_NO_DEVICE
(ck_moe_workspace_size, which launches nothing, answers CK_STATUS_SUCCESS and the byte count).

Draws: every argument has a strategy for valid values (sizes on the export's multiples, aligned
pointers, enums in range) and one over the whole range of its C type (any int64, any 32-bit
enum value, NULL, misaligned, host and wild pointers). A drawn call changes a few of its
arguments (none, one, two, three or all) to the whole-range strategy, so that valid calls, calls
with exactly one defect (whose status and message are then exactly predicted) and calls with
many defects all occur. A parameter struct's fields count as arguments there ("params->tokens"),
and so does the struct itself (NULL, or a struct_size of another version).

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

    def corruption_keys(self, name):
        """What a drawn call can change of this argument (draw_call's corruption order)."""
        return [name] if self.corruptible else []

    def draw(self, data, name, changed):
        """The argument's value from Hypothesis' `data`: over the whole range when a key of
        corruption_keys is in `changed`, else valid (settled later)."""
        return data.draw(self.strategy(name in changed), label=name)

    def c_argument(self, value):
        """(what ctypes passes, the ctypes object the call writes an answer into or None)."""
        return value, None


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
    CK_INT4_SYMMETRIC (the mode argument `mode`)."""

    def __init__(self, mode="mode", align=1):
        super().__init__(align)
        self.mode = mode

    def example(self):
        return 0

    def settle(self, name, args):
        return 0 if args[self.mode] == ck.INT4_SYMMETRIC else args[name]

    def violations(self, name, label, args):
        mode = args[self.mode]
        if mode == ck.INT4_SYMMETRIC and args[name]:
            return [Violation(Status.INVALID_VALUE, (label,))]
        if mode == ck.INT4_ASYMMETRIC and not args[name]:
            return [Violation(Status.INVALID_VALUE, (label,))]
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


class Alternative(Pointer):
    """Given exactly when the pointer argument `other` is not (ck_moe_params_t's routing: the
    caller's topk_ids and topk_weights, or router_logits for the layer to route): both given or
    both NULL is CK_STATUS_INVALID_VALUE naming both."""

    def __init__(self, other, align=1):
        super().__init__(align)
        self.other = other

    def settle(self, name, args):
        return 0 if args[self.other] else args[name]

    def violations(self, name, label, args):
        if bool(args[self.other]) == bool(args[name]):
            return [Violation(Status.INVALID_VALUE, (label, self.other))]
        return super().violations(name, label, args) if args[name] else []


def overlaps(a, a_bytes, b, b_bytes):
    """Whether [a, a + a_bytes) and [b, b + b_bytes) share a byte, as the library compares
    addresses (uintptr_t arithmetic, which wraps); an empty range shares none."""
    if a_bytes <= 0 or b_bytes <= 0:
        return False
    return a < (b + b_bytes) % 2**64 and b < (a + a_bytes) % 2**64


class Disjoint(Pointer):
    """A buffer that the export checks against others for overlap (CK_STATUS_INVALID_VALUE,
    one of its rules). spans(args): its byte count and the (address, bytes) of the buffers it
    must not overlap, or None while the sizes are invalid (no overlap check is reached). A
    valid draw that overlaps them moves to the first 256-byte boundary past them."""

    def __init__(self, align, spans, optional=False):
        super().__init__(align, optional)
        self.spans = spans

    def settle(self, name, args):
        address, spans = args[name], self.spans(args)
        if not address or spans is None:
            return address
        size, others = spans
        if not any(overlaps(address, size, other, other_bytes) for other, other_bytes in others):
            return address
        end = max(other + other_bytes for other, other_bytes in others)
        moved = -(-end // 256) * 256 % 2**64
        if any(overlaps(moved, size, other, other_bytes) for other, other_bytes in others):
            return address   # past the top of the address space: left to the rule
        return moved


def _round_up(value, multiple):
    rounded = -(-value // multiple) * multiple
    return rounded if rounded <= INT64_MAX else value // multiple * multiple


class Size(Kind):
    """An int64_t size: >= `least` (1 unless given), and at most `most` where the export bounds
    it on its own. Valid draws are multiples of `multiple`, at most draws_up_to (default: most)
    where rules of several arguments bound it further (the MoE layer's pairs and row blocks).
    label: the name the export's messages give it, where not the header's."""

    def __init__(self, multiple=1, most=None, draws_up_to=None, least=None, label=None):
        self.multiple, self.most, self.label = multiple, most, label
        self.draws_up_to = draws_up_to or most
        if least is not None:
            self.least = least

    def example(self):
        return 256

    def valid(self):
        top = self.draws_up_to
        if top is None:
            base = st.one_of(st.integers(1, 300),
                             st.sampled_from([v for v in SPECIAL_SIZES if v >= 1]),
                             st.integers(1, 2**40))
            return base.map(lambda v: _round_up(v, self.multiple))
        low = max(1, self.least)
        base = st.one_of(st.integers(low, min(300, top)),
                         st.sampled_from([v for v in SPECIAL_SIZES if low <= v <= top]),
                         st.integers(low, top))
        return base.map(lambda v: min(_round_up(v, self.multiple),
                                      top // self.multiple * self.multiple))

    def any(self):
        whole = st.one_of(st.sampled_from(SPECIAL_SIZES), st.integers(INT64_MIN, INT64_MAX),
                          st.integers(-300, 300))
        if self.most is None:
            return whole
        return st.one_of(whole, st.sampled_from((self.most, self.most + 1)))

    least = 1  # the smallest valid value

    def violations(self, name, label, args):
        value = args[name]
        if value < self.least or (self.most is not None and value > self.most):
            return [Violation(Status.INVALID_VALUE, (self.label or label,), (value,))]
        return []


class TopK(Size):
    """The k experts per token of the MoE exports: 1 .. min(experts, 32), experts the argument
    of that name (the bound by experts is checked only once experts is valid)."""

    def __init__(self):
        super().__init__(most=MOE_MAX_TOP_K)

    def example(self):
        return 2

    def settle(self, name, args):
        experts = args["experts"]
        return min(args[name], experts) if 1 <= experts <= MOE_MAX_EXPERTS else args[name]

    def violations(self, name, label, args):
        value, experts = args[name], args["experts"]
        if value < 1 or value > self.most or (1 <= experts <= MOE_MAX_EXPERTS and value > experts):
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
    """A ck_dtype_t argument; `accepted`: the dtypes the export takes; of: the optional pointer
    argument whose elements it describes, where it is checked only when that is given (a MoE
    layer's router_dtype, with router_logits)."""

    def __init__(self, accepted, of=None):
        self.accepted, self.of = tuple(accepted), of

    def example(self):
        return self.accepted[0]

    def valid(self):
        return st.sampled_from(self.accepted)

    def any(self):
        return st.one_of(st.integers(-1, 7), st.sampled_from(SPECIAL_ENUMS),
                         st.integers(INT32_MIN, INT32_MAX))

    def violations(self, name, label, args):
        value = args[name]
        if self.of and not args[self.of]:
            return []
        if _element_size(value) is None:
            return [Violation(Status.INVALID_VALUE, (label,), (value,))]
        if value not in self.accepted:
            return [Violation(Status.UNSUPPORTED, (label,))]
        return []


GROUP_SIZES = (32, 64, 128, ck.GROUP_ROW)
W4A8_GROUP_SIZES = (128, ck.GROUP_ROW)   # ck_gemm_w4a8: a 128-wide k-block, or the row
NF4_BLOCK_SIZES = ck.NF4_BLOCK_SIZES   # ck_quantize_nf4's blocksize: bitsandbytes' sizes


class GroupSize(Kind):
    """A group or block size: one of `sizes` (the INT4 group sizes by default; else
    CK_STATUS_UNSUPPORTED)."""

    def __init__(self, sizes=GROUP_SIZES):
        self.sizes = tuple(sizes)

    def example(self):
        return 128

    def valid(self):
        return st.sampled_from(self.sizes)

    def any(self):
        odd = (0, 1, 2, 16, 31, 33, 48, 96, 127, 129, 256, 4096, 8192, -2, -32, -128)
        return st.one_of(st.sampled_from(odd + self.sizes), st.sampled_from(SPECIAL_SIZES),
                         st.integers(INT64_MIN, INT64_MAX))

    def violations(self, name, label, args):
        value = args[name]
        if value not in self.sizes:
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
    """A host integer out-parameter of C type `ctype` (ck_device_count's int*,
    ck_moe_workspace_size's size_t*): NULL (CK_STATUS_INVALID_VALUE), or "int", a real one that
    the call writes (never garbage: a host out-parameter is the caller's to get right)."""

    def __init__(self, ctype=ctypes.c_int):
        self.ctype = ctype

    def example(self):
        return "int"

    def valid(self):
        return st.just("int")

    def any(self):
        return st.sampled_from(("int", None))

    def violations(self, name, label, args):
        return [] if args[name] == "int" else [Violation(Status.INVALID_VALUE, (label,))]

    def c_argument(self, value):
        if value != "int":
            return None, None
        out = self.ctype(-1)   # what a call that writes nothing leaves: -1, or SIZE_MAX
        return ctypes.byref(out), out


class AnyInt(Kind):
    """Any value of a C int (ck_status_string's status)."""

    def example(self):
        return 0

    def valid(self):
        return st.one_of(st.integers(0, 7), st.sampled_from(SPECIAL_ENUMS),
                         st.integers(INT32_MIN, INT32_MAX))


class Flag(AnyInt):
    """A C int read as a boolean (ck_moe_route's and ck_moe_params_t's renormalize): every
    value is valid, non-zero meaning true."""

    def valid(self):
        return st.sampled_from((0, 1))

    def any(self):
        return st.one_of(st.sampled_from(SPECIAL_ENUMS), st.integers(INT32_MIN, INT32_MAX))


class Struct(Kind):
    """A parameter struct passed by const pointer (ctype: its ctypes.Structure, as
    ck_moe_params_t is cuda_wrapper.MoeParams). A call's value is a dict of the struct's fields,
    struct_size included, or None for NULL. Each field has a kind of its own: it is drawn,
    corrupted ("params->tokens" in the call's corruption order), settled and checked as a flat
    argument is, its rules (functions of the field dict) as an export's; corrupting the struct
    itself gives NULL, a struct_size this version does not know, which ends validation (no
    field of a struct of unknown layout is read), or one of the `older` sizes, the struct_size
    of an earlier version that the library still accepts: the fields appended since then (at
    offsets from that size on) are not read and take their defaults, 0 (Struct.read), whatever
    the caller's bytes past its struct hold. unchecked: the fields that the export does not
    validate (ck_moe_workspace_size reads no pointer), drawn as the others and breaking no rule.
    example: the valid call's sizes, where a field kind's own example does not fit."""

    def __init__(self, ctype, fields, rules=(), unchecked=(), example=None, older=()):
        self.ctype, self.fields, self.rules = ctype, fields, tuple(rules)
        self.unchecked, self.examples = frozenset(unchecked), dict(example or {})
        self.size, self.older = ctypes.sizeof(ctype), tuple(older)
        near = [size + d for size in (self.size,) + self.older for d in (-8, -1, 1, 8)]
        sizes = [st.none(), st.sampled_from(sorted({0, 8, 2 * self.size, *near})),
                 st.integers(0, UINT64_MAX)]
        self.sizes = st.one_of(*sizes, *([st.sampled_from(self.older)] if self.older else []))

    def known_size(self, size):
        """A struct_size the library accepts: this version's or an earlier one's."""
        return size == self.size or size in self.older

    def read(self, fields):
        """The fields as the library reads them: with an earlier version's struct_size, those
        appended since then are 0 (their defaults), not the caller's values."""
        size = fields["struct_size"]
        if size not in self.older:
            return fields
        return {field: value if self._covers(size, field) else 0
                for field, value in fields.items()}

    def _covers(self, size, field):
        """Whether a struct_size of `size` bytes holds the field."""
        return field == "struct_size" or getattr(self.ctype, field).offset < size

    def example(self):
        fields = {"struct_size": self.size}
        for index, (field, kind) in enumerate(self.fields.items()):
            fields[field] = self.examples.get(field, kind.example())
            if isinstance(kind, Pointer) and fields[field]:   # far apart: no overlap at any size
                fields[field] = FAKE_DEVICE + (index + 1) * 2**48
        for field, kind in self.fields.items():
            fields[field] = kind.settle(field, fields)
        return fields

    def corruption_keys(self, name):
        return [name] + ["%s->%s" % (name, field) for field, kind in self.fields.items()
                         if kind.corruptible]

    def draw(self, data, name, changed):
        size = data.draw(self.sizes, label=name + "->struct_size") if name in changed \
            else self.size
        if size is None:
            return None
        keys = {field: "%s->%s" % (name, field) for field in self.fields}
        fields = {"struct_size": size}
        for field, kind in self.fields.items():
            fields[field] = kind.draw(data, keys[field], changed)
        read = self.read(fields)   # settled as the library reads them
        for field, kind in self.fields.items():
            if keys[field] not in changed:
                read[field] = kind.settle(field, read)
        # The fields past an earlier version's struct_size keep their drawn bytes, unread.
        return {field: read[field] if self._covers(size, field) else value
                for field, value in fields.items()}

    def field_violations(self, fields):
        """The rules that the fields of a struct of a known size break (as read: Struct.read)."""
        fields = self.read(fields)
        found = []
        for field, kind in self.fields.items():
            if field not in self.unchecked:
                found += kind.violations(field, field, fields)
        for rule in self.rules:
            found += rule(fields)
        return found

    def violations(self, name, label, args):
        fields = args[name]
        if fields is None:
            return [Violation(Status.INVALID_VALUE, (label,))]
        if not self.known_size(fields["struct_size"]):
            return [Violation(Status.INVALID_VALUE, ("struct_size",), (fields["struct_size"],))]
        return self.field_violations(fields)

    def c_argument(self, value):
        return (None if value is None else ctypes.byref(self.ctype(**value))), None


class WorkspaceBytes(Kind):
    """ck_moe_forward's size_t workspace_bytes: at least ck_moe_workspace_size's bytes for the
    call's params (the argument `params`; moe_workspace checks it). A valid draw is a margin
    that settle adds to that size."""

    def __init__(self, params="params"):
        self.params = params

    def example(self):
        return 0

    def valid(self):
        return st.sampled_from((0, 1, 255, 256, 4096, 2**20))

    def any(self):
        return st.one_of(st.sampled_from((0, 1, 255, 256, 2**31, 2**32, 2**63, UINT64_MAX)),
                         st.integers(0, UINT64_MAX))

    def settle(self, name, args):
        need = moe_workspace_bytes(args[self.params])
        return args[name] if need is None or args[name] >= need else need + args[name]


class Count(Size):
    """An int64_t count that may be 0 (attention's total_k): 0 .. most."""

    least = 0


class HeadsKv(Size):
    """Attention's num_heads_kv: 1 .. num_heads_q and a divisor of it (checked once num_heads_q
    is valid, 1 .. heads_most; a non-divisor is CK_STATUS_INVALID_VALUE naming both)."""

    def __init__(self, heads_most=None):
        super().__init__()
        self.heads_most = heads_most or ATTENTION_MAX_HEADS

    def example(self):
        return 1

    def _heads_q(self, args):
        heads = args["num_heads_q"]
        return heads if 1 <= heads <= self.heads_most else None

    def settle(self, name, args):
        heads, value = self._heads_q(args), args[name]
        if heads is None:
            return value
        value = min(max(value, 1), heads)
        while heads % value:
            value -= 1
        return value

    def violations(self, name, label, args):
        heads, value = self._heads_q(args), args[name]
        if heads is None:
            return []
        if not 1 <= value <= heads:
            return [Violation(Status.INVALID_VALUE, (label,), (value,))]
        if heads % value:
            return [Violation(Status.INVALID_VALUE, (label, "num_heads_q"), (value, heads))]
        return []


class HeadDim(Size):
    """Attention's head_dim: >= 1 (else CK_STATUS_INVALID_VALUE), one of the kernel's
    (else CK_STATUS_UNSUPPORTED)."""

    def example(self):
        return 128

    def valid(self):
        return st.sampled_from(ATTENTION_HEAD_DIMS)

    def violations(self, name, label, args):
        value = args[name]
        if value < 1:
            return [Violation(Status.INVALID_VALUE, (label,), (value,))]
        if value not in ATTENTION_HEAD_DIMS:
            return [Violation(Status.UNSUPPORTED, (label,), (value,))]
        return []


class Batch(Size):
    """Attention's batch: 1 .. 65535 with offsets (cu_seqlens_q or cu_seqlens_k given), 0 or 1
    for one sequence."""

    def _range(self, args):
        if args["cu_seqlens_q"] or args["cu_seqlens_k"]:
            return 1, ATTENTION_MAX_BATCH
        return 0, 1

    def example(self):
        return 1

    def settle(self, name, args):   # cu_seqlens_k settles later, to go with cu_seqlens_q
        least, most = (1, ATTENTION_MAX_BATCH) if args["cu_seqlens_q"] else (0, 1)
        return min(max(args[name], least), most)

    def violations(self, name, label, args):
        least, most = self._range(args)
        if not least <= args[name] <= most:
            return [Violation(Status.INVALID_VALUE, (label,), (args[name],))]
        return []


class MaxSeqlen(Size):
    """Attention's max_seqlen_q (_k): 0 .. the field `total` (checked once that is valid)."""

    def __init__(self, total, least):
        super().__init__()
        self.total, self.least = total, least

    def example(self):
        return 0

    def _total(self, args):
        total = args[self.total]
        return total if self.least <= total <= INT32_MAX else None

    def settle(self, name, args):
        total = self._total(args)
        return args[name] if total is None else min(args[name], total)

    def violations(self, name, label, args):
        total = self._total(args)
        if total is not None and not 0 <= args[name] <= total:
            return [Violation(Status.INVALID_VALUE, (label,), (args[name],))]
        return []


class Float32(Kind):
    """A float field (attention's softmax_scale): finite, else CK_STATUS_INVALID_VALUE."""

    def example(self):
        return 0.0

    def valid(self):
        return st.floats(width=32, allow_nan=False, allow_infinity=False)

    def any(self):
        return st.one_of(st.sampled_from((float("nan"), float("inf"), float("-inf"), 0.0)),
                         st.floats(width=32))

    def violations(self, name, label, args):
        if not np.isfinite(args[name]):
            return [Violation(Status.INVALID_VALUE, (label,))]
        return []


# ---------------------------------------------------------------------------------------------
# Cross-argument rules of the status-returning exports
# ---------------------------------------------------------------------------------------------
def _positive(args, *names):
    return all(isinstance(args[n], int) and args[n] >= 1 for n in names)


def matrix_bytes(rows, cols, dtype_arg, labels=None):
    """rows * cols elements of the dtype argument's size (or of dtype_arg bytes, an int): the
    byte count fits in int64_t. labels: the names the messages give the two sizes, where not
    their arguments' names."""
    def rule(args):
        size = dtype_arg if isinstance(dtype_arg, int) else _element_size(args[dtype_arg])
        if size is None or not _positive(args, rows, cols):
            return []
        if args[rows] * args[cols] * size > INT64_MAX:
            return [Violation(Status.INVALID_VALUE, labels or (rows, cols),
                              (args[rows], args[cols]))]
        return []
    return rule


def row_scales(args):
    """CK_PER_ROW: the rows float32 scales' byte count fits in int64_t too."""
    rows = args["rows"]
    if args["granularity"] == ck.PER_ROW and rows >= 1 and rows * 4 > INT64_MAX:
        return [Violation(Status.INVALID_VALUE, ("rows",), (rows,))]
    return []


def fp8_scale_bytes(args):
    """ck_quantize_fp8 / ck_dequantize_fp8: the float32 scales of the granularity (rows, rows x
    ceil(cols / 128) or ceil(rows / 128) x ceil(cols / 128)) have a byte count that fits in
    int64_t, checked once the matrix and the granularity pass."""
    rows, cols, gran = args["rows"], args["cols"], args["granularity"]
    size = _element_size(args["x_dtype" if "x_dtype" in args else "out_dtype"])
    if size is None or not _positive(args, "rows", "cols") or rows * cols * size > INT64_MAX \
            or not 0 <= gran < 4:
        return []
    blocks_r, blocks_c = -(-rows // 128), -(-cols // 128)
    count = {ck.PER_TENSOR: 1, ck.PER_ROW: rows, ck.PER_BLOCK_1X128: rows * blocks_c,
             ck.PER_BLOCK_128X128: blocks_r * blocks_c}[gran]
    if count * 4 > INT64_MAX:
        return [Violation(Status.INVALID_VALUE, ("rows", "cols"), (rows, cols))]
    return []


def _int8_prepack_spans(args):
    """ck_int8_prepack: b_nk's K N bytes must not overlap b_kn's."""
    k, n = args["k"], args["n"]
    if not _positive(args, "k", "n") or k * n > INT64_MAX:
        return None
    return k * n, [(args["b_kn_ptr"], k * n)]


def int8_prepack_bytes(args):
    """ck_int8_prepack: the K N bytes of each matrix fit in int64_t."""
    if _positive(args, "k", "n") and args["k"] * args["n"] > INT64_MAX:
        return [Violation(Status.INVALID_VALUE, ("k", "n"), (args["k"], args["n"]))]
    return []


def int8_prepack_apart(args):
    """ck_int8_prepack: b_nk does not overlap b_kn (CK_STATUS_INVALID_VALUE naming both),
    checked last."""
    spans = _int8_prepack_spans(args)
    if spans is None or not args["b_kn_ptr"] or not args["b_nk_ptr"]:
        return []
    size, ((other, other_bytes),) = spans
    if overlaps(args["b_nk_ptr"], size, other, other_bytes):
        return [Violation(Status.INVALID_VALUE, ("b_nk", "b_kn"))]
    return []


def int32_columns(args):
    """ck_permute_columns: perm's int32 indices address at most 2^31 - 1 columns."""
    rows, cols, size = args["rows"], args["cols"], _element_size(args["dtype"])
    if size is None or not _positive(args, "rows", "cols") or rows * cols * size > INT64_MAX:
        return []
    if cols > INT32_MAX:
        return [Violation(Status.UNSUPPORTED, ("cols",), (cols,))]
    return []


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


def multiple_of(arg, divisor, when=None, status=Status.UNSUPPORTED):
    """arg a multiple of divisor (CK_STATUS_UNSUPPORTED unless `status` says otherwise), for a
    positive arg; when(args): the calls the rule applies to."""
    def rule(args):
        value = args[arg]
        if not _positive(args, arg) or (when and not when(args)) or value % divisor == 0:
            return []
        return [Violation(status, (arg,), (value,))]
    return rule


def fp8_block_scale_pair(args):
    """ck_gemm_fp8_scaled: block scales come as a_granularity CK_PER_BLOCK_1X128 with
    b_granularity CK_PER_BLOCK_128X128 (CK_STATUS_UNSUPPORTED for another mix with a block
    granularity)."""
    ga, gb = args["a_granularity"], args["b_granularity"]
    if not (0 <= ga < 4 and 0 <= gb < 4) or (ga < 2 and gb < 2) or (ga, gb) == (2, 3):
        return []
    return [Violation(Status.UNSUPPORTED, ("a_granularity", "b_granularity"), ())]


def linear_multiples(args):
    """ck_linear: K and N multiples of 16 / sizeof(dtype), so that rows start 16-byte aligned."""
    if args["dtype"] not in FLOAT_DTYPES:
        return []
    per_vector = 16 // _element_size(args["dtype"])
    return (multiple_of("k", per_vector)(args) + multiple_of("n", per_vector)(args))


def nf4_absmax_bytes(args):
    """ck_quantize_nf4 / ck_dequantize_nf4: the float32 absmax [rows, ceil(cols / blocksize)]
    has a byte count that fits in int64_t (checked once the matrix and the block size pass)."""
    rows, cols, blocksize = args["rows"], args["cols"], args["blocksize"]
    dtype_arg = "x_dtype" if "x_dtype" in args else "out_dtype"
    size = _element_size(args[dtype_arg])
    if size is None or not _positive(args, "rows", "cols") or rows * cols * size > INT64_MAX \
            or blocksize not in NF4_BLOCK_SIZES:
        return []
    if rows * -(-cols // blocksize) * 4 > INT64_MAX:
        return [Violation(Status.INVALID_VALUE, ("rows",), (rows,))]
    return []


# ck_w4a16_prepacked_bytes returns 0 (and ck_w4a16_prepack refuses the call) beyond N or K of
# 2^40, the prepacked layout's limit (cuda_kernels.h).
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


# Block 4-bit weights (ck_block4_prepack, ck_gemm_block4_prepacked; cuda_kernels.h): the block
# each format's GEMM reads, its scale unit (bytes per row and G k) and what a [N, K] weight needs.
BLOCK4_FORMATS = 3
BLOCK4_BLOCKS = {ck.BLOCK4_NF4: (32, 64, 128), ck.BLOCK4_MXFP4: (32,), ck.BLOCK4_NVFP4: (16,)}
BLOCK4_UNIT_BYTES = {ck.BLOCK4_NF4: 4, ck.BLOCK4_MXFP4: 1, ck.BLOCK4_NVFP4: 2}


def _block4_format(args):
    """The call's format when it is a valid ck_block4_format_t, else None."""
    fmt = args["format"]
    return fmt if 0 <= fmt < BLOCK4_FORMATS else None


def _block4_blocksize(args, value):
    """value if the (valid) format takes it, else that format's first block (64 for NF4)."""
    fmt = _block4_format(args)
    if fmt is None or value in BLOCK4_BLOCKS[fmt]:
        return value
    return 64 if fmt == ck.BLOCK4_NF4 else BLOCK4_BLOCKS[fmt][0]


class Block4Size(GroupSize):
    """The blocksize of a block 4-bit call: one the format's GEMM reads (NF4 32, 64 or 128,
    MXFP4 32, NVFP4 16; else CK_STATUS_UNSUPPORTED, once the format is valid)."""

    def __init__(self):
        super().__init__(sorted({b for blocks in BLOCK4_BLOCKS.values() for b in blocks}))

    def settle(self, name, args):
        return _block4_blocksize(args, args[name])

    def violations(self, name, label, args):
        fmt = _block4_format(args)
        if fmt is None or args[name] in BLOCK4_BLOCKS[fmt]:
            return []
        return [Violation(Status.UNSUPPORTED, (label,), (args[name],))]


class Block4K(Size):
    """K of a block 4-bit weight: valid draws are multiples of 32 and of the (settled) block."""

    def __init__(self):
        super().__init__(32)

    def settle(self, name, args):
        if _block4_format(args) is None or not _positive(args, name):
            return args[name]
        block = max(32, _block4_blocksize(args, args["blocksize"]))
        return _round_up(args[name], block)


class Block4Scales(Pointer):
    """ck_block4_prepack's scales: NF4's float32 absmax 4-byte aligned, the uint8 scales of the
    others anywhere."""

    def alignment(self, args):
        return 4 if args["format"] == ck.BLOCK4_NF4 else 1


class GlobalScale(Pointer):
    """NVFP4's float32 global scale: required (4-byte aligned) for CK_BLOCK4_NVFP4 (nvfp4: the
    value of the argument `format` that means NVFP4, among `formats`), NULL for the other
    formats (CK_STATUS_INVALID_VALUE naming it); an invalid format is the format's violation."""

    def __init__(self, nvfp4=ck.BLOCK4_NVFP4, formats=BLOCK4_FORMATS):
        super().__init__(4)
        self.nvfp4, self.formats = nvfp4, formats

    def settle(self, name, args):
        return args[name] if args["format"] == self.nvfp4 else 0

    def violations(self, name, label, args):
        fmt = args["format"]
        if not 0 <= fmt < self.formats:
            return []
        if fmt == self.nvfp4:
            return super().violations(name, label, args)
        return [Violation(Status.INVALID_VALUE, (label,))] if args[name] else []


def block4_k_rule(args):
    """K a multiple of the format's block (the last block of a row whole), once the format, the
    block and K's multiple of 32 pass."""
    fmt, k, block = _block4_format(args), args["k"], args["blocksize"]
    if fmt is None or block not in BLOCK4_BLOCKS[fmt] or not _positive(args, "k") or k % 32 \
            or k % block == 0:
        return []
    return [Violation(Status.UNSUPPORTED, ("k",), (k,))]


def block4_prepacked_scales_bytes(format, n, k, blocksize):
    """ck_block4_prepacked_scales_bytes: ceil(N / 8) * 8 * (K / G) units (G = NF4's block, 32
    for the others) of 4, 1 or 2 bytes; 0 when an argument is invalid or the count overflows."""
    if not 0 <= format < BLOCK4_FORMATS or blocksize not in BLOCK4_BLOCKS[format]:
        return 0
    if prepacked_bytes(n, k) == 0 or k % blocksize:
        return 0
    group = blocksize if format == ck.BLOCK4_NF4 else 32
    nbytes = -(-n // 8) * 8 * (k // group) * BLOCK4_UNIT_BYTES[format]
    return nbytes if nbytes <= INT64_MAX else 0


def kn_layout(args):
    return args["b_layout"] == ck.LAYOUT_KN


# Structured-sparse INT4 weights (cuda_kernels.h): a ck_sparsity_t (2:4 or 16:32), group_size
# 64 or 128 (dense k per group), K a multiple of 32 (one metadata word per 32 k) and of the group
# (so K >= 64) and, for the prepacked 2:4 layout, of 128 (its chunks of k), whose rows are padded
# to a multiple of 16. The calls without an M check the weight [N, K] at the dtype's size as
# ck_quantize_int4 checks its [rows, cols], their messages naming n and k (the GEMMs check M, N
# and K first, as every GEMM does).
SPARSITIES = 2
SPARSE_GROUP_SIZES = (64, 128)
SPARSE_WORD_K, SPARSE_PACK_K, SPARSE_PACK_ROWS = 32, 128, 16
SPARSE_MATRIX_LABELS = ("n", "k")   # the messages' names of N and K


def sparse_n():
    """N of a sparse weight call without an M."""
    return Size(label=SPARSE_MATRIX_LABELS[0])


def sparse_k(multiple=SPARSE_PACK_K):
    """K of a sparse weight call without an M; valid draws suit every group and the prepacked
    layout (multiples of 128) unless `multiple` says otherwise (ck_sparse_prune's 32)."""
    return Size(multiple, label=SPARSE_MATRIX_LABELS[1])


def sparse_k_group(args):
    """K a multiple of the group (the last group of a row whole; CK_STATUS_UNSUPPORTED naming
    k), once the group size is valid and K positive."""
    k, group = args["k"], args["group_size"]
    if group not in SPARSE_GROUP_SIZES or not _positive(args, "k") or k % group == 0:
        return []
    return [Violation(Status.UNSUPPORTED, ("k",), (k,))]


def sparse_prepacked_bytes(n, k):
    """ck_sparse_w4a16_prepacked_bytes: N16 * K * 3 / 8 (N16 = ceil(N / 16) * 16) for K a
    multiple of 128, 0 when an argument is invalid or the count overflows."""
    if n < 1 or k < SPARSE_PACK_K or k % SPARSE_PACK_K or n > INT64_MAX - SPARSE_PACK_ROWS:
        return 0
    nbytes = -(-n // SPARSE_PACK_ROWS) * SPARSE_PACK_ROWS * (k // 8 * 3)
    return nbytes if nbytes <= INT64_MAX else 0


def sparse_prepacked_groups(n, k, group_size):
    """ck_sparse_w4a16_prepacked_groups: N16 * (K / group_size), 0 when invalid (as the bytes,
    or a group size other than 64 and 128) or overflowing."""
    if group_size not in SPARSE_GROUP_SIZES or sparse_prepacked_bytes(n, k) == 0:
        return 0
    values = -(-n // SPARSE_PACK_ROWS) * SPARSE_PACK_ROWS * (k // group_size)
    return values if values <= INT64_MAX else 0


def sparse_prepacked_size(m=None):
    """The prepacked layout's bytes and values representable (ck_sparse_w4a16_prepacked_groups
    not 0; CK_STATUS_INVALID_VALUE naming n and k), once the sizes pass their other rules: the
    weight's 2-byte values (the prepack), or the GEMM's operands with the argument `m`, and K's
    multiples with a valid group. One row pads to 16: its 16 K 3 / 8 = 6 K bytes overflow past
    K = (2^63 - 1) / 6, where the dense row's 2 K bytes fit."""
    def rule(args):
        n, k, group = args["n"], args["k"], args["group_size"]
        if not _positive(args, "n", "k", *([m] if m else [])) or group not in SPARSE_GROUP_SIZES \
                or k % SPARSE_PACK_K:
            return []
        if (m and max(args[m] * k, n * k, args[m] * n) * 4 > INT64_MAX) or \
                (not m and n * k * 2 > INT64_MAX):
            return []
        if sparse_prepacked_groups(n, k, group) == 0:
            return [Violation(Status.INVALID_VALUE, ("n", "k"), (n, k))]
        return []
    return rule


def sparse_weight_rules(dtype_arg, prepacked=False):
    """What every sparse call without an M checks of its [N, K] weight (check_sparse_weight):
    its bytes at the dtype's size, K a multiple of 32 and of the group (and, prepacked, of 128,
    with the layout's bytes representable)."""
    rules = (matrix_bytes("n", "k", dtype_arg, SPARSE_MATRIX_LABELS),
             multiple_of("k", SPARSE_WORD_K), sparse_k_group)
    if prepacked:
        rules += (multiple_of("k", SPARSE_PACK_K), sparse_prepacked_size())
    return rules


# Mixture of experts (cuda_kernels.h): 1 <= experts <= 1024, 1 <= top_k <= min(experts, 32),
# tokens * top_k pairs at most 2^40 (the pair count's limit, a size error past it), hidden and
# intermediate multiples of 32 up to 2^24; the layer groups the pairs in blocks of 16 rows, each
# expert's padded to a whole block, at most 65535 blocks (CK_STATUS_UNSUPPORTED beyond); its
# workspace's regions are sized for blocks of up to 128 rows.
MOE_MAX_EXPERTS, MOE_MAX_TOP_K, MOE_MAX_PAIRS, MOE_MAX_FEATURES = 1024, 32, 2**40, 2**24
MOE_BLOCK_ROWS, MOE_MAX_BLOCK_ROWS, MOE_MAX_BLOCKS = 16, 256, 65535


def moe_prepacked_bytes(experts, n, k):
    """ck_moe_prepacked_bytes: experts * ck_w4a16_prepacked_bytes(n, k), 0 when an argument is
    invalid or the count overflows (no bound on experts: ck_moe_prepack has it)."""
    total = experts * prepacked_bytes(n, k)
    return total if experts >= 1 and 0 < total <= INT64_MAX else 0


def moe_prepacked_groups(experts, n, k, group_size):
    """ck_moe_prepacked_groups: experts * ck_w4a16_prepacked_groups(n, k, group_size), 0 when
    invalid or overflowing."""
    total = experts * prepacked_groups(n, k, group_size)
    return total if experts >= 1 and 0 < total <= INT64_MAX else 0


def moe_prepack_size_rule(args):
    """ck_moe_prepack: N and K within the prepacked layout's 2^40, then the prepacked weights'
    bytes and values representable (ck_moe_prepacked_bytes and _groups not 0), once the other
    rules of the sizes pass."""
    experts, n, k = args["experts"], args["n"], args["k"]
    if (not 1 <= experts <= MOE_MAX_EXPERTS or not _positive(args, "n", "k") or k % 32
            or (is_gate_up(args) and n % 16) or args["group_size"] not in GROUP_SIZES
            or max(experts, n) * k * 4 > INT64_MAX or experts * n * 4 > INT64_MAX):
        return []
    if n > PREPACK_LIMIT or k > PREPACK_LIMIT:
        return [Violation(Status.INVALID_VALUE, ("n", "k"), (n, k))]
    if not moe_prepacked_bytes(experts, n, k) or \
            not moe_prepacked_groups(experts, n, k, args["group_size"]):
        return [Violation(Status.INVALID_VALUE, ("experts", "n", "k"), (experts, n, k))]
    return []


def is_gate_up(args):
    return args["gate_up"] == 1


def _moe_routing_valid(args):
    """tokens, experts and top_k pass the routing's rules (those of the layer too)."""
    tokens, experts, top_k = args["tokens"], args["experts"], args["top_k"]
    return (tokens >= 1 and 1 <= experts <= MOE_MAX_EXPERTS
            and 1 <= top_k <= min(experts, MOE_MAX_TOP_K) and tokens <= MOE_MAX_PAIRS // top_k)


def moe_pairs(args):
    """The tokens * top_k pairs: at most 2^40 (CK_STATUS_INVALID_VALUE naming both sizes), the
    library's limit, which cuda_kernels.h does not state (see the xfail test
    test_moe_pair_limit_is_documented)."""
    tokens, top_k = args["tokens"], args["top_k"]
    if tokens >= 1 and 1 <= top_k <= MOE_MAX_TOP_K and tokens > MOE_MAX_PAIRS // top_k:
        return [Violation(Status.INVALID_VALUE, ("tokens", "top_k"), (tokens, top_k))]
    return []


def _moe_features_valid(args):
    return all(1 <= args[name] <= MOE_MAX_FEATURES and args[name] % 32 == 0
               for name in ("hidden", "intermediate"))


def moe_pair_bytes(args):
    """The workspace's per-pair rows, counted as pairs * max(hidden, 2 * intermediate) * 8
    bytes: representable in int64_t (reached only past the row blocks' limit, which the call
    breaks too)."""
    if not _moe_routing_valid(args) or not _moe_features_valid(args):
        return []
    names = ("tokens", "top_k", "hidden", "intermediate")
    pairs = args["tokens"] * args["top_k"]
    if pairs * 8 * max(args["hidden"], 2 * args["intermediate"]) > INT64_MAX:
        return [Violation(Status.INVALID_VALUE, names, tuple(args[n] for n in names))]
    return []


def _moe_blocks(pairs, experts, rows):
    """Blocks of `rows` rows that the pairs grouped by expert take at most: each of the
    min(experts, pairs) experts with pairs pads its own to a whole block."""
    return -(-(pairs + min(experts, pairs) * (rows - 1)) // rows)


def moe_row_blocks(args):
    """At most 65535 blocks of 16 rows (CK_STATUS_UNSUPPORTED naming tokens, top_k and
    experts)."""
    if not _moe_routing_valid(args):
        return []
    names = ("tokens", "top_k", "experts")
    if _moe_blocks(args["tokens"] * args["top_k"], args["experts"],
                   MOE_BLOCK_ROWS) > MOE_MAX_BLOCKS:
        return [Violation(Status.UNSUPPORTED, names, tuple(args[n] for n in names))]
    return []


# ck_moe_workspace_size and ck_moe_forward check the sizes of ck_moe_params_t with these rules
# (besides the fields' own). The expert weights' byte counts (ck_moe_prepacked_bytes of
# [2I, H] and [H, I]) cannot overflow within these limits: 2^10 experts of 2^25 x 2^24 / 2.
MOE_SIZE_RULES = (moe_pairs, multiple_of("hidden", 32, lambda a: a["hidden"] <= MOE_MAX_FEATURES),
                  multiple_of("intermediate", 32,
                              lambda a: a["intermediate"] <= MOE_MAX_FEATURES),
                  moe_pair_bytes, moe_row_blocks)


def moe_workspace_bytes(params):
    """ck_moe_workspace_size's answer for the fields of a ck_moe_params_t, or None where it
    rejects them: the ids and weights of the pairs, the sorted pair ids (for the most rows of
    any path: 16-row, 256-row or mixed 256/128-row blocks), the blocks' experts, the activations
    between the projections (2 bytes per value) and the pairs' float32 outputs (a region that
    first holds the gathered rows' activations, 2 bytes per value), each region rounded up to
    256 bytes."""
    if params is None or MOE_PARAMS_SIZES.violations("params", "params", {"params": params}):
        return None
    pairs = params["tokens"] * params["top_k"]
    active = min(params["experts"], pairs)
    tiles = _moe_blocks(pairs, params["experts"], MOE_MAX_BLOCK_ROWS) * MOE_MAX_BLOCK_ROWS
    blocks16 = _moe_blocks(pairs, params["experts"], MOE_BLOCK_ROWS)
    # The Hopper path's mixed blocks: 256-row blocks padding an expert by at most 127 rows, then
    # one 128-row block per expert.
    wide_rows = -(-(pairs + active * 127) // 256) * 256
    rows = max(tiles, wide_rows + active * 128, blocks16 * MOE_BLOCK_ROWS)
    blocks = max(blocks16, wide_rows // 256 + active)
    regions = (pairs * 4, pairs * 4, rows * 4, blocks * 4, rows * params["intermediate"] * 2,
               max(pairs * 4, rows * 2) * params["hidden"])
    return sum(-(-region // 256) * 256 for region in regions)


def _moe_activation_bytes(params):
    """Bytes of x and of out, [tokens, hidden] of a 16-bit dtype, where the sizes are valid."""
    if moe_workspace_bytes(params) is None:
        return None
    return params["tokens"] * params["hidden"] * 2


def moe_out_apart(params):
    """ck_moe_forward: out does not overlap x (checked last among the fields)."""
    act = _moe_activation_bytes(params)
    if act is None or not params["x"] or not params["out"]:
        return []
    if overlaps(params["x"], act, params["out"], act):
        return [Violation(Status.INVALID_VALUE, ("out", "x"))]
    return []


def _moe_out_spans(params):
    act = _moe_activation_bytes(params)
    return None if act is None else (act, [(params["x"], act)])


def _moe_workspace_spans(args):
    need, act = moe_workspace_bytes(args["params"]), _moe_activation_bytes(args["params"])
    if need is None:
        return None
    return need, [(args["params"]["x"], act), (args["params"]["out"], act)]


def workspace_violations(args, spans):
    """A caller's workspace (workspace_ptr, workspace_bytes), once the params pass: at least
    `need` bytes (CK_STATUS_INVALID_VALUE naming workspace_bytes and saying both sizes), then
    (after its alignment) not overlapping the others. spans: (need, [(address, bytes) of the
    others]), or None where no workspace check is reached."""
    if spans is None:
        return []
    need, others = spans
    found = []
    if args["workspace_bytes"] < need:
        found.append(Violation(Status.INVALID_VALUE, ("workspace_bytes",),
                               (args["workspace_bytes"], need)))
    workspace = args["workspace_ptr"]
    if workspace and any(overlaps(workspace, need, other, size) for other, size in others):
        found.append(Violation(Status.INVALID_VALUE, ("workspace",)))
    return found


def moe_workspace(args):
    """ck_moe_forward's workspace, once the params pass: at least ck_moe_workspace_size bytes
    (CK_STATUS_INVALID_VALUE naming workspace_bytes and saying both sizes), then (after its
    alignment) not overlapping x or out."""
    return workspace_violations(args, _moe_workspace_spans(args))


# ---------------------------------------------------------------------------------------------
# The table: every export of cuda_kernels.h
# ---------------------------------------------------------------------------------------------
class Description(typing.NamedTuple):
    arguments: dict     # DECLARATIONS' argument name -> Kind, in the declaration's order
    rules: tuple = ()   # cross-argument rules (status exports)
    drive: str = "validated"   # the property test that drives it (test_fuzz_abi.py)
    launches: bool = True      # a valid call reaches a launch; else it answers on the host


FLOATS = DTypeArg(FLOAT_DTYPES)
HALVES = DTypeArg(HALF_DTYPES)
GRANULARITY, SCALE_MODE, INT4_MODE = Enum(2), Enum(2), Enum(2)   # INT8: tensor or row
FP8_FORMAT, FP8_GRANULARITY = Enum(2), Enum(4)   # FP8 takes the block granularities too
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
    zeros = ZeroPoints(align=16) if prepacked else ZeroPoints()
    return {"x_ptr": Pointer(16), "dtype": HALVES, "w_ptr": Pointer(16),
            "scales_ptr": Pointer(align), "zeros_ptr": zeros,
            "group_size": GroupSize(), "mode": INT4_MODE,
            "bias_ptr": Pointer("dtype", optional=True), "activation": ACTIVATION, "m": Size(),
            "n": Size(), "k": Size(32), "out_ptr": Pointer("dtype"), "stream": Stream()}


def _sparse_gemm(prepacked):
    """The sparse GEMMs' arguments: the interchange format (a sparsity, codes and meta 16-byte
    aligned, scales aligned to dtype, zeros anywhere) or the prepacked 2:4 layout (w_prepacked
    16-byte, scales_prepacked and zeros_prepacked 4-byte aligned: a lane's two rows)."""
    weight = {"w_ptr": Pointer(16), "scales_ptr": Pointer(4), "zeros_ptr": ZeroPoints(align=4)} \
        if prepacked else \
        {"sparsity": Enum(SPARSITIES), "codes_ptr": Pointer(16), "meta_ptr": Pointer(16),
         "scales_ptr": Pointer("dtype"), "zeros_ptr": ZeroPoints()}
    return {"x_ptr": Pointer(16), "dtype": HALVES, **weight,
            "group_size": GroupSize(SPARSE_GROUP_SIZES), "mode": INT4_MODE,
            "bias_ptr": Pointer("dtype", optional=True), "activation": ACTIVATION, "m": Size(),
            "n": Size(), "k": Size(SPARSE_PACK_K), "out_ptr": Pointer("dtype"),
            "stream": Stream()}


_SPARSE_GEMM_RULES = (gemm_bytes("m", "n", "k", "dtype"), multiple_of("k", SPARSE_WORD_K),
                      sparse_k_group)


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


def _moe_fields():
    """The fields of ck_moe_params_t, in its order (struct_size apart)."""
    return {"tokens": Size(draws_up_to=4096), "hidden": Size(32, most=MOE_MAX_FEATURES),
            "intermediate": Size(32, most=MOE_MAX_FEATURES),
            "experts": Size(most=MOE_MAX_EXPERTS), "top_k": TopK(), "dtype": HALVES,
            "group_size": GroupSize(), "mode": INT4_MODE, "x": Pointer(16),
            "router_logits": Pointer("router_dtype", optional=True),
            "router_dtype": DTypeArg(FLOAT_DTYPES, of="router_logits"), "renormalize": Flag(),
            "topk_ids": Alternative("router_logits", 4),
            "topk_weights": Alternative("router_logits", 4), "w13": Pointer(16),
            "w13_scales": Pointer(16), "w13_zeros": ZeroPoints(align=16), "w2": Pointer(16),
            "w2_scales": Pointer(16), "w2_zeros": ZeroPoints(align=16), "activation": Enum(1),
            "out": Disjoint(16, _moe_out_spans)}


def _moe_params(pointers):
    """ck_moe_params_t as ck_moe_forward checks it, or (pointers=False) as
    ck_moe_workspace_size does: its pointers and router_dtype (which describes router_logits)
    unchecked."""
    fields = _moe_fields()
    unchecked = () if pointers else [field for field, kind in fields.items()
                                     if isinstance(kind, Pointer) or getattr(kind, "of", None)]
    rules = MOE_SIZE_RULES + (moe_out_apart,) if pointers else MOE_SIZE_RULES
    example = dict(tokens=4, hidden=256, intermediate=512, experts=8, top_k=2,
                   router_logits=FAKE_DEVICE)
    return Struct(ck.MoeParams, fields, rules, unchecked, example)


MOE_PARAMS, MOE_PARAMS_SIZES = _moe_params(pointers=True), _moe_params(pointers=False)

# ck_attention_forward (cuda_kernels.h): the limits of ck_attention_params_t, and its
# overlap rules, checked once every size, pointer and alignment passed.
ATTENTION_HEAD_DIMS = (64, 128)
ATTENTION_MAX_HEADS = ATTENTION_MAX_BATCH = 65535


def _attention_sizes_valid(params):
    return not ATTENTION_PARAMS_SIZES.field_violations(params)


def _attention_bytes(params):
    """(q and out bytes, k and v bytes, lse bytes), or None while the sizes are invalid."""
    if not _attention_sizes_valid(params):
        return None
    q = params["total_q"] * params["num_heads_q"] * params["head_dim"] * 2
    kv = params["total_k"] * params["num_heads_kv"] * params["head_dim"] * 2
    return q, kv, params["total_q"] * params["num_heads_q"] * 4


class HeadRowSpans:
    """The overlap rules of the attention exports (prefill and decode): out does not overlap q,
    k or v; lse (when given) none of them nor out. byte_sizes(params): (q and out bytes, k and v
    bytes, lse bytes), or None while the sizes are invalid; k, v: the fields' names; extra(params):
    the (address, bytes) of further inputs that out and lse must not overlap either (a quantized
    cache's scales), once the sizes are valid."""

    def __init__(self, byte_sizes, k, v, extra=lambda params: []):
        self.byte_sizes, self.k, self.v, self.extra = byte_sizes, k, v, extra

    def out(self, params):
        """Disjoint spans of out."""
        sizes = self.byte_sizes(params)
        if sizes is None:
            return None
        q, kv, _ = sizes
        return q, [(params["q"], q), (params[self.k], kv), (params[self.v], kv)] + \
            self.extra(params)

    def lse(self, params):
        """Disjoint spans of lse."""
        sizes = self.byte_sizes(params)
        if sizes is None:
            return None
        q, _, lse = sizes
        return lse, self.out(params)[1] + [(params["out"], q)]

    def apart(self, params):
        """The struct's rule."""
        found = []
        for field, spans in (("out", self.out), ("lse", self.lse)):
            span = spans(params)
            if span is None or not params[field]:
                continue
            if any(overlaps(params[field], span[0], other, size) for other, size in span[1]):
                found.append(Violation(Status.INVALID_VALUE, (field,)))
        return found


ATTENTION_SPANS = HeadRowSpans(_attention_bytes, "k", "v")


def _attention_params(pointers):
    """ck_attention_params_t as ck_attention_forward checks it, or (pointers=False) its sizes
    alone (what the overlap rule needs first)."""
    fields = {"dtype": HALVES, "q": Pointer(16), "k": Pointer(16), "v": Pointer(16),
              "out": Disjoint(16, ATTENTION_SPANS.out),
              "lse": Disjoint(4, ATTENTION_SPANS.lse, optional=True),
              "total_q": Size(most=INT32_MAX), "total_k": Count(most=INT32_MAX),
              "num_heads_q": Size(most=ATTENTION_MAX_HEADS), "num_heads_kv": HeadsKv(),
              "head_dim": HeadDim(), "batch": Batch(),
              "cu_seqlens_q": Pointer(4, optional=True),
              "cu_seqlens_k": PairedPointer("cu_seqlens_q", "cu_seqlens_q", 4),
              "max_seqlen_q": MaxSeqlen("total_q", 1), "max_seqlen_k": MaxSeqlen("total_k", 0),
              "softmax_scale": Float32(), "causal": Enum(2)}
    unchecked = () if pointers else [field for field, kind in fields.items()
                                     if isinstance(kind, Pointer)]
    example = dict(total_q=300, total_k=400, num_heads_q=8, num_heads_kv=2)
    return Struct(ck.AttentionParams, fields, (ATTENTION_SPANS.apart,) if pointers else (),
                  unchecked, example)


ATTENTION_PARAMS_SIZES = _attention_params(pointers=False)
ATTENTION_PARAMS = _attention_params(pointers=True)

# ck_attention_decode and ck_attention_decode_workspace_size (cuda_kernels.h): the limits of
# ck_attention_decode_params_t, the paged fields (checked only with a block_table, which the
# size query reads as a flag alone), the cache's format (quantized: 1-byte codes and float32
# scales), its byte count, the overlaps, the split rule and the workspace. The struct's first
# version ended at num_splits: its struct_size is still accepted, the format then CK_KV_DTYPE.
DECODE_MAX_BATCH = DECODE_MAX_HEADS = 65535
DECODE_MAX_QUERIES = 16
DECODE_MAX_SEQLEN = 2**30
DECODE_MAX_PAGE_SIZE = 65536
DECODE_MAX_SPLITS = 64
DECODE_MAX_AUTO_SPLITS = 16   # the automatic rule's most, but for a quantized cache: 64
DECODE_WAVE_CTAS, DECODE_MIN_SPLIT_KEYS, DECODE_BLOCK_N = 264, 128, 64
DECODE_MIN_SPLIT_KEYS_QUANTIZED = 256
DECODE_SIZE = ctypes.sizeof(ck.AttentionDecodeParams)


class Wrapping:
    """A kind that draws its values as the kind self.inner does (a mixin)."""

    def example(self):
        return self.inner.example()

    def valid(self):
        return self.inner.valid()

    def any(self):
        return self.inner.any()


class When(Wrapping, Kind):
    """A field read, and checked by `inner` (a kind), only in the calls where when(args) holds."""

    def __init__(self, inner, when):
        self.inner, self.when = inner, when

    def settle(self, name, args):
        return self.inner.settle(name, args) if self.when(args) else args[name]

    def violations(self, name, label, args):
        return self.inner.violations(name, label, args) if self.when(args) else []


class PagedOnly(When):
    """A field of a paged cache (num_pages, page_size, max_blocks_per_seq): read, and checked
    by `inner` (a kind), only when block_table is given."""

    def __init__(self, inner):
        super().__init__(inner, lambda args: args["block_table"])


class PageSize(Size):
    """A power of two in [1, 65536], else CK_STATUS_INVALID_VALUE."""

    def example(self):
        return 16

    def valid(self):
        return st.sampled_from([2**i for i in range(17)])

    def violations(self, name, label, args):
        value = args[name]
        if not 1 <= value <= DECODE_MAX_PAGE_SIZE or value & (value - 1):
            return [Violation(Status.INVALID_VALUE, (label,), (value,))]
        return []


# Quantized KV caches (cuda_kernels.h, "Quantized KV cache"): ck_kv_format_t and
# ck_kv_scaling_t, and the scales that ck_attention_decode reads and ck_kv_cache_append reads
# (per head) or writes (per token).
KV_FORMATS, KV_SCALINGS = 3, 2
KV_QUANTIZED = (ck.KV_FP8_E4M3, ck.KV_INT8)


def kv_quantized(args):
    """The cache holds 8-bit codes with scales (an invalid kv_format is its own violation, and
    then nothing that depends on it is checked)."""
    return args["kv_format"] in KV_QUANTIZED


def kv_per_token(args):
    """A quantized cache with a scale per cache row."""
    return kv_quantized(args) and args["kv_scaling"] == ck.KV_SCALE_PER_TOKEN


def kv_element_bytes(args):
    """Bytes of a cache element: 1 (a code) for the quantized formats, 2 for the dtype's."""
    return 1 if kv_quantized(args) else 2


def kv_scale_bytes(args, cache_bytes):
    """The bytes of k_scale (and of v_scale) of a quantized cache of cache_bytes: one float32
    per kv head, or per cache row (head_dim 1-byte codes) with per-token scales."""
    if kv_per_token(args):
        return cache_bytes // args["head_dim"] * 4
    return args["num_heads_kv"] * 4


class KvScales(Disjoint):
    """k_scale or v_scale of a KV cache: not read for CK_KV_DTYPE (any value), else required
    (CK_STATUS_INVALID_VALUE) and 4-byte aligned (CK_STATUS_MISALIGNED). spans: as Disjoint's,
    None where the call does not write the scales (it reads them, and its outputs keep clear)."""

    def __init__(self, spans=lambda args: None):
        super().__init__(4, spans)

    def settle(self, name, args):
        return super().settle(name, args) if kv_quantized(args) else args[name]

    def violations(self, name, label, args):
        return super().violations(name, label, args) if kv_quantized(args) else []


def _decode_fields_valid(params, names):
    kinds = DECODE_PARAMS_SIZES.fields
    return all(not kinds[name].violations(name, name, params) for name in names)


_DECODE_SHAPE = ("batch", "seqlen_q", "num_heads_q", "num_heads_kv", "head_dim", "max_seqlen_k",
                 "kv_format", "kv_scaling")   # all checked before the cache's bytes
_DECODE_PAGES = ("num_pages", "page_size", "max_blocks_per_seq")


def decode_pages_hold_max_seqlen(params):
    """Paged: max_seqlen_k <= max_blocks_per_seq * page_size."""
    if not params["block_table"] or not _decode_fields_valid(params, ("max_seqlen_k",)
                                                             + _DECODE_PAGES):
        return []
    names = ("max_seqlen_k", "max_blocks_per_seq", "page_size")
    if params["max_seqlen_k"] > params["max_blocks_per_seq"] * params["page_size"]:
        return [Violation(Status.INVALID_VALUE, names, tuple(params[n] for n in names))]
    return []


def decode_cache_bytes(params):
    """The bytes of k_cache (and of v_cache): [batch, max_seqlen_k, Hkv, D] or [num_pages,
    page_size, Hkv, D] of 2-byte values, or of 1-byte codes for a quantized format; None while
    a size (or the format) it needs is invalid."""
    paged = bool(params["block_table"])
    names = _DECODE_SHAPE + (_DECODE_PAGES if paged else ())
    if not _decode_fields_valid(params, names) or decode_pages_hold_max_seqlen(params):
        return None
    rows = params["num_pages"] * params["page_size"] if paged else \
        params["batch"] * params["max_seqlen_k"]
    return rows * params["num_heads_kv"] * params["head_dim"] * kv_element_bytes(params)


def decode_cache_fits(params):
    """The cache's byte count fits in int64_t (CK_STATUS_INVALID_VALUE naming the two sizes
    that multiply it: batch and max_seqlen_k, or num_pages and page_size)."""
    size = decode_cache_bytes(params)
    if size is None or size <= INT64_MAX:
        return []
    names = ("num_pages", "page_size") if params["block_table"] else ("batch", "max_seqlen_k")
    return [Violation(Status.INVALID_VALUE, names, tuple(params[n] for n in names))]


def _decode_sizes_valid(params):
    return not DECODE_PARAMS_SIZES.field_violations(params)


def decode_num_splits(params):
    """The splits of a valid call (cuda_kernels.h's rule, or the forced num_splits)."""
    if params["num_splits"]:
        return params["num_splits"]
    rows = params["num_heads_q"] // params["num_heads_kv"] * params["seqlen_q"]
    width = 16 if rows <= 16 else 32 if rows <= 32 else 64
    ctas = params["batch"] * params["num_heads_kv"] * -(-rows // width)
    blocks = -(-params["max_seqlen_k"] // DECODE_BLOCK_N)
    # A quantized cache: kv_format, a field of the struct's second version.
    quantized = (params.get("kv_format", 0) != 0 and params.get("struct_size", DECODE_SIZE)
                 > ck.AttentionDecodeParams.kv_format.offset)
    min_keys = DECODE_MIN_SPLIT_KEYS_QUANTIZED if quantized else DECODE_MIN_SPLIT_KEYS
    most = min(DECODE_MAX_SPLITS if quantized else DECODE_MAX_AUTO_SPLITS,
               -(-params["max_seqlen_k"] // min_keys))

    def cost(splits):  # waves x key blocks per split
        per_split = -(-blocks // splits)
        return -(-ctas * -(-blocks // per_split) // DECODE_WAVE_CTAS) * per_split

    return min(range(1, most + 1), key=lambda s: (cost(s), s))


def decode_workspace_bytes(params):
    """ck_attention_decode_workspace_size's answer for the fields of a
    ck_attention_decode_params_t, or None where it rejects them: 0 for one split, else float32
    O_s and lse_s of splits x batch x seqlen_q x Hq rows, each region rounded up to 256."""
    if params is None or DECODE_PARAMS_SIZES.violations("params", "params", {"params": params}):
        return None
    splits = decode_num_splits(params)
    if splits == 1:
        return 0
    rows = splits * params["batch"] * params["seqlen_q"] * params["num_heads_q"]
    return sum(-(-region // 256) * 256 for region in (rows * params["head_dim"] * 4, rows * 4))


def _decode_bytes(params):
    """(q and out bytes, cache bytes, lse bytes), or None while the sizes are invalid."""
    if not _decode_sizes_valid(params):
        return None
    q = params["batch"] * params["seqlen_q"] * params["num_heads_q"] * params["head_dim"] * 2
    return q, decode_cache_bytes(params), q // params["head_dim"] * 2


def _decode_scale_spans(params):
    """The (address, bytes) of k_scale and v_scale, read for a quantized cache (none for
    CK_KV_DTYPE), once the sizes are valid."""
    if not kv_quantized(params):
        return []
    size = kv_scale_bytes(params, decode_cache_bytes(params))
    return [(params["k_scale"], size), (params["v_scale"], size)]


DECODE_SPANS = HeadRowSpans(_decode_bytes, "k_cache", "v_cache", _decode_scale_spans)
# The first version of ck_attention_decode_params_t ended at num_splits (152 bytes).
DECODE_PARAMS_V1_SIZE = ck.AttentionDecodeParams.kv_format.offset


def _decode_params(pointers):
    """ck_attention_decode_params_t as ck_attention_decode checks it, or (pointers=False) as
    ck_attention_decode_workspace_size does (block_table only says whether the cache is paged,
    the scales are not read); either takes the first version's struct_size too."""
    fields = {"dtype": HALVES, "q": Pointer(16), "k_cache": Pointer(16),
              "v_cache": Pointer(16), "seqlens_k": Pointer(4),
              "block_table": Pointer(4, optional=True),
              "out": Disjoint(16, DECODE_SPANS.out),
              "lse": Disjoint(4, DECODE_SPANS.lse, optional=True),
              "batch": Size(most=DECODE_MAX_BATCH), "seqlen_q": Size(most=DECODE_MAX_QUERIES),
              "num_heads_q": Size(most=DECODE_MAX_HEADS), "num_heads_kv": HeadsKv(),
              "head_dim": HeadDim(), "max_seqlen_k": Size(most=DECODE_MAX_SEQLEN),
              "num_pages": PagedOnly(Size(most=INT32_MAX)), "page_size": PagedOnly(PageSize()),
              "max_blocks_per_seq": PagedOnly(Size(most=INT32_MAX)),
              "softmax_scale": Float32(), "num_splits": Enum(DECODE_MAX_SPLITS + 1),
              "kv_format": Enum(KV_FORMATS), "kv_scaling": When(Enum(KV_SCALINGS), kv_quantized),
              "k_scale": KvScales(), "v_scale": KvScales()}
    unchecked = () if pointers else [field for field, kind in fields.items()
                                     if isinstance(kind, Pointer)]
    example = dict(batch=4, seqlen_q=2, num_heads_q=8, num_heads_kv=2, max_seqlen_k=1000,
                   num_pages=300, page_size=16, max_blocks_per_seq=100)
    rules = (decode_pages_hold_max_seqlen, decode_cache_fits)
    return Struct(ck.AttentionDecodeParams, fields,
                  rules + ((DECODE_SPANS.apart,) if pointers else ()), unchecked, example,
                  older=(DECODE_PARAMS_V1_SIZE,))


DECODE_PARAMS_SIZES = _decode_params(pointers=False)
DECODE_PARAMS = _decode_params(pointers=True)


class DecodeWorkspacePointer(Disjoint):
    """ck_attention_decode's workspace: read (and checked: not NULL, 256-byte aligned, clear of
    q, the cache, out, lse and a quantized cache's scales) only when the call has more than one
    split."""

    def __init__(self):
        super().__init__(256, _decode_workspace_spans)

    def violations(self, name, label, args):
        need = decode_workspace_bytes(args["params"])
        return super().violations(name, label, args) if need else []


class DecodeWorkspaceBytes(WorkspaceBytes):
    """ck_attention_decode's workspace_bytes: at least ck_attention_decode_workspace_size."""

    def settle(self, name, args):
        need = decode_workspace_bytes(args[self.params])
        return args[name] if need is None or args[name] >= need else need + args[name]


def _decode_workspace_spans(args):
    need = decode_workspace_bytes(args["params"])
    if not need:
        return None
    params = DECODE_PARAMS.read(args["params"])
    q, cache, lse = _decode_bytes(params)
    others = [(params["q"], q), (params["k_cache"], cache), (params["v_cache"], cache),
              (params["out"], q)]
    if params["lse"]:
        others.append((params["lse"], lse))
    return need, others + _decode_scale_spans(params)


def decode_workspace(args):
    """ck_attention_decode's workspace, once the params pass and the call has several splits:
    at least ck_attention_decode_workspace_size bytes (naming workspace_bytes and both sizes),
    then (after its alignment) clear of q, the cache, out, lse and a quantized cache's scales."""
    return workspace_violations(args, _decode_workspace_spans(args))


# ck_kv_cache_append (cuda_kernels.h): ck_kv_cache_append_params_t, checked field by field in
# its order (the scales only for a quantized format), the cache's slots (its bytes within
# int64_t), the alignments, then the overlaps of the outputs: the cache always, the scales where
# the call writes them (per token); slot_mapping is not checked against them (the host never
# reads it). k and v hold num_tokens rows of Hkv x D dtype values, the cache num_slots rows of
# Hkv x D elements of the format.
KV_APPEND_MAX_TOKENS = INT32_MAX
_KV_APPEND_SIZES = ("kv_format", "kv_scaling", "num_tokens", "num_heads_kv", "head_dim")


def _kv_append_fields_valid(params, names):
    kinds = KV_APPEND_PARAMS.fields
    return all(not kinds[name].violations(name, name, params) for name in names)


def kv_append_cache_bytes(params):
    """The bytes of k_cache (and of v_cache), or None while a size or the format it needs is
    invalid (num_slots < 1 included); may pass INT64_MAX (kv_append_slots_fit)."""
    if not _kv_append_fields_valid(params, _KV_APPEND_SIZES) or params["num_slots"] < 1:
        return None
    return params["num_slots"] * params["num_heads_kv"] * params["head_dim"] * \
        kv_element_bytes(params)


def kv_append_slots_fit(params):
    """The cache's bytes fit in int64_t (CK_STATUS_INVALID_VALUE naming num_slots)."""
    size = kv_append_cache_bytes(params)
    if size is None or size <= INT64_MAX:
        return []
    return [Violation(Status.INVALID_VALUE, ("num_slots",), (params["num_slots"],))]


def _kv_append_buffers(params):
    """[(field, address, bytes, written)] of the buffers the overlap rule compares, or None
    while the sizes are invalid: k and v (read), the cache (written) and, for a quantized
    format, the scales (written per token, else read)."""
    cache = kv_append_cache_bytes(params)
    if cache is None or cache > INT64_MAX:
        return None
    new = params["num_tokens"] * params["num_heads_kv"] * params["head_dim"] * 2
    buffers = [("k", new, False), ("v", new, False), ("k_cache", cache, True),
               ("v_cache", cache, True)]
    if kv_quantized(params):
        scales, written = kv_scale_bytes(params, cache), kv_per_token(params)
        buffers += [("k_scale", scales, written), ("v_scale", scales, written)]
    return [(field, params[field], size, written) for field, size, written in buffers]


def _kv_append_spans(field):
    """Disjoint spans of the output `field`, or None where the call does not write it."""
    def spans(params):
        buffers = _kv_append_buffers(params)
        mine = [size for name, _, size, written in buffers or () if name == field and written]
        if not mine:
            return None
        return mine[0], [(address, size) for name, address, size, _ in buffers if name != field]
    return spans


def kv_append_apart(params):
    """Every output (the cache; the scales, per token) overlaps no other buffer of the call
    (CK_STATUS_INVALID_VALUE naming both), checked last."""
    buffers = _kv_append_buffers(params)
    found = []
    for out, address, size, written in buffers or ():
        if not written:
            continue
        others = [name for name, other, other_size, _ in buffers
                  if name != out and overlaps(address, size, other, other_size)]
        if others:
            found.append(Violation(Status.INVALID_VALUE, (out, *others)))
    return found


def _kv_append_params():
    fields = {"dtype": HALVES, "kv_format": Enum(KV_FORMATS),
              "kv_scaling": When(Enum(KV_SCALINGS), kv_quantized),
              "k": Pointer(16), "v": Pointer(16), "slot_mapping": Pointer(8),
              "k_cache": Disjoint(16, _kv_append_spans("k_cache")),
              "v_cache": Disjoint(16, _kv_append_spans("v_cache")),
              "k_scale": KvScales(_kv_append_spans("k_scale")),
              "v_scale": KvScales(_kv_append_spans("v_scale")),
              "num_tokens": Size(most=KV_APPEND_MAX_TOKENS),
              "num_heads_kv": Size(most=DECODE_MAX_HEADS),
              "head_dim": HeadDim(), "num_slots": Size(draws_up_to=2**40)}
    example = dict(num_tokens=16, num_heads_kv=8, num_slots=4096)
    return Struct(ck.KvCacheAppendParams, fields, (kv_append_slots_fit, kv_append_apart),
                  example=example)


KV_APPEND_PARAMS = _kv_append_params()


# ck_qkv_prepack and ck_qkv_projection (cuda_kernels.h): ck_qkv_params_t. Its [prepack] fields
# (the layer) are checked first and alike by both: the heads and head size (at most 2^20 each,
# the library's limit, which cuda_kernels.h does not state), RoPE's rotary_dim, hidden and the
# format's group size or block, then the [N, H] weight's N = (Hq + 2 Hkv) D rows within the
# prepacked layout's 2^40 and its bytes (as the prepacks count them) within int64_t. The
# prepack then checks its pointer arguments as the format's own prepack does (ck_w4a16_prepack
# for INT4, ck_block4_prepack for the block formats, each naming them its way); the projection
# the struct's pointers, tokens, the cos/sin table and the overlaps of q, k and v.
QKV_MAX_DIM = 2**20
WEIGHT4_FORMATS, ROPE_STYLES = 4, 3
WEIGHT4_GROUPS = {ck.WEIGHT4_INT4: GROUP_SIZES, ck.WEIGHT4_NF4: BLOCK4_BLOCKS[ck.BLOCK4_NF4],
                  ck.WEIGHT4_MXFP4: BLOCK4_BLOCKS[ck.BLOCK4_MXFP4],
                  ck.WEIGHT4_NVFP4: BLOCK4_BLOCKS[ck.BLOCK4_NVFP4]}


def _weight4_format(args):
    """The call's format when it is a valid ck_weight4_format_t, else None."""
    fmt = args["format"]
    return fmt if 0 <= fmt < WEIGHT4_FORMATS else None


def _rope(args):
    """A rotation is asked for (any rope_style but CK_ROPE_NONE: an invalid one is its own
    violation)."""
    return args["rope_style"] != ck.ROPE_NONE


class Weight4Mode(Enum):
    """ck_qkv_params_t's mode: a ck_int4_mode_t for INT4, CK_INT4_SYMMETRIC (0) for the block
    formats (CK_STATUS_INVALID_VALUE); checked once the format is valid."""

    def __init__(self):
        super().__init__(2)

    def settle(self, name, args):
        fmt = _weight4_format(args)
        return 0 if fmt is not None and fmt != ck.WEIGHT4_INT4 else args[name]

    def violations(self, name, label, args):
        fmt = _weight4_format(args)
        if fmt is None:
            return []
        if fmt == ck.WEIGHT4_INT4:
            return super().violations(name, label, args)
        if args[name] != ck.INT4_SYMMETRIC:
            return [Violation(Status.INVALID_VALUE, (label,), (args[name],))]
        return []


class Weight4GroupSize(GroupSize):
    """ck_qkv_params_t's group_size: INT4's group sizes, or the block format's blocksize (as
    Block4Size: NF4 32, 64 or 128, MXFP4 32, NVFP4 16); else CK_STATUS_UNSUPPORTED, once the
    format is valid."""

    def __init__(self):
        super().__init__(sorted({g for sizes in WEIGHT4_GROUPS.values() for g in sizes}))

    def settle(self, name, args):
        fmt = _weight4_format(args)
        if fmt is None or args[name] in WEIGHT4_GROUPS[fmt]:
            return args[name]
        return {ck.WEIGHT4_INT4: 128, ck.WEIGHT4_NF4: 64}.get(fmt, WEIGHT4_GROUPS[fmt][0])

    def violations(self, name, label, args):
        fmt = _weight4_format(args)
        if fmt is None or args[name] in WEIGHT4_GROUPS[fmt]:
            return []
        return [Violation(Status.UNSUPPORTED, (label,), (args[name],))]


QKV_GROUP_SIZE = Weight4GroupSize()


def _qkv_block(args):
    """The block a block-format layer's hidden must be a multiple of (its valid group size),
    else None."""
    fmt = _weight4_format(args)
    if fmt in (None, ck.WEIGHT4_INT4) or args["group_size"] not in WEIGHT4_GROUPS[fmt]:
        return None
    return args["group_size"]


class QkvHidden(Size):
    """ck_qkv_params_t's hidden H: 32 .. 2^40 (else CK_STATUS_INVALID_VALUE); valid draws are
    multiples of 32 and of a block format's block (the rules qkv_hidden_rules)."""

    def __init__(self):
        super().__init__(32, most=PREPACK_LIMIT, draws_up_to=2**32, least=32)

    def example(self):
        return 4096

    def settle(self, name, args):   # before group_size: with the block it settles to
        block = _qkv_block(dict(args, group_size=QKV_GROUP_SIZE.settle("group_size", args)))
        if block is None or not 32 <= args[name] <= self.draws_up_to:
            return args[name]
        return _round_up(args[name], max(32, block))


class RotaryDim(Size):
    """ck_qkv_params_t's rotary_dim R: with RoPE, even and in [2, head_dim] (checked once
    head_dim is valid; CK_STATUS_INVALID_VALUE), ignored without."""

    def __init__(self):
        super().__init__(2)

    def example(self):
        return 128

    def _head_dim(self, args):
        head_dim = args["head_dim"]
        return head_dim if 8 <= head_dim <= QKV_MAX_DIM and head_dim % 8 == 0 else None

    def settle(self, name, args):
        head_dim = self._head_dim(args)
        if head_dim is None or not _rope(args):
            return args[name]
        return min(max(args[name], 2), head_dim) // 2 * 2

    def violations(self, name, label, args):
        head_dim, value = self._head_dim(args), args[name]
        if head_dim is None or not _rope(args) or (2 <= value <= head_dim and value % 2 == 0):
            return []
        return [Violation(Status.INVALID_VALUE, (label,), (value,))]


class RopeTable(Pointer):
    """positions and cos_sin: required with RoPE and 4-byte aligned; not read without it (any
    value)."""

    def __init__(self):
        super().__init__(4)

    def _required(self, args):
        return _rope(args)

    def violations(self, name, label, args):
        return super().violations(name, label, args) if _rope(args) else []


class QkvScales(Pointer):
    """ck_qkv_prepack's scales: INT4's aligned to dtype (as ck_w4a16_prepack's), NF4's float32
    absmax 4-byte aligned and the uint8 scales of the others anywhere (Block4Scales)."""

    def alignment(self, args):
        if args["format"] == ck.WEIGHT4_INT4:
            return _element_size(args["dtype"])
        return 4 if args["format"] == ck.WEIGHT4_NF4 else 1


class LayerPointer(Wrapping, Pointer):
    """A pointer argument of ck_qkv_prepack: checked only once its params pass (the library
    checks the layer first), as `inner` (a Pointer kind) checks it over the layer's fields
    (params->mode as ZeroPoints' mode, params->dtype as Pointer's dtype); int4_label: its name on
    the INT4 path where ck_w4a16_prepack's differs from ck_block4_prepack's (w_packed, packed)."""

    def __init__(self, inner, int4_label=None, params="params"):
        Pointer.__init__(self, inner.align, inner.optional)
        self.inner, self.int4_label, self.params = inner, int4_label, params

    def _layer(self, args):
        """The arguments with the params' fields, or None while the params break a rule."""
        params = args[self.params]
        if params is None or QKV_LAYER.violations(self.params, self.params, args):
            return None
        return dict(params, **{arg: value for arg, value in args.items() if arg != self.params})

    def settle(self, name, args):
        layer = self._layer(args)
        return args[name] if layer is None else self.inner.settle(name, layer)

    def violations(self, name, label, args):
        layer = self._layer(args)
        if layer is None:
            return []
        if self.int4_label and layer["format"] == ck.WEIGHT4_INT4:
            label = self.int4_label
        return self.inner.violations(name, label, layer)


def _qkv_shape_valid(params):
    """Hq, Hkv, D and H pass their own rules."""
    heads_q, heads_kv, head_dim = params["num_heads_q"], params["num_heads_kv"], params["head_dim"]
    return (1 <= heads_kv <= heads_q <= QKV_MAX_DIM and heads_q % heads_kv == 0
            and 8 <= head_dim <= QKV_MAX_DIM and head_dim % 8 == 0
            and 32 <= params["hidden"] <= PREPACK_LIMIT)


def qkv_rows(params):
    """N = (Hq + 2 Hkv) D, the stacked weight's rows."""
    return (params["num_heads_q"] + 2 * params["num_heads_kv"]) * params["head_dim"]


def qkv_weight_size(params):
    """The [N, H] weight: N within the prepacked layout's 2^40 (CK_STATUS_INVALID_VALUE naming
    Hq, Hkv and D), then its bytes, counted at 4 per value as the prepacks count them
    (gemm_bytes(1, n, k, 2)), within int64_t (naming H too); once the shape's own rules pass.
    Its prepacked bytes and values are then representable."""
    if not _qkv_shape_valid(params):
        return []
    heads = ("num_heads_q", "num_heads_kv", "head_dim")
    rows = qkv_rows(params)
    if rows > PREPACK_LIMIT:
        return [Violation(Status.INVALID_VALUE, heads, tuple(params[n] for n in heads))]
    if rows * params["hidden"] * 4 > INT64_MAX:
        names = heads + ("hidden",)
        return [Violation(Status.INVALID_VALUE, names, tuple(params[n] for n in names))]
    return []


def qkv_hidden_block(params):
    """A block format's hidden: a multiple of its block (NF4's 64 or 128; CK_STATUS_UNSUPPORTED
    naming hidden), once hidden is valid and a multiple of 32."""
    block, hidden = _qkv_block(params), params["hidden"]
    if block is None or not 32 <= hidden <= PREPACK_LIMIT or hidden % 32 or hidden % block == 0:
        return []
    return [Violation(Status.UNSUPPORTED, ("hidden",), (hidden,))]


QKV_LAYER_RULES = (
    multiple_of("head_dim", 8, lambda a: a["head_dim"] <= QKV_MAX_DIM, Status.INVALID_VALUE),
    multiple_of("hidden", 32, lambda a: 32 <= a["hidden"] <= PREPACK_LIMIT),
    qkv_hidden_block, qkv_weight_size)


def _qkv_layer_valid(params):
    return not QKV_LAYER.field_violations(params)


def qkv_tokens_bytes(params):
    """ck_qkv_projection's GEMM [T, H] x [N, H]^T -> [T, N], each operand counted at 4 bytes per
    value (gemm_bytes): within int64_t (CK_STATUS_INVALID_VALUE naming tokens), once the layer
    passes (its own [N, H] is then representable)."""
    tokens = params["tokens"]
    if tokens < 1 or not _qkv_layer_valid(params):
        return []
    if tokens * max(params["hidden"], qkv_rows(params)) * 4 > INT64_MAX:
        return [Violation(Status.INVALID_VALUE, ("tokens",), (tokens,))]
    return []


def qkv_table_bytes(params):
    """With RoPE, the cos/sin table [max_position, R] float32: its bytes within int64_t
    (CK_STATUS_INVALID_VALUE naming max_position), once R and max_position are valid."""
    position = params["max_position"]
    if not _rope(params) or position < 1 or not _qkv_layer_valid(params):
        return []
    if position * params["rotary_dim"] * 4 > INT64_MAX:
        return [Violation(Status.INVALID_VALUE, ("max_position",), (position,))]
    return []


def _qkv_bytes(params):
    """(x bytes, q bytes, k and v bytes), or None while the sizes are invalid."""
    if QKV_PARAMS_SIZES.field_violations(params):
        return None
    rows = params["tokens"] * params["head_dim"] * _element_size(params["dtype"])
    return (params["tokens"] * params["hidden"] * _element_size(params["dtype"]),
            rows * params["num_heads_q"], rows * params["num_heads_kv"])


def _qkv_spans(field, others):
    """Disjoint spans of the output `field` (q, k or v): the buffers among x, q, k and v that
    the library checks it against."""
    def spans(params):
        sizes = _qkv_bytes(params)
        if sizes is None:
            return None
        size = dict(zip(("x", "q", "k", "v"), (sizes[0], sizes[1], sizes[2], sizes[2])))
        return size[field], [(params[other], size[other]) for other in others]
    return spans


def qkv_apart(params):
    """ck_qkv_projection: q, k and v do not overlap each other (CK_STATUS_INVALID_VALUE naming
    them), then none of them overlaps x (naming it too); checked last."""
    sizes = _qkv_bytes(params)
    if sizes is None:
        return []
    spans = {"x": sizes[0], "q": sizes[1], "k": sizes[2], "v": sizes[2]}
    found = []
    for pairs, names in (((("q", "k"), ("q", "v"), ("k", "v")), ("q", "k", "v")),
                         ((("x", "q"), ("x", "k"), ("x", "v")), ("q", "k", "v", "x"))):
        if any(params[a] and params[b] and overlaps(params[a], spans[a], params[b], spans[b])
               for a, b in pairs):
            found.append(Violation(Status.INVALID_VALUE, names))
    return found


def _qkv_params(which):
    """ck_qkv_params_t as ck_qkv_projection checks it ("call"), its sizes alone ("sizes": what
    the overlap rule needs first) or its [prepack] fields alone ("layer": as ck_qkv_prepack
    checks it, the other fields drawn and ignored)."""
    fields = {"tokens": Size(draws_up_to=2**28), "hidden": QkvHidden(),
              "num_heads_q": Size(most=QKV_MAX_DIM, draws_up_to=4096),
              "num_heads_kv": HeadsKv(QKV_MAX_DIM),
              "head_dim": Size(8, most=QKV_MAX_DIM, draws_up_to=4096), "dtype": HALVES,
              "format": Enum(WEIGHT4_FORMATS), "group_size": QKV_GROUP_SIZE,
              "mode": Weight4Mode(), "rope_style": Enum(ROPE_STYLES), "rotary_dim": RotaryDim(),
              "x": Pointer(16), "w_prepacked": Pointer(16), "scales_prepacked": Pointer(16),
              "zeros_prepacked": ZeroPoints(align=16),
              "global_scale": GlobalScale(ck.WEIGHT4_NVFP4, WEIGHT4_FORMATS),
              "bias": Pointer("dtype", optional=True), "positions": RopeTable(),
              "cos_sin": RopeTable(), "max_position": When(Size(draws_up_to=2**32), _rope),
              "q": Disjoint("dtype", _qkv_spans("q", ("x",))),
              "k": Disjoint("dtype", _qkv_spans("k", ("x", "q"))),
              "v": Disjoint("dtype", _qkv_spans("v", ("x", "q", "k")))}
    layer = ("hidden", "num_heads_q", "num_heads_kv", "head_dim", "dtype", "format",
             "group_size", "mode", "rope_style", "rotary_dim")
    rules = QKV_LAYER_RULES
    if which == "layer":
        unchecked = [field for field in fields if field not in layer]
    else:
        rules += (qkv_tokens_bytes, qkv_table_bytes)
        unchecked = [] if which == "call" else \
            [field for field, kind in fields.items() if isinstance(kind, Pointer)]
    if which == "call":
        rules += (qkv_apart,)
    example = dict(tokens=16, num_heads_q=32, num_heads_kv=8, head_dim=128,
                   rope_style=ck.ROPE_NEOX, max_position=4096)
    return Struct(ck.QkvParams, fields, rules, unchecked, example)


QKV_LAYER = _qkv_params("layer")
QKV_PARAMS_SIZES = _qkv_params("sizes")
QKV_PARAMS = _qkv_params("call")


# Exports whose fuzz description is still to be written. The set may only shrink.
UNDESCRIBED = set()

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
        (matrix_bytes("rows", "cols", "x_dtype"), row_scales)),
    "ck_dequantize_int8": Description(
        {"q_ptr": Pointer(1), "scales_ptr": Pointer(4), "rows": Size(), "cols": Size(),
         "granularity": GRANULARITY, "out_ptr": Pointer("out_dtype"), "out_dtype": FLOATS,
         "stream": Stream()},
        (matrix_bytes("rows", "cols", "out_dtype"), row_scales)),
    "ck_quantize_fp8": Description(
        {"x_ptr": Pointer("x_dtype"), "x_dtype": FLOATS, "rows": Size(), "cols": Size(),
         "format": FP8_FORMAT, "granularity": FP8_GRANULARITY, "scale_mode": SCALE_MODE,
         "scales_ptr": Pointer(4), "q_ptr": Pointer(1), "stream": Stream()},
        (matrix_bytes("rows", "cols", "x_dtype"), fp8_scale_bytes)),
    "ck_dequantize_fp8": Description(
        {"q_ptr": Pointer(1), "format": FP8_FORMAT, "scales_ptr": Pointer(4), "rows": Size(),
         "cols": Size(), "granularity": FP8_GRANULARITY, "out_ptr": Pointer("out_dtype"),
         "out_dtype": FLOATS, "stream": Stream()},
        (matrix_bytes("rows", "cols", "out_dtype"), fp8_scale_bytes)),
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
    "ck_quantize_nf4": Description(
        {"x_ptr": Pointer("x_dtype"), "x_dtype": FLOATS, "rows": Size(), "cols": Size(),
         "blocksize": GroupSize(NF4_BLOCK_SIZES), "packed_ptr": Pointer(1),
         "absmax_ptr": Pointer(4), "stream": Stream()},
        (matrix_bytes("rows", "cols", "x_dtype"), nf4_absmax_bytes)),
    "ck_dequantize_nf4": Description(
        {"packed_ptr": Pointer(1), "absmax_ptr": Pointer(4), "rows": Size(), "cols": Size(),
         "blocksize": GroupSize(NF4_BLOCK_SIZES), "out_ptr": Pointer("out_dtype"),
         "out_dtype": FLOATS, "stream": Stream()},
        (matrix_bytes("rows", "cols", "out_dtype"), nf4_absmax_bytes)),
    "ck_quantize_mxfp4": Description(
        {"x_ptr": Pointer("x_dtype"), "x_dtype": FLOATS, "rows": Size(), "cols": Size(),
         "packed_ptr": Pointer(1), "scales_ptr": Pointer(1), "stream": Stream()},
        (matrix_bytes("rows", "cols", "x_dtype"),)),
    "ck_dequantize_mxfp4": Description(
        {"packed_ptr": Pointer(1), "scales_ptr": Pointer(1), "rows": Size(), "cols": Size(),
         "out_ptr": Pointer("out_dtype"), "out_dtype": FLOATS, "stream": Stream()},
        (matrix_bytes("rows", "cols", "out_dtype"),)),
    "ck_quantize_nvfp4": Description(
        {"x_ptr": Pointer("x_dtype"), "x_dtype": FLOATS, "rows": Size(), "cols": Size(),
         "scale_mode": SCALE_MODE, "global_scale_ptr": Pointer(4), "packed_ptr": Pointer(1),
         "scales_ptr": Pointer(1), "stream": Stream()},
        (matrix_bytes("rows", "cols", "x_dtype"),)),
    "ck_dequantize_nvfp4": Description(
        {"packed_ptr": Pointer(1), "scales_ptr": Pointer(1), "global_scale_ptr": Pointer(4),
         "rows": Size(), "cols": Size(), "out_ptr": Pointer("out_dtype"), "out_dtype": FLOATS,
         "stream": Stream()},
        (matrix_bytes("rows", "cols", "out_dtype"),)),
    "ck_gemm_int8": Description(
        dict(_int8_gemm_shape(), c_ptr=Pointer(4), stream=Stream()),
        (gemm_bytes("m", "n", "k", 4), multiple_of("k", 16), multiple_of("n", 16, kn_layout))),
    "ck_int8_prepack": Description(
        {"b_kn_ptr": Pointer(16), "k": Size(16), "n": Size(16),
         "b_nk_ptr": Disjoint(16, _int8_prepack_spans), "stream": Stream()},
        (int8_prepack_bytes, multiple_of("k", 16), multiple_of("n", 16), int8_prepack_apart)),
    "ck_gemm_int8_scaled": Description(
        dict(_int8_gemm_shape(), **_epilogue(), out_ptr=Pointer("out_dtype"), out_dtype=FLOATS,
             stream=Stream()),
        (gemm_bytes("m", "n", "k", "out_dtype"), multiple_of("k", 16),
         multiple_of("n", 16, kn_layout))),
    "ck_gemm_fp8_scaled": Description(
        {"a_ptr": Pointer(16), "b_ptr": Pointer(16), "m": Size(), "n": Size(), "k": Size(16),
         **_epilogue(), "a_granularity": FP8_GRANULARITY, "b_granularity": FP8_GRANULARITY,
         "out_ptr": Pointer("out_dtype"), "out_dtype": FLOATS, "stream": Stream()},
        (gemm_bytes("m", "n", "k", "out_dtype"), multiple_of("k", 16), fp8_block_scale_pair)),
    # W4A8: the group sizes 32 and 64, valid INT4 groups, are unsupported here as any other.
    "ck_gemm_w4a8": Description(
        {"a_ptr": Pointer(16), "scale_a_ptr": Pointer(4), "a_granularity": GRANULARITY,
         "w_ptr": Pointer(16), "w_scales_ptr": Pointer("scale_dtype"), "scale_dtype": HALVES,
         "group_size": GroupSize(W4A8_GROUP_SIZES), "bias_ptr": Pointer("out_dtype", optional=True),
         "activation": ACTIVATION, "m": Size(), "n": Size(), "k": Size(32),
         "out_ptr": Pointer("out_dtype"), "out_dtype": FLOATS, "stream": Stream()},
        (gemm_bytes("m", "n", "k", "out_dtype"), multiple_of("k", 32))),
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
    "ck_block4_prepacked_scales_bytes": Description(
        {"format": Enum(BLOCK4_FORMATS), "n": Size(), "k": Size(32), "blocksize": Block4Size()},
        drive="pure"),
    "ck_block4_prepack": Description(
        {"format": Enum(BLOCK4_FORMATS), "packed_ptr": Pointer(16), "scales_ptr": Block4Scales(),
         "n": Size(), "k": Block4K(), "blocksize": Block4Size(), "w_out_ptr": Pointer(16),
         "scales_out_ptr": Pointer(16), "stream": Stream()},
        (gemm_bytes(1, "n", "k", 2), multiple_of("k", 32), block4_k_rule, prepack_size_rule)),
    "ck_gemm_block4_prepacked": Description(
        {"x_ptr": Pointer(16), "dtype": HALVES, "format": Enum(BLOCK4_FORMATS),
         "w_ptr": Pointer(16), "scales_ptr": Pointer(16), "global_scale_ptr": GlobalScale(),
         "blocksize": Block4Size(), "bias_ptr": Pointer("dtype", optional=True),
         "activation": ACTIVATION, "m": Size(), "n": Size(), "k": Block4K(),
         "out_ptr": Pointer("dtype"), "stream": Stream()},
        (gemm_bytes("m", "n", "k", "dtype"), multiple_of("k", 32), block4_k_rule,
         prepack_size_rule)),
    "ck_qkv_prepack": Description(
        {"params": QKV_LAYER, "packed_ptr": LayerPointer(Pointer(16), "w_packed"),
         "scales_ptr": LayerPointer(QkvScales()), "zeros_ptr": LayerPointer(ZeroPoints()),
         "w_out_ptr": LayerPointer(Pointer(16)), "scales_out_ptr": LayerPointer(Pointer(16)),
         "zeros_out_ptr": LayerPointer(ZeroPoints(align=16)), "stream": Stream()}),
    "ck_qkv_projection": Description({"params": QKV_PARAMS, "stream": Stream()}),
    "ck_import_gptq": Description(_import(gptq=True), _IMPORT_RULES),
    "ck_import_awq": Description(_import(gptq=False), _IMPORT_RULES),
    "ck_permute_columns": Description(
        {"x_ptr": Pointer("dtype"), "dtype": FLOATS, "rows": Size(), "cols": Size(),
         "perm_ptr": Pointer(4), "out_ptr": Pointer("dtype"), "stream": Stream()},
        (matrix_bytes("rows", "cols", "dtype"), int32_columns)),
    "ck_sparse_prune": Description(
        {"w_ptr": Pointer("dtype"), "dtype": FLOATS, "sparsity": Enum(SPARSITIES),
         "n": sparse_n(), "k": sparse_k(SPARSE_WORD_K), "out_ptr": Pointer("dtype"),
         "stream": Stream()},
        (matrix_bytes("n", "k", "dtype", SPARSE_MATRIX_LABELS),
         multiple_of("k", SPARSE_WORD_K))),
    "ck_sparse_quantize_int4": Description(
        {"w_ptr": Pointer("dtype"), "dtype": FLOATS, "sparsity": Enum(SPARSITIES),
         "n": sparse_n(), "k": sparse_k(), "group_size": GroupSize(SPARSE_GROUP_SIZES),
         "mode": INT4_MODE, "codes_ptr": Pointer(16), "meta_ptr": Pointer(16),
         "scales_ptr": Pointer("dtype"), "zeros_ptr": ZeroPoints(),
         "violations_ptr": Pointer(4, optional=True), "stream": Stream()},
        sparse_weight_rules("dtype")),
    "ck_sparse_1632_to_24": Description(
        {"masks_ptr": Pointer(16), "n": sparse_n(), "k": sparse_k(SPARSE_WORD_K),
         "meta_ptr": Pointer(16), "violations_ptr": Pointer(4, optional=True),
         "stream": Stream()},
        (matrix_bytes("n", "k", 4, SPARSE_MATRIX_LABELS), multiple_of("k", SPARSE_WORD_K))),
    "ck_sparse_dequantize_int4": Description(
        {"codes_ptr": Pointer(16), "meta_ptr": Pointer(16), "scales_ptr": Pointer("out_dtype"),
         "zeros_ptr": ZeroPoints(), "sparsity": Enum(SPARSITIES), "n": sparse_n(),
         "k": sparse_k(), "group_size": GroupSize(SPARSE_GROUP_SIZES), "mode": INT4_MODE,
         "out_ptr": Pointer("out_dtype"), "out_dtype": FLOATS, "stream": Stream()},
        sparse_weight_rules("out_dtype")),
    "ck_gemm_sparse_w4a16": Description(_sparse_gemm(prepacked=False), _SPARSE_GEMM_RULES),
    "ck_sparse_w4a16_prepacked_bytes": Description({"n": Size(), "k": Size(SPARSE_PACK_K)},
                                                   drive="pure"),
    "ck_sparse_w4a16_prepacked_groups": Description(
        {"n": Size(), "k": Size(SPARSE_PACK_K), "group_size": GroupSize(SPARSE_GROUP_SIZES)},
        drive="pure"),
    "ck_sparse_w4a16_prepack": Description(
        {"codes_ptr": Pointer(16), "meta_ptr": Pointer(16), "scales_ptr": Pointer("dtype"),
         "zeros_ptr": ZeroPoints(), "dtype": HALVES, "n": sparse_n(), "k": sparse_k(),
         "group_size": GroupSize(SPARSE_GROUP_SIZES), "mode": INT4_MODE,
         "w_out_ptr": Pointer(16), "scales_out_ptr": Pointer(16),
         "zeros_out_ptr": ZeroPoints(align=16), "stream": Stream()},
        sparse_weight_rules("dtype", prepacked=True)),
    "ck_sparse_w4a16_prepack_dense": Description(
        {"codes_ptr": Pointer(16), "meta_ptr": Pointer(16), "scales_ptr": Pointer("dtype"),
         "zeros_ptr": ZeroPoints(), "sparsity": Enum(SPARSITIES), "dtype": HALVES,
         "n": sparse_n(), "k": sparse_k(64), "group_size": GroupSize(SPARSE_GROUP_SIZES),
         "mode": INT4_MODE, "w_out_ptr": Pointer(16), "scales_out_ptr": Pointer(16),
         "zeros_out_ptr": ZeroPoints(align=16), "stream": Stream()},
        sparse_weight_rules("dtype") + (prepack_size_rule,)),
    "ck_gemm_sparse_w4a16_prepacked": Description(
        _sparse_gemm(prepacked=True),
        _SPARSE_GEMM_RULES + (multiple_of("k", SPARSE_PACK_K), sparse_prepacked_size("m"))),
    "ck_gemm_int4": Description(
        {"a_ptr": Pointer(16), "b_ptr": Pointer(16), "m": Size(), "n": Size(), "k": Size(32),
         "c_ptr": Pointer(4), "stream": Stream()},
        (gemm_bytes("m", "n", "k", 4), multiple_of("k", 32))),
    "ck_gemm_int4_scaled": Description(
        {"a_ptr": Pointer(16), "b_ptr": Pointer(16), "m": Size(), "n": Size(), "k": Size(32),
         **_epilogue(), "out_ptr": Pointer("out_dtype"), "out_dtype": FLOATS,
         "stream": Stream()},
        (gemm_bytes("m", "n", "k", "out_dtype"), multiple_of("k", 32))),
    # tokens * experts * 4 bytes of logits cannot overflow within the pairs' and experts' limits.
    "ck_moe_route": Description(
        {"logits_ptr": Pointer("logits_dtype"), "logits_dtype": FLOATS,
         "tokens": Size(draws_up_to=MOE_MAX_PAIRS),
         "experts": Size(most=MOE_MAX_EXPERTS), "top_k": TopK(), "renormalize": Flag(),
         "topk_ids_ptr": Pointer(4), "topk_weights_ptr": Pointer(4), "stream": Stream()},
        (moe_pairs,)),
    "ck_moe_prepacked_bytes": Description({"experts": Size(), "n": Size(), "k": Size(32)},
                                          drive="pure"),
    "ck_moe_prepacked_groups": Description(
        {"experts": Size(), "n": Size(), "k": Size(32), "group_size": GroupSize()},
        drive="pure"),
    "ck_moe_prepack": Description(
        {"w_ptr": Pointer(16), "scales_ptr": Pointer("dtype"), "zeros_ptr": ZeroPoints(),
         "dtype": HALVES, "experts": Size(most=MOE_MAX_EXPERTS), "n": Size(16), "k": Size(32),
         "group_size": GroupSize(), "mode": INT4_MODE, "gate_up": Enum(2),
         "w_out_ptr": Pointer(16), "scales_out_ptr": Pointer(16),
         "zeros_out_ptr": ZeroPoints(align=16), "stream": Stream()},
        (gemm_bytes("experts", "n", "k", 2), multiple_of("k", 32), multiple_of("n", 16, is_gate_up),
         moe_prepack_size_rule)),
    "ck_moe_workspace_size": Description(
        {"params": MOE_PARAMS_SIZES, "bytes": HostInt(ctypes.c_size_t)}, launches=False),
    "ck_moe_forward": Description(
        {"params": MOE_PARAMS, "workspace_ptr": Disjoint(256, _moe_workspace_spans),
         "workspace_bytes": WorkspaceBytes(), "stream": Stream()},
        (moe_workspace,)),
    "ck_attention_forward": Description({"params": ATTENTION_PARAMS, "stream": Stream()}),
    "ck_kv_cache_append": Description({"params": KV_APPEND_PARAMS, "stream": Stream()}),
    "ck_attention_decode_workspace_size": Description(
        {"params": DECODE_PARAMS_SIZES, "bytes": HostInt(ctypes.c_size_t)}, launches=False),
    "ck_attention_decode": Description(
        {"params": DECODE_PARAMS, "workspace_ptr": DecodeWorkspacePointer(),
         "workspace_bytes": DecodeWorkspaceBytes(), "stream": Stream()},
        (decode_workspace,)),
}

# The answer of each size query that the fuzzer checks (test_fuzz_abi.py), from its params.
WORKSPACE_MODELS = {"ck_moe_workspace_size": moe_workspace_bytes,
                    "ck_attention_decode_workspace_size": decode_workspace_bytes}

VALIDATED = sorted(name for name, d in DESCRIPTIONS.items()
                   if d.drive == "validated" and d.launches)
# Validated entry points whose valid call answers on the host, CK_STATUS_SUCCESS with no launch
# (ck_moe_workspace_size: the byte count).
HOST_VALIDATED = sorted(name for name, d in DESCRIPTIONS.items()
                        if d.drive == "validated" and not d.launches)


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
    for arg, kind in arguments.items():   # each buffer at its own fake address (a struct's
        if isinstance(kind, Pointer) and args[arg]:   # get theirs from Struct.example)
            args[arg] = FAKE_DEVICE + next(pointers) * 0x100000
    for arg, kind in arguments.items():
        args[arg] = kind.settle(arg, args)
    return args


# How many arguments a drawn call takes from the whole-range strategies: none (a valid call, up
# to the cross-argument rules), one (the status and message are then predicted exactly), a few,
# or all of them.
CORRUPTION_COUNTS = (0, 1, 1, 1, 2, 2, 3, None)


_COUNTS = st.sampled_from(CORRUPTION_COUNTS)
_ORDERS = {name: st.permutations([key for arg, kind in d.arguments.items()
                                  for key in kind.corruption_keys(arg)])
           for name, d in DESCRIPTIONS.items()}


def draw_call(data, name):
    """Draws the arguments of a call of `name` (a DESCRIPTIONS export) from Hypothesis' `data`."""
    arguments = DESCRIPTIONS[name].arguments
    count = data.draw(_COUNTS, label="corrupted arguments")
    order = data.draw(_ORDERS[name], label="corruption order")
    changed = set(order if count is None else order[:count])
    args = {arg: kind.draw(data, arg, changed) for arg, kind in arguments.items()}
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
    """name(**args) in the declaration's order, each argument as its kind passes it
    (Kind.c_argument: a HostInt becomes a real integer or NULL, a Struct its ctypes structure
    or NULL). Returns (result, the integer written through a HostInt argument or None)."""
    values, out = [], None
    for param in ck.DECLARATIONS[name][1]:
        value, written = DESCRIPTIONS[name].arguments[param[0]].c_argument(args[param[0]])
        out = written if written is not None else out
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
