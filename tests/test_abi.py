"""The C ABI through ctypes, on the host alone (no GPU needed, none touched).

- the wrapper's table of declarations matches cuda_kernels.h, and every export loads;
- versions, status names and enum values agree between the header, the library and the wrapper;
- every entry point rejects every kind of bad argument with the documented status and a message
  that names the offending argument (validation runs before any CUDA call, so fake device
  addresses are safe here: nothing is ever launched);
- the GEMM rules (K and N multiples, alignment, NULL bias allowed) and the kernel override
  CK_GEMM_INT8_KERNEL: unknown names are rejected; valid-but-unusual arguments pass validation
  (proved by planting the override's error, which the library reports only after validation);
- error messages are per thread;
- ck_int4_groups_per_row;
- the wrapper's own host-side checks (contiguity, shapes) and its loading errors.

Each bad-argument case changes one argument of a call that would otherwise be valid.
"""
import ctypes
import os
import re
import subprocess
import sys
import threading

import numpy as np
import pytest

import cuda_wrapper as ck
from cuda_wrapper import CKError, DType, Status

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HEADER = os.path.join(REPO_ROOT, "cuda_kernels.h")


# ------------------------------------------------------------------------------------------------
# The header, parsed
# ------------------------------------------------------------------------------------------------
def header_text():
    text = open(HEADER).read()
    text = re.sub(r"/\*.*?\*/", " ", text, flags=re.S)
    return re.sub(r"//[^\n]*", " ", text)


def header_declarations():
    """{name: (return type, [parameter types])} of every CK_API function."""
    decls = {}
    for ret, name, params in re.findall(r"\bCK_API\s+([^;(]*?)\s*\b(ck_\w+)\s*\(([^)]*)\)\s*;",
                                        header_text()):
        params = " ".join(params.split())
        types = []
        if params != "void":
            for param in params.split(","):
                types.append(re.match(r"(.*?)\s*\b\w+$", param.strip()).group(1).replace(" *", "*"))
        decls[name] = (" ".join(ret.split()).replace(" *", "*"), types)
    return decls


def header_enum(prefix):
    """{SUFFIX: value} for the enumerators CK_<prefix>_<SUFFIX> = value."""
    return {m.group(1): int(m.group(2))
            for m in re.finditer(r"\bCK_%s_(\w+)\s*=\s*(-?\d+)" % prefix, header_text())}


def header_macro(name):
    return int(re.search(r"#define %s \(?(-?\d+)\)?" % name, open(HEADER).read()).group(1))


DECLARATIONS = header_declarations()
STATUS_FUNCTIONS = sorted(n for n, (ret, _) in DECLARATIONS.items() if ret == "ck_status_t")


@pytest.fixture(scope="module")
def lib():
    try:
        return ck.load_library()
    except ck.LibraryNotFoundError as e:
        pytest.fail(str(e))


# ------------------------------------------------------------------------------------------------
# Declarations, loading, versions, enums
# ------------------------------------------------------------------------------------------------
def expected_ctype(c_type, is_return):
    """The ctypes type the wrapper must declare for a C type of the header."""
    if is_return and c_type == "ck_status_t":
        return ck._STATUS
    if c_type == "const char*":
        return ctypes.c_char_p
    if c_type.endswith("*") or c_type == "ck_stream_t":
        return "pointer"
    if c_type == "int64_t":
        return ctypes.c_int64
    if c_type == "int" or re.fullmatch(r"ck_\w+_t", c_type):   # enums are int-sized
        return ctypes.c_int
    raise AssertionError("no rule for the C type %r: extend expected_ctype" % c_type)


def test_header_parses():
    assert "ck_quantize_int4" in DECLARATIONS
    assert DECLARATIONS["ck_quantize_int4"][1][:3] == ["const void*", "ck_dtype_t", "int64_t"]
    assert DECLARATIONS["ck_version"] == ("int", [])


def test_wrapper_declares_exactly_the_header():
    assert sorted(ck.DECLARATIONS) == sorted(DECLARATIONS)


@pytest.mark.parametrize("name", sorted(DECLARATIONS))
def test_wrapper_declaration_matches_header(name):
    c_ret, c_params = DECLARATIONS[name]
    restype, argtypes = ck.DECLARATIONS[name]
    assert restype == expected_ctype(c_ret, True), "return type of %s" % name
    assert len(argtypes) == len(c_params), "%s takes %d arguments" % (name, len(c_params))
    for i, (c_type, py_type) in enumerate(zip(c_params, argtypes)):
        want = expected_ctype(c_type, False)
        if want == "pointer":
            ok = py_type is ctypes.c_void_p or issubclass(py_type, ctypes._Pointer)
        else:
            ok = py_type is want
        assert ok, "%s argument %d (%s) is declared %s" % (name, i, c_type, py_type.__name__)


@pytest.mark.parametrize("name", sorted(DECLARATIONS))
def test_every_entry_point_loads(name, lib):
    bare = ctypes.CDLL(ck.library_path())
    assert getattr(bare, name) is not None
    assert getattr(lib, name).argtypes is not None


def test_version_matches_header(lib):
    major, minor, patch = (header_macro("CK_VERSION_" + p) for p in ("MAJOR", "MINOR", "PATCH"))
    assert lib.ck_version() == major * 10000 + minor * 100 + patch
    assert ck.version() == "%d.%d.%d" % (major, minor, patch)


def test_wrapper_enums_match_header():
    assert {m.name: m.value for m in Status} == header_enum("STATUS")
    assert {m.name: m.value for m in DType} == header_enum("DTYPE")
    assert (ck.PER_TENSOR, ck.PER_ROW) == (header_macro_enum("CK_PER_TENSOR"),
                                           header_macro_enum("CK_PER_ROW"))
    assert (ck.STATIC, ck.DYNAMIC) == (header_macro_enum("CK_SCALE_STATIC"),
                                       header_macro_enum("CK_SCALE_DYNAMIC"))
    assert (ck.INT4_SYMMETRIC, ck.INT4_ASYMMETRIC) == (header_macro_enum("CK_INT4_SYMMETRIC"),
                                                       header_macro_enum("CK_INT4_ASYMMETRIC"))
    assert ck.GROUP_ROW == header_macro("CK_GROUP_ROW")


def test_wrapper_gemm_enums_match_header():
    assert (ck.LAYOUT_NK, ck.LAYOUT_KN) == (header_macro_enum("CK_LAYOUT_NK"),
                                            header_macro_enum("CK_LAYOUT_KN"))
    assert header_enum("LAYOUT") == {"NK": ck.LAYOUT_NK, "KN": ck.LAYOUT_KN}
    assert header_enum("ACTIVATION") == {"NONE": ck.ACTIVATION_NONE, "RELU": ck.ACTIVATION_RELU}
    assert ck._layout("nk") == ck.LAYOUT_NK and ck._layout("KN") == ck.LAYOUT_KN
    assert ck._activation(None) == ck._activation("none") == ck.ACTIVATION_NONE
    assert ck._activation("relu") == ck.ACTIVATION_RELU


def header_macro_enum(name):
    return int(re.search(r"\b%s\s*=\s*(-?\d+)" % name, header_text()).group(1))


@pytest.mark.parametrize("status", list(Status), ids=lambda s: s.name)
def test_status_string_names_each_status(lib, status):
    assert lib.ck_status_string(status).decode() == "CK_STATUS_" + status.name
    assert ck.status_string(status) == "CK_STATUS_" + status.name


@pytest.mark.parametrize("value", [8, 99, -1, 2**31 - 1])
def test_status_string_of_unknown_value(lib, value):
    name = lib.ck_status_string(value)
    assert name, "ck_status_string must never return NULL or an empty string"
    assert name.decode() not in {"CK_STATUS_" + s.name for s in Status}


def test_device_count_reports_device_or_no_device(lib):
    """Runs anywhere: CK_STATUS_NO_DEVICE with *count = 0, or success with a count."""
    count = ctypes.c_int(-1)
    bare = ctypes.CDLL(ck.library_path())   # its own function objects: the raw status comes back
    bare.ck_device_count.argtypes = [ctypes.POINTER(ctypes.c_int)]
    bare.ck_last_error_message.restype = ctypes.c_char_p
    status = bare.ck_device_count(ctypes.byref(count))
    message = bare.ck_last_error_message().decode()
    if status == Status.NO_DEVICE:
        assert count.value == 0, "*count must be set to 0 with CK_STATUS_NO_DEVICE"
        assert message.startswith("ck_device_count: "), message
        assert ck.device_count() == 0
    else:
        assert status == Status.SUCCESS, (status, message)
        assert count.value >= 1
        assert message == "", "a successful call leaves an empty message"
        assert ck.device_count() == count.value


# ------------------------------------------------------------------------------------------------
# Bad arguments: one table per entry point
# ------------------------------------------------------------------------------------------------
# Fake device addresses, 256-byte aligned; nothing is ever launched on them.
X, S, Z, Q, O = 0x7F0000100000, 0x7F0000200000, 0x7F0000300000, 0x7F0000400000, 0x7F0000500000
INVALID, MISALIGNED, UNSUPPORTED = Status.INVALID_VALUE, Status.MISALIGNED, Status.UNSUPPORTED
BIG = 2**62               # rows * cols overflows int64
HALF_BIG = 2**31          # rows * cols = 2**62 fits, but not its byte count for 4-byte elements
UNKNOWN_DTYPES = [99, -1, 6]
NOT_FLOAT_DTYPES = [DType.INT8, DType.INT32, DType.UINT8]
BAD_GROUP_SIZES = [48, 0, 256, 16, 1, 4096, -2]

# Each row: (id, changed arguments, status, names the message must contain as words). A value
# written as name=value in the changes must also appear in the message when it is an int.
QUANTIZE_INT8 = dict(x_ptr=X, x_dtype=DType.FP32, rows=4, cols=64, granularity=ck.PER_ROW,
                     scale_mode=ck.DYNAMIC, scales_ptr=S, q_ptr=Q)
QUANTIZE_INT8_CASES = (
    [("null-x", dict(x_ptr=0), INVALID, ["x"]),
     ("null-scales-dynamic", dict(scales_ptr=0), INVALID, ["scales"]),
     ("null-scales-static", dict(scales_ptr=0, scale_mode=ck.STATIC), INVALID, ["scales"]),
     ("null-q", dict(q_ptr=0), INVALID, ["q"])]
    + [("x_dtype=%d" % d, dict(x_dtype=d), INVALID, ["x_dtype"]) for d in UNKNOWN_DTYPES]
    + [("x_dtype=%s" % d.name, dict(x_dtype=d), UNSUPPORTED, ["x_dtype"]) for d in NOT_FLOAT_DTYPES]
    + [("granularity=%d" % g, dict(granularity=g), INVALID, ["granularity"]) for g in (2, -1, 99)]
    + [("scale_mode=%d" % m, dict(scale_mode=m), INVALID, ["scale_mode"]) for m in (2, -1)]
    + [("rows=%d" % r, dict(rows=r), INVALID, ["rows"]) for r in (0, -1, -2**63)]
    + [("cols=%d" % c, dict(cols=c), INVALID, ["cols"]) for c in (0, -5)]
    + [("overflow-elements", dict(rows=BIG, cols=BIG), INVALID, ["rows", "cols"]),
       ("overflow-bytes", dict(rows=HALF_BIG, cols=HALF_BIG), INVALID, ["rows", "cols"]),
       ("misaligned-x-fp32", dict(x_ptr=X + 2), MISALIGNED, ["x"]),
       ("misaligned-x-fp16", dict(x_ptr=X + 1, x_dtype=DType.FP16), MISALIGNED, ["x"]),
       ("misaligned-x-bf16", dict(x_ptr=X + 1, x_dtype=DType.BF16), MISALIGNED, ["x"]),
       ("misaligned-scales", dict(scales_ptr=S + 2), MISALIGNED, ["scales"]),
       ("misaligned-scales-static", dict(scales_ptr=S + 1, scale_mode=ck.STATIC,
                                         granularity=ck.PER_TENSOR), MISALIGNED, ["scales"])]
)

DEQUANTIZE_INT8 = dict(q_ptr=Q, scales_ptr=S, rows=4, cols=64, granularity=ck.PER_ROW, out_ptr=O,
                       out_dtype=DType.FP32)
DEQUANTIZE_INT8_CASES = (
    [("null-q", dict(q_ptr=0), INVALID, ["q"]),
     ("null-scales", dict(scales_ptr=0), INVALID, ["scales"]),
     ("null-out", dict(out_ptr=0), INVALID, ["out"])]
    + [("out_dtype=%d" % d, dict(out_dtype=d), INVALID, ["out_dtype"]) for d in UNKNOWN_DTYPES]
    + [("out_dtype=%s" % d.name, dict(out_dtype=d), UNSUPPORTED, ["out_dtype"])
       for d in NOT_FLOAT_DTYPES]
    + [("granularity=%d" % g, dict(granularity=g), INVALID, ["granularity"]) for g in (2, -1)]
    + [("rows=%d" % r, dict(rows=r), INVALID, ["rows"]) for r in (0, -3)]
    + [("cols=%d" % c, dict(cols=c), INVALID, ["cols"]) for c in (0, -1)]
    + [("overflow-elements", dict(rows=BIG, cols=BIG), INVALID, ["rows", "cols"]),
       ("overflow-bytes", dict(rows=HALF_BIG, cols=HALF_BIG), INVALID, ["rows", "cols"]),
       ("misaligned-scales", dict(scales_ptr=S + 2), MISALIGNED, ["scales"]),
       ("misaligned-out-fp32", dict(out_ptr=O + 2), MISALIGNED, ["out"]),
       ("misaligned-out-fp16", dict(out_ptr=O + 1, out_dtype=DType.FP16), MISALIGNED, ["out"]),
       ("misaligned-out-bf16", dict(out_ptr=O + 1, out_dtype=DType.BF16), MISALIGNED, ["out"])]
)

QUANTIZE_INT4 = dict(x_ptr=X, x_dtype=DType.FP16, rows=4, cols=256, group_size=128,
                     mode=ck.INT4_SYMMETRIC, q_ptr=Q, scales_ptr=S, zeros_ptr=0)
QUANTIZE_INT4_CASES = (
    [("null-x", dict(x_ptr=0), INVALID, ["x"]),
     ("null-q_packed", dict(q_ptr=0), INVALID, ["q_packed"]),
     ("null-scales", dict(scales_ptr=0), INVALID, ["scales"]),
     ("null-zeros-asymmetric", dict(mode=ck.INT4_ASYMMETRIC), INVALID, ["zeros"]),
     ("zeros-symmetric", dict(zeros_ptr=Z), INVALID, ["zeros"])]
    + [("mode=%d" % m, dict(mode=m), INVALID, ["mode"]) for m in (2, -1)]
    + [("x_dtype=%d" % d, dict(x_dtype=d), INVALID, ["x_dtype"]) for d in UNKNOWN_DTYPES]
    + [("x_dtype=%s" % d.name, dict(x_dtype=d), UNSUPPORTED, ["x_dtype"]) for d in NOT_FLOAT_DTYPES]
    + [("rows=%d" % r, dict(rows=r), INVALID, ["rows"]) for r in (0, -1)]
    + [("cols=%d" % c, dict(cols=c), INVALID, ["cols"]) for c in (0, -1)]
    + [("overflow-elements", dict(rows=BIG, cols=BIG), INVALID, ["rows", "cols"]),
       ("overflow-bytes", dict(rows=HALF_BIG, cols=HALF_BIG, x_dtype=DType.FP32), INVALID,
        ["rows", "cols"])]
    + [("group_size=%d" % g, dict(group_size=g), UNSUPPORTED, ["group_size"])
       for g in BAD_GROUP_SIZES]
    + [("misaligned-x-fp32", dict(x_ptr=X + 2, x_dtype=DType.FP32), MISALIGNED, ["x"]),
       ("misaligned-x-fp16", dict(x_ptr=X + 1), MISALIGNED, ["x"]),
       ("misaligned-x-bf16", dict(x_ptr=X + 1, x_dtype=DType.BF16), MISALIGNED, ["x"]),
       ("misaligned-scales-fp32", dict(scales_ptr=S + 2, x_dtype=DType.FP32), MISALIGNED,
        ["scales"]),
       ("misaligned-scales-fp16", dict(scales_ptr=S + 1), MISALIGNED, ["scales"])]
)

DEQUANTIZE_INT4 = dict(q_ptr=Q, scales_ptr=S, zeros_ptr=0, rows=4, cols=256, group_size=128,
                       mode=ck.INT4_SYMMETRIC, out_ptr=O, out_dtype=DType.FP16)
DEQUANTIZE_INT4_CASES = (
    [("null-q_packed", dict(q_ptr=0), INVALID, ["q_packed"]),
     ("null-scales", dict(scales_ptr=0), INVALID, ["scales"]),
     ("null-out", dict(out_ptr=0), INVALID, ["out"]),
     ("null-zeros-asymmetric", dict(mode=ck.INT4_ASYMMETRIC), INVALID, ["zeros"]),
     ("zeros-symmetric", dict(zeros_ptr=Z), INVALID, ["zeros"])]
    + [("mode=%d" % m, dict(mode=m), INVALID, ["mode"]) for m in (2, -1)]
    + [("out_dtype=%d" % d, dict(out_dtype=d), INVALID, ["out_dtype"]) for d in UNKNOWN_DTYPES]
    + [("out_dtype=%s" % d.name, dict(out_dtype=d), UNSUPPORTED, ["out_dtype"])
       for d in NOT_FLOAT_DTYPES]
    + [("rows=%d" % r, dict(rows=r), INVALID, ["rows"]) for r in (0, -1)]
    + [("cols=%d" % c, dict(cols=c), INVALID, ["cols"]) for c in (0, -7)]
    + [("overflow-elements", dict(rows=BIG, cols=BIG), INVALID, ["rows", "cols"]),
       ("overflow-bytes", dict(rows=HALF_BIG, cols=HALF_BIG, out_dtype=DType.FP32), INVALID,
        ["rows", "cols"])]
    + [("group_size=%d" % g, dict(group_size=g), UNSUPPORTED, ["group_size"])
       for g in BAD_GROUP_SIZES]
    + [("misaligned-scales-fp16", dict(scales_ptr=S + 1), MISALIGNED, ["scales"]),
       ("misaligned-scales-fp32", dict(scales_ptr=S + 2, out_dtype=DType.FP32), MISALIGNED,
        ["scales"]),
       ("misaligned-out-fp16", dict(out_ptr=O + 1), MISALIGNED, ["out"]),
       ("misaligned-out-bf16", dict(out_ptr=O + 1, out_dtype=DType.BF16), MISALIGNED, ["out"]),
       ("misaligned-out-fp32", dict(out_ptr=O + 2, out_dtype=DType.FP32), MISALIGNED, ["out"])]
)

# Matrix products. a, b (the weight), c/out, the two scale vectors and the bias get their own fake
# addresses. Rules (cuda_kernels.h): K a multiple of 16 (and N for CK_LAYOUT_KN), a and b 16-byte
# aligned, c 4-byte aligned, scales 4-byte aligned, bias and out aligned to out_dtype; ck_linear:
# K and N multiples of 16 / sizeof(dtype), every pointer 16-byte aligned. bias may be NULL.
A, B, C = X, Z, O
SA, SB, BIAS = 0x7F0000600000, 0x7F0000700000, 0x7F0000800000
NK, KN = ck.LAYOUT_NK, ck.LAYOUT_KN
BAD_LAYOUTS = [2, -1, 99]
BAD_ACTIVATIONS = [2, -1, 99]
BAD_GEMM_K = [1, 8, 24, 100, 4104]          # >= 1 but not a multiple of 16
BAD_KN_N = [1, 8, 15, 24, 100, 4104]        # not a multiple of 16: only CK_LAYOUT_KN minds


def gemm_shape_cases(k_rule=True):
    """Bad m, n, k (< 1, overflowing) and, for the INT8 GEMMs, the multiple-of-16 rules."""
    cases = (
        [("m=%d" % v, dict(m=v), INVALID, ["m"]) for v in (0, -1, -2**63)]
        + [("n=%d" % v, dict(n=v), INVALID, ["n"]) for v in (0, -3)]
        + [("k=%d" % v, dict(k=v), INVALID, ["k"]) for v in (0, -16)]
        + [("overflow-mk", dict(m=BIG, k=BIG), INVALID, ["m", "k"]),
           ("overflow-nk", dict(n=BIG, k=BIG), INVALID, ["n", "k"]),
           ("overflow-mn-bytes", dict(m=HALF_BIG, n=HALF_BIG), INVALID, ["m", "n"])])
    if k_rule:
        cases += [("k=%d" % v, dict(k=v), UNSUPPORTED, ["k"]) for v in BAD_GEMM_K]
        cases += [("kn-n=%d" % v, dict(b_layout=KN, n=v), UNSUPPORTED, ["n"]) for v in BAD_KN_N]
        cases += [("kn-k=24", dict(b_layout=KN, k=24), UNSUPPORTED, ["k"])]
    return cases


def gemm_operand_cases():
    """What both INT8 GEMMs check on a and b."""
    return (
        [("null-a", dict(a_ptr=0), INVALID, ["a"]),
         ("null-b", dict(b_ptr=0), INVALID, ["b"])]
        + [("b_layout=%d" % v, dict(b_layout=v), INVALID, ["b_layout"]) for v in BAD_LAYOUTS]
        + [("misaligned-a+%d" % d, dict(a_ptr=A + d), MISALIGNED, ["a"]) for d in (1, 4, 8)]
        + [("misaligned-b+%d" % d, dict(b_ptr=B + d), MISALIGNED, ["b"]) for d in (1, 2, 8)]
        + [("misaligned-b-kn", dict(b_ptr=B + 4, b_layout=KN), MISALIGNED, ["b"])]
    )


GEMM_INT8 = dict(a_ptr=A, b_ptr=B, b_layout=NK, m=4, n=64, k=64, c_ptr=C)
GEMM_INT8_CASES = (
    gemm_operand_cases() + gemm_shape_cases()
    + [("null-c", dict(c_ptr=0), INVALID, ["c"])]
    + [("misaligned-c+%d" % d, dict(c_ptr=C + d), MISALIGNED, ["c"]) for d in (1, 2, 3)]
)

GEMM_INT8_SCALED = dict(a_ptr=A, b_ptr=B, b_layout=NK, m=4, n=64, k=64, scale_a_ptr=SA,
                        a_granularity=ck.PER_ROW, scale_b_ptr=SB, b_granularity=ck.PER_ROW,
                        bias_ptr=BIAS, activation=ck.ACTIVATION_RELU, out_ptr=O,
                        out_dtype=DType.FP16)
GEMM_INT8_SCALED_CASES = (
    gemm_operand_cases() + gemm_shape_cases()
    + [("null-out", dict(out_ptr=0), INVALID, ["out"]),
       ("null-scale_a", dict(scale_a_ptr=0), INVALID, ["scale_a"]),
       ("null-scale_b", dict(scale_b_ptr=0), INVALID, ["scale_b"])]
    + [("out_dtype=%d" % d, dict(out_dtype=d), INVALID, ["out_dtype"]) for d in UNKNOWN_DTYPES]
    + [("out_dtype=%s" % d.name, dict(out_dtype=d), UNSUPPORTED, ["out_dtype"])
       for d in NOT_FLOAT_DTYPES]
    + [("a_granularity=%d" % g, dict(a_granularity=g), INVALID, ["a_granularity"])
       for g in (2, -1)]
    + [("b_granularity=%d" % g, dict(b_granularity=g), INVALID, ["b_granularity"])
       for g in (2, -1)]
    + [("activation=%d" % v, dict(activation=v), INVALID, ["activation"])
       for v in BAD_ACTIVATIONS]
    + [("misaligned-out-fp16", dict(out_ptr=O + 1), MISALIGNED, ["out"]),
       ("misaligned-out-bf16", dict(out_ptr=O + 1, out_dtype=DType.BF16), MISALIGNED, ["out"]),
       ("misaligned-out-fp32", dict(out_ptr=O + 2, out_dtype=DType.FP32), MISALIGNED, ["out"]),
       ("misaligned-scale_a", dict(scale_a_ptr=SA + 2), MISALIGNED, ["scale_a"]),
       ("misaligned-scale_a-tensor", dict(scale_a_ptr=SA + 1, a_granularity=ck.PER_TENSOR),
        MISALIGNED, ["scale_a"]),
       ("misaligned-scale_b", dict(scale_b_ptr=SB + 2), MISALIGNED, ["scale_b"]),
       ("misaligned-scale_b-tensor", dict(scale_b_ptr=SB + 3, b_granularity=ck.PER_TENSOR),
        MISALIGNED, ["scale_b"]),
       ("misaligned-bias-fp16", dict(bias_ptr=BIAS + 1), MISALIGNED, ["bias"]),
       ("misaligned-bias-bf16", dict(bias_ptr=BIAS + 1, out_dtype=DType.BF16), MISALIGNED,
        ["bias"]),
       ("misaligned-bias-fp32", dict(bias_ptr=BIAS + 2, out_dtype=DType.FP32), MISALIGNED,
        ["bias"])]
)

LINEAR = dict(x_ptr=X, w_ptr=B, bias_ptr=BIAS, dtype=DType.FP16, m=4, n=64, k=64,
              activation=ck.ACTIVATION_NONE, out_ptr=O)
LINEAR_CASES = (
    [("null-x", dict(x_ptr=0), INVALID, ["x"]),
     ("null-w", dict(w_ptr=0), INVALID, ["w"]),
     ("null-out", dict(out_ptr=0), INVALID, ["out"])]
    + [("dtype=%d" % d, dict(dtype=d), INVALID, ["dtype"]) for d in UNKNOWN_DTYPES]
    + [("dtype=%s" % d.name, dict(dtype=d), UNSUPPORTED, ["dtype"]) for d in NOT_FLOAT_DTYPES]
    + [("activation=%d" % v, dict(activation=v), INVALID, ["activation"])
       for v in BAD_ACTIVATIONS]
    + gemm_shape_cases(k_rule=False)
    # K and N multiples of 16 / sizeof(dtype): 8 for fp16 and bf16, 4 for fp32.
    + [("fp16-k=%d" % v, dict(k=v), UNSUPPORTED, ["k"]) for v in (1, 4, 12, 4100)]
    + [("bf16-k=%d" % v, dict(k=v, dtype=DType.BF16), UNSUPPORTED, ["k"]) for v in (2, 20)]
    + [("fp32-k=%d" % v, dict(k=v, dtype=DType.FP32), UNSUPPORTED, ["k"]) for v in (1, 6)]
    + [("fp16-n=%d" % v, dict(n=v), UNSUPPORTED, ["n"]) for v in (1, 4, 100)]
    + [("bf16-n=%d" % v, dict(n=v, dtype=DType.BF16), UNSUPPORTED, ["n"]) for v in (2, 36)]
    + [("fp32-n=%d" % v, dict(n=v, dtype=DType.FP32), UNSUPPORTED, ["n"]) for v in (1, 2, 4094)]
    + [("misaligned-%s+%d" % (name[:-4], d), {name: base + d}, MISALIGNED, [name[:-4]])
       for name, base in (("x_ptr", X), ("w_ptr", B), ("bias_ptr", BIAS), ("out_ptr", O))
       for d in (2, 8)]
    + [("misaligned-x-fp32", dict(x_ptr=X + 4, dtype=DType.FP32), MISALIGNED, ["x"]),
       ("misaligned-out-fp32", dict(out_ptr=O + 12, dtype=DType.FP32), MISALIGNED, ["out"]),
       ("misaligned-bias-bf16", dict(bias_ptr=BIAS + 1, dtype=DType.BF16), MISALIGNED,
        ["bias"])]
)

# W4A16: x [M, K] and out [M, N] of dtype (fp16 or bf16 only), a packed INT4 weight [N, K / 2]
# with scales [N, groups] of dtype and, for CK_INT4_ASYMMETRIC only, uint8 zeros. Rules
# (cuda_kernels.h): K a multiple of 32, group_size 32, 64, 128 or -1, x and w_packed 16-byte
# aligned, scales, bias and out aligned to dtype; bias may be NULL, zeros need no alignment.
W4A16 = dict(x_ptr=X, dtype=DType.FP16, w_ptr=B, scales_ptr=S, zeros_ptr=0, group_size=128,
             mode=ck.INT4_SYMMETRIC, bias_ptr=BIAS, activation=ck.ACTIVATION_RELU, m=4, n=64,
             k=256, out_ptr=O)
BAD_W4A16_K = [1, 16, 48, 100, 4112]        # >= 1 but not a multiple of 32
W4A16_CASES = (
    [("null-x", dict(x_ptr=0), INVALID, ["x"]),
     ("null-w_packed", dict(w_ptr=0), INVALID, ["w_packed"]),
     ("null-scales", dict(scales_ptr=0), INVALID, ["scales"]),
     ("null-out", dict(out_ptr=0), INVALID, ["out"]),
     ("null-zeros-asymmetric", dict(mode=ck.INT4_ASYMMETRIC), INVALID, ["zeros"]),
     ("zeros-symmetric", dict(zeros_ptr=Z), INVALID, ["zeros"])]
    + [("mode=%d" % v, dict(mode=v), INVALID, ["mode"]) for v in (2, -1, 99)]
    + [("dtype=%d" % d, dict(dtype=d), INVALID, ["dtype"]) for d in UNKNOWN_DTYPES]
    + [("dtype=%s" % d.name, dict(dtype=d), UNSUPPORTED, ["dtype"])
       for d in [DType.FP32] + NOT_FLOAT_DTYPES]
    + [("activation=%d" % v, dict(activation=v), INVALID, ["activation"])
       for v in BAD_ACTIVATIONS]
    + gemm_shape_cases(k_rule=False)
    + [("k=%d" % v, dict(k=v), UNSUPPORTED, ["k"]) for v in BAD_W4A16_K]
    + [("group_size=%d" % g, dict(group_size=g), UNSUPPORTED, ["group_size"])
       for g in BAD_GROUP_SIZES]
    + [("misaligned-x+%d" % d, dict(x_ptr=X + d), MISALIGNED, ["x"]) for d in (1, 2, 8)]
    + [("misaligned-w_packed+%d" % d, dict(w_ptr=B + d), MISALIGNED, ["w_packed"])
       for d in (1, 4, 8)]
    + [("misaligned-%s-%s" % (name[:-4], dt.name.lower()), {name: base + 1, "dtype": dt},
        MISALIGNED, [name[:-4]])
       for name, base in (("scales_ptr", S), ("bias_ptr", BIAS), ("out_ptr", O))
       for dt in (DType.FP16, DType.BF16)]
)

# The prepacked W4A16 GEMM: ck_gemm_w4a16's rules, except that the prepacked weight, scales and
# zeros need 16-byte alignment (the kernels copy them with 16-byte cp.async).
W4A16_PREPACKED = dict(W4A16)
PREPACKED_NAMES = {"w_packed": "w_prepacked", "scales": "scales_prepacked"}
W4A16_PREPACKED_CASES = (
    [(case_id, changes, status, [PREPACKED_NAMES.get(n, n) for n in names])
     for case_id, changes, status, names in W4A16_CASES]
    + [("misaligned-scales_prepacked+%d" % d, dict(scales_ptr=S + d), MISALIGNED,
        ["scales_prepacked"]) for d in (2, 8)]
    + [("misaligned-zeros_prepacked+%d" % d,
        dict(mode=ck.INT4_ASYMMETRIC, zeros_ptr=Z + d), MISALIGNED, ["zeros_prepacked"])
       for d in (1, 4)]
)

# ck_w4a16_prepack: the interchange weight in, the prepacked one out (all outputs 16-byte aligned).
W4A16_PREPACK = dict(w_ptr=B, scales_ptr=S, zeros_ptr=0, dtype=DType.FP16, n=64, k=256,
                     group_size=128, mode=ck.INT4_SYMMETRIC, w_out_ptr=Q, scales_out_ptr=O,
                     zeros_out_ptr=0)
ASYM_PREPACK = dict(mode=ck.INT4_ASYMMETRIC, zeros_ptr=Z, zeros_out_ptr=BIAS)
W4A16_PREPACK_CASES = (
    [("null-w_packed", dict(w_ptr=0), INVALID, ["w_packed"]),
     ("null-scales", dict(scales_ptr=0), INVALID, ["scales"]),
     ("null-w_prepacked", dict(w_out_ptr=0), INVALID, ["w_prepacked"]),
     ("null-scales_prepacked", dict(scales_out_ptr=0), INVALID, ["scales_prepacked"]),
     ("null-zeros-asymmetric", dict(ASYM_PREPACK, zeros_ptr=0), INVALID, ["zeros"]),
     ("null-zeros_prepacked-asymmetric", dict(ASYM_PREPACK, zeros_out_ptr=0), INVALID,
      ["zeros_prepacked"]),
     ("zeros-symmetric", dict(zeros_ptr=Z), INVALID, ["zeros"]),
     ("zeros_prepacked-symmetric", dict(zeros_out_ptr=BIAS), INVALID, ["zeros_prepacked"])]
    + [("mode=%d" % v, dict(mode=v), INVALID, ["mode"]) for v in (2, -1)]
    + [("dtype=%d" % d, dict(dtype=d), INVALID, ["dtype"]) for d in UNKNOWN_DTYPES]
    + [("dtype=%s" % d.name, dict(dtype=d), UNSUPPORTED, ["dtype"])
       for d in [DType.FP32] + NOT_FLOAT_DTYPES]
    + [("n=%d" % v, dict(n=v), INVALID, ["n"]) for v in (0, -3)]
    + [("k=%d" % v, dict(k=v), INVALID, ["k"]) for v in (0, -32)]
    + [("overflow-nk", dict(n=BIG, k=BIG), INVALID, ["n", "k"])]
    + [("k=%d" % v, dict(k=v), UNSUPPORTED, ["k"]) for v in BAD_W4A16_K]
    + [("group_size=%d" % g, dict(group_size=g), UNSUPPORTED, ["group_size"])
       for g in BAD_GROUP_SIZES]
    + [("misaligned-w_packed+%d" % d, dict(w_ptr=B + d), MISALIGNED, ["w_packed"])
       for d in (1, 8)]
    + [("misaligned-scales+1", dict(scales_ptr=S + 1), MISALIGNED, ["scales"]),
       ("misaligned-w_prepacked+8", dict(w_out_ptr=Q + 8), MISALIGNED, ["w_prepacked"]),
       ("misaligned-scales_prepacked+2", dict(scales_out_ptr=O + 2), MISALIGNED,
        ["scales_prepacked"]),
       ("misaligned-zeros_prepacked+4", dict(ASYM_PREPACK, zeros_out_ptr=BIAS + 4), MISALIGNED,
        ["zeros_prepacked"])]
)

# Importers: checkpoint int32 tensors in, the interchange format out. N a multiple of 8, K of 32.
G, P = 0x7F0000900000, 0x7F0000A00000   # g_idx, perm
IMPORT_AWQ = dict(qweight_ptr=A, qzeros_ptr=Z, scales_ptr=S, dtype=DType.FP16, n=64, k=256,
                  group_size=128, w_ptr=Q, scales_out_ptr=O, zeros_out_ptr=BIAS)


def import_cases():
    """What both importers check."""
    return (
        [("null-%s" % name[:-4], {name: 0}, INVALID, [label])
         for name, label in (("qweight_ptr", "qweight"), ("qzeros_ptr", "qzeros"),
                             ("scales_ptr", "scales"), ("w_ptr", "w_packed"),
                             ("scales_out_ptr", "scales_out"), ("zeros_out_ptr", "zeros_out"))]
        + [("dtype=%d" % d, dict(dtype=d), INVALID, ["dtype"]) for d in UNKNOWN_DTYPES]
        + [("dtype=%s" % d.name, dict(dtype=d), UNSUPPORTED, ["dtype"])
           for d in [DType.FP32] + NOT_FLOAT_DTYPES]
        + [("n=%d" % v, dict(n=v), INVALID, ["n"]) for v in (0, -8)]
        + [("k=%d" % v, dict(k=v), INVALID, ["k"]) for v in (0, -32)]
        + [("overflow-nk", dict(n=BIG, k=BIG), INVALID, ["n", "k"])]
        + [("n=%d" % v, dict(n=v), UNSUPPORTED, ["n"]) for v in (1, 12, 100)]
        + [("k=%d" % v, dict(k=v), UNSUPPORTED, ["k"]) for v in BAD_W4A16_K]
        + [("group_size=%d" % g, dict(group_size=g), UNSUPPORTED, ["group_size"])
           for g in BAD_GROUP_SIZES]
        + [("misaligned-qweight+2", dict(qweight_ptr=A + 2), MISALIGNED, ["qweight"]),
           ("misaligned-qzeros+1", dict(qzeros_ptr=Z + 1), MISALIGNED, ["qzeros"]),
           ("misaligned-scales+1", dict(scales_ptr=S + 1), MISALIGNED, ["scales"]),
           ("misaligned-scales_out+1", dict(scales_out_ptr=O + 1), MISALIGNED, ["scales_out"])]
    )


IMPORT_AWQ_CASES = import_cases()
IMPORT_GPTQ = dict(IMPORT_AWQ, g_idx_ptr=0, perm_ptr=0)
IMPORT_GPTQ_CASES = import_cases() + [
    ("g_idx-without-perm", dict(g_idx_ptr=G), INVALID, ["perm"]),
    ("perm-without-g_idx", dict(perm_ptr=P), INVALID, ["perm", "g_idx"]),
    ("misaligned-g_idx+2", dict(g_idx_ptr=G + 2, perm_ptr=P), MISALIGNED, ["g_idx"]),
    ("misaligned-perm+1", dict(g_idx_ptr=G, perm_ptr=P + 1), MISALIGNED, ["perm"]),
]

PERMUTE_COLUMNS = dict(x_ptr=X, dtype=DType.FP16, rows=4, cols=64, perm_ptr=P, out_ptr=O)
PERMUTE_COLUMNS_CASES = (
    [("null-x", dict(x_ptr=0), INVALID, ["x"]),
     ("null-perm", dict(perm_ptr=0), INVALID, ["perm"]),
     ("null-out", dict(out_ptr=0), INVALID, ["out"])]
    + [("dtype=%d" % d, dict(dtype=d), INVALID, ["dtype"]) for d in UNKNOWN_DTYPES]
    + [("dtype=%s" % d.name, dict(dtype=d), UNSUPPORTED, ["dtype"]) for d in NOT_FLOAT_DTYPES]
    + [("rows=%d" % r, dict(rows=r), INVALID, ["rows"]) for r in (0, -1)]
    + [("cols=%d" % c, dict(cols=c), INVALID, ["cols"]) for c in (0, -5)]
    + [("overflow-bytes", dict(rows=HALF_BIG, cols=HALF_BIG), INVALID, ["rows", "cols"]),
       ("misaligned-x-fp16", dict(x_ptr=X + 1), MISALIGNED, ["x"]),
       ("misaligned-x-fp32", dict(x_ptr=X + 2, dtype=DType.FP32), MISALIGNED, ["x"]),
       ("misaligned-perm", dict(perm_ptr=P + 2), MISALIGNED, ["perm"]),
       ("misaligned-out-bf16", dict(out_ptr=O + 1, dtype=DType.BF16), MISALIGNED, ["out"])]
)

# INT4 x INT4: packed a [M, K / 2] and b [N, K / 2]; K a multiple of 32; a, b 16-byte aligned.
BAD_INT4_K = [16, 48, 100, 4112]


def gemm_int4_operand_cases():
    return (
        [("null-a", dict(a_ptr=0), INVALID, ["a"]),
         ("null-b", dict(b_ptr=0), INVALID, ["b"])]
        + gemm_shape_cases(k_rule=False)
        + [("k=%d" % v, dict(k=v), UNSUPPORTED, ["k"]) for v in BAD_INT4_K]
        + [("misaligned-a+%d" % d, dict(a_ptr=A + d), MISALIGNED, ["a"]) for d in (1, 8)]
        + [("misaligned-b+%d" % d, dict(b_ptr=B + d), MISALIGNED, ["b"]) for d in (2, 4)]
    )


GEMM_INT4 = dict(a_ptr=A, b_ptr=B, m=4, n=64, k=64, c_ptr=C)
GEMM_INT4_CASES = gemm_int4_operand_cases() + [
    ("null-c", dict(c_ptr=0), INVALID, ["c"]),
    ("misaligned-c+2", dict(c_ptr=C + 2), MISALIGNED, ["c"]),
]
GEMM_INT4_SCALED = {key: value for key, value in GEMM_INT8_SCALED.items() if key != "b_layout"}
GEMM_INT4_SCALED_CASES = gemm_int4_operand_cases() + [
    case for case in GEMM_INT8_SCALED_CASES
    if not any(key in ("a_ptr", "b_ptr", "b_layout", "m", "n", "k") for key in case[1])
]

ENTRY_POINTS = {
    "ck_quantize_int8": (ck.raw.quantize_int8, QUANTIZE_INT8, QUANTIZE_INT8_CASES),
    "ck_dequantize_int8": (ck.raw.dequantize_int8, DEQUANTIZE_INT8, DEQUANTIZE_INT8_CASES),
    "ck_quantize_int4": (ck.raw.quantize_int4, QUANTIZE_INT4, QUANTIZE_INT4_CASES),
    "ck_dequantize_int4": (ck.raw.dequantize_int4, DEQUANTIZE_INT4, DEQUANTIZE_INT4_CASES),
    "ck_gemm_int8": (ck.raw.gemm_int8, GEMM_INT8, GEMM_INT8_CASES),
    "ck_gemm_int8_scaled": (ck.raw.gemm_int8_scaled, GEMM_INT8_SCALED, GEMM_INT8_SCALED_CASES),
    "ck_linear": (ck.raw.linear, LINEAR, LINEAR_CASES),
    "ck_gemm_w4a16": (ck.raw.gemm_w4a16, W4A16, W4A16_CASES),
    "ck_gemm_w4a16_prepacked": (ck.raw.gemm_w4a16_prepacked, W4A16_PREPACKED,
                                W4A16_PREPACKED_CASES),
    "ck_w4a16_prepack": (ck.raw.w4a16_prepack, W4A16_PREPACK, W4A16_PREPACK_CASES),
    "ck_import_gptq": (ck.raw.import_gptq, IMPORT_GPTQ, IMPORT_GPTQ_CASES),
    "ck_import_awq": (ck.raw.import_awq, IMPORT_AWQ, IMPORT_AWQ_CASES),
    "ck_permute_columns": (ck.raw.permute_columns, PERMUTE_COLUMNS, PERMUTE_COLUMNS_CASES),
    "ck_gemm_int4": (ck.raw.gemm_int4, GEMM_INT4, GEMM_INT4_CASES),
    "ck_gemm_int4_scaled": (ck.raw.gemm_int4_scaled, GEMM_INT4_SCALED, GEMM_INT4_SCALED_CASES),
}


def bad_call_params():
    for function, (_, _, cases) in ENTRY_POINTS.items():
        for case_id, changes, status, names in cases:
            yield pytest.param(function, changes, status, names, id="%s-%s" % (function, case_id))


def mentions(message, word):
    """word appears in message as a whole identifier or number."""
    return re.search(r"(?<![\w-])%s(?![\w])" % re.escape(str(word)), message) is not None


def rejection(function, changes):
    """Calls `function` with its valid arguments changed by `changes`; returns the CKError."""
    raw_function, valid, _ = ENTRY_POINTS[function]
    kwargs = dict(valid, **changes)
    with pytest.raises(CKError) as info:
        raw_function(**kwargs, stream=0)
    return info.value


def test_every_status_function_has_bad_argument_cases():
    covered = set(ENTRY_POINTS) | {"ck_device_count"}
    assert covered == set(STATUS_FUNCTIONS)


def test_valid_baselines_are_valid_shapes():
    """Sanity of the tables: the unchanged arguments are right (but never called here)."""
    for function, (raw_function, valid, cases) in ENTRY_POINTS.items():
        sizes = [valid[key] for key in ("rows", "cols", "m", "n", "k") if key in valid]
        assert len(sizes) in (2, 3) and all(size >= 1 for size in sizes), function
        if "k" in valid:   # a multiple of 16 suits every GEMM rule, N too (for CK_LAYOUT_KN)
            assert valid["k"] % 16 == 0 and valid["n"] % 16 == 0, function
        assert all(ptr % 256 == 0 for key, ptr in valid.items() if key.endswith("_ptr"))
        assert len({case_id for case_id, *_ in cases}) == len(cases), function


@pytest.mark.parametrize("function, changes, status, names", list(bad_call_params()))
def test_bad_argument_rejected(lib, function, changes, status, names):
    error = rejection(function, changes)
    message = error.message
    assert error.status == status, "%s: got %s (%s)" % (function, error.status, message)
    assert message, "a rejected call must leave a message"
    assert message == ck.last_error_message()
    assert message.startswith(function + ": "), "the message names the function: %r" % message
    for name in names:
        assert mentions(message, name), "the message does not name %s: %r" % (name, message)
    # The offending value itself, where it is a plain number (sizes, enums, group sizes).
    for name, value in changes.items():
        if name in names and not name.endswith("_ptr") and isinstance(value, int) \
                and not isinstance(value, DType):
            assert mentions(message, value), "the message does not say %s=%d: %r" % (
                name, value, message)
    assert error.cuda_error == 0 and lib.ck_last_cuda_error() == 0, \
        "validation must not call CUDA"


def test_device_count_rejects_null(lib):
    with pytest.raises(CKError) as info:
        lib.ck_device_count(None)
    assert info.value.status == Status.INVALID_VALUE
    assert info.value.message.startswith("ck_device_count: ")
    assert mentions(info.value.message, "count"), info.value.message


def test_misaligned_by_one_is_fine_for_int8_data(lib):
    """int8 q and uint8 zeros have no alignment requirement: the only defect here is NULL
    scales, so the error must be about scales (not about q's odd address)."""
    error = rejection("ck_quantize_int8", dict(q_ptr=Q + 1, scales_ptr=0))
    assert error.status == Status.INVALID_VALUE and mentions(error.message, "scales")
    error = rejection("ck_dequantize_int4", dict(q_ptr=Q + 3, zeros_ptr=Z + 1,
                                                 mode=ck.INT4_ASYMMETRIC, scales_ptr=0))
    assert error.status == Status.INVALID_VALUE and mentions(error.message, "scales")


def test_gemm_null_bias_is_allowed(lib):
    """bias may be NULL: with another defect planted, the error is about that one, not bias."""
    for function in ("ck_gemm_int8_scaled", "ck_linear"):
        error = rejection(function, dict(bias_ptr=0, k=20))
        assert error.status == Status.UNSUPPORTED and mentions(error.message, "k"), error.message
        error = rejection(function, dict(bias_ptr=0, out_ptr=O + 1))
        assert error.status == Status.MISALIGNED and mentions(error.message, "out"), error.message
    error = rejection("ck_gemm_int8_scaled", dict(bias_ptr=0, scale_b_ptr=SB + 2))
    assert error.status == Status.MISALIGNED and mentions(error.message, "scale_b"), error.message


def kernel_override_rejection(monkeypatch, function, changes):
    """Calls `function` with CK_GEMM_INT8_KERNEL=bogus, which the library reads once every
    argument has passed validation (and before any CUDA call): an INVALID_VALUE about it
    proves that the changed arguments are valid. Returns the CKError."""
    monkeypatch.setenv("CK_GEMM_INT8_KERNEL", "bogus")
    error = rejection(function, changes)
    assert error.status == Status.INVALID_VALUE, error.message
    assert "CK_GEMM_INT8_KERNEL" in error.message, error.message
    return error


@pytest.mark.parametrize("function", ["ck_gemm_int8", "ck_gemm_int8_scaled"])
@pytest.mark.parametrize("changes", [dict(n=15), dict(n=1, m=1), dict(n=4097, m=3, k=16),
                                     dict(b_layout=KN, n=16, k=16), dict(m=10**6)],
                         ids=["n=15", "1x1", "n=4097", "kn-16x16", "m=1e6"])
def test_gemm_valid_shapes_pass_validation(lib, monkeypatch, function, changes):
    """Any M and N (N a multiple of 16 only for CK_LAYOUT_KN), K a multiple of 16."""
    kernel_override_rejection(monkeypatch, function, changes)


@pytest.mark.parametrize("changes", [dict(c_ptr=C + 4), dict(c_ptr=C + 12)], ids=["c+4", "c+12"])
def test_gemm_int8_element_aligned_c_passes_validation(lib, monkeypatch, changes):
    """c needs 4-byte alignment only."""
    kernel_override_rejection(monkeypatch, "ck_gemm_int8", changes)


@pytest.mark.parametrize("changes", [
    dict(out_ptr=O + 2, bias_ptr=BIAS + 2),
    dict(out_ptr=O + 6, bias_ptr=BIAS + 10, out_dtype=DType.BF16),
    dict(out_ptr=O + 4, bias_ptr=BIAS + 12, out_dtype=DType.FP32),
    dict(scale_a_ptr=SA + 4, scale_b_ptr=SB + 12),
    dict(bias_ptr=0, activation=ck.ACTIVATION_NONE),
    dict(a_granularity=ck.PER_TENSOR, b_granularity=ck.PER_TENSOR),
], ids=["fp16+2", "bf16+6", "fp32+4", "scales+4", "no-bias", "per-tensor"])
def test_gemm_int8_scaled_element_aligned_pointers_pass_validation(lib, monkeypatch, changes):
    """Scales need 4 bytes, bias and out their element size; bias may be NULL."""
    kernel_override_rejection(monkeypatch, "ck_gemm_int8_scaled", changes)


@pytest.mark.parametrize("value", ["bogus", "cublas"])
@pytest.mark.parametrize("function", ["ck_gemm_int8", "ck_gemm_int8_scaled"])
def test_gemm_kernel_override_rejects_unknown_names(lib, monkeypatch, function, value):
    """CK_GEMM_INT8_KERNEL (read on every call) must name a variant; anything else is an
    invalid value, reported before any CUDA call. (Valid names would launch on the fake
    addresses: the GPU tests cover them.)"""
    monkeypatch.setenv("CK_GEMM_INT8_KERNEL", value)
    raw_function, valid, _ = ENTRY_POINTS[function]
    with pytest.raises(CKError) as info:
        raw_function(**valid, stream=0)
    error = info.value
    assert error.status == Status.INVALID_VALUE, error.message
    assert error.message.startswith(function + ": ")
    assert "CK_GEMM_INT8_KERNEL" in error.message and value in error.message, error.message
    assert error.cuda_error == 0 and lib.ck_last_cuda_error() == 0


def test_gemm_argument_errors_come_before_the_kernel_override(lib, monkeypatch):
    monkeypatch.setenv("CK_GEMM_INT8_KERNEL", "bogus")
    error = rejection("ck_gemm_int8", dict(k=24))
    assert error.status == Status.UNSUPPORTED and mentions(error.message, "k"), error.message


def w4a16_override_rejection(monkeypatch, changes):
    """ck_gemm_w4a16 with CK_GEMM_W4A16_KERNEL=bogus, which the library reads once every
    argument has passed validation (and before any CUDA call): an INVALID_VALUE about it proves
    that the changed arguments are valid."""
    monkeypatch.setenv("CK_GEMM_W4A16_KERNEL", "bogus")
    error = rejection("ck_gemm_w4a16", changes)
    assert error.status == Status.INVALID_VALUE, error.message
    assert "CK_GEMM_W4A16_KERNEL" in error.message, error.message
    assert error.cuda_error == 0 and lib_last_cuda_error() == 0
    return error


def lib_last_cuda_error():
    return ck.load_library().ck_last_cuda_error()


@pytest.mark.parametrize("changes", [
    dict(n=1, m=1, k=32),
    dict(n=7, m=17, k=96, group_size=64),            # a partial last group
    dict(n=4097, m=100, k=160, group_size=ck.GROUP_ROW),
    dict(m=10**6, group_size=32),
    dict(dtype=DType.BF16, activation=ck.ACTIVATION_NONE),
    dict(mode=ck.INT4_ASYMMETRIC, zeros_ptr=Z + 1),   # uint8 zeros: any address
    dict(bias_ptr=0),
    dict(scales_ptr=S + 2, bias_ptr=BIAS + 6, out_ptr=O + 10),
    dict(scales_ptr=S + 2, bias_ptr=BIAS + 2, out_ptr=O + 2, dtype=DType.BF16),
], ids=["1x1x32", "partial-group", "row-group", "m=1e6", "bf16", "asym-zeros+1", "no-bias",
        "fp16-element-aligned", "bf16-element-aligned"])
def test_gemm_w4a16_valid_arguments_pass_validation(lib, monkeypatch, changes):
    """Any M and N, K a multiple of 32, any supported group size (K need not be a multiple of
    it), scales/bias/out aligned to their element only, zeros anywhere, bias NULL."""
    w4a16_override_rejection(monkeypatch, changes)


@pytest.mark.parametrize("value", ["bogus", "mma", "wgmma", "SMALL_M", "cublas"])
def test_gemm_w4a16_kernel_override_rejects_unknown_names(lib, monkeypatch, value):
    """CK_GEMM_W4A16_KERNEL is auto, reference or small_m (mma/wgmma are INT8 GEMM names);
    anything else is an invalid value reported before any CUDA call."""
    monkeypatch.setenv("CK_GEMM_W4A16_KERNEL", value)
    with pytest.raises(CKError) as info:
        ck.raw.gemm_w4a16(**W4A16, stream=0)
    error = info.value
    assert error.status == Status.INVALID_VALUE, error.message
    assert error.message.startswith("ck_gemm_w4a16: ")
    assert "CK_GEMM_W4A16_KERNEL" in error.message and value in error.message, error.message
    assert error.cuda_error == 0 and lib.ck_last_cuda_error() == 0


def test_gemm_w4a16_argument_errors_come_before_the_kernel_override(lib, monkeypatch):
    monkeypatch.setenv("CK_GEMM_W4A16_KERNEL", "bogus")
    error = rejection("ck_gemm_w4a16", dict(k=48))
    assert error.status == Status.UNSUPPORTED and mentions(error.message, "k"), error.message
    error = rejection("ck_gemm_w4a16", dict(group_size=48))
    assert error.status == Status.UNSUPPORTED and mentions(error.message, "group_size")


def test_gemm_w4a16_ignores_the_int8_override(lib, monkeypatch):
    """CK_GEMM_INT8_KERNEL belongs to the INT8 GEMMs: a bogus value must not fail W4A16."""
    monkeypatch.setenv("CK_GEMM_INT8_KERNEL", "bogus")
    error = w4a16_override_rejection(monkeypatch, {})
    assert "CK_GEMM_INT8_KERNEL" not in error.message


def test_gemm_w4a16_null_bias_is_allowed(lib):
    """bias may be NULL: with another defect planted, the error is about that one."""
    error = rejection("ck_gemm_w4a16", dict(bias_ptr=0, k=48))
    assert error.status == Status.UNSUPPORTED and mentions(error.message, "k"), error.message
    error = rejection("ck_gemm_w4a16", dict(bias_ptr=0, out_ptr=O + 1))
    assert error.status == Status.MISALIGNED and mentions(error.message, "out"), error.message
    error = rejection("ck_gemm_w4a16", dict(bias_ptr=0, scales_ptr=S + 1))
    assert error.status == Status.MISALIGNED and mentions(error.message, "scales")


@pytest.mark.parametrize("function", ["ck_gemm_int4", "ck_gemm_int4_scaled"])
@pytest.mark.parametrize("value", ["bogus", "wgmma", "tc", "MMA"])
def test_gemm_int4_kernel_override_rejects_unknown_names(lib, monkeypatch, function, value):
    """CK_GEMM_INT4_KERNEL is auto, reference, mma or small_m; anything else is an invalid value
    reported after the arguments passed validation and before any CUDA call."""
    monkeypatch.setenv("CK_GEMM_INT4_KERNEL", value)
    error = rejection(function, {})
    assert error.status == Status.INVALID_VALUE, error.message
    assert error.message.startswith(function + ": ")
    assert "CK_GEMM_INT4_KERNEL" in error.message and value in error.message, error.message
    assert error.cuda_error == 0 and lib.ck_last_cuda_error() == 0


def test_gemm_int4_argument_errors_come_before_the_kernel_override(lib, monkeypatch):
    monkeypatch.setenv("CK_GEMM_INT4_KERNEL", "bogus")
    error = rejection("ck_gemm_int4", dict(k=48))
    assert error.status == Status.UNSUPPORTED and mentions(error.message, "k"), error.message


@pytest.mark.parametrize("changes", [
    dict(m=1, n=1, k=32), dict(m=17, n=7, k=96), dict(m=10**6, k=4096), dict(c_ptr=C + 4),
], ids=["1x1x32", "17x7x96", "m=1e6", "c+4"])
def test_gemm_int4_valid_arguments_pass_validation(lib, monkeypatch, changes):
    """Any M and N, K a multiple of 32, c 4-byte aligned: the planted override's error proves
    that validation passed."""
    monkeypatch.setenv("CK_GEMM_INT4_KERNEL", "bogus")
    error = rejection("ck_gemm_int4", changes)
    assert error.status == Status.INVALID_VALUE and "CK_GEMM_INT4_KERNEL" in error.message


def test_next_rejection_replaces_the_message(lib):
    first = rejection("ck_quantize_int4", dict(group_size=48)).message
    second = rejection("ck_dequantize_int8", dict(rows=0)).message
    assert mentions(first, "group_size") and first != second
    assert ck.last_error_message() == second
    assert "group_size" not in second


@pytest.mark.gpu
def test_successful_call_clears_the_message(lib):
    rejection("ck_quantize_int8", dict(x_ptr=0))
    assert ck.last_error_message()
    assert ck.raw.device_count() >= 1
    assert ck.last_error_message() == ""


# ------------------------------------------------------------------------------------------------
# Messages are per thread
# ------------------------------------------------------------------------------------------------
def test_message_is_per_thread(lib):
    mine = rejection("ck_quantize_int8", dict(x_ptr=0)).message
    seen = {}

    def other():
        seen["fresh"] = ck.last_error_message()
        seen["own"] = rejection("ck_quantize_int4", dict(group_size=48)).message
        seen["after"] = ck.last_error_message()

    thread = threading.Thread(target=other)
    thread.start()
    thread.join()
    assert seen["fresh"] == "", "a new thread starts with an empty message"
    assert mentions(seen["own"], "group_size") and seen["after"] == seen["own"]
    assert ck.last_error_message() == mine, "another thread's failure changed this thread's message"


def test_messages_stay_per_thread_under_concurrency(lib):
    """Threads failing at the same time (ctypes drops the GIL) each read their own message."""
    cases = [("ck_quantize_int8", dict(rows=-(i + 1)), "rows=%d" % -(i + 1)) for i in range(4)] + \
            [("ck_dequantize_int4", dict(group_size=40 + i), "group_size=%d" % (40 + i))
             for i in range(4)]
    barrier = threading.Barrier(len(cases))
    failures = []

    def worker(function, changes, expected):
        raw_function, valid, _ = ENTRY_POINTS[function]
        barrier.wait()
        for _ in range(300):
            try:
                raw_function(**dict(valid, **changes), stream=0)
                failures.append("%s accepted %s" % (function, changes))
                return
            except CKError as e:
                if expected not in e.message or expected not in ck.last_error_message():
                    failures.append("%s: expected %r, read %r" % (function, expected, e.message))
                    return

    threads = [threading.Thread(target=worker, args=case) for case in cases]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not failures, failures


# ------------------------------------------------------------------------------------------------
# ck_int4_groups_per_row
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("cols, group_size, groups", [
    (1, 32, 1), (32, 32, 1), (33, 32, 2), (64, 64, 1), (65, 64, 2), (128, 128, 1),
    (129, 128, 2), (4096, 128, 32), (4095, 64, 64), (11008, 128, 86), (14336, 32, 448),
    (1, ck.GROUP_ROW, 1), (100, ck.GROUP_ROW, 1), (2**40, ck.GROUP_ROW, 1), (2**40, 32, 2**35),
    (2**63 - 1, 32, 2**58),
])
def test_int4_groups_per_row(lib, cols, group_size, groups):
    assert lib.ck_int4_groups_per_row(cols, group_size) == groups
    assert ck.raw.int4_groups_per_row(cols, group_size) == groups


@pytest.mark.parametrize("cols, group_size", [
    (0, 128), (-1, 128), (-2**63, 32), (0, ck.GROUP_ROW), (128, 48), (128, 0), (128, -2),
    (128, 256), (128, 16),
])
def test_int4_groups_per_row_invalid_is_zero(lib, cols, group_size):
    assert lib.ck_int4_groups_per_row(cols, group_size) == 0


# ------------------------------------------------------------------------------------------------
# The wrapper on the host: loading and argument checks made before anything reaches the GPU
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("n, k, nbytes", [
    (1, 32, 8 * 128 // 2),              # one tile: 8 rows x 128 k, both padded
    (8, 128, 512), (9, 128, 1024), (64, 256, 64 * 256 // 2), (4096, 4096, 4096 * 2048),
    (4096, 4128, 4096 * 4224 // 2),     # K padded to 33 chunks of 128
])
def test_w4a16_prepacked_bytes(lib, n, k, nbytes):
    assert lib.ck_w4a16_prepacked_bytes(n, k) == nbytes


@pytest.mark.parametrize("n, k", [(0, 128), (-1, 128), (8, 0), (8, 48), (8, 100), (2**62, 2**62)])
def test_w4a16_prepacked_bytes_invalid_is_zero(lib, n, k):
    assert lib.ck_w4a16_prepacked_bytes(n, k) == 0


@pytest.mark.parametrize("n, k, group_size, values", [
    (1, 32, 32, 8), (9, 128, 32, 16 * 4), (64, 256, 128, 64 * 2), (64, 96, 64, 64 * 2),
    (4096, 4096, ck.GROUP_ROW, 4096),
])
def test_w4a16_prepacked_groups(lib, n, k, group_size, values):
    assert lib.ck_w4a16_prepacked_groups(n, k, group_size) == values


@pytest.mark.parametrize("n, k, group_size", [(0, 128, 128), (8, 48, 32), (8, 128, 48),
                                              (8, 128, 0)])
def test_w4a16_prepacked_groups_invalid_is_zero(lib, n, k, group_size):
    assert lib.ck_w4a16_prepacked_groups(n, k, group_size) == 0


def run_python(code, **env):
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, env=dict(os.environ, **env),
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=60)
    return proc.returncode, proc.stdout


def test_missing_library_says_run_make(tmp_path):
    code = ("import cuda_wrapper as ck\n"
            "try:\n    ck.version()\n"
            "except ck.LibraryNotFoundError as e:\n    print('ERR', e)\n")
    rc, out = run_python(code, CK_LIBRARY_PATH=str(tmp_path / "nowhere.so"))
    assert rc == 0 and out.startswith("ERR") and "run `make`" in out, out


@pytest.mark.parametrize("how", ["file", "directory"])
def test_library_path_from_environment(lib, how):
    target = ck.library_path() if how == "file" else os.path.dirname(ck.library_path())
    rc, out = run_python("import cuda_wrapper as ck; print(ck.library_path()); print(ck.version())",
                         CK_LIBRARY_PATH=target)
    assert rc == 0, out
    assert out.split() == [os.path.join(os.path.dirname(ck.library_path()), ck.LIBRARY_NAME),
                           ck.version()]


def test_ckerror_text(lib):
    error = rejection("ck_quantize_int4", dict(group_size=48))
    assert isinstance(error, RuntimeError)
    assert error.function == "ck_quantize_int4"
    assert str(error).startswith("UNSUPPORTED: ck_quantize_int4: ")


class FakeCudaArray:
    """Just a __cuda_array_interface__: enough for the host-side checks (never dereferenced)."""

    def __init__(self, shape, typestr="<f4", strides=None, ptr=X, version=3):
        self.__cuda_array_interface__ = dict(shape=shape, typestr=typestr, data=(ptr, False),
                                             strides=strides, version=version)


@pytest.mark.parametrize("x, error", [
    (np.zeros((4, 6), np.float32)[:, ::2], ValueError),          # not C-contiguous
    (np.zeros((4, 6), np.float32).T, ValueError),                # Fortran order
    (np.zeros((2, 3, 4), np.float32), ValueError),               # 3-D
    (np.zeros((0, 4), np.float32), ValueError),                  # empty
    (np.zeros((4, 4), np.float64), TypeError),                   # no float64 kernels
    (np.zeros((4, 4), np.uint16), TypeError),                    # uint16 without dtype="bf16"
    (FakeCudaArray((4, 8), strides=(4, 16)), ValueError),        # a transposed CUDA array
    (FakeCudaArray((4, 8), strides=(64, 8)), ValueError),        # every other column
    (FakeCudaArray((2, 2, 2)), ValueError),
    (FakeCudaArray((4, 8), typestr="<f8"), TypeError),
], ids=["sliced", "transposed", "3d", "empty", "float64", "uint16", "cai-transposed",
        "cai-strided", "cai-3d", "cai-float64"])
def test_wrapper_rejects_before_any_copy(lib, x, error):
    with pytest.raises(error):
        ck.quantize_int8(x)
    with pytest.raises(error):
        ck.quantize_int4(x)


I8 = np.zeros((4, 32), np.int8)
# W4A16 operands for K=32, N=8, group 128 (one group per row): device ones are never copied.
W4, S4 = np.zeros((8, 16), np.uint8), np.ones((8, 1), np.float16)
X16 = FakeCudaArray((4, 32), "<f2")
W4D = FakeCudaArray((8, 16), "|u1", ptr=B)
S16 = FakeCudaArray((8, 1), "<f2", ptr=S)


@pytest.mark.parametrize("call, error", [
    (lambda: ck.gemm_int8(I8.astype(np.int16), I8), TypeError),
    (lambda: ck.gemm_int8(I8.astype(np.float32), I8), TypeError),
    (lambda: ck.gemm_int8(I8[:, ::2], I8), ValueError),
    (lambda: ck.gemm_int8(np.zeros((2, 2, 32), np.int8), I8), ValueError),
    (lambda: ck.gemm_int8(np.zeros((0, 32), np.int8), I8), ValueError),
    (lambda: ck.gemm_int8(FakeCudaArray((4, 32), "|i1", strides=(1, 4)), I8), ValueError),
    (lambda: ck.gemm_int8(I8, I8, layout="tn"), ValueError),
    (lambda: ck.gemm_int8_scaled(I8.astype(np.uint8), I8, 1.0, 1.0), TypeError),
    (lambda: ck.gemm_int8_scaled(I8, I8, 1.0, 1.0, activation="gelu"), ValueError),
    (lambda: ck.gemm_int8_scaled(I8, I8, 1.0, 1.0, out_dtype="fp8"), ValueError),
    (lambda: ck.gemm_int8_scaled(I8, I8, 1.0, 1.0, layout="nn"), ValueError),
    (lambda: ck.linear(np.zeros((4, 32), np.float64), I8), TypeError),
    (lambda: ck.linear(np.zeros((4, 32), np.uint16), I8), TypeError),
    (lambda: ck.linear(np.zeros((4, 32), np.float32), I8, activation="tanh"), ValueError),
    (lambda: ck.int8_matmul(I8.astype(np.float32), I8, scale_c=1.0), TypeError),
    (lambda: ck.gemm_w4a16(np.zeros((4, 32), np.float64), W4, S4), TypeError),
    (lambda: ck.gemm_w4a16(np.zeros((4, 32), np.uint16), W4, S4), TypeError),
    (lambda: ck.gemm_w4a16(X16, W4D, S16, activation="gelu"), ValueError),
    (lambda: ck.gemm_w4a16(X16, FakeCudaArray((8, 32), "|u1"), S16), ValueError),
    (lambda: ck.gemm_w4a16(X16, FakeCudaArray((8, 16), "<i1"), S16), TypeError),
    (lambda: ck.gemm_w4a16(X16, W4D, FakeCudaArray((8, 2), "<f2")), ValueError),
    (lambda: ck.gemm_w4a16(X16, W4D, FakeCudaArray((8, 1), "<f4")), TypeError),
    (lambda: ck.gemm_w4a16(X16, W4D, S16, FakeCudaArray((8, 1), "<i1")), TypeError),
    (lambda: ck.gemm_w4a16(X16, W4D, S16, FakeCudaArray((8, 2), "|u1")), ValueError),
    (lambda: ck.gemm_w4a16(X16, W4D, S16, group_size=48), ValueError),
    (lambda: ck.gemm_w4a16(X16, W4D, S16, bias=FakeCudaArray((7,), "<f2")), ValueError),
], ids=["int16", "float32", "sliced", "3d", "empty", "cai-strided", "layout", "scaled-uint8",
        "activation", "out_dtype", "scaled-layout", "linear-float64",
        "linear-uint16", "linear-activation", "int8_matmul-float32", "w4a16-float64",
        "w4a16-uint16", "w4a16-activation", "w4a16-w-unpacked", "w4a16-w-int8",
        "w4a16-scales-count", "w4a16-scales-float32", "w4a16-zeros-int8", "w4a16-zeros-count",
        "w4a16-group_size", "w4a16-bias-count"])
def test_wrapper_gemm_rejects_before_any_copy(lib, call, error):
    with pytest.raises(error):
        call()


def test_wrapper_accepts_contiguous_strides_of_unit_dimensions():
    assert ck._c_contiguous((1, 8), (999, 4), 4)
    assert ck._c_contiguous((4, 8), (32, 4), 4)
    assert not ck._c_contiguous((4, 8), (4, 16), 4)


def test_wrapper_bf16_needs_two_byte_integers(lib):
    with pytest.raises(TypeError):
        ck.quantize_int8(np.zeros((2, 2), np.float16), dtype="bf16")
    with pytest.raises(TypeError):
        ck.quantize_int8(np.zeros((2, 2), np.float32), dtype="fp16")


def test_device_array_interface():
    array = ck.DeviceArray(X, (3, 5), np.uint16, ck_dtype=DType.BF16)
    cai = array.__cuda_array_interface__
    assert cai == dict(shape=(3, 5), typestr="<u2", data=(X, False), strides=None, version=3)
    assert array.ck_dtype == DType.BF16 and array.nbytes == 30
    array.stream = 0
    assert array.__cuda_array_interface__["stream"] == 1, "0 is not allowed: legacy stream is 1"
    array.free()   # not owning: nothing happens
    array.free()
    assert ck.DeviceArray(X, (2,), np.float32).ck_dtype == DType.FP32
    assert ck.DeviceArray(X, (2,), np.uint16).ck_dtype is None
    with pytest.raises(ValueError):
        ck.DeviceArray(X, (2,), np.float32, ck_dtype=DType.BF16)


# ------------------------------------------------------------------------------------------------
# The wrapper's plumbing on a GPU (skipped without one). The kernels' numbers are checked
# against tests/reference.py in test_quantize_gpu.py; here each convenience path (NumPy in,
# CUDA arrays in, out=, streams, 1-D, static scales) must give bitwise what the raw level gives.
# ------------------------------------------------------------------------------------------------
def as_bf16_bits(x):
    """bfloat16 bit patterns of float32 x (truncated: any bf16 values will do here)."""
    return (np.ascontiguousarray(x, np.float32).view(np.uint32) >> 16).astype(np.uint16)


def make_input(rng, shape, dtype):
    x = rng.standard_normal(shape).astype(np.float32) * 3
    if dtype == DType.FP16:
        return x.astype(np.float16)
    if dtype == DType.BF16:
        return as_bf16_bits(x)
    return x


FLOAT_DTYPES = [DType.FP32, DType.FP16, DType.BF16]
DTYPE_ARG = {DType.FP32: None, DType.FP16: None, DType.BF16: "bf16"}


def raw_quantize_int8(x, ck_dtype, granularity):
    rows, cols = x.shape
    xd = ck.DeviceArray.from_numpy(x)
    q = ck.DeviceArray.empty((rows, cols), np.int8).fill_byte(0x7F)
    s = ck.DeviceArray.empty((1 if granularity == ck.PER_TENSOR else rows,), np.float32)
    ck.raw.quantize_int8(xd.ptr, ck_dtype, rows, cols, granularity, ck.DYNAMIC, s.ptr, q.ptr)
    return q.to_numpy(), s.to_numpy()


def raw_quantize_int4(x, ck_dtype, group_size, mode):
    rows, cols = x.shape
    groups = ck.raw.int4_groups_per_row(cols, group_size)
    xd = ck.DeviceArray.from_numpy(x)
    p = ck.DeviceArray.empty((rows, (cols + 1) // 2), np.uint8)
    s = ck.DeviceArray.empty((rows, groups), x.dtype)
    z = ck.DeviceArray.empty((rows, groups), np.uint8) if mode == ck.INT4_ASYMMETRIC else None
    ck.raw.quantize_int4(xd.ptr, ck_dtype, rows, cols, group_size, mode, p.ptr, s.ptr,
                         z.ptr if z is not None else 0)
    return p.to_numpy(), s.to_numpy(), (z.to_numpy() if z is not None else None)


def assert_same(actual, expected, what):
    actual = actual.to_numpy() if isinstance(actual, ck.DeviceArray) else np.asarray(actual)
    assert actual.dtype == expected.dtype and actual.shape == expected.shape, \
        "%s: %s %s != %s %s" % (what, actual.dtype, actual.shape, expected.dtype, expected.shape)
    assert np.array_equal(actual.view(np.uint8), expected.view(np.uint8)), "%s differs" % what


@pytest.mark.gpu
@pytest.mark.parametrize("granularity", ["tensor", "row"])
@pytest.mark.parametrize("ck_dtype", FLOAT_DTYPES, ids=lambda d: d.name)
def test_wrapper_int8_paths_agree(ck_dtype, granularity):
    rng = np.random.default_rng(1)
    x = make_input(rng, (7, 300), ck_dtype)
    gran = ck.PER_TENSOR if granularity == "tensor" else ck.PER_ROW
    want_q, want_s = raw_quantize_int8(x, ck_dtype, gran)
    dtype = DTYPE_ARG[ck_dtype]

    q, s = ck.quantize_int8(x, granularity=granularity, dtype=dtype)          # NumPy
    assert_same(q, want_q, "numpy q")
    assert_same(s, want_s, "numpy scales")

    xd = ck.DeviceArray.from_numpy(x, ck_dtype=ck_dtype)                      # CUDA array
    qd, sd = ck.quantize_int8(xd, granularity=granularity)
    assert isinstance(qd, ck.DeviceArray) and isinstance(sd, ck.DeviceArray)
    assert_same(qd, want_q, "device q")
    assert_same(sd, want_s, "device scales")

    q_out, s_out = np.empty_like(want_q), np.empty_like(want_s)               # out=
    result = ck.quantize_int8(x, granularity=granularity, dtype=dtype, out=(q_out, s_out))
    assert result[0] is q_out and result[1] is s_out
    assert_same(q_out, want_q, "out= q")

    q_static, s_static = ck.quantize_int8(x, granularity=granularity, dtype=dtype, scales=want_s)
    assert_same(q_static, want_q, "static scales reproduce dynamic q")
    assert s_static is want_s

    for out_dtype, np_dtype in (("fp32", np.float32), ("fp16", np.float16), ("bf16", np.uint16)):
        host = ck.dequantize_int8(want_q, want_s, granularity=granularity, out_dtype=out_dtype)
        dev = ck.dequantize_int8(qd, sd, out_dtype=out_dtype)                 # inferred granularity
        assert host.dtype == np_dtype and host.shape == x.shape
        assert_same(dev, host, "dequantize %s" % out_dtype)
        if out_dtype == "bf16":
            assert dev.ck_dtype == DType.BF16


@pytest.mark.gpu
@pytest.mark.parametrize("symmetric", [True, False], ids=["sym", "asym"])
@pytest.mark.parametrize("group_size", [32, 128, ck.GROUP_ROW])
@pytest.mark.parametrize("ck_dtype", FLOAT_DTYPES, ids=lambda d: d.name)
def test_wrapper_int4_paths_agree(ck_dtype, group_size, symmetric):
    rng = np.random.default_rng(2)
    x = make_input(rng, (5, 259), ck_dtype)
    mode = ck.INT4_SYMMETRIC if symmetric else ck.INT4_ASYMMETRIC
    want_p, want_s, want_z = raw_quantize_int4(x, ck_dtype, group_size, mode)
    dtype = DTYPE_ARG[ck_dtype]

    p, s, z = ck.quantize_int4(x, group_size=group_size, symmetric=symmetric, dtype=dtype)
    assert_same(p, want_p, "numpy packed")
    assert_same(s, want_s, "numpy scales")
    assert (z is None) == symmetric
    if not symmetric:
        assert_same(z, want_z, "numpy zeros")

    xd = ck.DeviceArray.from_numpy(x, ck_dtype=ck_dtype)
    pd, sd, zd = ck.quantize_int4(xd, group_size=group_size, symmetric=symmetric)
    assert_same(pd, want_p, "device packed")
    assert sd.ck_dtype == ck_dtype

    out_dtype = "bf16" if ck_dtype == DType.BF16 else None
    host = ck.dequantize_int4(want_p, want_s, want_z, cols=259, group_size=group_size,
                              out_dtype=out_dtype)
    dev = ck.dequantize_int4(pd, sd, zd, cols=259, group_size=group_size)
    assert host.shape == x.shape and host.dtype == x.dtype
    assert_same(dev, host, "dequantize_int4 device vs numpy")


@pytest.mark.gpu
def test_wrapper_one_dimensional_and_scalar_scale():
    x = np.linspace(-2, 2, 1001, dtype=np.float32)
    q, scale = ck.quantize_tensor(x)
    assert q.shape == (1001,) and isinstance(scale, float)
    back = ck.dequantize_tensor(q, scale)
    assert back.shape == (1001,) and back.dtype == np.float32
    assert np.max(np.abs(back - x)) <= scale * 0.5001
    qd, sd = ck.quantize_int8(ck.DeviceArray.from_numpy(x))
    assert qd.shape == (1001,) and sd.shape == (1,)
    # A Python float as the static scale of a device call is uploaded and kept alive.
    q2, s2 = ck.quantize_int8(ck.DeviceArray.from_numpy(x), scales=scale)
    assert isinstance(s2, ck.DeviceArray)
    assert_same(q2, q, "static scalar scale")


@pytest.mark.gpu
def test_wrapper_on_a_non_blocking_stream():
    stream = ck.cuda.stream_create(non_blocking=True)
    try:
        x = np.random.default_rng(3).standard_normal((64, 4096)).astype(np.float32)
        want_q, want_s = raw_quantize_int8(x, DType.FP32, ck.PER_ROW)
        q, s = ck.quantize_int8(x, granularity="row", stream=stream)       # NumPy on a stream
        assert_same(q, want_q, "numpy on a stream")
        xd = ck.DeviceArray.from_numpy(x)
        qd, sd = ck.quantize_int8(xd, granularity="row", stream=stream)
        assert qd.stream == stream and qd.__cuda_array_interface__["stream"] == stream
        assert_same(qd, want_q, "device on a stream")                     # to_numpy waits for it
    finally:
        ck.cuda.stream_synchronize(stream)
        ck.cuda.stream_destroy(stream)


@pytest.mark.gpu
def test_wrapper_uses_foreign_cuda_arrays_in_place():
    x = np.random.default_rng(4).standard_normal((4, 64)).astype(np.float16)
    xd = ck.DeviceArray.from_numpy(x)
    q_buffer = ck.DeviceArray.empty((4, 64), np.int8).fill_byte(0)
    foreign_x = FakeCudaArray((4, 64), "<f2", strides=(128, 2), ptr=xd.ptr)
    foreign_q = FakeCudaArray((4, 64), "|i1", ptr=q_buffer.ptr)
    q, s = ck.quantize_int8(foreign_x, granularity="row", out=(foreign_q, None))
    assert q is foreign_q and isinstance(s, ck.DeviceArray)
    want_q, _ = raw_quantize_int8(x, DType.FP16, ck.PER_ROW)
    assert_same(q_buffer, want_q, "written in place")


@pytest.mark.gpu
def test_wrapper_torch_interop():
    torch = pytest.importorskip("torch")
    x = torch.randn(8, 256, device="cuda", dtype=torch.float16)
    q, s = ck.quantize_int8(x, granularity="row")
    qt = torch.as_tensor(q, device="cuda")
    assert qt.dtype == torch.int8 and tuple(qt.shape) == (8, 256)
    want_q, _ = raw_quantize_int8(x.cpu().numpy(), DType.FP16, ck.PER_ROW)
    assert np.array_equal(qt.cpu().numpy(), want_q)
    # bfloat16 tensors (CAI typestr "|V2"), directly or as their int16 bits with dtype="bf16".
    xb = x.to(torch.bfloat16)
    bits = xb.view(torch.int16).cpu().numpy().view(np.uint16)
    want_qb = raw_quantize_int8(bits, DType.BF16, ck.PER_ROW)[0]
    for tensor, dtype in ((xb, None), (xb.view(torch.int16), "bf16")):
        qb, _ = ck.quantize_int8(tensor, granularity="row", dtype=dtype)
        assert np.array_equal(torch.as_tensor(qb, device="cuda").cpu().numpy(), want_qb)
    packed, scales, zeros = ck.quantize_int4(xb, group_size=64, symmetric=False)
    assert scales.dtype == np.uint16 and scales.ck_dtype == DType.BF16
    back = ck.dequantize_int4(packed, scales, zeros, cols=256, group_size=64)
    assert back.ck_dtype == DType.BF16 and back.shape == (8, 256)


@pytest.mark.gpu
def test_graph_capture_defers_frees_and_replays():
    stream = ck.cuda.stream_create()
    x = ck.DeviceArray.from_numpy(np.arange(-64, 64, dtype=np.float32).reshape(2, 64))
    q = ck.DeviceArray.empty((2, 64), np.int8)
    s = ck.DeviceArray.empty((2,), np.float32)
    scratch = ck.DeviceArray.empty((16,), np.float32)
    try:
        with ck.cuda.graph_capture(stream) as graph:
            ck.raw.quantize_int8(x.ptr, DType.FP32, 2, 64, ck.PER_ROW, ck.DYNAMIC, s.ptr, q.ptr,
                                 stream)
            scratch.free()     # cudaFree would invalidate the capture: it waits until the end
            del scratch
        q.fill_byte(0x80)              # -128: a code the kernel never writes
        ck.cuda.device_synchronize()
        assert (q.to_numpy() == -128).all(), "capture records, it does not run"
        graph.launch(stream)
        ck.cuda.stream_synchronize(stream)
        assert q.to_numpy()[0, 0] == -127 and q.to_numpy()[1, -1] == 127
        graph.close()
        graph.close()
        with pytest.raises(RuntimeError):
            graph.launch(stream)
    finally:
        ck.cuda.stream_destroy(stream)


@pytest.mark.gpu
@pytest.mark.cuda_api_error
def test_graph_capture_of_the_legacy_stream_raises():
    with pytest.raises(ck.CUDAError):          # the legacy stream cannot be captured
        with ck.cuda.graph_capture(0):
            pass
