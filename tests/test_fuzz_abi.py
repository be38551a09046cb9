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
  (ck_int4_groups_per_row, ck_w4a16_prepacked_bytes/_groups) equal their formulas over the whole
  int64 range; ck_status_string, ck_device_count, ck_version, ck_last_error_message and
  ck_last_cuda_error keep their promises after any call.
- Products of sizes past 2^31 (accepted: 64-bit sizes) and past 2^63 in elements or bytes
  (rejected with CK_STATUS_INVALID_VALUE), one deterministic table per kind of export.
- Defects found are xfail(strict=True) tests that say what is wrong.

Valid calls reach a launch on fake addresses, so these tests run only where no CUDA device is
visible: on a machine with one, test_fuzz_gpu.py runs this file again in a child process with
CUDA_VISIBLE_DEVICES="" (and these tests skip in the parent).
"""
import ctypes

import pytest

pytest.importorskip("hypothesis", reason="the ABI fuzzer needs Hypothesis (requirements.txt)")
from hypothesis import given, settings          # noqa: E402
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
CUDA_ERROR_INVALID_CONFIGURATION = 9   # cudaErrorInvalidConfiguration

# A valid GEMM call whose M x N output needs more than 2^31 - 1 tiles is refused by the launcher
# with CK_STATUS_CUDA_ERROR (cudaErrorInvalidConfiguration), before any CUDA call: a defect (the
# header promises any M, N >= 1; see test_gemm_past_int32_tiles_is_served_or_unsupported). Every
# kernel's tile holds at least one output, so it can only happen where M * N > 2^31 - 1.
GRID_LIMITED = ("ck_gemm_int8", "ck_gemm_int8_scaled", "ck_gemm_int4", "ck_gemm_int4_scaled",
                "ck_gemm_w4a16", "ck_gemm_w4a16_prepacked")


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


def known_grid_refusal(name, args, status, cuda_error):
    return (name in GRID_LIMITED and args["m"] * args["n"] > INT32_MAX
            and status == Status.CUDA_ERROR and cuda_error == CUDA_ERROR_INVALID_CONFIGURATION)


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
    if known_grid_refusal(name, args, status, cuda_error):
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
    if isinstance(kind, fz.HostInt):
        return py_type is ctypes.POINTER(ctypes.c_int)
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
    count = run_fuzz(lambda data: check_validated_call(lib, name, fz.draw_call(data, name)))
    assert_budget(name, count)


PURE_MODELS = {
    "ck_int4_groups_per_row": fz.groups_per_row,
    "ck_w4a16_prepacked_bytes": fz.prepacked_bytes,
    "ck_w4a16_prepacked_groups": fz.prepacked_groups,
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
                  "ck_quantize_int4": "x_dtype", "ck_dequantize_int4": "out_dtype",
                  "ck_permute_columns": "dtype"}
GEMM_EXPORTS = {"ck_gemm_int8": None, "ck_gemm_int8_scaled": "out_dtype", "ck_linear": "dtype",
                "ck_gemm_w4a16": "dtype", "ck_gemm_w4a16_prepacked": "dtype",
                "ck_gemm_int4": None, "ck_gemm_int4_scaled": "out_dtype"}
WEIGHT_EXPORTS = ("ck_w4a16_prepack", "ck_import_gptq", "ck_import_awq")   # [N, K], no M


def matrix_cases():
    for name, dtype_arg in MATRIX_EXPORTS.items():
        fp16, fp32 = {dtype_arg: DType.FP16}, {dtype_arg: DType.FP32}
        yield name, "elements-past-2^31", dict(rows=65537, cols=32771), ACCEPTED
        yield name, "elements-past-2^32", dict(rows=2**21 + 1, cols=2**11 + 3), ACCEPTED
        yield name, "one-row-past-2^32", dict(rows=1, cols=2**32 + 3), ACCEPTED
        # (2^31 - 1)(2^31 + 1) = 2^62 - 1 elements: 2^63 - 2 bytes of fp16 fit, of fp32 not.
        yield name, "fp16-bytes-just-fit", dict(rows=2**31 - 1, cols=2**31 + 1, **fp16), ACCEPTED
        yield name, "fp32-bytes-past-2^63", dict(rows=2**31 - 1, cols=2**31 + 1, **fp32), REJECTED
        yield name, "elements-past-2^63", dict(rows=3037000500, cols=3037000500), REJECTED
        yield name, "elements-wrap-2^64", dict(rows=2**32 + 1, cols=2**32 + 1), REJECTED
        yield name, "elements-2^64", dict(rows=2**62, cols=4), REJECTED
        yield name, "int64-max-rows", dict(rows=2**63 - 1, cols=2), REJECTED


def gemm_cases():
    for name, dtype_arg in GEMM_EXPORTS.items():
        fp32 = {dtype_arg: DType.FP32} if name in ("ck_linear", "ck_gemm_int8_scaled",
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


@pytest.mark.parametrize("name, case, changes, outcome", [
    pytest.param(*case, id=f"{case[0]}-{case[1]}") for case in [*matrix_cases(), *gemm_cases()]])
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
# Defects (xfail, strict: each fails until the library or the header is fixed)
# ------------------------------------------------------------------------------------------------
@pytest.mark.xfail(strict=True, reason=(
    "a valid GEMM whose M x N output needs more than 2^31 - 1 tiles is refused by the launcher "
    "(grid_fits) with CK_STATUS_CUDA_ERROR and ck_last_cuda_error() = "
    "cudaErrorInvalidConfiguration, 'kernel launch failed', although no CUDA call failed and "
    "even where no device is visible; the header promises any M, N >= 1 and states no limit "
    "(expected: served, or CK_STATUS_UNSUPPORTED naming m and n, with the limit documented)"))
@pytest.mark.parametrize("name", GRID_LIMITED)
def test_gemm_past_int32_tiles_is_served_or_unsupported(lib, name):
    args = dict(fz.example_call(name), m=2**40, n=2**20)   # 2^60 outputs, 2^62 bytes
    assert fz.violations(name, args) == []
    status, _ = fz.call(lib, name, args)
    message, cuda_error = message_of(lib), lib.ck_last_cuda_error()
    if status == Status.UNSUPPORTED:
        assert mentions(message, "m") or mentions(message, "n"), message
        assert cuda_error == 0
    else:
        assert status == Status.NO_DEVICE, f"{Status(status).name}: {message!r} ({cuda_error})"


@pytest.mark.xfail(strict=True, reason=(
    "rows >= 2^61 with a 2-byte dtype and CK_PER_ROW: the rows float32 scales take rows * 4 "
    ">= 2^63 bytes, past int64_t, yet the call passes validation (Check::matrix counts only "
    "the [rows, cols] operand's bytes)"))
@pytest.mark.parametrize("name, dtype_arg", [("ck_quantize_int8", "x_dtype"),
                                             ("ck_dequantize_int8", "out_dtype")])
def test_per_row_scales_past_int64_bytes_are_rejected(lib, name, dtype_arg):
    args = dict(fz.example_call(name), rows=2**61, cols=1, granularity=ck.PER_ROW,
                **{dtype_arg: DType.FP16})
    status, _ = fz.call(lib, name, args)
    assert status == Status.INVALID_VALUE and mentions(message_of(lib), "rows"), \
        f"{Status(status).name}: {message_of(lib)!r}"


@pytest.mark.xfail(strict=True, reason=(
    "ck_w4a16_prepacked_bytes returns 0 for N or K above 2^40 and ck_w4a16_prepack then "
    "rejects the call saying 'n=.., k=.. overflow a 64-bit byte count', which is false (N = 2^41, "
    "K = 32 takes 2^47 bytes); the header states no such limit"))
@pytest.mark.parametrize("query", ["bytes", "prepack"])
def test_prepacked_layout_has_no_undocumented_limit(lib, query):
    n, k = 2**41, 32
    if query == "bytes":
        assert lib.ck_w4a16_prepacked_bytes(n, k) == n * 128 // 2
        return
    args = dict(fz.example_call("ck_w4a16_prepack"), n=n, k=k)
    status, _ = fz.call(lib, "ck_w4a16_prepack", args)
    assert status == Status.NO_DEVICE, f"{Status(status).name}: {message_of(lib)!r}"


@pytest.mark.xfail(strict=True, reason=(
    "ck_gemm_w4a16_prepacked calls its zeros_prepacked argument 'zeros' in the messages about a "
    "missing (CK_INT4_ASYMMETRIC) or superfluous (CK_INT4_SYMMETRIC) one: 'zeros is NULL', "
    "'zeros must be NULL for CK_INT4_SYMMETRIC' (its misalignment message says zeros_prepacked, "
    "the header's name)"))
@pytest.mark.parametrize("mode, zeros", [(ck.INT4_ASYMMETRIC, 0),
                                         (ck.INT4_SYMMETRIC, fz.FAKE_DEVICE)],
                         ids=["asymmetric-null", "symmetric-given"])
def test_prepacked_zero_points_are_named_as_in_the_header(lib, mode, zeros):
    args = dict(fz.example_call("ck_gemm_w4a16_prepacked"), mode=mode, zeros_ptr=zeros)
    status, _ = fz.call(lib, "ck_gemm_w4a16_prepacked", args)
    assert status == Status.INVALID_VALUE
    assert mentions(message_of(lib), "zeros_prepacked"), message_of(lib)


# ------------------------------------------------------------------------------------------------
# Aliasing: what the header says
# ------------------------------------------------------------------------------------------------
# Every entry point that returns ck_status_t writes device memory; the header should say for
# each whether its outputs may overlap its inputs (and test_fuzz_gpu.py checks what it says).
# These say nothing (neither in their section's opening comment nor in their own):
ALIASING_UNSTATED = ("ck_dequantize_int8", "ck_quantize_int4", "ck_dequantize_int4",
                     "ck_gemm_w4a16_prepacked", "ck_gemm_int4", "ck_gemm_int4_scaled",
                     "ck_linear")


def aliasing_params():
    for name in fz.VALIDATED:
        marks = [pytest.mark.xfail(strict=True, reason=(
            f"cuda_kernels.h does not say whether {name}'s outputs may overlap its inputs "
            "(in place) or must not"))] if name in ALIASING_UNSTATED else []
        yield pytest.param(name, marks=marks, id=name)


@pytest.mark.parametrize("name", list(aliasing_params()))
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
