"""Robustness of the C ABI on the host: every export of cuda_kernels.h fuzzed with Hypothesis, the
size limits at and past 2^31 and 2^63, and the header's word on aliasing.

- Every export has a description in fuzz_support.DESCRIPTIONS (argument kinds over the wrapper's
  DECLARATIONS): a new export without one fails test_every_export_has_a_fuzz_description.
- Each export is called with arguments drawn over the whole range of their C types (fixed budget:
  the "ci" profile, 200 calls per export, derandomized; CK_FUZZ_PROFILE=long for more). The
  property of an entry point that returns ck_status_t: the status is one the header documents,
  the calling thread's message is non-empty and starts with the function's name, and
    * a call that breaks a rule of the header gets the status the header documents for one of
      the rules it breaks, and a message naming the argument; with one broken rule, exactly that
      status and the offending value; it makes no CUDA call (ck_last_cuda_error() stays 0), so
      it launches nothing;
    * a valid call passes validation and reaches its launch, which here, where no CUDA device is
      visible, answers CK_STATUS_NO_DEVICE (a GEMM past 2^31 - 1 output tiles excepted: a
      defect, see GRID_LIMITED);
  and no call writes through a host pointer or crashes the process (pointers into an
  inaccessible page would fault if validation touched them). The size queries
  (ck_int4_groups_per_row, ck_w4a16_prepacked_bytes/_groups, the MoE, block 4-bit and sparse
  ones) equal their formulas over the whole int64 range; ck_status_string, ck_device_count,
  ck_version, ck_last_error_message and ck_last_cuda_error keep their promises after any call.
- Products of sizes past 2^31 (accepted: 64-bit sizes) and past 2^63 in elements or bytes
  (rejected with CK_STATUS_INVALID_VALUE), one deterministic table per kind of export.
- The limits it found undocumented or mishandled (a grid past 2^31 - 1 blocks, per-row scales
  past 2^63 bytes, the prepacked layout's 2^40, perm's int32 columns) keep a test each.
- The quantized KV cache: ck_kv_cache_append's and the quantized decode's valid calls, the
  first version of ck_attention_decode_params_t, caches of 1-byte codes past what fp16 values
  could hold, and the unread scales of a CK_KV_DTYPE cache (never compared for overlaps).

Valid calls reach a launch on fake addresses, so these tests run only where no CUDA device is
visible: on a machine with one, test_fuzz_gpu.py runs this file again in a child process with
CUDA_VISIBLE_DEVICES="" (and these tests skip in the parent).
"""
import ctypes
import re

import pytest

pytest.importorskip("hypothesis", reason="the ABI fuzzer needs Hypothesis (requirements.txt)")
from hypothesis import assume, given, settings  # noqa: E402
from hypothesis import strategies as st         # noqa: E402

import cuda_wrapper as ck                       # noqa: E402
import fuzz_support as fz                       # noqa: E402
from conftest import has_gpu                    # noqa: E402
from cuda_wrapper import DType, Status          # noqa: E402
from fuzz_support import INT32_MAX, mentions    # noqa: E402

pytestmark = pytest.mark.skipif(
    has_gpu(), reason="a CUDA device is visible: valid calls would launch on fake addresses; "
                      "test_fuzz_gpu.py runs this file in a child process that sees no device")

HEADER_STATUSES = fz.header_statuses()
REJECTIONS = {Status.INVALID_VALUE, Status.MISALIGNED, Status.UNSUPPORTED}

# A valid GEMM call whose M x N output needs more than 2^31 - 1 tiles is refused by the launcher
# with CK_STATUS_CUDA_ERROR (cudaErrorInvalidConfiguration), before any CUDA call: a defect (the
# header promises any M, N >= 1; see test_gemm_past_int32_tiles_is_served_or_unsupported). Every
# kernel's tile holds at least one output, so it can only happen where M * N > 2^31 - 1.
GRID_LIMITED = ("ck_gemm_int8", "ck_gemm_int8_scaled", "ck_gemm_int4", "ck_gemm_int4_scaled",
                "ck_gemm_w4a16", "ck_gemm_w4a16_prepacked", "ck_gemm_block4_prepacked",
                "ck_gemm_sparse_w4a16", "ck_gemm_sparse_w4a16_prepacked", "ck_qkv_projection")

def gemm_mn(name, args):
    """The M and N of a GEMM's output: its m and n, or ck_qkv_projection's tokens and
    (num_heads_q + 2 num_heads_kv) head_dim (the stacked weight's rows)."""
    if name == "ck_qkv_projection":
        return args["params"]["tokens"], fz.qkv_rows(args["params"])
    return args["m"], args["n"]


@pytest.fixture(scope="module")
def lib():
    try:
        ck.load_library()
    except ck.LibraryNotFoundError as e:
        pytest.fail(str(e))
    return fz.bare_library()


def message_of(lib):
    message = lib.ck_last_error_message()
    assert message is not None, "ck_last_error_message() returned NULL"
    return message.decode("utf-8", "replace")


# Where no device is visible, the GEMMs choose their reference kernels: 64 x 64 output tiles.
REFERENCE_TILE = 64


def grid_refusal(name, args, status, cuda_error, message):
    """A valid GEMM whose reference grid would pass 2^31 - 1 blocks: CK_STATUS_UNSUPPORTED
    before any CUDA call (cuda_kernels.h: Sizes), with the message naming m and n."""
    if name not in GRID_LIMITED:
        return False
    m, n = gemm_mn(name, args)
    if -(-m // REFERENCE_TILE) * -(-n // REFERENCE_TILE) <= INT32_MAX:
        return False
    assert status == Status.UNSUPPORTED and cuda_error == 0, (Status(status).name, message)
    assert "m=%d, n=%d" % (m, n) in message, message
    return True


def check_validated_call(lib, name, args):
    """Calls an entry point that returns ck_status_t and checks the property (module doc)."""
    status, _ = fz.call(lib, name, args)
    message, cuda_error = message_of(lib), lib.ck_last_cuda_error()
    assert status in HEADER_STATUSES, f"{name} returned {status}, not a documented ck_status_t"
    assert lib.ck_status_string(status).decode() == HEADER_STATUSES[status]
    assert fz.host_buffer_intact(), f"{name} wrote into a host buffer"
    assert status != Status.SUCCESS, f"{name} succeeded where no CUDA device is visible"
    assert message.startswith(name + ": ") and len(message) > len(name) + 2, \
        f"{name}: status {status}, message {message!r}"
    broken = fz.violations(name, args)
    if broken:
        allowed = {v.status for v in broken}
        assert status in allowed, \
            f"{name} returned {Status(status).name} ({message!r}); the broken rules are {broken}"
        named = [n for v in broken if v.status == status for n in v.names]
        assert any(mentions(message, n) for n in named), \
            f"{name}: the message names none of {named}: {message!r}"
        if len(broken) == 1:
            for value in broken[0].values:
                assert mentions(message, value), f"{name}: {message!r} does not say {value}"
        assert cuda_error == 0, f"{name} made a CUDA call before rejecting: {message!r}"
        return status
    if grid_refusal(name, args, status, cuda_error, message):
        return status
    assert status == Status.NO_DEVICE, \
        f"{name}: a valid call must reach its launch (CK_STATUS_NO_DEVICE here), got " \
        f"{Status(status).name}: {message!r}"
    assert cuda_error != 0, f"{name}: CK_STATUS_NO_DEVICE without the cudaError_t behind it"
    return status


def run_fuzz(body):
    """Runs `body(data)` under Hypothesis (the loaded profile); returns how many calls ran."""
    calls = []

    @given(st.data())
    def fuzz(data):
        body(data)
        calls.append(1)

    fuzz()
    return len(calls)


def assert_budget(name, count):
    """The profile's budget was spent: at least max_examples calls."""
    print(f"{name}: {count} calls ({fz.PROFILE} profile)")
    assert count >= settings().max_examples, f"{name}: only {count} calls"


# ------------------------------------------------------------------------------------------------
# The description table covers the ABI
# ------------------------------------------------------------------------------------------------
DRIVES = {"validated", "pure", "status_string", "device_count", "state"}


def test_every_export_has_a_fuzz_description():
    """A new export needs a row in fuzz_support.DESCRIPTIONS: the kind of each argument (and,
    for an entry point, its cross-argument rules)."""
    described, declared = set(fz.DESCRIPTIONS), set(ck.DECLARATIONS)
    header = fz.header_exports()
    missing = sorted((declared | header) - described - fz.UNDESCRIBED)
    assert fz.UNDESCRIBED <= declared and not (fz.UNDESCRIBED & described)
    assert not missing, f"exports without a fuzz description in fuzz_support.DESCRIPTIONS: " \
                        f"{missing}"
    assert described - declared == set() and described - header == set(), \
        "descriptions of functions the ABI does not have"
    assert {d.drive for d in fz.DESCRIPTIONS.values()} <= DRIVES


def kind_fits(kind, arg, py_type):
    """A kind for an argument of ctypes type py_type (DECLARATIONS)."""
    if isinstance(kind, fz.Stream):
        return arg == "stream" and py_type is ctypes.c_void_p
    if isinstance(kind, fz.Pointer):
        return arg.endswith("_ptr") and py_type is ctypes.c_void_p
    if isinstance(kind, (fz.Struct, fz.HostInt)):   # a ck_moe_params_t*, an int* or size_t*
        return py_type is ctypes.POINTER(kind.ctype)
    if isinstance(kind, fz.WorkspaceBytes):
        return py_type is ctypes.c_size_t
    if isinstance(kind, (fz.Size, fz.GroupSize)):
        return py_type is ctypes.c_int64
    return isinstance(kind, (fz.Enum, fz.DTypeArg, fz.AnyInt)) and py_type is ctypes.c_int


@pytest.mark.parametrize("name", sorted(fz.DESCRIPTIONS))
def test_description_follows_the_declaration(name):
    restype, params = ck.DECLARATIONS[name]
    arguments = fz.DESCRIPTIONS[name].arguments
    assert list(arguments) == [param[0] for param in params], \
        f"{name}: the description's arguments are not the declaration's, in order"
    for param in params:
        assert kind_fits(arguments[param[0]], param[0], param[1]), \
            f"{name}: {param[0]} ({param[1].__name__}) cannot be a {type(arguments[param[0]])}"
    drive = fz.DESCRIPTIONS[name].drive
    if restype is ck._STATUS:
        assert drive in ("validated", "device_count"), name
    else:
        assert drive in ("pure", "status_string", "state"), name
    if drive == "pure":
        assert name in PURE_MODELS


@pytest.mark.parametrize("name", fz.VALIDATED)
def test_example_call_passes_validation(lib, name):
    """The table's valid call of each entry point breaks no rule, and the library agrees: it
    reaches the launch (CK_STATUS_NO_DEVICE where no device is visible)."""
    args = fz.example_call(name)
    assert fz.violations(name, args) == []
    assert check_validated_call(lib, name, args) == Status.NO_DEVICE


# ------------------------------------------------------------------------------------------------
# The fuzzers
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", fz.VALIDATED)
def test_fuzz_entry_point(lib, name):
    def body(data):
        args = fz.draw_call(data, name)
        check_validated_call(lib, name, args)
    assert_budget(name, run_fuzz(body))


PURE_MODELS = {
    "ck_int4_groups_per_row": fz.groups_per_row,
    "ck_w4a16_prepacked_bytes": fz.prepacked_bytes,
    "ck_w4a16_prepacked_groups": fz.prepacked_groups,
    "ck_moe_prepacked_bytes": fz.moe_prepacked_bytes,
    "ck_moe_prepacked_groups": fz.moe_prepacked_groups,
    "ck_block4_prepacked_scales_bytes": fz.block4_prepacked_scales_bytes,
    "ck_sparse_w4a16_prepacked_bytes": fz.sparse_prepacked_bytes,
    "ck_sparse_w4a16_prepacked_groups": fz.sparse_prepacked_groups,
}


@pytest.mark.parametrize("name", sorted(PURE_MODELS))
def test_fuzz_size_query(lib, name):
    """The size queries equal their formula (fuzz_support) for any int64 arguments, 0 where an
    argument is invalid or the count overflows."""
    def body(data):
        args = fz.draw_call(data, name)
        got, _ = fz.call(lib, name, args)
        assert got == PURE_MODELS[name](**args), f"{name}({args}) = {got}"
    assert_budget(name, run_fuzz(body))


STATUS_VALUES = fz.DESCRIPTIONS["ck_status_string"].arguments["status"].strategy(True)


def test_fuzz_status_string(lib):
    """A static, non-empty name for every int: the header's for its statuses."""
    def body(data):
        value = data.draw(STATUS_VALUES, label="status")
        name = lib.ck_status_string(value)
        assert name, f"ck_status_string({value}) is NULL or empty"
        known = set(HEADER_STATUSES.values())
        if value in HEADER_STATUSES:
            assert name.decode() == HEADER_STATUSES[value]
        else:
            assert name.decode() not in known, f"ck_status_string({value}) = {name!r}"
    assert_budget("ck_status_string", run_fuzz(body))


def check_device_count(lib, args):
    status, count = fz.call(lib, "ck_device_count", args)
    message = message_of(lib)
    if args["count"] is None:
        assert status == Status.INVALID_VALUE and mentions(message, "count"), message
        assert message.startswith("ck_device_count: ")
    else:
        assert status == Status.NO_DEVICE and count == 0, (status, count, message)
        assert message.startswith("ck_device_count: ")
    return status


def test_fuzz_device_count(lib):
    """NULL: CK_STATUS_INVALID_VALUE; a host int: CK_STATUS_NO_DEVICE and *count = 0 here. (Two
    inputs: Hypothesis stops once it has tried both.)"""
    count = run_fuzz(lambda data: check_device_count(lib, fz.draw_call(data, "ck_device_count")))
    assert count >= 2


def test_fuzz_error_state_after_any_call(lib):
    """ck_last_error_message, ck_last_cuda_error and ck_version after a random call of any entry
    point: the message is never NULL, empty exactly after a success and otherwise names the
    failed function; the CUDA error is 0 after a rejection and set after CK_STATUS_CUDA_ERROR;
    both stay as they are until the thread's next call; the version is the header's."""
    version = fz.header_version()
    exports = st.sampled_from(fz.VALIDATED + ["ck_device_count"])

    def body(data):
        name = data.draw(exports, label="export")
        args = fz.draw_call(data, name)
        status, _ = fz.call(lib, name, args)
        message, cuda_error = message_of(lib), lib.ck_last_cuda_error()
        if status == Status.SUCCESS:
            assert message == ""
        else:
            assert message.startswith(name + ": "), (name, status, message)
        if status in REJECTIONS:
            assert cuda_error == 0, (name, status, message)
        if status == Status.CUDA_ERROR:
            assert cuda_error != 0, (name, message)
        assert lib.ck_version() == version
        assert (message_of(lib), lib.ck_last_cuda_error()) == (message, cuda_error), \
            "reading the error state changed it"
    assert_budget("ck_last_error_message/ck_last_cuda_error/ck_version", run_fuzz(body))


# ------------------------------------------------------------------------------------------------
# Sizes past 2^31 and 2^63
# ------------------------------------------------------------------------------------------------
# cuda_kernels.h gives every size as int64_t and rejects "non-positive or overflowing" sizes with
# CK_STATUS_INVALID_VALUE; it states no other bound. The library's rule: the byte count of each
# [rows, cols] operand, and of each GEMM operand [M, K], [N, K], [M, N] counted at
# max(4, sizeof(out)) bytes per element, fits in int64_t. Products past 2^31 and 2^32 must be
# accepted (64-bit arithmetic): here such a call reaches its launch (CK_STATUS_NO_DEVICE).
ACCEPTED, REJECTED = "accepted", "rejected"
MATRIX_EXPORTS = {"ck_quantize_int8": "x_dtype", "ck_dequantize_int8": "out_dtype",
                  "ck_quantize_fp8": "x_dtype", "ck_dequantize_fp8": "out_dtype",
                  "ck_quantize_int4": "x_dtype", "ck_dequantize_int4": "out_dtype",
                  "ck_permute_columns": "dtype"}
GEMM_EXPORTS = {"ck_gemm_int8": None, "ck_gemm_int8_scaled": "out_dtype",
                "ck_gemm_fp8_scaled": "out_dtype", "ck_gemm_w4a8": "out_dtype",
                "ck_linear": "dtype",
                "ck_gemm_w4a16": "dtype", "ck_gemm_w4a16_prepacked": "dtype",
                "ck_gemm_sparse_w4a16": "dtype", "ck_gemm_sparse_w4a16_prepacked": "dtype",
                "ck_gemm_int4": None, "ck_gemm_int4_scaled": "out_dtype"}
WEIGHT_EXPORTS = ("ck_w4a16_prepack", "ck_import_gptq", "ck_import_awq")   # [N, K], no M
# The sparse weight calls without an M: their [N, K] counted at the dtype's size (2 bytes for
# the prepack), K a multiple of 128 in every shape (each group, the prepacked chunks).
SPARSE_WEIGHT_EXPORTS = {"ck_sparse_prune": "dtype", "ck_sparse_quantize_int4": "dtype",
                         "ck_sparse_dequantize_int4": "out_dtype",
                         "ck_sparse_w4a16_prepack": "dtype",
                         "ck_sparse_w4a16_prepack_dense": "dtype"}


def matrix_cases():
    for name, dtype_arg in MATRIX_EXPORTS.items():
        fp16, fp32 = {dtype_arg: DType.FP16}, {dtype_arg: DType.FP32}
        # ck_permute_columns takes at most 2^31 - 1 columns (int32 perm): its wide shapes are
        # the same products with rows and cols swapped.
        wide = (lambda r, c: dict(rows=c, cols=r)) if name == "ck_permute_columns" else \
            (lambda r, c: dict(rows=r, cols=c))
        yield name, "elements-past-2^31", dict(rows=65537, cols=32771), ACCEPTED
        yield name, "elements-past-2^32", dict(rows=2**21 + 1, cols=2**11 + 3), ACCEPTED
        yield name, "one-row-past-2^32", wide(1, 2**32 + 3), ACCEPTED
        # (2^31 - 1)(2^31 + 1) = 2^62 - 1 elements: 2^63 - 2 bytes of fp16 fit, of fp32 not.
        yield name, "fp16-bytes-just-fit", dict(wide(2**31 - 1, 2**31 + 1), **fp16), ACCEPTED
        yield name, "fp32-bytes-past-2^63", dict(rows=2**31 - 1, cols=2**31 + 1, **fp32), REJECTED
        yield name, "elements-past-2^63", dict(rows=3037000500, cols=3037000500), REJECTED
        yield name, "elements-wrap-2^64", dict(rows=2**32 + 1, cols=2**32 + 1), REJECTED
        yield name, "elements-2^64", dict(rows=2**62, cols=4), REJECTED
        yield name, "int64-max-rows", dict(rows=2**63 - 1, cols=2), REJECTED


def gemm_cases():
    for name, dtype_arg in GEMM_EXPORTS.items():
        fp32 = {dtype_arg: DType.FP32} if name in ("ck_linear", "ck_gemm_int8_scaled",
                                                   "ck_gemm_fp8_scaled", "ck_gemm_w4a8",
                                                   "ck_gemm_int4_scaled") else {}
        yield name, "mk-past-2^32", dict(m=2**20 + 1, k=2**12), ACCEPTED
        yield name, "nk-past-2^32", dict(n=2**21, k=2**12), ACCEPTED
        yield name, "mn-past-2^32", dict(m=2**16 + 1, n=2**16 + 256), ACCEPTED
        # (2^31 - 1) 2^30 elements: 2^63 - 2^32 bytes at 4 bytes each fit; 2^31 x 2^30 does not.
        yield name, "mk-bytes-just-fit", dict(m=2**31 - 1, k=2**30, **fp32), ACCEPTED
        yield name, "mk-bytes-past-2^63", dict(m=2**31, k=2**30, **fp32), REJECTED
        yield name, "nk-bytes-past-2^63", dict(n=2**31, k=2**30), REJECTED
        yield name, "mn-bytes-past-2^63", dict(m=2**31, n=2**30), REJECTED
        yield name, "mn-wraps-2^64", dict(m=2**32 + 256, n=2**32 + 256), REJECTED
        yield name, "nk-past-2^63", dict(n=3037000512, k=3037000512), REJECTED
    for name in WEIGHT_EXPORTS:
        yield name, "nk-past-2^32", dict(n=2**21, k=2**12), ACCEPTED
        yield name, "nk-bytes-just-fit", dict(n=2**31 - 8, k=2**30), ACCEPTED
        yield name, "nk-bytes-past-2^63", dict(n=2**31, k=2**30), REJECTED
        yield name, "nk-past-2^63", dict(n=3037000512, k=3037000512), REJECTED
        yield name, "nk-wraps-2^64", dict(n=2**32 + 256, k=2**32 + 256), REJECTED


def sparse_cases():
    for name, dtype_arg in SPARSE_WEIGHT_EXPORTS.items():
        fp16 = {dtype_arg: DType.FP16}
        yield name, "nk-past-2^32", dict(n=2**21, k=2**12), ACCEPTED
        yield name, "one-row-past-2^32", dict(n=1, k=2**32 + 128), ACCEPTED
        # (2^32 - 1) 2^30 values: 2^63 - 2^31 bytes of fp16 fit; 2^32 x 2^30 do not.
        yield name, "fp16-bytes-just-fit", dict(n=2**32 - 1, k=2**30, **fp16), ACCEPTED
        yield name, "fp16-bytes-past-2^63", dict(n=2**32, k=2**30, **fp16), REJECTED
        if name not in ("ck_sparse_w4a16_prepack", "ck_sparse_w4a16_prepack_dense"):
            # the prepacks take fp16 and bf16 only
            fp32 = {dtype_arg: DType.FP32}
            yield name, "fp32-bytes-past-2^63", dict(n=2**31, k=2**30, **fp32), REJECTED
        yield name, "nk-past-2^63", dict(n=3037000576, k=3037000576), REJECTED
        yield name, "nk-wraps-2^64", dict(n=2**32 + 256, k=2**32 + 256), REJECTED
    # The prepacked layout pads a row to 16 rows of K 3 / 8 bytes: one row's 6 K bytes overflow
    # past K = (2^63 - 1) / 6 (ck_sparse_w4a16_prepacked_bytes is then 0) where its dense 2 K
    # bytes still fit.
    most = (2**63 - 1) // 6 // 128 * 128
    yield "ck_sparse_w4a16_prepack", "prepacked-bytes-just-fit", dict(n=1, k=most), ACCEPTED
    yield "ck_sparse_w4a16_prepack", "prepacked-bytes-past-2^63", dict(n=1, k=most + 128), \
        REJECTED
    yield "ck_gemm_sparse_w4a16_prepacked", "prepacked-bytes-past-2^63", \
        dict(m=1, n=1, k=most + 128), REJECTED
    # The dense prepacked layout holds N and K up to 2^40 (beyond: a limit, not an overflow,
    # test_prepacked_layout_limit_is_documented_and_named).
    yield "ck_sparse_w4a16_prepack_dense", "layout-just-fits", dict(n=1, k=2**40), ACCEPTED


@pytest.mark.parametrize("name, case, changes, outcome", [
    pytest.param(*case, id=f"{case[0]}-{case[1]}")
    for case in [*matrix_cases(), *gemm_cases(), *sparse_cases()]])
def test_size_products(lib, name, case, changes, outcome):
    args = dict(fz.example_call(name), **changes)
    status = check_validated_call(lib, name, args)   # agrees with the model, which says:
    want = Status.NO_DEVICE if outcome == ACCEPTED else Status.INVALID_VALUE
    assert status == want, f"{name} {case}: {Status(status).name}: {message_of(lib)!r}"
    if outcome == REJECTED:
        sizes = [arg for arg in ("rows", "cols", "m", "n", "k") if arg in changes]
        message = message_of(lib)
        assert all(mentions(message, args[arg]) for arg in sizes), message
        assert "overflow" in message, message


# ------------------------------------------------------------------------------------------------
# Limits the fuzzer found undocumented or mishandled, now documented and kept
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", GRID_LIMITED)
def test_gemm_past_int32_tiles_is_served_or_unsupported(lib, name):
    """A valid GEMM whose output needs more than 2^31 - 1 thread blocks is refused as
    CK_STATUS_UNSUPPORTED naming the shape (cuda_kernels.h: Sizes), not as a CUDA failure."""
    args = fz.example_call(name)
    if name == "ck_qkv_projection":   # M = 2^40 tokens, N = (4096 + 2 x 2048) x 128 = 2^20;
        args["params"] = dict(    # q 2^60 bytes, k and v 2^59 each, x 2^53: spread apart
            args["params"], tokens=2**40, num_heads_q=4096, num_heads_kv=2048, head_dim=128,
            q=2**61, k=2**62, v=2**62 + 2**60)
    else:
        args = dict(args, m=2**40, n=2**20)   # 2^60 outputs, 2^62 bytes
    assert fz.violations(name, args) == []
    status, _ = fz.call(lib, name, args)
    message, cuda_error = message_of(lib), lib.ck_last_cuda_error()
    if status == Status.UNSUPPORTED:
        assert "m=1099511627776" in message and "n=1048576" in message, message
        assert cuda_error == 0, (message, cuda_error)
    else:
        assert status == Status.NO_DEVICE, f"{Status(status).name}: {message!r} ({cuda_error})"


@pytest.mark.parametrize("name, dtype_arg, granularity", [
    ("ck_quantize_int8", "x_dtype", ck.PER_ROW), ("ck_dequantize_int8", "out_dtype", ck.PER_ROW),
    ("ck_quantize_fp8", "x_dtype", ck.PER_ROW),
    ("ck_quantize_fp8", "x_dtype", ck.PER_BLOCK_1X128),
    ("ck_dequantize_fp8", "out_dtype", ck.PER_BLOCK_1X128)])
def test_per_row_scales_past_int64_bytes_are_rejected(lib, name, dtype_arg, granularity):
    """rows >= 2^61 with a 2-byte dtype fits the [rows, 1] operand but not its rows float32
    scales (per row, or per 1 x 128 block of a row): rejected before any launch."""
    args = dict(fz.example_call(name), rows=2**61, cols=1, granularity=granularity,
                **{dtype_arg: DType.FP16})
    status, _ = fz.call(lib, name, args)
    assert status == Status.INVALID_VALUE and mentions(message_of(lib), "rows"), \
        f"{Status(status).name}: {message_of(lib)!r}"
    assert [v.status for v in fz.violations(name, args)] == [Status.INVALID_VALUE]


@pytest.mark.parametrize("query", ["bytes", "ck_w4a16_prepack", "ck_sparse_w4a16_prepack_dense"])
def test_prepacked_layout_limit_is_documented_and_named(lib, query):
    """The prepacked layout holds N and K up to 2^40, as the header says: the size query gives
    0 beyond, and the prepack calls say which limit (not a false overflow)."""
    assert "up to 2^40" in " ".join(fz.header_comment_of("ck_w4a16_prepacked_bytes").split())
    n, k = 2**41, 128
    if query == "bytes":
        assert lib.ck_w4a16_prepacked_bytes(n, k) == 0
        assert lib.ck_w4a16_prepacked_bytes(2**40, k) == 2**40 * 128 // 2
        return
    args = dict(fz.example_call(query), n=n, k=k)
    status, _ = fz.call(lib, query, args)
    message = message_of(lib)
    assert status == Status.INVALID_VALUE, f"{Status(status).name}: {message!r}"
    assert "2^40" in message and "overflow" not in message, message


@pytest.mark.parametrize("mode, zeros", [(ck.INT4_ASYMMETRIC, 0),
                                         (ck.INT4_SYMMETRIC, fz.FAKE_DEVICE)],
                         ids=["asymmetric-null", "symmetric-given"])
def test_prepacked_zero_points_are_named_as_in_the_header(lib, mode, zeros):
    """ck_gemm_w4a16_prepacked's messages name its zero points zeros_prepacked."""
    args = dict(fz.example_call("ck_gemm_w4a16_prepacked"), mode=mode, zeros_ptr=zeros)
    status, _ = fz.call(lib, "ck_gemm_w4a16_prepacked", args)
    assert status == Status.INVALID_VALUE
    assert mentions(message_of(lib), "zeros_prepacked"), message_of(lib)


def test_permuted_columns_fit_int32_indices(lib):
    """perm's int32 entries address at most 2^31 - 1 columns: wider rows are refused (the
    kernel's grid of column blocks was truncated to 32 bits past 2^39 columns)."""
    args = dict(fz.example_call("ck_permute_columns"), rows=1, cols=2**31)
    status, _ = fz.call(lib, "ck_permute_columns", args)
    assert status == Status.UNSUPPORTED and mentions(message_of(lib), "cols"), message_of(lib)
    args = dict(args, cols=2**31 - 1)
    assert fz.violations("ck_permute_columns", args) == []
    status, _ = fz.call(lib, "ck_permute_columns", args)
    assert status == Status.NO_DEVICE, f"{Status(status).name}: {message_of(lib)!r}"


# ------------------------------------------------------------------------------------------------
# Aliasing: what the header says
# ------------------------------------------------------------------------------------------------
# Every entry point that returns ck_status_t writes device memory; the header says for each
# whether its outputs may overlap its inputs (and test_fuzz_gpu.py checks what it says).
@pytest.mark.parametrize("name", fz.VALIDATED)
def test_header_states_the_aliasing_rule(name):
    words = " ".join(fz.header_comment_of(name).split()).lower()
    assert "overlap" in words or "in place" in words, \
        f"the header's comment of {name} says nothing about overlapping buffers"


def test_header_comment_reader():
    """header_comment_of finds an export's own comment and its section's."""
    words = " ".join(fz.header_comment_of("ck_quantize_int8").split())
    assert "x and q must not overlap" in words and "INT8 quantization" in words
    words = " ".join(fz.header_comment_of("ck_import_awq").split())
    assert "no output overlapping an input" in words
    assert "Gathers columns" not in words


# ------------------------------------------------------------------------------------------------
# Mixture of experts: the parameter struct, the size query on the host, sizes, defects
# ------------------------------------------------------------------------------------------------
# ck_moe_workspace_size and ck_moe_forward take a const ck_moe_params_t* (fz.Struct), the first
# a size_t* for its answer (fz.HostInt), the second a size_t workspace_bytes (fz.WorkspaceBytes).
def check_host_validated_call(lib, name, args):
    """An entry point whose valid call answers on the host (ck_moe_workspace_size): a rejection
    keeps check_validated_call's property and leaves the answer 0; a valid call succeeds with
    an empty message and no CUDA call, and writes the model's byte count."""
    status, answer = fz.call(lib, name, args)
    message, cuda_error = message_of(lib), lib.ck_last_cuda_error()
    if fz.violations(name, args):
        assert check_validated_call(lib, name, args) == status   # the same call again
        assert answer in (None, 0), f"{name} wrote {answer} and returned {status}: {message!r}"
        return status
    assert status == Status.SUCCESS, f"{name}: {Status(status).name}: {message!r}"
    assert message == "" and cuda_error == 0, (message, cuda_error)
    assert fz.host_buffer_intact(), f"{name} wrote into a host buffer"
    assert answer == fz.WORKSPACE_MODELS[name](args["params"]), (args, answer)
    return status


@pytest.mark.parametrize("name", fz.HOST_VALIDATED)
def test_example_call_answers_on_the_host(lib, name):
    args = fz.example_call(name)
    assert fz.violations(name, args) == []
    assert check_host_validated_call(lib, name, args) == Status.SUCCESS


@pytest.mark.parametrize("name", fz.HOST_VALIDATED)
def test_fuzz_host_entry_point(lib, name):
    """As test_fuzz_entry_point, and reading the error state changes nothing."""
    version = fz.header_version()

    def body(data):
        check_host_validated_call(lib, name, fz.draw_call(data, name))
        state = (message_of(lib), lib.ck_last_cuda_error())
        assert lib.ck_version() == version
        assert (message_of(lib), lib.ck_last_cuda_error()) == state, \
            "reading the error state changed it"
    assert_budget(name, run_fuzz(body))


def moe_call(name, **changes):
    """The table's valid call of a MoE entry point with these arguments changed, a
    ck_moe_params_t's fields by their names; workspace_bytes follows the params (the model's
    ck_moe_workspace_size, 0 where it rejects them)."""
    args = fz.example_call(name)
    if "params" not in args:
        return dict(args, **changes)
    args["params"] = dict(args["params"], **changes)
    if "workspace_bytes" in args:
        args["workspace_bytes"] = fz.moe_workspace_bytes(args["params"]) or 0
    return args


def check_moe_call(lib, name, args):
    if name in fz.HOST_VALIDATED:
        return check_host_validated_call(lib, name, args)
    return check_validated_call(lib, name, args)


# Sizes past 2^31 and 2^63 (as test_size_products): the layer bounds T * k (2^40 pairs and 65535
# blocks of 16 rows), E, H and I on its own, so that every byte count stays far below 2^63;
# counts past 2^31 and 2^32 are accepted, the bounds refuse what would overflow.
ROW_SLOTS = "row slots"   # past 65535 blocks of 16 rows: CK_STATUS_UNSUPPORTED
LAYER = ("ck_moe_forward", "ck_moe_workspace_size")


def moe_size_cases():
    for name in LAYER:
        # x and out 2^16 x 2^16 x 2 = 2^33 bytes; the activations [rows, I] of the workspace 2^34.
        yield name, "x-bytes-past-2^32", dict(tokens=2**16, hidden=2**16, top_k=1), ACCEPTED
        yield name, "workspace-past-2^32", dict(tokens=2**15, intermediate=2**17), ACCEPTED
        yield name, "features-at-2^24", dict(tokens=1, hidden=2**24, intermediate=2**24), \
            ACCEPTED
        # 2^35 pairs of 2I = 2^25 values at 8 bytes each: 2^63.
        yield name, "pair-bytes-past-2^63", dict(tokens=2**35, top_k=1, experts=1,
                                                 intermediate=2**24), REJECTED
        yield name, "int64-max-tokens", dict(tokens=2**63 - 1), REJECTED
        # T * k + min(E, T * k) * 15 row slots: 1048560 = 65535 blocks of 16, the most.
        yield name, "row-slots-at-limit", dict(tokens=1048545, top_k=1, experts=1), ACCEPTED
        yield name, "row-slots-past-limit", dict(tokens=1048561, top_k=1, experts=1), ROW_SLOTS
    route = "ck_moe_route"
    yield route, "logits-past-2^32", dict(tokens=2**22 + 1, experts=1024, top_k=32), ACCEPTED
    yield route, "pairs-past-2^32", dict(tokens=2**33 // 32, experts=64, top_k=32), ACCEPTED
    # More than 2^31 - 1 blocks of 4 tokens: launched in parts.
    yield route, "tokens-past-grid", dict(tokens=2**33 + 5, experts=64, top_k=1), ACCEPTED
    yield route, "int64-max-tokens", dict(tokens=2**63 - 1), REJECTED
    prepack = "ck_moe_prepack"
    yield prepack, "weights-past-2^32", dict(experts=1024, n=2**16, k=2**16), ACCEPTED
    yield prepack, "nk-past-2^32", dict(n=2**21, k=2**12), ACCEPTED
    # E x (2^40 x 2^20 / 2) bytes: 15 x 2^59 fits in int64_t, 16 x 2^59 = 2^63 does not.
    yield prepack, "experts-bytes-just-fit", dict(experts=15, n=2**40, k=2**20), ACCEPTED
    yield prepack, "experts-bytes-past-2^63", dict(experts=16, n=2**40, k=2**20), REJECTED
    yield prepack, "nk-bytes-past-2^63", dict(n=2**31, k=2**30), REJECTED
    yield prepack, "nk-wraps-2^64", dict(n=2**32 + 256, k=2**32 + 256), REJECTED


@pytest.mark.parametrize("name, case, changes, outcome", [
    pytest.param(*case, id=f"{case[0]}-{case[1]}") for case in moe_size_cases()])
def test_moe_size_products(lib, name, case, changes, outcome):
    args = moe_call(name, **changes)
    status = check_moe_call(lib, name, args)   # agrees with the model, which says:
    accepted = Status.SUCCESS if name in fz.HOST_VALIDATED else Status.NO_DEVICE
    want = {ACCEPTED: accepted, REJECTED: Status.INVALID_VALUE,
            ROW_SLOTS: Status.UNSUPPORTED}[outcome]
    assert status == want, f"{name} {case}: {Status(status).name}: {message_of(lib)!r}"


def test_moe_prepacked_sizes_agree_with_the_prepack(lib):
    """ck_moe_prepack accepts the sizes whose ck_moe_prepacked_bytes and _groups are not 0."""
    for experts, n, k in ((15, 2**40, 2**20), (16, 2**40, 2**20), (1024, 2**16, 2**16)):
        args = moe_call("ck_moe_prepack", experts=experts, n=n, k=k)
        sized = lib.ck_moe_prepacked_bytes(experts, n, k) and \
            lib.ck_moe_prepacked_groups(experts, n, k, args["group_size"])
        status, _ = fz.call(lib, "ck_moe_prepack", args)
        assert (status == Status.NO_DEVICE) == bool(sized), (experts, n, k, message_of(lib))


# Limits the fuzzer found undocumented or mishandled, now documented and kept
def test_moe_route_past_int32_blocks_is_served_or_unsupported(lib):
    """More tokens than 2^31 - 1 blocks of 4 hold: launched in parts, not refused."""
    args = moe_call("ck_moe_route", tokens=2**33, experts=64, top_k=1)   # 2^31 blocks
    assert fz.violations("ck_moe_route", args) == []
    status, _ = fz.call(lib, "ck_moe_route", args)
    message, cuda_error = message_of(lib), lib.ck_last_cuda_error()
    if status == Status.UNSUPPORTED:
        assert mentions(message, "tokens") and cuda_error == 0, (message, cuda_error)
    else:
        assert status == Status.NO_DEVICE, f"{Status(status).name}: {message!r} ({cuda_error})"


@pytest.mark.parametrize("name", ("ck_moe_route",) + LAYER)
def test_moe_pair_limit_is_documented(lib, name):
    """tokens * top_k <= 2^40, as the header says: refused as a limit, not as an overflow."""
    args = moe_call(name, tokens=2**40 + 1, experts=1, top_k=1)
    status, _ = fz.call(lib, name, args)
    message = message_of(lib)
    words = " ".join((fz.header_comment_of(name) + fz.header_comment_of("ck_moe_forward")).split())
    if "2^40" in words:   # a documented limit, refused as such
        assert status == Status.INVALID_VALUE and "overflow" not in message, message
    else:   # no limit: valid (the route), or past the layer's row slots
        assert status != Status.INVALID_VALUE, message


def test_moe_prepack_overflow_names_experts(lib):
    """ck_moe_prepack's size messages call its first size experts."""
    args = moe_call("ck_moe_prepack", experts=1024, n=2**52, k=32)   # E x N x 4 bytes: 2^64
    status, _ = fz.call(lib, "ck_moe_prepack", args)
    message = message_of(lib)
    assert status == Status.INVALID_VALUE, message
    assert mentions(message, "experts") and not mentions(message, "m"), message


# ------------------------------------------------------------------------------------------------
# Fused Q/K/V projection: sizes past 2^31 and 2^63, the layer's limits
# ------------------------------------------------------------------------------------------------
# Both entry points check the layer (ck_qkv_params_t's [prepack] fields): N = (Hq + 2 Hkv) D rows
# up to the prepacked layout's 2^40, the [N, H] weight's bytes (4 per value) within int64_t; the
# projection also [T, H] and [T, N], and the cos/sin table [max_position, R] float32.
QKV = ("ck_qkv_prepack", "ck_qkv_projection")
UNSERVED = "unserved"   # CK_STATUS_UNSUPPORTED: a shape the kernels do not serve
ROWS_2_40 = dict(num_heads_q=2**19, num_heads_kv=2**18, head_dim=2**20, rotary_dim=128)


def qkv_call(name, **fields):
    """The table's valid call of a Q/K/V entry point with these fields of its params changed."""
    args = fz.example_call(name)
    args["params"] = dict(args["params"], **fields)
    return args


def qkv_size_cases():
    for name in QKV:
        yield name, "heads-at-2^20", dict(num_heads_q=2**20, num_heads_kv=2**20), ACCEPTED
        yield name, "head_dim-at-2^20", dict(num_heads_q=8, num_heads_kv=8, head_dim=2**20,
                                              tokens=1), ACCEPTED
        yield name, "rows-past-2^40", dict(ROWS_2_40, num_heads_kv=2**18 + 1), REJECTED
        # 2^40 rows x 2^21 values x 4 bytes = 2^63; 32 values fewer fit.
        yield name, "weight-bytes-past-2^63", dict(ROWS_2_40, hidden=2**21), REJECTED
        yield name, "nf4-hidden-past-its-block", dict(format=ck.WEIGHT4_NF4, group_size=128,
                                                      hidden=4096 + 64), UNSERVED
    yield "ck_qkv_prepack", "rows-at-2^40", ROWS_2_40, ACCEPTED
    yield "ck_qkv_prepack", "weight-bytes-just-fit", dict(ROWS_2_40, hidden=2**21 - 32), ACCEPTED
    projection = "ck_qkv_projection"
    yield projection, "x-bytes-past-2^32", dict(tokens=2**20, hidden=2**13), ACCEPTED
    yield projection, "tokens-bytes-past-2^63", dict(tokens=2**49, hidden=2**12), REJECTED
    yield projection, "table-bytes-just-fit", dict(max_position=2**54 - 1), ACCEPTED
    yield projection, "table-bytes-past-2^63", dict(max_position=2**54), REJECTED   # x 128 x 4


@pytest.mark.parametrize("name, case, changes, outcome", [
    pytest.param(*case, id=f"{case[0]}-{case[1]}") for case in qkv_size_cases()])
def test_qkv_size_products(lib, name, case, changes, outcome):
    args = qkv_call(name, **changes)
    status = check_validated_call(lib, name, args)   # agrees with the model, which says:
    want = {ACCEPTED: Status.NO_DEVICE, REJECTED: Status.INVALID_VALUE,
            UNSERVED: Status.UNSUPPORTED}[outcome]
    assert status == want, f"{name} {case}: {Status(status).name}: {message_of(lib)!r}"
    if outcome != ACCEPTED and not {"tokens", "max_position"} & set(changes):
        message = message_of(lib)   # the layer's: named by its fields, not the prepack's n, k
        assert not mentions(message, "n") and not mentions(message, "k"), message


def test_qkv_head_limit_is_documented():
    words = " ".join(fz.header_comment_of("ck_qkv_projection").split())
    fields = re.search(r"typedef struct ck_qkv_params \{.*?\} ck_qkv_params_t;",
                       fz.header_text(strip_comments=False), flags=re.S).group(0)
    assert "2^20" in words + " ".join(fields.split())


# ------------------------------------------------------------------------------------------------
# Quantized KV cache: ck_kv_cache_append's valid calls, the decode's formats and struct versions,
# byte counts of 1-byte codes
# ------------------------------------------------------------------------------------------------
def struct_call(name, **fields):
    """The table's valid call of an entry point that takes a params struct, with these fields
    changed (pointers as the fields' own names)."""
    args = fz.example_call(name)
    args["params"] = dict(args["params"], **fields)
    return args


PER_HEAD_INT8 = dict(kv_format=ck.KV_INT8, kv_scaling=ck.KV_SCALE_PER_HEAD)
PER_HEAD_FP8 = dict(kv_format=ck.KV_FP8_E4M3, kv_scaling=ck.KV_SCALE_PER_HEAD)
PER_TOKEN_INT8 = dict(kv_format=ck.KV_INT8, kv_scaling=ck.KV_SCALE_PER_TOKEN)
PER_TOKEN_FP8 = dict(kv_format=ck.KV_FP8_E4M3, kv_scaling=ck.KV_SCALE_PER_TOKEN)
UNALIGNED = fz.FAKE_DEVICE + 3   # a scale that is not read may be any value


@pytest.mark.parametrize("case, fields", [
    ("dtype-fp16", dict()),
    ("dtype-bf16", dict(dtype=DType.BF16)),
    ("dtype-ignores-the-scaling-and-scales", dict(kv_scaling=-7, k_scale=0, v_scale=UNALIGNED)),
    ("fp8-per-head", PER_HEAD_FP8), ("int8-per-head-bf16", dict(PER_HEAD_INT8, dtype=DType.BF16)),
    ("fp8-per-token-d64", dict(PER_TOKEN_FP8, head_dim=64)), ("int8-per-token", PER_TOKEN_INT8),
    ("one-token-one-slot", dict(PER_TOKEN_INT8, num_tokens=1, num_slots=1, num_heads_kv=1)),
    ("most-heads", dict(PER_TOKEN_FP8, num_heads_kv=65535)),
    ("most-tokens", dict(PER_HEAD_INT8, num_tokens=2**31 - 1)),
    ("scales-4-byte-aligned", dict(PER_TOKEN_INT8, k_scale=fz.FAKE_DEVICE + 2**56 + 4,
                                   v_scale=fz.FAKE_DEVICE + 2**57 + 12)),
    ("slot_mapping-8-byte-aligned", dict(slot_mapping=fz.FAKE_DEVICE + 2**55 + 8))],
    ids=lambda value: value if isinstance(value, str) else "")
def test_kv_cache_append_valid_calls_reach_the_gpu_check(lib, case, fields):
    """Valid calls pass every check of ck_kv_cache_append and stop at the device's (none is
    visible here): the model agrees that they break no rule."""
    args = struct_call("ck_kv_cache_append", **fields)
    assert fz.violations("ck_kv_cache_append", args) == [], case
    assert check_validated_call(lib, "ck_kv_cache_append", args) == Status.NO_DEVICE, case


@pytest.mark.parametrize("fields", [
    PER_HEAD_INT8, PER_HEAD_FP8, PER_TOKEN_INT8, PER_TOKEN_FP8,
    dict(PER_TOKEN_FP8, block_table=0, head_dim=64),
    dict(struct_size=fz.DECODE_PARAMS_V1_SIZE),
    dict(struct_size=fz.DECODE_PARAMS_V1_SIZE, kv_format=99, kv_scaling=-1, k_scale=UNALIGNED)],
    ids=["int8-per-head", "fp8-per-head", "int8-per-token", "fp8-per-token",
         "fp8-per-token-contiguous-d64", "first-version", "first-version-bytes-past-it"])
def test_attention_decode_valid_formats_reach_the_gpu_check(lib, fields):
    """Quantized caches, and the first version of the struct (whose appended fields are not
    read), pass every check of ck_attention_decode and its size query."""
    args = struct_call("ck_attention_decode", **fields)
    assert fz.violations("ck_attention_decode", args) == []
    assert check_validated_call(lib, "ck_attention_decode", args) == Status.NO_DEVICE
    query = dict(params=args["params"], bytes="int")
    assert check_host_validated_call(lib, "ck_attention_decode_workspace_size",
                                     query) == Status.SUCCESS


@pytest.mark.parametrize("name", ["ck_kv_cache_append", "ck_attention_decode"])
def test_unread_scales_are_not_compared(lib, name):
    """For CK_KV_DTYPE the scales are not read (cuda_kernels.h): no value of theirs fails a
    call, one that points inside the cache or the workspace included."""
    args = fz.example_call(name)
    params = args["params"]
    assert params["kv_format"] == ck.KV_DTYPE
    inside = 256 + (params["k_cache"] if name == "ck_kv_cache_append" else args["workspace_ptr"])
    args = dict(args, params=dict(params, k_scale=inside))
    assert fz.violations(name, args) == []
    status, _ = fz.call(lib, name, args)
    assert status == Status.NO_DEVICE, f"{Status(status).name}: {message_of(lib)!r}"


# Byte counts of a quantized cache: 1 per element, so that a cache whose fp16 values would pass
# 2^63 bytes can hold codes. The buffers of these calls are placed apart by hand: the caches
# take most of the address space.
APPEND_HUGE = dict(k=fz.FAKE_DEVICE, v=fz.FAKE_DEVICE + 2**20, slot_mapping=fz.FAKE_DEVICE + 2**21,
                   k_cache=2**61, v_cache=2**62 + 2**61, k_scale=2**63 + 2**62,
                   v_scale=2**63 + 2**62 + 2**60, num_tokens=16, num_heads_kv=8, head_dim=128)
# Decode: 1024 sequences of 2^30 keys of 65535 heads of 128 codes: 2^63 - 2^47 bytes a cache;
# one split, which needs no workspace.
DECODE_HUGE = dict(block_table=0, batch=1024, seqlen_q=1, num_heads_q=65535, num_heads_kv=65535,
                   head_dim=128, max_seqlen_k=2**30, k_cache=2**47, v_cache=2**63,
                   q=2**40, out=2**41, lse=2**42, seqlens_k=2**43, k_scale=2**43 + 2**20,
                   v_scale=2**43 + 2**21, num_splits=1)


def quantized_size_cases():
    append = "ck_kv_cache_append"
    # 2^52 slots x 8 x 128: 2^62 bytes of codes (2^57 of per-token scales); 2^63 of fp16.
    yield append, "codes-2^62-bytes", dict(APPEND_HUGE, **PER_TOKEN_INT8, num_slots=2**52), \
        ACCEPTED
    yield append, "fp16-2^63-bytes", dict(APPEND_HUGE, num_slots=2**52), REJECTED
    yield append, "codes-2^63-bytes", dict(APPEND_HUGE, **PER_HEAD_FP8, num_slots=2**53), \
        REJECTED
    for name in ("ck_attention_decode", "ck_attention_decode_workspace_size"):
        yield name, "codes-just-fit", dict(DECODE_HUGE, **PER_HEAD_INT8), ACCEPTED
        yield name, "fp16-past-2^63", DECODE_HUGE, REJECTED
        yield name, "codes-past-2^63", dict(DECODE_HUGE, **PER_HEAD_FP8, batch=1025), REJECTED


@pytest.mark.parametrize("name, case, changes, outcome", [
    pytest.param(*case, id=f"{case[0]}-{case[1]}") for case in quantized_size_cases()])
def test_quantized_cache_size_products(lib, name, case, changes, outcome):
    args = struct_call(name, **changes)
    if name in fz.HOST_VALIDATED:
        status = check_host_validated_call(lib, name, args)   # agrees with the model
        accepted = Status.SUCCESS
    else:
        status = check_validated_call(lib, name, args)
        accepted = Status.NO_DEVICE
    want = accepted if outcome == ACCEPTED else Status.INVALID_VALUE
    assert status == want, f"{name} {case}: {Status(status).name}: {message_of(lib)!r}"
    if outcome == REJECTED:
        sizes = ("num_slots",) if name == "ck_kv_cache_append" else ("batch", "max_seqlen_k")
        assert all(mentions(message_of(lib), args["params"][size]) for size in sizes), \
            message_of(lib)
