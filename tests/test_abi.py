"""The C ABI through ctypes, on the host alone (no GPU needed, none touched; the wrapper on a GPU:
test_wrapper_gpu.py).

- the wrapper's table of declarations matches cuda_kernels.h (types and argument names), every
  export loads, and the raw level has one function per export with the table's arguments;
- versions, status names and enum values agree between the header, the library and the wrapper;
- every entry point rejects every kind of bad argument with the documented status and a message
  that names the offending argument (validation runs before any CUDA call, so fake device
  addresses are safe here: nothing is ever launched);
- the GEMM rules (K and N multiples, alignment, NULL bias allowed) and the kernel overrides
  (CK_GEMM_INT8_KERNEL, CK_GEMM_FP8_KERNEL, CK_GEMM_W4A8_KERNEL, CK_GEMM_INT4_KERNEL,
  CK_GEMM_W4A16_KERNEL, CK_GEMM_BLOCK4_KERNEL, CK_GEMM_SPARSE_KERNEL), one table row each: unknown
  names are rejected; valid-but-unusual arguments pass validation (proved by planting the
  override's error, which the library reports only after validation); argument errors come
  first; each entry point reads its own override only;
- error messages are per thread;
- ck_int4_groups_per_row, the prepacked W4A16, sparse and MoE sizes and the MoE workspace
  query;
- the parameter structs (MoE, attention, decode, KV cache append, Q/K/V): the wrapper's classes
  have the header's fields, in its order, with the C compiler's offsets; a struct_size of an
  earlier version of a struct (the first ck_attention_decode_params_t) is accepted, its
  appended fields unread;
- the wrapper's own host-side checks (contiguity, shapes) and its loading errors.

Each bad-argument case changes one argument of a call that would otherwise be valid.
"""
import ctypes
import inspect
import os
import re
import shutil
import subprocess
import sys
import threading
import typing

import numpy as np
import pytest

import cuda_wrapper as ck
from cuda_wrapper import CKError, DType, Status
from gpu_support import FakeCudaArray
from reference import block4_prepacked_sizes, w4a16_prepacked_sizes

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HEADER = os.path.join(REPO_ROOT, "cuda_kernels.h")


# ------------------------------------------------------------------------------------------------
# The header, parsed
# ------------------------------------------------------------------------------------------------
def header_text():
    text = open(HEADER).read()
    text = re.sub(r"/\*.*?\*/", " ", text, flags=re.S)
    return re.sub(r"//[^\n]*", " ", text)


def header_functions():
    """[(name, return type, [(parameter type, parameter name)])] of every CK_API function."""
    functions = []
    for ret, name, params in re.findall(r"\bCK_API\s+([^;(]*?)\s*\b(ck_\w+)\s*\(([^)]*)\)\s*;",
                                        header_text()):
        params = " ".join(params.split())
        typed = []
        if params != "void":
            for param in params.split(","):
                c_type, c_name = re.match(r"(.*?)\s*\b(\w+)$", param.strip()).groups()
                typed.append((c_type.replace(" *", "*"), c_name))
        functions.append((name, " ".join(ret.split()).replace(" *", "*"), typed))
    return functions


def header_declarations():
    """{name: (return type, [parameter types])} of every CK_API function."""
    return {name: (ret, [c_type for c_type, _ in params])
            for name, ret, params in header_functions()}


def header_parameter_names():
    """{name: [parameter names]} of every CK_API function."""
    return {name: [c_name for _, c_name in params] for name, _, params in header_functions()}


def header_enum(prefix):
    """{SUFFIX: value} for the enumerators CK_<prefix>_<SUFFIX> = value."""
    return {m.group(1): int(m.group(2))
            for m in re.finditer(r"\bCK_%s_(\w+)\s*=\s*(-?\d+)" % prefix, header_text())}


def header_macro(name):
    return int(re.search(r"#define %s \(?(-?\d+)\)?" % name, open(HEADER).read()).group(1))


DECLARATIONS = header_declarations()
PARAMETER_NAMES = header_parameter_names()
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
    if c_type == "size_t":
        return ctypes.c_size_t
    if c_type == "int" or re.fullmatch(r"ck_\w+_t", c_type):   # enums are int-sized
        return ctypes.c_int
    raise AssertionError("no rule for the C type %r: extend expected_ctype" % c_type)


def test_header_parses():
    assert "ck_quantize_int4" in DECLARATIONS
    assert DECLARATIONS["ck_quantize_int4"][1][:3] == ["const void*", "ck_dtype_t", "int64_t"]
    assert DECLARATIONS["ck_version"] == ("int", [])


def test_wrapper_declares_exactly_the_header():
    assert sorted(ck.DECLARATIONS) == sorted(DECLARATIONS)


def header_name_of(param, c_type):
    """The header's name of a DECLARATIONS argument (name, ctype[, header's name]): its third
    field, else its name less the "_ptr" a device pointer takes at the raw level."""
    if len(param) == 3:
        return param[2]
    return param[0][:-len("_ptr")] if is_device_pointer(param[1], c_type) else param[0]


def is_device_pointer(py_type, c_type):
    """A pointer argument of an entry point is a device address (an int at the raw level), but
    the stream (a handle) and ck_device_count's int* (host memory it writes) are not."""
    return py_type is ctypes.c_void_p and c_type != "ck_stream_t"


@pytest.mark.parametrize("name", sorted(DECLARATIONS))
def test_wrapper_declaration_matches_header(name):
    c_ret, c_params = DECLARATIONS[name]
    restype, params = ck.DECLARATIONS[name]
    assert restype == expected_ctype(c_ret, True), "return type of %s" % name
    assert len(params) == len(c_params), "%s takes %d arguments" % (name, len(c_params))
    for i, (c_type, c_name, param) in enumerate(zip(c_params, PARAMETER_NAMES[name], params)):
        assert len(param) in (2, 3), "%s argument %d: (name, ctype[, header's name])" % (name, i)
        arg, py_type = param[:2]
        want = expected_ctype(c_type, False)
        if want == "pointer":
            ok = py_type is ctypes.c_void_p or issubclass(py_type, ctypes._Pointer)
        else:
            ok = py_type is want
        assert ok, "%s argument %d (%s) is declared %s" % (name, i, c_type, py_type.__name__)
        # Names: the header's, with "_ptr" for a device pointer (and no other argument).
        assert arg.endswith("_ptr") == is_device_pointer(py_type, c_type), \
            "%s argument %d (%s %s) is named %s" % (name, i, c_type, c_name, arg)
        assert header_name_of(param, c_type) == c_name, \
            "%s argument %d is the header's %s, not %s" % (name, i, c_name, arg)
        if len(param) == 3:
            assert param[2] != header_name_of(param[:2], c_type), \
                "%s argument %d: the header's name needs saying only where it differs" % (name, i)


# Arguments that the raw level returns instead of taking them (the raw functions of
# ck_device_count and the workspace size queries are written out, as are those that decode a string:
# ck_status_string, ck_last_error_message).
OUT_PARAMETERS = {"ck_device_count": ["count"], "ck_moe_workspace_size": ["bytes"],
                  "ck_attention_decode_workspace_size": ["bytes"]}


@pytest.mark.parametrize("name", sorted(DECLARATIONS))
def test_raw_function_of_each_export(name):
    """raw.<name less ck_> takes the table's arguments by their names, stream=0 by default."""
    function = getattr(ck.raw, name[len("ck_"):])
    arguments = [param[0] for param in ck.DECLARATIONS[name][1]
                 if param[0] not in OUT_PARAMETERS.get(name, ())]
    parameters = inspect.signature(function).parameters
    assert list(parameters) == arguments
    for arg, parameter in parameters.items():
        assert parameter.default == (0 if arg == "stream" else inspect.Parameter.empty), arg
    assert function.__name__ == name[len("ck_"):]
    assert function.__doc__.startswith(name), function.__doc__


# ------------------------------------------------------------------------------------------------
# Parameter structs: the wrapper's ctypes.Structure against the header's typedef
# ------------------------------------------------------------------------------------------------
def header_struct(tag):
    """[(C type, field name)] of `typedef struct <tag> { ... }` in the header, in order."""
    body = re.search(r"typedef struct %s \{(.*?)\}\s*\w+\s*;" % tag, header_text(), re.S).group(1)
    fields = []
    for declaration in body.split(";"):
        declaration = " ".join(declaration.split())
        if declaration:
            c_type, name = re.match(r"(.*?)\s*\b(\w+)$", declaration).groups()
            fields.append((c_type.replace(" *", "*"), name))
    return fields


def expected_field_ctype(c_type):
    """The ctypes type of a struct field of the header's C type: pointers are c_void_p (ints
    in Python), enums int-sized."""
    if c_type.endswith("*"):
        return ctypes.c_void_p
    fixed = {"size_t": ctypes.c_size_t, "int64_t": ctypes.c_int64, "int32_t": ctypes.c_int32,
             "float": ctypes.c_float}
    if c_type in fixed:
        return fixed[c_type]
    if re.fullmatch(r"ck_\w+_t", c_type):
        return ctypes.c_int
    raise AssertionError("no rule for the field type %r: extend expected_field_ctype" % c_type)


# The header's parameter structs and the wrapper's ctypes.Structure of each.
PARAM_STRUCTS = [("ck_moe_params", ck.MoeParams), ("ck_attention_params", ck.AttentionParams),
                 ("ck_attention_decode_params", ck.AttentionDecodeParams),
                 ("ck_kv_cache_append_params", ck.KvCacheAppendParams),
                 ("ck_qkv_params", ck.QkvParams)]


@pytest.mark.parametrize("tag, cls", PARAM_STRUCTS)
def test_params_fields_match_header(tag, cls):
    fields = header_struct(tag)
    assert [name for _, name in fields] == [name for name, _ in cls._fields_]
    for (c_type, name), (_, py_type) in zip(fields, cls._fields_):
        assert py_type is expected_field_ctype(c_type), "%s (%s) is declared %s" % (
            name, c_type, py_type.__name__)
    assert fields[0] == ("size_t", "struct_size"), "the first field is size_t struct_size"
    assert cls().struct_size == ctypes.sizeof(cls)
    assert cls(struct_size=8).struct_size == 8


@pytest.mark.parametrize("tag, cls", PARAM_STRUCTS)
def test_params_layout_matches_the_c_compiler(tmp_path, tag, cls):
    """sizeof and every field's offset as the C compiler lays the struct out."""
    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        pytest.skip("no C compiler")
    names = [name for name, _ in cls._fields_]
    program = tmp_path / "layout.c"
    program.write_text(
        "#include <stddef.h>\n#include <stdio.h>\n#include \"cuda_kernels.h\"\n"
        "int main(void) {\n  printf(\"%%zu\\n\", sizeof(%s_t));\n%s  return 0;\n}\n"
        % (tag, "".join("  printf(\"%%zu\\n\", offsetof(%s_t, %s));\n" % (tag, name)
                        for name in names)))
    binary = tmp_path / "layout"
    subprocess.run([compiler, "-std=c99", "-I", REPO_ROOT, str(program), "-o", str(binary)],
                   check=True, capture_output=True)
    sizes = [int(v) for v in subprocess.run([str(binary)], check=True, capture_output=True,
                                             text=True).stdout.split()]
    assert sizes[0] == ctypes.sizeof(cls)
    assert dict(zip(names, sizes[1:])) == {name: getattr(cls, name).offset for name in names}


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
    assert (ck.PER_BLOCK_1X128, ck.PER_BLOCK_128X128) == (
        header_macro_enum("CK_PER_BLOCK_1X128"), header_macro_enum("CK_PER_BLOCK_128X128"))
    assert header_enum("FP8") == {"E4M3": ck.FP8_E4M3, "E5M2": ck.FP8_E5M2}
    assert (ck.STATIC, ck.DYNAMIC) == (header_macro_enum("CK_SCALE_STATIC"),
                                       header_macro_enum("CK_SCALE_DYNAMIC"))
    assert (ck.INT4_SYMMETRIC, ck.INT4_ASYMMETRIC) == (header_macro_enum("CK_INT4_SYMMETRIC"),
                                                       header_macro_enum("CK_INT4_ASYMMETRIC"))
    assert ck.GROUP_ROW == header_macro("CK_GROUP_ROW")
    assert header_enum("BLOCK4") == {"NF4": ck.BLOCK4_NF4, "MXFP4": ck.BLOCK4_MXFP4,
                                     "NVFP4": ck.BLOCK4_NVFP4}
    assert header_enum("WEIGHT4") == {"INT4": ck.WEIGHT4_INT4, "NF4": ck.WEIGHT4_NF4,
                                      "MXFP4": ck.WEIGHT4_MXFP4, "NVFP4": ck.WEIGHT4_NVFP4}
    assert header_enum("ROPE") == {"NONE": ck.ROPE_NONE, "NEOX": ck.ROPE_NEOX,
                                   "INTERLEAVED": ck.ROPE_INTERLEAVED}
    assert header_enum("KV") == {"DTYPE": ck.KV_DTYPE, "FP8_E4M3": ck.KV_FP8_E4M3,
                                 "INT8": ck.KV_INT8, "SCALE_PER_HEAD": ck.KV_SCALE_PER_HEAD,
                                 "SCALE_PER_TOKEN": ck.KV_SCALE_PER_TOKEN}


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
NOT_HALF_DTYPES = [DType.FP32] + NOT_FLOAT_DTYPES   # the W4A16 GEMMs and importers: fp16, bf16
BAD_GROUP_SIZES = [48, 0, 256, 16, 1, 4096, -2]
# INT8 and the integer GEMMs take CK_PER_TENSOR and CK_PER_ROW: the block granularities (FP8's)
# are rejected as any value outside the enum is.
BAD_INT_GRANULARITIES = [ck.PER_BLOCK_1X128, ck.PER_BLOCK_128X128, 4, -1, 99]

# Each row: (id, changed arguments, status, names the message must contain as words). A value
# written as name=value in the changes must also appear in the message when it is an int.


def bad(arg, values, status):
    """One row per value of the argument `arg`, each naming it: ("arg=value", ...)."""
    return [("%s=%s" % (arg, value.name if isinstance(value, DType) else value), {arg: value},
             status, [arg]) for value in values]


def null(*names):
    """One row per pointer argument (named as in the header; x_ptr at the raw level) set to NULL."""
    return [("null-%s" % name, {name + "_ptr": 0}, INVALID, [name]) for name in names]


def bad_dtypes(arg, unsupported=NOT_FLOAT_DTYPES):
    """A dtype argument: values that are no ck_dtype_t, and dtypes the entry point does not take."""
    return bad(arg, UNKNOWN_DTYPES, INVALID) + bad(arg, unsupported, UNSUPPORTED)


def rows_cols_cases(rows, cols, **wide):
    """Bad rows and cols, and rows * cols overflowing int64, or only its byte count (for 4-byte
    elements: `wide` says how to get them)."""
    return (bad("rows", rows, INVALID) + bad("cols", cols, INVALID)
            + [("overflow-elements", dict(rows=BIG, cols=BIG), INVALID, ["rows", "cols"]),
               ("overflow-bytes", dict(rows=HALF_BIG, cols=HALF_BIG, **wide), INVALID,
                ["rows", "cols"])])


def int4_format_cases():
    """What both INT4 (de)quantizers check of the format: the codes and the scales (NULL), the
    zero points (NULL or given, against the mode), the mode and the group size."""
    return ([("null-q_packed", dict(q_ptr=0), INVALID, ["q_packed"]),
             ("null-scales", dict(scales_ptr=0), INVALID, ["scales"]),
             ("null-zeros-asymmetric", dict(mode=ck.INT4_ASYMMETRIC), INVALID, ["zeros"]),
             ("zeros-symmetric", dict(zeros_ptr=Z), INVALID, ["zeros"])]
            + bad("mode", (2, -1), INVALID)
            + bad("group_size", BAD_GROUP_SIZES, UNSUPPORTED))


QUANTIZE_INT8 = dict(x_ptr=X, x_dtype=DType.FP32, rows=4, cols=64, granularity=ck.PER_ROW,
                     scale_mode=ck.DYNAMIC, scales_ptr=S, q_ptr=Q)
QUANTIZE_INT8_CASES = (
    null("x", "q")
    + [("null-scales-dynamic", dict(scales_ptr=0), INVALID, ["scales"]),
       ("null-scales-static", dict(scales_ptr=0, scale_mode=ck.STATIC), INVALID, ["scales"])]
    + bad_dtypes("x_dtype")
    + bad("granularity", BAD_INT_GRANULARITIES, INVALID)
    + bad("scale_mode", (2, -1), INVALID)
    + rows_cols_cases((0, -1, -2**63), (0, -5))
    + [("misaligned-x-fp32", dict(x_ptr=X + 2), MISALIGNED, ["x"]),
       ("misaligned-x-fp16", dict(x_ptr=X + 1, x_dtype=DType.FP16), MISALIGNED, ["x"]),
       ("misaligned-x-bf16", dict(x_ptr=X + 1, x_dtype=DType.BF16), MISALIGNED, ["x"]),
       ("misaligned-scales", dict(scales_ptr=S + 2), MISALIGNED, ["scales"]),
       ("misaligned-scales-static", dict(scales_ptr=S + 1, scale_mode=ck.STATIC,
                                         granularity=ck.PER_TENSOR), MISALIGNED, ["scales"])]
)

DEQUANTIZE_INT8 = dict(q_ptr=Q, scales_ptr=S, rows=4, cols=64, granularity=ck.PER_ROW, out_ptr=O,
                       out_dtype=DType.FP32)
DEQUANTIZE_INT8_CASES = (
    null("q", "scales", "out")
    + bad_dtypes("out_dtype")
    + bad("granularity", BAD_INT_GRANULARITIES, INVALID)
    + rows_cols_cases((0, -3), (0, -1))
    + [("misaligned-scales", dict(scales_ptr=S + 2), MISALIGNED, ["scales"]),
       ("misaligned-out-fp32", dict(out_ptr=O + 2), MISALIGNED, ["out"]),
       ("misaligned-out-fp16", dict(out_ptr=O + 1, out_dtype=DType.FP16), MISALIGNED, ["out"]),
       ("misaligned-out-bf16", dict(out_ptr=O + 1, out_dtype=DType.BF16), MISALIGNED, ["out"])]
)

# FP8: q takes any address, scales are float32; the scales' byte count overflows int64 where the
# matrix of 2-byte elements does not (a [rows, 1] matrix has rows scales of 4 bytes).
QUANTIZE_FP8 = dict(x_ptr=X, x_dtype=DType.BF16, rows=300, cols=1000, format=ck.FP8_E4M3,
                    granularity=ck.PER_BLOCK_1X128, scale_mode=ck.DYNAMIC, scales_ptr=S, q_ptr=Q)
FP8_SCALES_OVERFLOW = dict(rows=2**61, cols=1, granularity=ck.PER_ROW)
QUANTIZE_FP8_CASES = (
    null("x", "scales", "q")
    + [("null-scales-static", dict(scales_ptr=0, scale_mode=ck.STATIC), INVALID, ["scales"])]
    + bad_dtypes("x_dtype")
    + bad("format", (2, -1, 99), INVALID)
    + bad("granularity", (4, -1, 99), INVALID)
    + bad("scale_mode", (2, -1), INVALID)
    + rows_cols_cases((0, -1, -2**63), (0, -5), x_dtype=DType.FP32)
    + [("overflow-scales-row", FP8_SCALES_OVERFLOW, INVALID, ["rows", "cols"]),
       ("overflow-scales-1x128", dict(FP8_SCALES_OVERFLOW, granularity=ck.PER_BLOCK_1X128),
        INVALID, ["rows", "cols"]),
       ("misaligned-x-fp32", dict(x_ptr=X + 2, x_dtype=DType.FP32), MISALIGNED, ["x"]),
       ("misaligned-x-fp16", dict(x_ptr=X + 1, x_dtype=DType.FP16), MISALIGNED, ["x"]),
       ("misaligned-x-bf16", dict(x_ptr=X + 1), MISALIGNED, ["x"]),
       ("misaligned-scales", dict(scales_ptr=S + 2), MISALIGNED, ["scales"]),
       ("misaligned-scales-static", dict(scales_ptr=S + 1, scale_mode=ck.STATIC,
                                         granularity=ck.PER_BLOCK_128X128), MISALIGNED,
        ["scales"])]
)

DEQUANTIZE_FP8 = dict(q_ptr=Q, format=ck.FP8_E5M2, scales_ptr=S, rows=300, cols=1000,
                      granularity=ck.PER_BLOCK_128X128, out_ptr=O, out_dtype=DType.FP16)
DEQUANTIZE_FP8_CASES = (
    null("q", "scales", "out")
    + bad("format", (2, -1), INVALID)
    + bad_dtypes("out_dtype")
    + bad("granularity", (4, -1), INVALID)
    + rows_cols_cases((0, -3), (0, -1), out_dtype=DType.FP32)
    + [("overflow-scales-row", dict(FP8_SCALES_OVERFLOW, out_dtype=DType.BF16), INVALID,
        ["rows", "cols"]),
       ("misaligned-scales", dict(scales_ptr=S + 2), MISALIGNED, ["scales"]),
       ("misaligned-out-fp32", dict(out_ptr=O + 2, out_dtype=DType.FP32), MISALIGNED, ["out"]),
       ("misaligned-out-fp16", dict(out_ptr=O + 1), MISALIGNED, ["out"]),
       ("misaligned-out-bf16", dict(out_ptr=O + 1, out_dtype=DType.BF16), MISALIGNED, ["out"])]
)


QUANTIZE_INT4 = dict(x_ptr=X, x_dtype=DType.FP16, rows=4, cols=256, group_size=128,
                     mode=ck.INT4_SYMMETRIC, q_ptr=Q, scales_ptr=S, zeros_ptr=0)
QUANTIZE_INT4_CASES = (
    null("x")
    + int4_format_cases()
    + bad_dtypes("x_dtype")
    + rows_cols_cases((0, -1), (0, -1), x_dtype=DType.FP32)
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
    null("out")
    + int4_format_cases()
    + bad_dtypes("out_dtype")
    + rows_cols_cases((0, -1), (0, -7), out_dtype=DType.FP32)
    + [("misaligned-scales-fp16", dict(scales_ptr=S + 1), MISALIGNED, ["scales"]),
       ("misaligned-scales-fp32", dict(scales_ptr=S + 2, out_dtype=DType.FP32), MISALIGNED,
        ["scales"]),
       ("misaligned-out-fp16", dict(out_ptr=O + 1), MISALIGNED, ["out"]),
       ("misaligned-out-bf16", dict(out_ptr=O + 1, out_dtype=DType.BF16), MISALIGNED, ["out"]),
       ("misaligned-out-fp32", dict(out_ptr=O + 2, out_dtype=DType.FP32), MISALIGNED, ["out"])]
)

# Block 4-bit formats: packed codes and uint8 scales take any address; NF4's absmax and NVFP4's
# global_scale are float32 (4-byte aligned); x and out are aligned to their element size.
# NF4's absmax [rows, ceil(cols / blocksize)] overflows a byte count where the [rows, 1]
# matrix of 2-byte elements does not.
GS = 0x7F0001500000   # NVFP4's global_scale
BAD_NF4_BLOCK_SIZES = [16, 48, 0, -64, 96, 8192, 1, 4097]


def block4_matrix_cases(dtype_arg, name, base):
    """A block 4-bit call's rules of its elements: the dtype, the shape, and the alignment of
    the element pointer `name` (x or out, at `base`)."""
    ptr = name + "_ptr"
    return (bad_dtypes(dtype_arg)
            + rows_cols_cases((0, -1), (0, -9), **{dtype_arg: DType.FP32})
            + [("misaligned-%s-fp32" % name, {ptr: base + 2, dtype_arg: DType.FP32},
                MISALIGNED, [name]),
               ("misaligned-%s-fp16" % name, {ptr: base + 1, dtype_arg: DType.FP16},
                MISALIGNED, [name]),
               ("misaligned-%s-bf16" % name, {ptr: base + 1, dtype_arg: DType.BF16},
                MISALIGNED, [name])])


def nf4_blocksize_cases():
    return (bad("blocksize", BAD_NF4_BLOCK_SIZES, UNSUPPORTED)
            + [("misaligned-absmax", dict(absmax_ptr=S + 2), MISALIGNED, ["absmax"]),
               ("overflow-absmax-bytes", dict(rows=2**61, cols=1, blocksize=32), INVALID,
                ["rows"])])


QUANTIZE_NF4 = dict(x_ptr=X, x_dtype=DType.FP16, rows=4, cols=256, blocksize=64, packed_ptr=Q,
                    absmax_ptr=S)
QUANTIZE_NF4_CASES = (
    null("x", "packed", "absmax")
    + block4_matrix_cases("x_dtype", "x", X)
    + nf4_blocksize_cases()
)

DEQUANTIZE_NF4 = dict(packed_ptr=Q, absmax_ptr=S, rows=4, cols=256, blocksize=64, out_ptr=O,
                      out_dtype=DType.FP16)
DEQUANTIZE_NF4_CASES = (
    null("packed", "absmax", "out")
    + block4_matrix_cases("out_dtype", "out", O)
    + nf4_blocksize_cases()
)

QUANTIZE_MXFP4 = dict(x_ptr=X, x_dtype=DType.BF16, rows=4, cols=256, packed_ptr=Q, scales_ptr=S)
QUANTIZE_MXFP4_CASES = (
    null("x", "packed", "scales")
    + block4_matrix_cases("x_dtype", "x", X)
)

DEQUANTIZE_MXFP4 = dict(packed_ptr=Q, scales_ptr=S, rows=4, cols=256, out_ptr=O,
                        out_dtype=DType.BF16)
DEQUANTIZE_MXFP4_CASES = (
    null("packed", "scales", "out")
    + block4_matrix_cases("out_dtype", "out", O)
)

QUANTIZE_NVFP4 = dict(x_ptr=X, x_dtype=DType.FP32, rows=4, cols=256, scale_mode=ck.DYNAMIC,
                      global_scale_ptr=GS, packed_ptr=Q, scales_ptr=S)
QUANTIZE_NVFP4_CASES = (
    null("x", "global_scale", "packed", "scales")
    + [("null-global_scale-static", dict(global_scale_ptr=0, scale_mode=ck.STATIC), INVALID,
        ["global_scale"]),
       ("misaligned-global_scale", dict(global_scale_ptr=GS + 2), MISALIGNED, ["global_scale"]),
       ("misaligned-global_scale-static", dict(global_scale_ptr=GS + 1, scale_mode=ck.STATIC),
        MISALIGNED, ["global_scale"])]
    + bad("scale_mode", (2, -1, 99), INVALID)
    + block4_matrix_cases("x_dtype", "x", X)
)

DEQUANTIZE_NVFP4 = dict(packed_ptr=Q, scales_ptr=S, global_scale_ptr=GS, rows=4, cols=256,
                        out_ptr=O, out_dtype=DType.FP32)
DEQUANTIZE_NVFP4_CASES = (
    null("packed", "scales", "global_scale", "out")
    + [("misaligned-global_scale", dict(global_scale_ptr=GS + 2), MISALIGNED, ["global_scale"])]
    + block4_matrix_cases("out_dtype", "out", O)
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
        bad("m", (0, -1, -2**63), INVALID)
        + bad("n", (0, -3), INVALID)
        + bad("k", (0, -16), INVALID)
        + [("overflow-mk", dict(m=BIG, k=BIG), INVALID, ["m", "k"]),
           ("overflow-nk", dict(n=BIG, k=BIG), INVALID, ["n", "k"]),
           ("overflow-mn-bytes", dict(m=HALF_BIG, n=HALF_BIG), INVALID, ["m", "n"])])
    if k_rule:
        cases += bad("k", BAD_GEMM_K, UNSUPPORTED)
        cases += [("kn-n=%d" % v, dict(b_layout=KN, n=v), UNSUPPORTED, ["n"]) for v in BAD_KN_N]
        cases += [("kn-k=24", dict(b_layout=KN, k=24), UNSUPPORTED, ["k"])]
    return cases


def gemm_operand_cases():
    """What both INT8 GEMMs check on a and b."""
    return (
        null("a", "b")
        + bad("b_layout", BAD_LAYOUTS, INVALID)
        + [("misaligned-a+%d" % d, dict(a_ptr=A + d), MISALIGNED, ["a"]) for d in (1, 4, 8)]
        + [("misaligned-b+%d" % d, dict(b_ptr=B + d), MISALIGNED, ["b"]) for d in (1, 2, 8)]
        + [("misaligned-b-kn", dict(b_ptr=B + 4, b_layout=KN), MISALIGNED, ["b"])]
    )


GEMM_INT8 = dict(a_ptr=A, b_ptr=B, b_layout=NK, m=4, n=64, k=64, c_ptr=C)
GEMM_INT8_CASES = (
    gemm_operand_cases() + gemm_shape_cases()
    + null("c")
    + [("misaligned-c+%d" % d, dict(c_ptr=C + d), MISALIGNED, ["c"]) for d in (1, 2, 3)]
)

INT8_PREPACK = dict(b_kn_ptr=B, k=64, n=32, b_nk_ptr=O)
INT8_PREPACK_CASES = (
    null("b_kn", "b_nk")
    + bad("k", (0, -16), INVALID)
    + bad("n", (0, -1), INVALID)
    + [("overflow-bytes", dict(k=BIG, n=BIG), INVALID, ["k", "n"]),
       ("k-not-16", dict(k=40), UNSUPPORTED, ["k", "16"]),
       ("n-not-16", dict(n=24), UNSUPPORTED, ["n", "16"]),
       ("misaligned-b_kn+8", dict(b_kn_ptr=B + 8), MISALIGNED, ["b_kn"]),
       ("misaligned-b_nk+1", dict(b_nk_ptr=O + 1), MISALIGNED, ["b_nk"]),
       ("overlapping", dict(b_nk_ptr=B + 256), INVALID, ["b_nk", "b_kn"])]
)

GEMM_INT8_SCALED = dict(a_ptr=A, b_ptr=B, b_layout=NK, m=4, n=64, k=64, scale_a_ptr=SA,
                        a_granularity=ck.PER_ROW, scale_b_ptr=SB, b_granularity=ck.PER_ROW,
                        bias_ptr=BIAS, activation=ck.ACTIVATION_RELU, out_ptr=O,
                        out_dtype=DType.FP16)


def scaled_epilogue_cases(bad_granularities=BAD_INT_GRANULARITIES):
    """What the INT8 and FP8 GEMMs with the scaled epilogue check of it."""
    return (
        null("out", "scale_a", "scale_b")
        + bad_dtypes("out_dtype")
        + bad("a_granularity", bad_granularities, INVALID)
        + bad("b_granularity", bad_granularities, INVALID)
        + bad("activation", BAD_ACTIVATIONS, INVALID)
        + SCALED_EPILOGUE_ALIGNMENT_CASES)


SCALED_EPILOGUE_ALIGNMENT_CASES = [
       ("misaligned-out-fp16", dict(out_ptr=O + 1), MISALIGNED, ["out"]),
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

GEMM_INT8_SCALED_CASES = (
    gemm_operand_cases() + gemm_shape_cases() + scaled_epilogue_cases())

# FP8 E4M3 operands [M, K] and [N, K] (no layout argument), the epilogue of GEMM_INT8_SCALED.
GEMM_FP8_SCALED = {key: value for key, value in GEMM_INT8_SCALED.items() if key != "b_layout"}
GEMM_FP8_SCALED_CASES = (
    null("a", "b")
    + [("misaligned-a+%d" % d, dict(a_ptr=A + d), MISALIGNED, ["a"]) for d in (1, 4, 8)]
    + [("misaligned-b+%d" % d, dict(b_ptr=B + d), MISALIGNED, ["b"]) for d in (1, 2, 8)]
    + gemm_shape_cases(k_rule=False) + bad("k", BAD_GEMM_K, UNSUPPORTED)
    + scaled_epilogue_cases([4, -1, 99])
    # Block scales come as the pair (1 x 128, 128 x 128) only.
    + [("block-a-only", dict(a_granularity=ck.PER_BLOCK_1X128), UNSUPPORTED,
        ["a_granularity", "b_granularity"]),
       ("block-b-only", dict(b_granularity=ck.PER_BLOCK_128X128), UNSUPPORTED,
        ["a_granularity", "b_granularity"]),
       ("block-swapped", dict(a_granularity=ck.PER_BLOCK_128X128,
                              b_granularity=ck.PER_BLOCK_1X128), UNSUPPORTED, ["a_granularity"]),
       ("block-tensor-b", dict(a_granularity=ck.PER_BLOCK_1X128, b_granularity=ck.PER_TENSOR),
        UNSUPPORTED, ["b_granularity"]),
       ("block-misaligned-scale_a", dict(a_granularity=ck.PER_BLOCK_1X128,
                                         b_granularity=ck.PER_BLOCK_128X128,
                                         scale_a_ptr=SA + 2), MISALIGNED, ["scale_a"]),
       ("block-null-scale_b", dict(a_granularity=ck.PER_BLOCK_1X128,
                                   b_granularity=ck.PER_BLOCK_128X128, scale_b_ptr=0), INVALID,
        ["scale_b"])])

# W4A8: FP8 E4M3 activations a [M, K] with float32 scale_a (per tensor or row: the block
# granularities are rejected as INT8's are), a symmetric packed INT4 weight [N, K / 2] with
# w_scales [N, groups] of scale_dtype (fp16 or bf16), the INT8 epilogue's bias, activation and
# out_dtype. Rules (cuda_kernels.h): group_size 128 or CK_GROUP_ROW (32 and 64, valid INT4
# groups, unsupported here); K >= 32 and a multiple of 32; a and w_packed 16-byte aligned,
# scale_a 4-byte, w_scales aligned to scale_dtype, bias and out to out_dtype; bias may be NULL.
GEMM_W4A8 = dict(a_ptr=A, scale_a_ptr=SA, a_granularity=ck.PER_ROW, w_ptr=B, w_scales_ptr=S,
                 scale_dtype=DType.FP16, group_size=128, bias_ptr=BIAS,
                 activation=ck.ACTIVATION_RELU, m=4, n=64, k=256, out_ptr=O,
                 out_dtype=DType.FP16)
BAD_W4A8_GROUP_SIZES = BAD_GROUP_SIZES + [32, 64]
BAD_W4A8_K = [1, 16, 31, 48, 100, 4112]      # >= 1 but below 32 or not a multiple of 32
GEMM_W4A8_CASES = (
    null("a", "scale_a", "w_scales", "out")
    + [("null-w_packed", dict(w_ptr=0), INVALID, ["w_packed"])]
    + bad_dtypes("out_dtype")
    + bad_dtypes("scale_dtype", NOT_HALF_DTYPES)
    + bad("a_granularity", BAD_INT_GRANULARITIES, INVALID)
    + bad("activation", BAD_ACTIVATIONS, INVALID)
    + bad("group_size", BAD_W4A8_GROUP_SIZES, UNSUPPORTED)
    + gemm_shape_cases(k_rule=False)
    + bad("k", BAD_W4A8_K, UNSUPPORTED)
    + [("misaligned-a+%d" % d, dict(a_ptr=A + d), MISALIGNED, ["a"]) for d in (1, 4, 8)]
    + [("misaligned-w_packed+%d" % d, dict(w_ptr=B + d), MISALIGNED, ["w_packed"])
       for d in (1, 4, 8)]
    + [("misaligned-out-fp16", dict(out_ptr=O + 1), MISALIGNED, ["out"]),
       ("misaligned-out-bf16", dict(out_ptr=O + 1, out_dtype=DType.BF16), MISALIGNED, ["out"]),
       ("misaligned-out-fp32", dict(out_ptr=O + 2, out_dtype=DType.FP32), MISALIGNED, ["out"]),
       ("misaligned-scale_a", dict(scale_a_ptr=SA + 2), MISALIGNED, ["scale_a"]),
       ("misaligned-scale_a-tensor", dict(scale_a_ptr=SA + 1, a_granularity=ck.PER_TENSOR),
        MISALIGNED, ["scale_a"]),
       ("misaligned-w_scales-fp16", dict(w_scales_ptr=S + 1), MISALIGNED, ["w_scales"]),
       ("misaligned-w_scales-bf16", dict(w_scales_ptr=S + 1, scale_dtype=DType.BF16),
        MISALIGNED, ["w_scales"]),
       ("misaligned-bias-fp16", dict(bias_ptr=BIAS + 1), MISALIGNED, ["bias"]),
       ("misaligned-bias-bf16", dict(bias_ptr=BIAS + 1, out_dtype=DType.BF16), MISALIGNED,
        ["bias"]),
       ("misaligned-bias-fp32", dict(bias_ptr=BIAS + 2, out_dtype=DType.FP32), MISALIGNED,
        ["bias"])]
)

LINEAR = dict(x_ptr=X, w_ptr=B, bias_ptr=BIAS, dtype=DType.FP16, m=4, n=64, k=64,
              activation=ck.ACTIVATION_NONE, out_ptr=O)
LINEAR_CASES = (
    null("x", "w", "out")
    + bad_dtypes("dtype")
    + bad("activation", BAD_ACTIVATIONS, INVALID)
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
GEMM_W4A16 = dict(x_ptr=X, dtype=DType.FP16, w_ptr=B, scales_ptr=S, zeros_ptr=0,
                  group_size=128, mode=ck.INT4_SYMMETRIC, bias_ptr=BIAS,
                  activation=ck.ACTIVATION_RELU, m=4, n=64, k=256, out_ptr=O)
BAD_W4A16_K = [1, 16, 48, 100, 4112]        # >= 1 but not a multiple of 32
GEMM_W4A16_CASES = (
    null("x", "scales", "out")
    + [("null-w_packed", dict(w_ptr=0), INVALID, ["w_packed"]),
       ("null-zeros-asymmetric", dict(mode=ck.INT4_ASYMMETRIC), INVALID, ["zeros"]),
       ("zeros-symmetric", dict(zeros_ptr=Z), INVALID, ["zeros"])]
    + bad("mode", (2, -1, 99), INVALID)
    + bad_dtypes("dtype", NOT_HALF_DTYPES)
    + bad("activation", BAD_ACTIVATIONS, INVALID)
    + gemm_shape_cases(k_rule=False)
    + bad("k", BAD_W4A16_K, UNSUPPORTED)
    + bad("group_size", BAD_GROUP_SIZES, UNSUPPORTED)
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
GEMM_W4A16_PREPACKED = dict(GEMM_W4A16)
PREPACKED_NAMES = {"w_packed": "w_prepacked", "scales": "scales_prepacked",
                   "zeros": "zeros_prepacked"}
GEMM_W4A16_PREPACKED_CASES = (
    [(case_id, changes, status, [PREPACKED_NAMES.get(n, n) for n in names])
     for case_id, changes, status, names in GEMM_W4A16_CASES]
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
    + bad("mode", (2, -1), INVALID)
    + bad_dtypes("dtype", NOT_HALF_DTYPES)
    + bad("n", (0, -3), INVALID)
    + bad("k", (0, -32), INVALID)
    + [("overflow-nk", dict(n=BIG, k=BIG), INVALID, ["n", "k"])]
    + bad("k", BAD_W4A16_K, UNSUPPORTED)
    + bad("group_size", BAD_GROUP_SIZES, UNSUPPORTED)
    + [("misaligned-w_packed+%d" % d, dict(w_ptr=B + d), MISALIGNED, ["w_packed"])
       for d in (1, 8)]
    + [("misaligned-scales+1", dict(scales_ptr=S + 1), MISALIGNED, ["scales"]),
       ("misaligned-w_prepacked+8", dict(w_out_ptr=Q + 8), MISALIGNED, ["w_prepacked"]),
       ("misaligned-scales_prepacked+2", dict(scales_out_ptr=O + 2), MISALIGNED,
        ["scales_prepacked"]),
       ("misaligned-zeros_prepacked+4", dict(ASYM_PREPACK, zeros_out_ptr=BIAS + 4), MISALIGNED,
        ["zeros_prepacked"])]
)

# Block 4-bit weights (NF4, MXFP4, NVFP4): ck_block4_prepack and ck_gemm_block4_prepacked.
# Rules (cuda_kernels.h): a valid format; blocksize NF4 32, 64 or 128, MXFP4 32, NVFP4 16
# (else unsupported); K a multiple of 32 and of blocksize; N, K <= 2^40; packed, x, the
# prepacked weight and scales 16-byte aligned, NF4's absmax 4-byte, global_scale 4-byte (given
# for NVFP4 only), bias and out aligned to dtype.
BLOCK4_FORMAT_BLOCKS = ((ck.BLOCK4_NF4, 64), (ck.BLOCK4_MXFP4, 32), (ck.BLOCK4_NVFP4, 16))
BAD_BLOCK4_BLOCKS = {ck.BLOCK4_NF4: [16, 48, 256, 4096, 0, -64],
                     ck.BLOCK4_MXFP4: [16, 64, 0, -32], ck.BLOCK4_NVFP4: [32, 8, 0, -16]}


def block4_weight_cases():
    """What both block 4-bit entry points check of the format and the [n, k] weight."""
    cases = bad("format", (3, -1, 99), INVALID)
    for fmt, _ in BLOCK4_FORMAT_BLOCKS:
        cases += [("format=%d-blocksize=%d" % (fmt, v), dict(format=fmt, blocksize=v),
                   UNSUPPORTED, ["blocksize"]) for v in BAD_BLOCK4_BLOCKS[fmt]]
    cases += [("nf4-k=96-blocksize=64", dict(format=ck.BLOCK4_NF4, blocksize=64, k=96),
               UNSUPPORTED, ["k"]),
              ("nf4-k=320-blocksize=128", dict(format=ck.BLOCK4_NF4, blocksize=128, k=320),
               UNSUPPORTED, ["k"])]
    cases += bad("k", BAD_W4A16_K, UNSUPPORTED)
    cases += [("n-beyond-2^40", dict(n=2**40 + 8), INVALID, ["n"]),
              ("k-beyond-2^40", dict(k=2**40 + 64), INVALID, ["k"])]
    return cases


BLOCK4_PREPACK = dict(format=ck.BLOCK4_NF4, packed_ptr=B, scales_ptr=S, n=64, k=256,
                      blocksize=64, w_out_ptr=Q, scales_out_ptr=O)
BLOCK4_PREPACK_CASES = (
    [("null-packed", dict(packed_ptr=0), INVALID, ["packed"]),
     ("null-scales", dict(scales_ptr=0), INVALID, ["scales"]),
     ("null-w_prepacked", dict(w_out_ptr=0), INVALID, ["w_prepacked"]),
     ("null-scales_prepacked", dict(scales_out_ptr=0), INVALID, ["scales_prepacked"])]
    + bad("n", (0, -3), INVALID)
    + bad("k", (0, -32), INVALID)
    + [("overflow-nk", dict(n=BIG, k=BIG), INVALID, ["n", "k"])]
    + block4_weight_cases()
    + [("misaligned-packed+%d" % d, dict(packed_ptr=B + d), MISALIGNED, ["packed"])
       for d in (1, 8)]
    + [("misaligned-nf4-absmax+2", dict(scales_ptr=S + 2), MISALIGNED, ["scales"]),
       ("misaligned-w_prepacked+8", dict(w_out_ptr=Q + 8), MISALIGNED, ["w_prepacked"]),
       ("misaligned-scales_prepacked+4", dict(scales_out_ptr=O + 4), MISALIGNED,
        ["scales_prepacked"])]
)

GEMM_BLOCK4_PREPACKED = dict(x_ptr=X, dtype=DType.FP16, format=ck.BLOCK4_NVFP4, w_ptr=B,
                             scales_ptr=S, global_scale_ptr=GS, blocksize=16, bias_ptr=BIAS,
                             activation=ck.ACTIVATION_RELU, m=4, n=64, k=256, out_ptr=O)
NF4_GEMM = dict(format=ck.BLOCK4_NF4, blocksize=64, global_scale_ptr=0)
GEMM_BLOCK4_PREPACKED_CASES = (
    null("x", "out", "global_scale")
    + [("null-w_prepacked", dict(w_ptr=0), INVALID, ["w_prepacked"]),
       ("null-scales_prepacked", dict(scales_ptr=0), INVALID, ["scales_prepacked"]),
       ("global_scale-nf4", dict(NF4_GEMM, global_scale_ptr=GS), INVALID, ["global_scale"]),
       ("global_scale-mxfp4", dict(format=ck.BLOCK4_MXFP4, blocksize=32), INVALID,
        ["global_scale"])]
    + bad_dtypes("dtype", NOT_HALF_DTYPES)
    + bad("activation", BAD_ACTIVATIONS, INVALID)
    + gemm_shape_cases(k_rule=False)
    + [(case_id, dict(changes, global_scale_ptr=0) if changes.get("format") in
        (ck.BLOCK4_NF4, ck.BLOCK4_MXFP4) else dict(changes), status, names)
       for case_id, changes, status, names in block4_weight_cases()
       if changes.get("format") not in (3, -1, 99)]
    + bad("format", (3, -1, 99), INVALID)
    + [("misaligned-x+%d" % d, dict(x_ptr=X + d), MISALIGNED, ["x"]) for d in (1, 2, 8)]
    + [("misaligned-w_prepacked+%d" % d, dict(w_ptr=B + d), MISALIGNED, ["w_prepacked"])
       for d in (1, 8)]
    + [("misaligned-scales_prepacked+%d" % d, dict(scales_ptr=S + d), MISALIGNED,
        ["scales_prepacked"]) for d in (1, 4)]
    + [("misaligned-global_scale+2", dict(global_scale_ptr=GS + 2), MISALIGNED,
        ["global_scale"])]
    + [("misaligned-%s-%s" % (name[:-4], dt.name.lower()), {name: base + 1, "dtype": dt},
        MISALIGNED, [name[:-4]])
       for name, base in (("bias_ptr", BIAS), ("out_ptr", O))
       for dt in (DType.FP16, DType.BF16)]
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
        + bad_dtypes("dtype", NOT_HALF_DTYPES)
        + bad("n", (0, -8), INVALID)
        + bad("k", (0, -32), INVALID)
        + [("overflow-nk", dict(n=BIG, k=BIG), INVALID, ["n", "k"])]
        + bad("n", (1, 12, 100), UNSUPPORTED)
        + bad("k", BAD_W4A16_K, UNSUPPORTED)
        + bad("group_size", BAD_GROUP_SIZES, UNSUPPORTED)
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
    null("x", "perm", "out")
    + bad_dtypes("dtype")
    + bad("rows", (0, -1), INVALID)
    + bad("cols", (0, -5), INVALID)
    + [("overflow-bytes", dict(rows=HALF_BIG, cols=HALF_BIG), INVALID, ["rows", "cols"]),
       ("misaligned-x-fp16", dict(x_ptr=X + 1), MISALIGNED, ["x"]),
       ("misaligned-x-fp32", dict(x_ptr=X + 2, dtype=DType.FP32), MISALIGNED, ["x"]),
       ("misaligned-perm", dict(perm_ptr=P + 2), MISALIGNED, ["perm"]),
       ("misaligned-out-bf16", dict(out_ptr=O + 1, dtype=DType.BF16), MISALIGNED, ["out"])]
)

# Structured-sparse INT4 weights (2:4, 16:32): codes [N, K / 4] and meta [N, K / 32] uint32,
# both 16-byte aligned; scales (and zeros, CK_INT4_ASYMMETRIC only) [N, K / group_size], the
# scales aligned to their dtype, zeros anywhere. Rules (cuda_kernels.h): a valid ck_sparsity_t;
# group_size 64 or 128 only (the dense INT4 sizes 32 and -1 are unsupported); K a multiple of 32
# and of the group (so K >= 64) and, for the prepacked 2:4 layout, of 128. The calls without an
# M check the weight [N, K] as ck_quantize_int4 checks its matrix, at the dtype's size, their
# messages naming n and k (the GEMMs check m, n and k as every GEMM does). The prepacked
# layout pads a row to 16 rows of K 3 / 8 bytes: one row's 6 K bytes overflow past
# SPARSE_PACK_MOST_K, where its dense 2 K bytes (and a GEMM's 4 K) still fit.
META, VIOLATIONS = 0x7F0001600000, 0x7F0001700000
BAD_SPARSITIES = [2, -1, 99]
BAD_SPARSE_GROUP_SIZES = [32, ck.GROUP_ROW] + BAD_GROUP_SIZES
SPARSE_PACK_MOST_K = (2**63 - 1) // 6 // 128 * 128


def sparse_matrix_cases():
    """The weight's N and K, each case saying its value."""
    return ([("n=%d" % v, dict(n=v), INVALID, ["n", v]) for v in (0, -1, -2**63)]
            + [("k=%d" % v, dict(k=v), INVALID, ["k", v]) for v in (0, -32)]
            + [("overflow-elements", dict(n=BIG, k=BIG), INVALID, ["n", "k"]),
               ("overflow-bytes", dict(n=HALF_BIG, k=HALF_BIG), INVALID, ["n", "k"])])


def sparse_k_cases(prepacked=False):
    """K a multiple of 32, of the group and (prepacked) of 128, against group_size 64 or 128."""
    cases = (bad("k", BAD_W4A16_K, UNSUPPORTED)
             + bad("group_size", BAD_SPARSE_GROUP_SIZES, UNSUPPORTED)
             + [("group_size=128-k=%d" % v, dict(k=v), UNSUPPORTED, ["k"]) for v in (64, 192)]
             + [("group_size=64-k=%d" % v, dict(group_size=64, k=v), UNSUPPORTED, ["k"])
                for v in (32, 96)])
    if prepacked:   # multiples of 32 and of the group, not of 128
        cases += [("prepacked-k=%d" % v, dict(group_size=64, k=v), UNSUPPORTED, ["k", 128])
                  for v in (64, 192, 4160)]
    return cases


def sparse_codes_cases():
    """codes and meta (the interchange format's) 16-byte aligned, either sparsity."""
    return ([("misaligned-codes+%d" % d, dict(codes_ptr=Q + d), MISALIGNED, ["codes"])
             for d in (1, 8)]
            + [("misaligned-meta+%d" % d, dict(meta_ptr=META + d), MISALIGNED, ["meta"])
               for d in (4, 8)]
            + [("16:32-misaligned-meta+4", dict(sparsity=ck.SPARSITY_16_32, meta_ptr=META + 4),
                MISALIGNED, ["meta"])])


def sparse_format_cases():
    """What the sparse quantizer and dequantizer check of the format: the codes, meta and scales
    (NULL), the sparsity, the zero points against the mode, the mode, N, K and the group size."""
    return (null("codes", "meta", "scales")
            + [("null-zeros-asymmetric", dict(mode=ck.INT4_ASYMMETRIC), INVALID, ["zeros"]),
               ("zeros-symmetric", dict(zeros_ptr=Z), INVALID, ["zeros"])]
            + bad("mode", (2, -1), INVALID)
            + bad("sparsity", BAD_SPARSITIES, INVALID)
            + sparse_matrix_cases()
            + sparse_k_cases()
            + sparse_codes_cases())


SPARSE_PRUNE = dict(w_ptr=X, dtype=DType.FP16, sparsity=ck.SPARSITY_2_4, n=64, k=256, out_ptr=O)
SPARSE_PRUNE_CASES = (
    null("w", "out")
    + bad("sparsity", BAD_SPARSITIES, INVALID)
    + bad_dtypes("dtype")
    + sparse_matrix_cases()
    + [("overflow-bytes-fp32", dict(n=2**31, k=2**30, dtype=DType.FP32), INVALID,
        ["n", "k"])]
    + bad("k", BAD_W4A16_K, UNSUPPORTED)   # K a multiple of 32: no group here
    + [("16:32-k=48", dict(sparsity=ck.SPARSITY_16_32, k=48), UNSUPPORTED, ["k"])]
    + [("misaligned-%s-%s" % (name[:-4], dt.name.lower()), {name: base + d, "dtype": dt},
        MISALIGNED, [name[:-4]])
       for name, base in (("w_ptr", X), ("out_ptr", O))
       for dt, d in ((DType.FP16, 1), (DType.BF16, 1), (DType.FP32, 2))]
)

SPARSE_QUANTIZE_INT4 = dict(w_ptr=X, dtype=DType.FP16, sparsity=ck.SPARSITY_2_4, n=64, k=256,
                            group_size=128, mode=ck.INT4_SYMMETRIC, codes_ptr=Q, meta_ptr=META,
                            scales_ptr=S, zeros_ptr=0, violations_ptr=VIOLATIONS)
SPARSE_QUANTIZE_INT4_CASES = (
    null("w")
    + sparse_format_cases()
    + bad_dtypes("dtype")
    + [("overflow-bytes-fp32", dict(n=2**31, k=2**30, dtype=DType.FP32), INVALID,
        ["n", "k"])]
    + [("misaligned-w-fp16", dict(w_ptr=X + 1), MISALIGNED, ["w"]),
       ("misaligned-w-bf16", dict(w_ptr=X + 1, dtype=DType.BF16), MISALIGNED, ["w"]),
       ("misaligned-w-fp32", dict(w_ptr=X + 2, dtype=DType.FP32), MISALIGNED, ["w"]),
       ("misaligned-scales-fp16", dict(scales_ptr=S + 1), MISALIGNED, ["scales"]),
       ("misaligned-scales-fp32", dict(scales_ptr=S + 2, dtype=DType.FP32), MISALIGNED,
        ["scales"])]
    + [("misaligned-violations+%d" % d, dict(violations_ptr=VIOLATIONS + d), MISALIGNED,
        ["violations"]) for d in (1, 2)]
)

SPARSE_DEQUANTIZE_INT4 = dict(codes_ptr=Q, meta_ptr=META, scales_ptr=S, zeros_ptr=0,
                              sparsity=ck.SPARSITY_2_4, n=64, k=256, group_size=128,
                              mode=ck.INT4_SYMMETRIC, out_ptr=O, out_dtype=DType.FP16)
SPARSE_DEQUANTIZE_INT4_CASES = (
    null("out")
    + sparse_format_cases()
    + bad_dtypes("out_dtype")
    + [("overflow-bytes-fp32", dict(n=2**31, k=2**30, out_dtype=DType.FP32), INVALID,
        ["n", "k"])]
    + [("misaligned-scales-fp16", dict(scales_ptr=S + 1), MISALIGNED, ["scales"]),
       ("misaligned-scales-fp32", dict(scales_ptr=S + 2, out_dtype=DType.FP32), MISALIGNED,
        ["scales"]),
       ("misaligned-out-fp16", dict(out_ptr=O + 1), MISALIGNED, ["out"]),
       ("misaligned-out-bf16", dict(out_ptr=O + 1, out_dtype=DType.BF16), MISALIGNED, ["out"]),
       ("misaligned-out-fp32", dict(out_ptr=O + 2, out_dtype=DType.FP32), MISALIGNED, ["out"])]
)


def sparse_gemm_cases(prepacked):
    """What both sparse GEMMs check (the prepacked one's weight, scales and zeros named
    w_prepacked, scales_prepacked and zeros_prepacked), and the interchange format's codes,
    meta and sparsity or the prepacked layout's K and alignments."""
    z = "zeros_prepacked" if prepacked else "zeros"
    cases = (
        null("x", "out")
        + [("null-%s-asymmetric" % z, dict(mode=ck.INT4_ASYMMETRIC), INVALID, [z]),
           ("%s-symmetric" % z, dict(zeros_ptr=Z), INVALID, [z])]
        + bad("mode", (2, -1, 99), INVALID)
        + bad_dtypes("dtype", NOT_HALF_DTYPES)
        + bad("activation", BAD_ACTIVATIONS, INVALID)
        + gemm_shape_cases(k_rule=False)
        + sparse_k_cases(prepacked)
        + [("misaligned-x+%d" % d, dict(x_ptr=X + d), MISALIGNED, ["x"]) for d in (1, 2, 8)]
        + [("misaligned-%s-%s" % (name[:-4], dt.name.lower()), {name: base + 1, "dtype": dt},
            MISALIGNED, [name[:-4]])
           for name, base in (("bias_ptr", BIAS), ("out_ptr", O))
           for dt in (DType.FP16, DType.BF16)])
    if prepacked:
        return cases + (
            [("null-w_prepacked", dict(w_ptr=0), INVALID, ["w_prepacked"]),
             ("null-scales_prepacked", dict(scales_ptr=0), INVALID, ["scales_prepacked"]),
             ("overflow-prepacked-bytes", dict(m=1, n=1, k=SPARSE_PACK_MOST_K + 128), INVALID,
              ["n", "k"])]
            + [("misaligned-w_prepacked+%d" % d, dict(w_ptr=B + d), MISALIGNED, ["w_prepacked"])
               for d in (1, 8)]
            + [("misaligned-scales_prepacked+%d" % d, dict(scales_ptr=S + d), MISALIGNED,
                ["scales_prepacked"]) for d in (1, 2)]
            + [("misaligned-zeros_prepacked+%d" % d, dict(mode=ck.INT4_ASYMMETRIC,
                                                           zeros_ptr=Z + d),
                MISALIGNED, ["zeros_prepacked"]) for d in (1, 2)])
    return cases + (
        null("codes", "meta", "scales")
        + bad("sparsity", BAD_SPARSITIES, INVALID)
        + sparse_codes_cases()
        + [("misaligned-scales-%s" % dt.name.lower(), dict(scales_ptr=S + 1, dtype=dt),
            MISALIGNED, ["scales"]) for dt in (DType.FP16, DType.BF16)])


# ck_sparse_1632_to_24: a 16:32 weight's masks [N, K / 32] -> 2:4 metadata, both 16-byte
# aligned; violations optional (int32).
SPARSE_1632_TO_24 = dict(masks_ptr=Q, n=64, k=256, meta_ptr=META, violations_ptr=VIOLATIONS)
SPARSE_1632_TO_24_CASES = (
    null("masks")
    + [("null-meta_24", dict(meta_ptr=0), INVALID, ["meta_24"])]
    + sparse_matrix_cases()
    + bad("k", BAD_W4A16_K, UNSUPPORTED)
    + [("misaligned-masks+%d" % d, dict(masks_ptr=Q + d), MISALIGNED, ["masks"]) for d in (4, 8)]
    + [("misaligned-meta_24+%d" % d, dict(meta_ptr=META + d), MISALIGNED, ["meta_24"])
       for d in (4, 8)]
    + [("misaligned-violations+2", dict(violations_ptr=VIOLATIONS + 2), MISALIGNED,
        ["violations"])]
)

# ck_gemm_sparse_w4a16: either sparsity, the interchange format.
GEMM_SPARSE_W4A16 = dict(x_ptr=X, dtype=DType.FP16, sparsity=ck.SPARSITY_2_4, codes_ptr=Q,
                         meta_ptr=META, scales_ptr=S, zeros_ptr=0, group_size=128,
                         mode=ck.INT4_SYMMETRIC, bias_ptr=BIAS, activation=ck.ACTIVATION_RELU,
                         m=4, n=64, k=256, out_ptr=O)
GEMM_SPARSE_W4A16_CASES = sparse_gemm_cases(prepacked=False)

# ck_sparse_w4a16_prepack: a 2:4 weight in the interchange format in (no sparsity argument), the
# prepacked one out (every output 16-byte aligned); fp16 or bf16 scales.
SPARSE_W4A16_PREPACK = dict(codes_ptr=Q, meta_ptr=META, scales_ptr=S, zeros_ptr=0,
                            dtype=DType.FP16, n=64, k=256, group_size=128,
                            mode=ck.INT4_SYMMETRIC, w_out_ptr=B, scales_out_ptr=O,
                            zeros_out_ptr=0)
SPARSE_W4A16_PREPACK_CASES = (
    [case for case in sparse_format_cases() if "sparsity" not in case[1]]
    + [("null-w_prepacked", dict(w_out_ptr=0), INVALID, ["w_prepacked"]),
       ("null-scales_prepacked", dict(scales_out_ptr=0), INVALID, ["scales_prepacked"]),
       ("null-zeros_prepacked-asymmetric", dict(ASYM_PREPACK, zeros_out_ptr=0), INVALID,
        ["zeros_prepacked"]),
       ("zeros_prepacked-symmetric", dict(zeros_out_ptr=BIAS), INVALID, ["zeros_prepacked"])]
    + bad_dtypes("dtype", NOT_HALF_DTYPES)
    + [case for case in sparse_k_cases(prepacked=True) if case[0].startswith("prepacked-")]
    + [("overflow-prepacked-bytes", dict(n=1, k=SPARSE_PACK_MOST_K + 128), INVALID, ["n", "k"])]
    + [("misaligned-scales-%s" % dt.name.lower(), dict(scales_ptr=S + 1, dtype=dt), MISALIGNED,
        ["scales"]) for dt in (DType.FP16, DType.BF16)]
    + [("misaligned-w_prepacked+%d" % d, dict(w_out_ptr=B + d), MISALIGNED, ["w_prepacked"])
       for d in (1, 8)]
    + [("misaligned-scales_prepacked+%d" % d, dict(scales_out_ptr=O + d), MISALIGNED,
        ["scales_prepacked"]) for d in (2, 4)]
    + [("misaligned-zeros_prepacked+4", dict(ASYM_PREPACK, zeros_out_ptr=BIAS + 4), MISALIGNED,
        ["zeros_prepacked"])]
)

# ck_sparse_w4a16_prepack_dense: either pattern in, the dense prepacked INT4 layout out (as
# ck_w4a16_prepack's outputs: 16-byte aligned, N and K up to 2^40); K a multiple of the group
# only (the layout pads K to 128: K = 320 with group 64 is valid, ck_sparse_w4a16_prepack's
# "prepacked-" cases are not bad here).
SPARSE_W4A16_PREPACK_DENSE = dict(SPARSE_W4A16_PREPACK, sparsity=ck.SPARSITY_16_32)
SPARSE_W4A16_PREPACK_DENSE_CASES = (
    [case for case in SPARSE_W4A16_PREPACK_CASES
     if not case[0].startswith(("prepacked-", "overflow-prepacked"))]
    + bad("sparsity", BAD_SPARSITIES, INVALID)
    + [("layout-past-2^40", dict(n=1, k=2**40 + 128), INVALID, ["n", "k"]),
       ("rows-past-2^40", dict(n=2**40 + 1, k=128), INVALID, ["n", "k"])]
)

# ck_gemm_sparse_w4a16_prepacked: the layout ck_sparse_w4a16_prepack writes (2:4 only).
GEMM_SPARSE_W4A16_PREPACKED = {key: value for key, value in GEMM_SPARSE_W4A16.items()
                               if key not in ("sparsity", "codes_ptr", "meta_ptr")}
GEMM_SPARSE_W4A16_PREPACKED["w_ptr"] = B
GEMM_SPARSE_W4A16_PREPACKED_CASES = sparse_gemm_cases(prepacked=True)

# INT4 x INT4: packed a [M, K / 2] and b [N, K / 2]; K a multiple of 32; a, b 16-byte aligned.
BAD_INT4_K = [16, 48, 100, 4112]


def gemm_int4_operand_cases():
    return (
        null("a", "b")
        + gemm_shape_cases(k_rule=False)
        + bad("k", BAD_INT4_K, UNSUPPORTED)
        + [("misaligned-a+%d" % d, dict(a_ptr=A + d), MISALIGNED, ["a"]) for d in (1, 8)]
        + [("misaligned-b+%d" % d, dict(b_ptr=B + d), MISALIGNED, ["b"]) for d in (2, 4)]
    )


GEMM_INT4 = dict(a_ptr=A, b_ptr=B, m=4, n=64, k=64, c_ptr=C)
GEMM_INT4_CASES = (gemm_int4_operand_cases() + null("c")
                   + [("misaligned-c+2", dict(c_ptr=C + 2), MISALIGNED, ["c"])])
GEMM_INT4_SCALED = {key: value for key, value in GEMM_INT8_SCALED.items() if key != "b_layout"}
GEMM_INT4_SCALED_CASES = gemm_int4_operand_cases() + [
    case for case in GEMM_INT8_SCALED_CASES
    if not any(key in ("a_ptr", "b_ptr", "b_layout", "m", "n", "k") for key in case[1])
]

# Mixture of experts. Fake addresses of the router logits, the caller's ids and weights, the two
# prepacked weights with their scales and zeros, and the workspace.
RL, IDS, TW, WS = 0x7F0000B00000, 0x7F0000C00000, 0x7F0000D00000, 0x7F0000E00000
W13, W13S, W13Z = 0x7F0000F00000, 0x7F0001000000, 0x7F0001100000
W2, W2S, W2Z = 0x7F0001200000, 0x7F0001300000, 0x7F0001400000


def moe_routing_size_cases():
    """What the route and the layer check of T, E and k, each a size error
    (CK_STATUS_INVALID_VALUE): T >= 1, 1 <= E <= 1024, 1 <= k <= min(E, 32), and T * k
    overflowing."""
    return (bad("tokens", (0, -1, -2**63), INVALID)
            + bad("experts", (0, -1, 1025, 2**40), INVALID)
            + bad("top_k", (0, -6), INVALID)
            + [("top_k>experts", dict(experts=5, top_k=6), INVALID, ["top_k"])]
            + [("top_k=%d" % v, dict(experts=64, top_k=v), INVALID, ["top_k"]) for v in (33, 64)]
            + [("overflow-pairs", dict(tokens=BIG), INVALID, ["tokens"])])


# ck_moe_route: logits [T, E] of logits_dtype (fp32, fp16, bf16) -> topk_ids int32 and
# topk_weights float32 [T, k]; every pointer aligned to its element size.
MOE_ROUTE = dict(logits_ptr=RL, logits_dtype=DType.FP32, tokens=4, experts=64, top_k=6,
                 renormalize=1, topk_ids_ptr=IDS, topk_weights_ptr=TW)
MOE_ROUTE_CASES = (
    null("logits", "topk_ids", "topk_weights")
    + bad_dtypes("logits_dtype")
    + moe_routing_size_cases()
    + [("overflow-bytes", dict(tokens=2**51, experts=1024), INVALID, ["tokens"]),
       ("misaligned-logits-fp32", dict(logits_ptr=RL + 2), MISALIGNED, ["logits"]),
       ("misaligned-logits-fp16", dict(logits_ptr=RL + 1, logits_dtype=DType.FP16), MISALIGNED,
        ["logits"]),
       ("misaligned-logits-bf16", dict(logits_ptr=RL + 1, logits_dtype=DType.BF16), MISALIGNED,
        ["logits"]),
       ("misaligned-topk_ids", dict(topk_ids_ptr=IDS + 2), MISALIGNED, ["topk_ids"]),
       ("misaligned-topk_weights", dict(topk_weights_ptr=TW + 1), MISALIGNED, ["topk_weights"])]
)

# ck_moe_prepack: ck_w4a16_prepack's rules for each of `experts` [n, k] weights (1 <= experts
# <= 1024, as the layer takes them), gate_up 0 or 1, and n a multiple of 16 for the gate+up
# weight (gate_up = 1).
MOE_PREPACK = dict(W4A16_PREPACK, experts=8, gate_up=1)
MOE_PREPACK_CASES = (
    W4A16_PREPACK_CASES
    + bad("experts", (0, -1, -2**63, 1025, BIG), INVALID)
    + bad("gate_up", (2, -1), INVALID)
    + [("gate_up-n=%d" % v, dict(n=v), UNSUPPORTED, ["n"]) for v in (8, 24, 40, 1000)]
)

# ck_moe_workspace_size and ck_moe_forward take a ck_moe_params_t (cuda_wrapper.MoeParams): a
# row changes its fields by name like any argument, a pointer field written <field>_ptr as the
# other tables write pointers; params_ptr=0 passes NULL for the struct, bytes_ptr=0 NULL for the
# size; struct_size is sizeof(MoeParams) unless a row says otherwise (moe_params below).
# Rules (cuda_kernels.h): H and I multiples of 32 up to 2^24, dtype fp16 or bf16, group sizes
# as INT4, router_logits or (topk_ids and topk_weights), zeros exactly for CK_INT4_ASYMMETRIC,
# x, out and the weights 16-byte aligned, the logits, ids and weights aligned to their element,
# out not overlapping x, the workspace 256-byte aligned and at least ck_moe_workspace_size bytes.
MOE_SIZEOF = ctypes.sizeof(ck.MoeParams)
GIVEN_IDS = dict(router_logits_ptr=0, topk_ids_ptr=IDS, topk_weights_ptr=TW)
ASYM_MOE = dict(mode=ck.INT4_ASYMMETRIC, w13_zeros_ptr=W13Z, w2_zeros_ptr=W2Z)
MOE_FORWARD = dict(tokens=4, hidden=256, intermediate=128, experts=8, top_k=2,
                   dtype=DType.FP16, group_size=128, mode=ck.INT4_SYMMETRIC, x_ptr=X,
                   router_logits_ptr=RL, router_dtype=DType.FP32, renormalize=1, topk_ids_ptr=0,
                   topk_weights_ptr=0, w13_ptr=W13, w13_scales_ptr=W13S, w13_zeros_ptr=0,
                   w2_ptr=W2, w2_scales_ptr=W2S, w2_zeros_ptr=0, activation=ck.MOE_SWIGLU,
                   out_ptr=O, workspace_ptr=WS, workspace_bytes=2**40)
MOE_FORWARD_CASES = (
    null("x", "out", "w13", "w13_scales", "w2", "w2_scales", "workspace")
    + [("null-params", dict(params_ptr=0), INVALID, ["params"])]
    # This version knows one struct_size, its own; a smaller or larger one is another version's.
    + bad("struct_size", (0, 8, MOE_SIZEOF - 8, MOE_SIZEOF + 8, 2**40), INVALID)
    + [("router_logits-and-topk_ids", dict(GIVEN_IDS, router_logits_ptr=RL), INVALID,
        ["router_logits", "topk_ids"]),
       ("no-routing", dict(router_logits_ptr=0), INVALID, ["router_logits", "topk_ids"]),
       ("topk_ids-without-topk_weights", dict(GIVEN_IDS, topk_weights_ptr=0), INVALID,
        ["topk_weights"]),
       ("topk_weights-without-topk_ids", dict(GIVEN_IDS, topk_ids_ptr=0), INVALID,
        ["topk_ids"]),
       ("null-w13_zeros-asymmetric", dict(ASYM_MOE, w13_zeros_ptr=0), INVALID, ["w13_zeros"]),
       ("null-w2_zeros-asymmetric", dict(ASYM_MOE, w2_zeros_ptr=0), INVALID, ["w2_zeros"]),
       ("w13_zeros-symmetric", dict(w13_zeros_ptr=W13Z), INVALID, ["w13_zeros"]),
       ("w2_zeros-symmetric", dict(w2_zeros_ptr=W2Z), INVALID, ["w2_zeros"])]
    + bad("mode", (2, -1), INVALID)
    + bad_dtypes("dtype", NOT_HALF_DTYPES)
    + bad_dtypes("router_dtype")
    + bad("activation", (1, -1, 99), INVALID)
    + moe_routing_size_cases()
    + bad("hidden", (0, -32, 2**24 + 32), INVALID)          # 1 <= H, I <= 2^24
    + bad("intermediate", (0, -32, 2**24 + 32), INVALID)
    + bad("hidden", (16, 48, 100, 4112), UNSUPPORTED)
    + bad("intermediate", (1, 16, 200), UNSUPPORTED)
    + bad("group_size", BAD_GROUP_SIZES, UNSUPPORTED)
    # x and out overflow a byte count; then the weights (the message may name any of E, H and
    # I: the status is the rule).
    + [("overflow-x", dict(tokens=2**30, hidden=2**40), INVALID, ["hidden"]),
       ("overflow-weights", dict(experts=1024, hidden=2**32, intermediate=2**32), INVALID, []),
       ("overflow-2I", dict(intermediate=2**62), INVALID, ["intermediate"]),
       ("out-overlaps-x", dict(out_ptr=X + 512), INVALID, ["out", "x"])]
    + bad("workspace_bytes", (0, 1, 255), INVALID)
    + [("misaligned-workspace+%d" % d, dict(workspace_ptr=WS + d), MISALIGNED, ["workspace"])
       for d in (1, 16, 128)]
    + [("misaligned-%s+%d" % (name[:-4], d), {name: base + d}, MISALIGNED, [name[:-4]])
       for name, base in (("x_ptr", X), ("out_ptr", O), ("w13_ptr", W13),
                          ("w13_scales_ptr", W13S), ("w2_ptr", W2), ("w2_scales_ptr", W2S))
       for d in (2, 8)]
    + [("misaligned-w13_zeros+4", dict(ASYM_MOE, w13_zeros_ptr=W13Z + 4), MISALIGNED,
        ["w13_zeros"]),
       ("misaligned-w2_zeros+1", dict(ASYM_MOE, w2_zeros_ptr=W2Z + 1), MISALIGNED,
        ["w2_zeros"]),
       ("misaligned-router_logits-fp32", dict(router_logits_ptr=RL + 2), MISALIGNED,
        ["router_logits"]),
       ("misaligned-router_logits-bf16", dict(router_logits_ptr=RL + 1,
                                              router_dtype=DType.BF16), MISALIGNED,
        ["router_logits"]),
       ("misaligned-topk_ids", dict(GIVEN_IDS, topk_ids_ptr=IDS + 2), MISALIGNED, ["topk_ids"]),
       ("misaligned-topk_weights", dict(GIVEN_IDS, topk_weights_ptr=TW + 2), MISALIGNED,
        ["topk_weights"])]
)

# ck_moe_workspace_size validates the struct as ck_moe_forward does, pointers excepted: the
# forward's cases that change no pointer (router_dtype matters only with logits: left out), and
# the two pointers it does need.
def workspace_size_table(call, call_cases, keep):
    """(valid fields, cases) of a ck_<family>_workspace_size from its call's table: the call's
    fields less the workspace; a NULL struct, a NULL size, then the call's cases that keep(case)
    says the size query checks too."""
    fields = {key: value for key, value in call.items() if not key.startswith("workspace")}
    cases = ([("null-params", dict(params_ptr=0), INVALID, ["params"]),
              ("null-bytes", dict(bytes_ptr=0), INVALID, ["bytes"])]
             + [case for case in call_cases if keep(case)])
    return fields, cases


MOE_WORKSPACE_SIZE, MOE_WORKSPACE_SIZE_CASES = workspace_size_table(
    MOE_FORWARD, MOE_FORWARD_CASES,
    lambda case: not any(key.endswith("_ptr") or key.startswith("workspace")
                         or key == "router_dtype" for key in case[1]))


def params_struct(struct, fields):
    """The `struct` (a cuda_wrapper params class) of a row's fields (pointer fields written
    <field>_ptr), or None (NULL) for params_ptr=0."""
    if fields.get("params_ptr", 1) == 0:
        return None
    return struct(**{name[:-len("_ptr")] if name.endswith("_ptr") else name: value
                     for name, value in fields.items() if name != "params_ptr"})


def workspace_size_call(export, struct):
    """The call of a row of `export` (ck_<family>_workspace_size: the struct and a size_t*;
    bytes_ptr=0 passes NULL for the size), returning the size."""
    def call(fields):
        fields = dict(fields)
        nbytes = ctypes.c_size_t(0)
        pointer = None if fields.pop("bytes_ptr", 1) == 0 else ctypes.byref(nbytes)
        getattr(ck.load_library(), export)(params_struct(struct, fields), pointer)
        return nbytes.value
    return call


def workspace_call(raw_name, struct):
    """The call of a row of an export that takes the struct and a workspace (workspace_ptr,
    workspace_bytes): cuda_wrapper.raw.<raw_name>."""
    def call(fields):
        fields = dict(fields)
        workspace = fields.pop("workspace_ptr"), fields.pop("workspace_bytes")
        getattr(ck.raw, raw_name)(params_struct(struct, fields), *workspace, stream=0)
    return call


def moe_params(fields):
    return params_struct(ck.MoeParams, fields)


moe_workspace_size = workspace_size_call("ck_moe_workspace_size", ck.MoeParams)
moe_forward = workspace_call("moe_forward", ck.MoeParams)


# ck_attention_forward takes a ck_attention_params_t (cuda_wrapper.AttentionParams), its rows
# written as the MoE struct's. Rules (cuda_kernels.h): dtype fp16 or bf16; q, k, v and out
# 16-byte aligned, lse and the offsets 4-byte aligned; 1 <= total_q < 2^31, 0 <= total_k < 2^31;
# 1 <= Hq <= 65535, Hkv in [1, Hq] dividing it; D >= 1, and 64 or 128 (else UNSUPPORTED); the
# offsets both or neither; batch 1 .. 65535 with them, 0 or 1 without; max_seqlen_q (_k) in
# [0, total_q (total_k)]; a finite softmax_scale; causal 0 or 1; out and lse overlapping none of
# q, k, v (and lse not out).
AQ, AK, AV, AO, ALSE, ACUQ, ACUK = (0x7F0003000000 + i * 0x100000 for i in range(7))
ATTENTION_SIZEOF = ctypes.sizeof(ck.AttentionParams)
ATTENTION_FORWARD = dict(dtype=DType.FP16, q_ptr=AQ, k_ptr=AK, v_ptr=AV, out_ptr=AO,
                         lse_ptr=ALSE, total_q=300, total_k=400, num_heads_q=8, num_heads_kv=2,
                         head_dim=128, batch=2, cu_seqlens_q_ptr=ACUQ, cu_seqlens_k_ptr=ACUK,
                         max_seqlen_q=200, max_seqlen_k=250, softmax_scale=0.0, causal=1)
ONE_SEQUENCE = dict(cu_seqlens_q_ptr=0, cu_seqlens_k_ptr=0)
ATTENTION_FORWARD_CASES = (
    null("q", "k", "v", "out")
    + [("null-params", dict(params_ptr=0), INVALID, ["params"])]
    + bad("struct_size", (0, 8, ATTENTION_SIZEOF - 8, ATTENTION_SIZEOF + 8, 2**40), INVALID)
    + bad_dtypes("dtype", NOT_HALF_DTYPES)
    + bad("total_q", (0, -1, 2**31, BIG), INVALID)
    + bad("total_k", (-1, 2**31, BIG), INVALID)
    + bad("num_heads_q", (0, -8, 65536), INVALID)
    + bad("num_heads_kv", (0, -1, 16), INVALID)
    + [("heads-not-divisible", dict(num_heads_kv=3), INVALID, ["num_heads_q", "num_heads_kv"])]
    + bad("head_dim", (0, -128), INVALID)
    + bad("head_dim", (32, 96, 100, 256), UNSUPPORTED)
    + [("cu_seqlens_q-alone", dict(cu_seqlens_k_ptr=0), INVALID,
        ["cu_seqlens_q", "cu_seqlens_k"]),
       ("cu_seqlens_k-alone", dict(cu_seqlens_q_ptr=0), INVALID,
        ["cu_seqlens_q", "cu_seqlens_k"]),
       ("one-sequence-batch=2", dict(ONE_SEQUENCE, batch=2), INVALID, ["batch"])]
    + bad("batch", (0, -1, 65536), INVALID)
    + bad("max_seqlen_q", (-1, 301), INVALID)
    + bad("max_seqlen_k", (-1, 401), INVALID)
    + [("softmax_scale=%s" % v, dict(softmax_scale=float(v)), INVALID, ["softmax_scale"])
       for v in ("nan", "inf", "-inf")]
    + bad("causal", (2, -1), INVALID)
    + [("misaligned-%s+%d" % (name[:-4], d), {name: base + d}, MISALIGNED, [name[:-4]])
       for name, base in (("q_ptr", AQ), ("k_ptr", AK), ("v_ptr", AV), ("out_ptr", AO))
       for d in (2, 8)]
    + [("misaligned-%s+%d" % (name[:-4], d), {name: base + d}, MISALIGNED, [name[:-4]])
       for name, base in (("lse_ptr", ALSE), ("cu_seqlens_q_ptr", ACUQ),
                          ("cu_seqlens_k_ptr", ACUK))
       for d in (1, 2)]
    + [("out-overlaps-q", dict(out_ptr=AQ + 512), INVALID, ["out", "q"]),
       ("out-overlaps-v", dict(out_ptr=AV - 256), INVALID, ["out", "v"]),
       ("lse-overlaps-out", dict(lse_ptr=AO + 256), INVALID, ["lse", "out"]),
       ("lse-overlaps-k", dict(lse_ptr=AK), INVALID, ["lse", "k"])]
)


def attention_forward(fields):
    ck.raw.attention_forward(params_struct(ck.AttentionParams, fields), stream=0)


# ck_attention_decode takes a ck_attention_decode_params_t (cuda_wrapper.AttentionDecodeParams)
# and the workspace, ck_attention_decode_workspace_size the struct and a size_t*, their rows
# written as the MoE layer's. Rules (cuda_kernels.h): dtype fp16 or bf16; q, k_cache, v_cache
# and out 16-byte aligned, lse, seqlens_k and block_table 4-byte aligned; 1 <= batch <= 65535,
# 1 <= seqlen_q <= 16, 1 <= Hq <= 65535, Hkv in [1, Hq] dividing it; D >= 1, and 64 or 128
# (else UNSUPPORTED); 1 <= max_seqlen_k <= 2^30; with a block_table (only then): 1 <= num_pages
# < 2^31, page_size a power of two up to 65536, 1 <= max_blocks_per_seq < 2^31 and max_seqlen_k
# <= max_blocks_per_seq * page_size; the cache's bytes (2 per element, 1 for a quantized
# format) within int64; a finite softmax_scale; 0 <= num_splits <= 64; kv_format a
# ck_kv_format_t and, quantized, kv_scaling a ck_kv_scaling_t and k_scale, v_scale given and
# 4-byte aligned (not read for CK_KV_DTYPE); out and lse clear of q, the cache, the scales and
# each other; with several splits the workspace given, 256-byte aligned, at least the query's
# bytes and clear of the operands. struct_size: this version's, or the first version's (which
# ends at num_splits: the format is then CK_KV_DTYPE). The valid call is paged, with 8
# automatic splits (4 x 2 kv heads of 8 rows: 8 CTAs, one wave at any count; 16 key blocks,
# and at most ceil(1000 / 128) = 8 splits, of 2 blocks each, the least per CTA), so that it
# needs a workspace; its cache holds fp16 values, its scales are given (and not read).
DQ, DK, DV, DSEQ, DBT, DO, DLSE, DWS, DKS, DVS = (0x7F0010000000 + i * 0x10000000
                                                  for i in range(10))
DECODE_SIZEOF = ctypes.sizeof(ck.AttentionDecodeParams)
DECODE_V1_SIZEOF = ck.AttentionDecodeParams.kv_format.offset   # ends at num_splits
ATTENTION_DECODE = dict(dtype=DType.FP16, q_ptr=DQ, k_cache_ptr=DK, v_cache_ptr=DV,
                        seqlens_k_ptr=DSEQ, block_table_ptr=DBT, out_ptr=DO, lse_ptr=DLSE,
                        batch=4, seqlen_q=2, num_heads_q=8, num_heads_kv=2, head_dim=128,
                        max_seqlen_k=1000, num_pages=300, page_size=16, max_blocks_per_seq=100,
                        softmax_scale=0.0, num_splits=0, kv_format=ck.KV_DTYPE,
                        kv_scaling=ck.KV_SCALE_PER_HEAD, k_scale_ptr=DKS, v_scale_ptr=DVS,
                        workspace_ptr=DWS, workspace_bytes=2**40)
CONTIGUOUS = dict(block_table_ptr=0)
# The quantized caches: int8 codes with scales per kv head (2 x 4 bytes each), FP8 E4M3 codes
# with scales per cache row (300 x 16 rows of 2 heads: 38400 bytes each).
PER_HEAD_INT8 = dict(kv_format=ck.KV_INT8, kv_scaling=ck.KV_SCALE_PER_HEAD)
PER_TOKEN_FP8 = dict(kv_format=ck.KV_FP8_E4M3, kv_scaling=ck.KV_SCALE_PER_TOKEN)
DECODE_CACHE_ROWS = 300 * 16   # num_pages x page_size
DECODE_ROW_ELEMENTS = 2 * 128   # Hkv x D
# 2^16 x 2^30 x 2^16 x 128 x 2 bytes (contiguous) and 2^31 x 2^16 x 2^16 x 128 x 2 (paged).
CACHE_PAST_2_63 = dict(num_heads_q=65535, num_heads_kv=65535)
ATTENTION_DECODE_CASES = (
    null("q", "k_cache", "v_cache", "seqlens_k", "out", "workspace")
    + [("null-params", dict(params_ptr=0), INVALID, ["params"])]
    + bad("struct_size", (0, 8, DECODE_V1_SIZEOF - 8, DECODE_V1_SIZEOF + 1, DECODE_V1_SIZEOF + 8,
                          DECODE_SIZEOF - 8, DECODE_SIZEOF + 8, 2**40), INVALID)
    + bad_dtypes("dtype", NOT_HALF_DTYPES)
    + bad("batch", (0, -1, 65536), INVALID)
    + bad("seqlen_q", (0, -1, 17), INVALID)
    + bad("num_heads_q", (0, -8, 65536), INVALID)
    + bad("num_heads_kv", (0, -1, 16), INVALID)
    + [("heads-not-divisible", dict(num_heads_kv=3), INVALID, ["num_heads_q", "num_heads_kv"])]
    + bad("head_dim", (0, -128), INVALID)
    + bad("head_dim", (32, 96, 100, 256), UNSUPPORTED)
    + bad("max_seqlen_k", (0, -1, 2**30 + 1), INVALID)
    + bad("num_pages", (0, -1, 2**31), INVALID)
    + bad("page_size", (0, -16, 3, 48, 2**17), INVALID)
    + bad("max_blocks_per_seq", (0, -1, 2**31), INVALID)
    + [("max_seqlen_k-past-the-pages", dict(max_seqlen_k=1601), INVALID,
        ["max_seqlen_k", "max_blocks_per_seq", "page_size"]),
       ("paged-cache-past-2^63", dict(CACHE_PAST_2_63, num_pages=2**31 - 1, page_size=65536),
        INVALID, ["num_pages", "page_size"]),
       ("contiguous-cache-past-2^63", dict(CONTIGUOUS, **CACHE_PAST_2_63, batch=65535,
                                           max_seqlen_k=2**30), INVALID,
        ["batch", "max_seqlen_k"]),
       # Without a block_table the paged fields are not read: the error is the scale's.
       ("contiguous-ignores-page_size", dict(CONTIGUOUS, page_size=3, num_pages=0,
                                             max_blocks_per_seq=-1,
                                             softmax_scale=float("nan")), INVALID,
        ["softmax_scale"])]
    + [("softmax_scale=%s" % v, dict(softmax_scale=float(v)), INVALID, ["softmax_scale"])
       for v in ("nan", "inf", "-inf")]
    + bad("num_splits", (-1, 65, 2**31 - 1), INVALID)
    + bad("kv_format", (3, -1, 99), INVALID)
    + [("kv_scaling=%d" % v, dict(PER_HEAD_INT8, kv_scaling=v), INVALID, ["kv_scaling"])
       for v in (2, -1)]
    # For CK_KV_DTYPE neither kv_scaling nor the scales are read: the errors are later fields'.
    + [("dtype-cache-ignores-kv_scaling", dict(kv_scaling=7, softmax_scale=float("nan")),
        INVALID, ["softmax_scale"]),
       ("dtype-cache-ignores-the-scales", dict(k_scale_ptr=0, v_scale_ptr=DVS + 1,
                                               workspace_bytes=1), INVALID, ["workspace_bytes"])]
    + [("null-%s-quantized" % name, dict(PER_HEAD_INT8, **{name + "_ptr": 0}), INVALID, [name])
       for name in ("k_scale", "v_scale")]
    + [("misaligned-%s+%d-quantized" % (name[:-4], d), dict(PER_TOKEN_FP8, **{name: base + d}),
        MISALIGNED, [name[:-4]])
       for name, base in (("k_scale_ptr", DKS), ("v_scale_ptr", DVS)) for d in (1, 2)]
    + [("misaligned-%s+%d" % (name[:-4], d), {name: base + d}, MISALIGNED, [name[:-4]])
       for name, base in (("q_ptr", DQ), ("k_cache_ptr", DK), ("v_cache_ptr", DV),
                          ("out_ptr", DO))
       for d in (2, 8)]
    + [("misaligned-%s+%d" % (name[:-4], d), {name: base + d}, MISALIGNED, [name[:-4]])
       for name, base in (("lse_ptr", DLSE), ("seqlens_k_ptr", DSEQ), ("block_table_ptr", DBT))
       for d in (1, 2)]
    + [("out-overlaps-q", dict(out_ptr=DQ + 512), INVALID, ["out", "q"]),
       ("out-overlaps-v_cache", dict(out_ptr=DV + 2**20), INVALID, ["out", "v_cache"]),
       ("lse-overlaps-out", dict(lse_ptr=DO + 256), INVALID, ["lse", "out"]),
       ("lse-overlaps-k_cache", dict(lse_ptr=DK), INVALID, ["lse", "k_cache"]),
       ("out-overlaps-k_scale", dict(PER_HEAD_INT8, out_ptr=DKS), INVALID, ["out", "k_scale"]),
       ("lse-overlaps-v_scale", dict(PER_HEAD_INT8, lse_ptr=DVS + 4), INVALID,
        ["lse", "v_scale"]),
       # Per-token scales span the cache's rows: 38400 bytes.
       ("out-overlaps-per-token-v_scale", dict(PER_TOKEN_FP8, out_ptr=DVS + 38400 - 16),
        INVALID, ["out", "v_scale"])]
    + bad("workspace_bytes", (0, 1, 255), INVALID)
    + [("misaligned-workspace+%d" % d, dict(workspace_ptr=DWS + d), MISALIGNED, ["workspace"])
       for d in (1, 16, 128)]
    + [("workspace-overlaps-%s" % name, dict(workspace_ptr=base), INVALID, ["workspace"])
       for name, base in (("out", DO), ("q", DQ), ("k_cache", DK), ("lse", DLSE))]
    + [("workspace-overlaps-k_scale", dict(PER_HEAD_INT8, workspace_ptr=DKS), INVALID,
        ["workspace"]),
       ("workspace-overlaps-per-token-v_scale",
        dict(PER_TOKEN_FP8, workspace_ptr=DVS + 38400 - 256), INVALID, ["workspace"])]
)

# ck_attention_decode_workspace_size validates the struct as ck_attention_decode does, pointers
# excepted (block_table says only whether the cache is paged): the cases that change no pointer.
ATTENTION_DECODE_WORKSPACE_SIZE, ATTENTION_DECODE_WORKSPACE_SIZE_CASES = workspace_size_table(
    ATTENTION_DECODE, ATTENTION_DECODE_CASES,
    lambda case: not any(key.endswith("_ptr") and key != "block_table_ptr" or
                         key.startswith("workspace") for key in case[1])
    and case[0] not in ("null-params",) and not case[0].startswith("misaligned-block_table"))


attention_decode_workspace_size = workspace_size_call("ck_attention_decode_workspace_size",
                                                      ck.AttentionDecodeParams)
attention_decode = workspace_call("attention_decode", ck.AttentionDecodeParams)


# ck_kv_cache_append takes a ck_kv_cache_append_params_t (cuda_wrapper.KvCacheAppendParams), its
# rows written as the MoE layer's. Rules (cuda_kernels.h), checked in the struct's order: dtype
# fp16 or bf16; kv_format a ck_kv_format_t and, quantized, kv_scaling a ck_kv_scaling_t; k, v,
# slot_mapping and the cache given, and the scales for a quantized format (not read for
# CK_KV_DTYPE); 1 <= num_tokens < 2^31, 1 <= Hkv <= 65535; D >= 1, and 64 or 128 (else
# UNSUPPORTED); num_slots >= 1 with the cache's bytes (2 per element, 1 quantized) within int64;
# k, v and the cache 16-byte aligned, slot_mapping 8, the scales 4; the cache, and the scales
# where written (per token), clear of every other buffer. The valid call writes int8 codes with
# per-token scales, so that every field is read: k and v 16 x 8 x 128 x 2 bytes, the cache
# 4096 x 8 x 128 bytes, each scale array 4096 x 8 x 4.
AK_NEW, AV_NEW, ASLOT, AKC, AVC, AKS, AVS = (0x7F0030000000 + i * 0x10000000 for i in range(7))
KV_APPEND_SIZEOF = ctypes.sizeof(ck.KvCacheAppendParams)
KV_CACHE_APPEND = dict(dtype=DType.FP16, kv_format=ck.KV_INT8,
                       kv_scaling=ck.KV_SCALE_PER_TOKEN, k_ptr=AK_NEW, v_ptr=AV_NEW,
                       slot_mapping_ptr=ASLOT, k_cache_ptr=AKC, v_cache_ptr=AVC, k_scale_ptr=AKS,
                       v_scale_ptr=AVS, num_tokens=16, num_heads_kv=8, head_dim=128,
                       num_slots=4096)
KV_APPEND_CACHE_BYTES = 4096 * 8 * 128
KV_CACHE_APPEND_CASES = (
    null("k", "v", "slot_mapping", "k_cache", "v_cache", "k_scale", "v_scale")
    + [("null-params", dict(params_ptr=0), INVALID, ["params"])]
    + bad("struct_size", (0, 8, KV_APPEND_SIZEOF - 8, KV_APPEND_SIZEOF + 8, 2**40), INVALID)
    + bad_dtypes("dtype", NOT_HALF_DTYPES)
    + bad("kv_format", (3, -1, 99), INVALID)
    + bad("kv_scaling", (2, -1), INVALID)
    # A cache of the dtype's values reads neither kv_scaling nor the scales: the error is D's.
    + [("dtype-cache-ignores-the-scales", dict(kv_format=ck.KV_DTYPE, kv_scaling=7, k_scale_ptr=0,
                                               v_scale_ptr=AVS + 1, head_dim=96), UNSUPPORTED,
        ["head_dim"])]
    + bad("num_tokens", (0, -1, 2**31, BIG), INVALID)
    + bad("num_heads_kv", (0, -1, 65536), INVALID)
    + bad("head_dim", (0, -128), INVALID)
    + bad("head_dim", (32, 96, 100, 256), UNSUPPORTED)
    + bad("num_slots", (0, -1, -2**63), INVALID)
    # 2^53 slots of 8 x 128 codes: 2^63 bytes; of fp16 values, 2^52 slots are as many.
    + [("num_slots-bytes-past-2^63", dict(num_slots=2**53), INVALID, ["num_slots"]),
       ("dtype-num_slots-bytes-past-2^63", dict(kv_format=ck.KV_DTYPE, num_slots=2**52),
        INVALID, ["num_slots"])]
    + [("misaligned-%s+%d" % (name[:-4], d), {name: base + d}, MISALIGNED, [name[:-4]])
       for name, base in (("k_ptr", AK_NEW), ("v_ptr", AV_NEW), ("k_cache_ptr", AKC),
                          ("v_cache_ptr", AVC))
       for d in (2, 8)]
    + [("misaligned-slot_mapping+%d" % d, dict(slot_mapping_ptr=ASLOT + d), MISALIGNED,
        ["slot_mapping"]) for d in (1, 4)]
    + [("misaligned-%s+%d" % (name[:-4], d), {name: base + d}, MISALIGNED, [name[:-4]])
       for name, base in (("k_scale_ptr", AKS), ("v_scale_ptr", AVS)) for d in (1, 2)]
    + [("k_cache-overlaps-k", dict(k_cache_ptr=AK_NEW + 256), INVALID, ["k_cache", "k"]),
       ("v_cache-overlaps-v", dict(v_ptr=AVC + KV_APPEND_CACHE_BYTES - 256), INVALID,
        ["v_cache", "v"]),
       ("k_cache-overlaps-v_cache", dict(v_cache_ptr=AKC + 2**20), INVALID,
        ["k_cache", "v_cache"]),
       ("k_cache-overlaps-v_scale", dict(v_scale_ptr=AKC + 4096), INVALID,
        ["k_cache", "v_scale"]),
       ("k_scale-overlaps-v", dict(k_scale_ptr=AV_NEW), INVALID, ["k_scale", "v"]),
       ("k_scale-overlaps-v_scale", dict(v_scale_ptr=AKS + 4096), INVALID,
        ["k_scale", "v_scale"]),
       # Per-head scales are read, but the cache must not overlap them either.
       ("k_cache-overlaps-per-head-k_scale",
        dict(kv_scaling=ck.KV_SCALE_PER_HEAD, k_scale_ptr=AKC + 4096), INVALID,
        ["k_cache", "k_scale"])]
)


def kv_cache_append(fields):
    ck.raw.kv_cache_append(params_struct(ck.KvCacheAppendParams, fields), stream=0)


# ck_qkv_projection takes a ck_qkv_params_t (cuda_wrapper.QkvParams), ck_qkv_prepack the same
# struct (its [prepack] fields) and the native weight in, the prepacked one out. Rules
# (cuda_kernels.h): dtype fp16 or bf16; format and rope_style known values; 1 <= Hkv <= 2^20
# dividing Hq <= 2^20; D a multiple of 8 in [8, 2^20]; with RoPE, rotary_dim even in [2, D],
# positions and cos_sin given (4-byte aligned) and max_position >= 1; hidden in [32, 2^40], a
# multiple of 32 (and of the block); INT4: a valid mode with zero points exactly when
# asymmetric, group 32/64/128/row; block formats: mode 0, no zero points, the format's block
# sizes, NVFP4's global_scale (and only NVFP4's); tokens >= 1; x and the weight 16-byte
# aligned, bias/q/k/v aligned to dtype; q, k and v clear of each other and of x.
QX, QW, QS, QZ, QG, QB, QPOS, QCS, QQ, QK, QV = (0x7F0020000000 + i * 0x10000000 for i in range(11))
QKV_SIZEOF = ctypes.sizeof(ck.QkvParams)
QKV_LAYER = dict(hidden=4096, num_heads_q=32, num_heads_kv=8, head_dim=128, dtype=DType.FP16,
                 format=ck.WEIGHT4_INT4, group_size=128, mode=ck.INT4_SYMMETRIC,
                 rope_style=ck.ROPE_NEOX, rotary_dim=128)
QKV_PROJECTION = dict(QKV_LAYER, tokens=16, x_ptr=QX, w_prepacked_ptr=QW, scales_prepacked_ptr=QS,
                      zeros_prepacked_ptr=0, global_scale_ptr=0, bias_ptr=QB, positions_ptr=QPOS,
                      cos_sin_ptr=QCS, max_position=4096, q_ptr=QQ, k_ptr=QK, v_ptr=QV)
QKV_NF4 = dict(format=ck.WEIGHT4_NF4, group_size=64)
QKV_NVFP4 = dict(format=ck.WEIGHT4_NVFP4, group_size=16)


def qkv_layer_cases():
    """What both entry points check of the layer description (the [prepack] fields)."""
    return ([("null-params", dict(params_ptr=0), INVALID, ["params"])]
            + bad("struct_size", (0, 8, QKV_SIZEOF - 8, QKV_SIZEOF + 8, 2**40), INVALID)
            + bad_dtypes("dtype", NOT_HALF_DTYPES)
            + bad("format", (4, -1), INVALID)
            + bad("rope_style", (3, -1), INVALID)
            + bad("num_heads_kv", (0, -1, 2**20 + 1), INVALID)
            + bad("num_heads_q", (0, -32, 4, 2**21), INVALID)
            + [("heads-not-divisible", dict(num_heads_kv=3), INVALID,
                ["num_heads_q", "num_heads_kv"])]
            + bad("head_dim", (0, -128, 4, 12, 2**21), INVALID)
            + bad("rotary_dim", (0, 1, 127, 130, -2), INVALID)
            + [("rotary_dim-ignored-without-rope", dict(rope_style=ck.ROPE_NONE, rotary_dim=-1,
                                                       hidden=48), UNSUPPORTED, ["hidden"])]
            + bad("hidden", (0, 16, -64, 2**41), INVALID)
            + bad("hidden", (48, 4100), UNSUPPORTED)
            + bad("mode", (2, -1), INVALID)
            + bad("group_size", BAD_GROUP_SIZES, UNSUPPORTED)
            + [("nf4-blocksize-16", dict(QKV_NF4, group_size=16), UNSUPPORTED, ["blocksize"]),
               ("mxfp4-blocksize-64", dict(format=ck.WEIGHT4_MXFP4, group_size=64), UNSUPPORTED,
                ["blocksize"]),
               ("nvfp4-blocksize-32", dict(QKV_NVFP4, group_size=32), UNSUPPORTED, ["blocksize"]),
               ("nf4-asymmetric", dict(QKV_NF4, mode=ck.INT4_ASYMMETRIC), INVALID, ["mode"])])


QKV_PROJECTION_CASES = (
    null("x", "w_prepacked", "scales_prepacked", "q", "k", "v", "positions", "cos_sin")
    + qkv_layer_cases()
    + [("null-zeros_prepacked-asymmetric", dict(mode=ck.INT4_ASYMMETRIC), INVALID,
        ["zeros_prepacked"]),
       ("zeros_prepacked-symmetric", dict(zeros_prepacked_ptr=QZ), INVALID, ["zeros_prepacked"]),
       ("zeros_prepacked-nf4", dict(QKV_NF4, zeros_prepacked_ptr=QZ), INVALID,
        ["zeros_prepacked"]),
       ("global_scale-int4", dict(global_scale_ptr=QG), INVALID, ["global_scale"]),
       ("global_scale-nf4", dict(QKV_NF4, global_scale_ptr=QG), INVALID, ["global_scale"]),
       ("null-global_scale-nvfp4", dict(QKV_NVFP4), INVALID, ["global_scale"]),
       ("overflow-tokens", dict(tokens=BIG), INVALID, ["tokens"])]
    + bad("tokens", (0, -1), INVALID)
    + bad("max_position", (0, -1, BIG), INVALID)
    + [("misaligned-%s+%d" % (name[:-4], d), {name: base + d}, MISALIGNED, [name[:-4]])
       for name, base in (("x_ptr", QX), ("w_prepacked_ptr", QW), ("scales_prepacked_ptr", QS))
       for d in (2, 8)]
    + [("misaligned-zeros_prepacked+4", dict(mode=ck.INT4_ASYMMETRIC, zeros_prepacked_ptr=QZ + 4),
        MISALIGNED, ["zeros_prepacked"]),
       ("misaligned-global_scale+2", dict(QKV_NVFP4, global_scale_ptr=QG + 2), MISALIGNED,
        ["global_scale"])]
    + [("misaligned-%s+%d" % (name[:-4], d), {name: base + d}, MISALIGNED, [name[:-4]])
       for name, base in (("positions_ptr", QPOS), ("cos_sin_ptr", QCS)) for d in (1, 2)]
    + [("misaligned-%s+1" % name[:-4], {name: base + 1}, MISALIGNED, [name[:-4]])
       for name, base in (("bias_ptr", QB), ("q_ptr", QQ), ("k_ptr", QK), ("v_ptr", QV))]
    + [("k-overlaps-q", dict(k_ptr=QQ + 256), INVALID, ["q", "k", "v"]),
       ("v-overlaps-k", dict(v_ptr=QK - 256), INVALID, ["q", "k", "v"]),
       ("q-overlaps-x", dict(q_ptr=QX + 512), INVALID, ["q", "x"])]
)


def qkv_projection(fields):
    ck.raw.qkv_projection(params_struct(ck.QkvParams, fields), stream=0)


# ck_qkv_prepack: the row's layer fields go into the struct, its pointers are the call's.
QKV_PREPACK = dict(QKV_LAYER, packed_ptr=B, scales_ptr=S, zeros_ptr=0, w_out_ptr=Q,
                   scales_out_ptr=O, zeros_out_ptr=0)
QKV_PREPACK_ASYM = dict(mode=ck.INT4_ASYMMETRIC, zeros_ptr=Z, zeros_out_ptr=BIAS)
QKV_PREPACK_CASES = (
    qkv_layer_cases()
    + [("null-packed", dict(packed_ptr=0), INVALID, ["w_packed"]),
       ("null-packed-nf4", dict(QKV_NF4, packed_ptr=0), INVALID, ["packed"]),
       ("null-scales", dict(scales_ptr=0), INVALID, ["scales"]),
       ("null-w_prepacked", dict(w_out_ptr=0), INVALID, ["w_prepacked"]),
       ("null-scales_prepacked", dict(scales_out_ptr=0), INVALID, ["scales_prepacked"]),
       ("null-zeros-asymmetric", dict(QKV_PREPACK_ASYM, zeros_ptr=0), INVALID, ["zeros"]),
       ("zeros-symmetric", dict(zeros_ptr=Z), INVALID, ["zeros"]),
       ("zeros-nf4", dict(QKV_NF4, zeros_ptr=Z), INVALID, ["zeros"]),
       ("zeros_prepacked-nf4", dict(QKV_NF4, zeros_out_ptr=BIAS), INVALID, ["zeros_prepacked"]),
       ("misaligned-w_packed+8", dict(packed_ptr=B + 8), MISALIGNED, ["w_packed"]),
       ("misaligned-packed-nf4+8", dict(QKV_NF4, packed_ptr=B + 8), MISALIGNED, ["packed"]),
       ("misaligned-w_prepacked+8", dict(w_out_ptr=Q + 8), MISALIGNED, ["w_prepacked"]),
       ("misaligned-scales_prepacked+4", dict(scales_out_ptr=O + 4), MISALIGNED,
        ["scales_prepacked"])]
)


def qkv_prepack(fields):
    fields = dict(fields)
    pointers = {name: fields.pop(name) for name in ("packed_ptr", "scales_ptr", "zeros_ptr",
                                                    "w_out_ptr", "scales_out_ptr",
                                                    "zeros_out_ptr")}
    ck.raw.qkv_prepack(params_struct(ck.QkvParams, fields), **pointers, stream=0)


# The entry points that take a parameter struct: how a row's arguments become a call.
STRUCT_CALLS = {"ck_moe_workspace_size": moe_workspace_size, "ck_moe_forward": moe_forward,
                "ck_attention_forward": attention_forward, "ck_kv_cache_append": kv_cache_append,
                "ck_attention_decode_workspace_size": attention_decode_workspace_size,
                "ck_attention_decode": attention_decode, "ck_qkv_prepack": qkv_prepack,
                "ck_qkv_projection": qkv_projection}

# The entry points with bad-argument cases: the valid call of each is the table named after it
# (QUANTIZE_INT8 for ck_quantize_int8), its cases are that table's _CASES.
ENTRY_POINTS = {
    "ck_" + table.lower(): (globals()[table], globals()[table + "_CASES"])
    for table in ("QUANTIZE_INT8", "DEQUANTIZE_INT8", "QUANTIZE_FP8", "DEQUANTIZE_FP8",
                  "QUANTIZE_INT4", "DEQUANTIZE_INT4",
                  "QUANTIZE_NF4", "DEQUANTIZE_NF4", "QUANTIZE_MXFP4", "DEQUANTIZE_MXFP4",
                  "QUANTIZE_NVFP4", "DEQUANTIZE_NVFP4",
                  "GEMM_INT8", "GEMM_INT8_SCALED", "GEMM_FP8_SCALED", "GEMM_W4A8",
                  "INT8_PREPACK", "LINEAR", "GEMM_W4A16", "GEMM_W4A16_PREPACKED",
                  "W4A16_PREPACK", "BLOCK4_PREPACK", "GEMM_BLOCK4_PREPACKED", "QKV_PREPACK",
                  "QKV_PROJECTION", "IMPORT_GPTQ", "IMPORT_AWQ", "PERMUTE_COLUMNS",
                  "SPARSE_PRUNE", "SPARSE_QUANTIZE_INT4", "SPARSE_1632_TO_24",
                  "SPARSE_DEQUANTIZE_INT4",
                  "GEMM_SPARSE_W4A16", "SPARSE_W4A16_PREPACK", "SPARSE_W4A16_PREPACK_DENSE",
                  "GEMM_SPARSE_W4A16_PREPACKED",
                  "GEMM_INT4",
                  "GEMM_INT4_SCALED", "MOE_ROUTE", "MOE_PREPACK", "MOE_WORKSPACE_SIZE",
                  "MOE_FORWARD", "ATTENTION_FORWARD", "KV_CACHE_APPEND",
                  "ATTENTION_DECODE_WORKSPACE_SIZE", "ATTENTION_DECODE")
}


def raw_function(function):
    """ck.raw's function of the entry point `function`."""
    return getattr(ck.raw, function[len("ck_"):])


def bad_call_params():
    for function, (_, cases) in ENTRY_POINTS.items():
        for case_id, changes, status, names in cases:
            yield pytest.param(function, changes, status, names, id="%s-%s" % (function, case_id))


def mentions(message, word):
    """word appears in message as a whole identifier or number."""
    return re.search(r"(?<![\w-])%s(?![\w])" % re.escape(str(word)), message) is not None


def call_entry_point(function, kwargs):
    """Calls `function` with a table's arguments (through its parameter struct, if it takes one)."""
    if function in STRUCT_CALLS:
        return STRUCT_CALLS[function](kwargs)
    return raw_function(function)(**kwargs, stream=0)


def rejection(function, changes):
    """Calls `function` with its valid arguments changed by `changes`; returns the CKError."""
    valid, _ = ENTRY_POINTS[function]
    kwargs = dict(valid, **changes)
    with pytest.raises(CKError) as info:
        call_entry_point(function, kwargs)
    return info.value


def test_every_status_function_has_bad_argument_cases():
    covered = set(ENTRY_POINTS) | {"ck_device_count"}
    assert covered == set(STATUS_FUNCTIONS)


def test_valid_baselines_are_valid_shapes():
    """Sanity of the tables: the unchanged arguments are right (but never called here)."""
    for function, (valid, cases) in ENTRY_POINTS.items():
        sizes = [valid[key] for key in ("rows", "cols", "m", "n", "k", "experts", "tokens",
                                        "hidden", "intermediate", "top_k", "total_q", "total_k",
                                        "num_heads_q", "num_heads_kv", "head_dim")
                 if key in valid]
        assert len(sizes) >= 2 and all(size >= 1 for size in sizes), function
        if "k" in valid:   # a multiple of 16 suits every GEMM rule, N too (for CK_LAYOUT_KN)
            assert valid["k"] % 16 == 0 and valid["n"] % 16 == 0, function
        if "top_k" in valid:   # the MoE limits
            assert valid["top_k"] <= min(valid["experts"], 32) and valid["experts"] <= 1024
        if "hidden" in valid:
            assert valid["hidden"] % 32 == 0 and valid.get("intermediate", 32) % 32 == 0, function
        assert all(ptr % 256 == 0 for key, ptr in valid.items() if key.endswith("_ptr"))
        assert len({case_id for case_id, *_ in cases}) == len(cases), function


@pytest.mark.parametrize("function, changes, status, names", list(bad_call_params()))
def test_bad_argument_rejected(lib, function, changes, status, names):
    assert_rejected_as(rejection(function, changes), function, changes, status, names)


def assert_rejected_as(error, function, changes, status, names):
    """The rejection of a bad-argument case: its status, and a message of the calling thread
    that starts with the function and names the arguments (and the offending value)."""
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
    assert error.cuda_error == 0 and ck.raw.last_cuda_error() == 0, \
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


def test_gemm_w4a16_null_bias_is_allowed(lib):
    """bias may be NULL: with another defect planted, the error is about that one."""
    error = rejection("ck_gemm_w4a16", dict(bias_ptr=0, k=48))
    assert error.status == Status.UNSUPPORTED and mentions(error.message, "k"), error.message
    error = rejection("ck_gemm_w4a16", dict(bias_ptr=0, out_ptr=O + 1))
    assert error.status == Status.MISALIGNED and mentions(error.message, "out"), error.message
    error = rejection("ck_gemm_w4a16", dict(bias_ptr=0, scales_ptr=S + 1))
    assert error.status == Status.MISALIGNED and mentions(error.message, "scales")


def test_gemm_w4a8_null_bias_is_allowed(lib):
    """bias may be NULL: with another defect planted, the error is about that one."""
    error = rejection("ck_gemm_w4a8", dict(bias_ptr=0, k=48))
    assert error.status == Status.UNSUPPORTED and mentions(error.message, "k"), error.message
    error = rejection("ck_gemm_w4a8", dict(bias_ptr=0, out_ptr=O + 1))
    assert error.status == Status.MISALIGNED and mentions(error.message, "out"), error.message
    error = rejection("ck_gemm_w4a8", dict(bias_ptr=0, w_scales_ptr=S + 1))
    assert error.status == Status.MISALIGNED and mentions(error.message, "w_scales")


# ck_gemm_w4a8 checks its arguments in the order the rows below follow: pointers (NULL), the
# output dtype, the scales' dtype, a_granularity, activation, group_size, the shape, the
# alignments. Each row plants two defects; the first in that order is the one reported.
W4A8_VALIDATION_ORDER = [
    ("null-a-before-out_dtype", dict(a_ptr=0, out_dtype=99), INVALID, "a"),
    ("null-w_scales-before-scale_dtype", dict(w_scales_ptr=0, scale_dtype=DType.FP32), INVALID,
     "w_scales"),
    ("out_dtype-before-scale_dtype", dict(out_dtype=DType.INT8, scale_dtype=DType.FP32),
     UNSUPPORTED, "out_dtype"),
    ("scale_dtype-before-a_granularity", dict(scale_dtype=DType.FP32,
                                              a_granularity=ck.PER_BLOCK_1X128),
     UNSUPPORTED, "scale_dtype"),
    ("a_granularity-before-activation", dict(a_granularity=ck.PER_BLOCK_128X128, activation=5),
     INVALID, "a_granularity"),
    ("activation-before-group_size", dict(activation=5, group_size=64), INVALID, "activation"),
    ("group_size-before-k", dict(group_size=64, k=48), UNSUPPORTED, "group_size"),
    ("group_size-before-m", dict(group_size=256, m=0), UNSUPPORTED, "group_size"),
    ("k-before-alignment", dict(k=48, a_ptr=A + 1), UNSUPPORTED, "k"),
    ("m-before-alignment", dict(m=0, out_ptr=O + 1), INVALID, "m"),
    ("a-before-out", dict(a_ptr=A + 8, out_ptr=O + 1), MISALIGNED, "a"),
    ("w_packed-before-w_scales", dict(w_ptr=B + 8, w_scales_ptr=S + 1), MISALIGNED,
     "w_packed"),
]


@pytest.mark.parametrize("changes, status, name", [
    pytest.param(changes, status, name, id=case_id)
    for case_id, changes, status, name in W4A8_VALIDATION_ORDER])
def test_gemm_w4a8_validation_order(lib, changes, status, name):
    error = rejection("ck_gemm_w4a8", changes)
    assert error.status == status and mentions(error.message, name), \
        "%s: got %s (%s)" % (changes, error.status, error.message)


def test_sparse_quantize_null_violations_is_allowed(lib):
    """violations may be NULL (no count asked for): with another defect planted, the error is
    about that one."""
    error = rejection("ck_sparse_quantize_int4", dict(violations_ptr=0, meta_ptr=META + 4))
    assert error.status == Status.MISALIGNED and mentions(error.message, "meta"), error.message


# ------------------------------------------------------------------------------------------------
# The kernel overrides: one row each
# ------------------------------------------------------------------------------------------------
# Each CK_GEMM_*_KERNEL variable (and CK_ATTENTION_KERNEL) forces a kernel variant of the entry
# points it governs; the library reads it on every call, once every argument has passed
# validation and before any CUDA call. So an unknown name is a host-side error (INVALID_VALUE, naming the function, the variable
# and the value), and planting one is a probe: that error, rather than another, proves that the
# arguments of the call are valid. The names an override accepts would launch on the fake
# addresses (the GPU tests run them); here they give the names it must refuse: each in capitals,
# and the names that only the other overrides accept.
class KernelOverride(typing.NamedTuple):
    env: str
    functions: tuple   # the entry points it governs; their valid calls are ENTRY_POINTS'
    accepts: tuple     # its variant names (the empty string means auto too)
    valid_calls: list  # (id, changes, functions): unusual arguments that pass validation


INT8_GEMMS = ("ck_gemm_int8", "ck_gemm_int8_scaled")
W4A16_GEMMS = ("ck_gemm_w4a16", "ck_gemm_w4a16_prepacked")
INT4_GEMMS = ("ck_gemm_int4", "ck_gemm_int4_scaled")
BLOCK4_GEMMS = ("ck_gemm_block4_prepacked",)
SPARSE_GEMMS = ("ck_gemm_sparse_w4a16", "ck_gemm_sparse_w4a16_prepacked")
KERNEL_OVERRIDES = [
    KernelOverride(
        "CK_GEMM_INT8_KERNEL", INT8_GEMMS, ("auto", "reference", "mma", "small_m", "wgmma"),
        # Any M and N (N a multiple of 16 only for CK_LAYOUT_KN), K a multiple of 16.
        [("n=15", dict(n=15), INT8_GEMMS), ("1x1", dict(n=1, m=1), INT8_GEMMS),
         ("n=4097", dict(n=4097, m=3, k=16), INT8_GEMMS),
         ("kn-16x16", dict(b_layout=KN, n=16, k=16), INT8_GEMMS),
         ("m=1e6", dict(m=10**6), INT8_GEMMS)]
        # c needs 4-byte alignment only.
        + [("c+%d" % d, dict(c_ptr=C + d), ["ck_gemm_int8"]) for d in (4, 12)]
        # Scales need 4 bytes, bias and out their element size; bias may be NULL.
        + [(case_id, changes, ["ck_gemm_int8_scaled"]) for case_id, changes in [
            ("fp16+2", dict(out_ptr=O + 2, bias_ptr=BIAS + 2)),
            ("bf16+6", dict(out_ptr=O + 6, bias_ptr=BIAS + 10, out_dtype=DType.BF16)),
            ("fp32+4", dict(out_ptr=O + 4, bias_ptr=BIAS + 12, out_dtype=DType.FP32)),
            ("scales+4", dict(scale_a_ptr=SA + 4, scale_b_ptr=SB + 12)),
            ("no-bias", dict(bias_ptr=0, activation=ck.ACTIVATION_NONE)),
            ("per-tensor", dict(a_granularity=ck.PER_TENSOR, b_granularity=ck.PER_TENSOR))]]),
    KernelOverride(
        "CK_GEMM_FP8_KERNEL", ("ck_gemm_fp8_scaled",), ("auto", "reference", "small_m", "wgmma"),
        # Any M and N, K a multiple of 16; the epilogue's alignments as INT8's.
        [(case_id, changes, ["ck_gemm_fp8_scaled"]) for case_id, changes in [
            ("1x1x16", dict(n=1, m=1, k=16)), ("n=4097", dict(n=4097, m=3, k=48)),
            ("m=1e6", dict(m=10**6)),
            ("fp32+4", dict(out_ptr=O + 4, bias_ptr=BIAS + 12, out_dtype=DType.FP32)),
            ("per-tensor", dict(a_granularity=ck.PER_TENSOR, b_granularity=ck.PER_TENSOR)),
            ("block-scales", dict(a_granularity=ck.PER_BLOCK_1X128,
                                  b_granularity=ck.PER_BLOCK_128X128, k=48)),
            ("no-bias", dict(bias_ptr=0, activation=ck.ACTIVATION_NONE))]]),
    KernelOverride(
        "CK_GEMM_W4A8_KERNEL", ("ck_gemm_w4a8",), ("auto", "reference", "small_m", "wgmma"),
        # Any M and N, K a multiple of 32, group 128 (K need not be a multiple of it) or the
        # row, either scale dtype, either granularity, bias NULL; a and w_packed 16-byte
        # aligned only, scale_a 4-byte, w_scales, bias and out aligned to their element only.
        [(case_id, changes, ["ck_gemm_w4a8"]) for case_id, changes in [
            ("1x1x32", dict(n=1, m=1, k=32)),
            ("partial-group", dict(n=7, m=17, k=160)),
            ("row-group", dict(n=4097, m=100, k=160, group_size=ck.GROUP_ROW)),
            ("m=1e6", dict(m=10**6)),
            ("bf16-scales", dict(scale_dtype=DType.BF16, w_scales_ptr=S + 2)),
            ("per-tensor", dict(a_granularity=ck.PER_TENSOR, scale_a_ptr=SA + 4)),
            ("no-bias", dict(bias_ptr=0, activation=ck.ACTIVATION_NONE)),
            ("16-byte-aligned", dict(a_ptr=A + 16, w_ptr=B + 48)),
            ("fp16-element-aligned", dict(w_scales_ptr=S + 2, bias_ptr=BIAS + 6, out_ptr=O + 10)),
            ("bf16-out-element-aligned", dict(bias_ptr=BIAS + 2, out_ptr=O + 2,
                                              out_dtype=DType.BF16)),
            ("fp32-out+4", dict(out_ptr=O + 4, bias_ptr=BIAS + 12, out_dtype=DType.FP32))]]),
    KernelOverride(
        "CK_GEMM_W4A16_KERNEL", W4A16_GEMMS, ("auto", "reference", "small_m", "tc", "wgmma"),
        # Any M and N, K a multiple of 32, any supported group size (K need not be a multiple
        # of it), bias NULL.
        [(case_id, changes, W4A16_GEMMS) for case_id, changes in [
            ("1x1x32", dict(n=1, m=1, k=32)),
            ("partial-group", dict(n=7, m=17, k=96, group_size=64)),
            ("row-group", dict(n=4097, m=100, k=160, group_size=ck.GROUP_ROW)),
            ("m=1e6", dict(m=10**6, group_size=32)),
            ("bf16", dict(dtype=DType.BF16, activation=ck.ACTIVATION_NONE)),
            ("no-bias", dict(bias_ptr=0))]]
        # The plain layout: scales, bias and out aligned to their element only, zeros anywhere
        # (the prepacked ones need 16 bytes).
        + [(case_id, changes, ["ck_gemm_w4a16"]) for case_id, changes in [
            ("asym-zeros+1", dict(mode=ck.INT4_ASYMMETRIC, zeros_ptr=Z + 1)),
            ("fp16-element-aligned", dict(scales_ptr=S + 2, bias_ptr=BIAS + 6, out_ptr=O + 10)),
            ("bf16-element-aligned", dict(scales_ptr=S + 2, bias_ptr=BIAS + 2, out_ptr=O + 2,
                                          dtype=DType.BF16))]]),
    KernelOverride(
        "CK_GEMM_INT4_KERNEL", INT4_GEMMS, ("auto", "reference", "mma", "small_m", "wgmma"),
        # Any M and N, K a multiple of 32, c 4-byte aligned.
        [(case_id, changes, INT4_GEMMS) for case_id, changes in [
            ("1x1x32", dict(m=1, n=1, k=32)), ("17x7x96", dict(m=17, n=7, k=96)),
            ("m=1e6", dict(m=10**6, k=4096))]]
        + [("c+4", dict(c_ptr=C + 4), ["ck_gemm_int4"])]),
    KernelOverride(
        "CK_GEMM_BLOCK4_KERNEL", BLOCK4_GEMMS, ("auto", "reference", "small_m", "wgmma"),
        # Any M and N, every format with its blocks, K a multiple of 32 and of the blocksize,
        # bias NULL, bias and out aligned to their element only.
        [(case_id, changes, BLOCK4_GEMMS) for case_id, changes in [
            ("1x1x32", dict(n=1, m=1, k=32)),
            ("17x7x96", dict(n=7, m=17, k=96)),
            ("m=1e6", dict(m=10**6)),
            ("nf4-32", dict(NF4_GEMM, blocksize=32, k=96)),
            ("nf4-128", dict(NF4_GEMM, blocksize=128, k=384, n=4097)),
            ("nf4-row-block", dict(NF4_GEMM, blocksize=128, k=128)),
            ("mxfp4", dict(format=ck.BLOCK4_MXFP4, blocksize=32, global_scale_ptr=0, k=32)),
            ("bf16", dict(dtype=DType.BF16, activation=ck.ACTIVATION_NONE)),
            ("no-bias", dict(bias_ptr=0)),
            ("global_scale+4", dict(global_scale_ptr=GS + 4)),
            ("element-aligned", dict(bias_ptr=BIAS + 6, out_ptr=O + 10)),
            ("bf16-element-aligned", dict(bias_ptr=BIAS + 2, out_ptr=O + 2, dtype=DType.BF16))]]),
    KernelOverride(
        "CK_GEMM_SPARSE_KERNEL", SPARSE_GEMMS, ("auto", "reference", "stream", "tiles",
                                                "wgmma"),
        # Any M and N, K a multiple of 32 and of the group (prepacked: of 128), bias NULL, bias
        # and out aligned to their element only. M past the prepacked kernel's 2^20 - 16 rows
        # is no argument error (the variant's limit).
        [(case_id, changes, SPARSE_GEMMS) for case_id, changes in [
            ("1x1x128", dict(m=1, n=1, k=128)),
            ("17x7x384-group64", dict(m=17, n=7, k=384, group_size=64)),
            ("m=1e6", dict(m=10**6)),
            ("bf16", dict(dtype=DType.BF16, activation=ck.ACTIVATION_NONE)),
            ("no-bias", dict(bias_ptr=0)),
            ("element-aligned", dict(bias_ptr=BIAS + 6, out_ptr=O + 10)),
            ("bf16-element-aligned", dict(bias_ptr=BIAS + 2, out_ptr=O + 2, dtype=DType.BF16))]]
        # The interchange format: 16:32 too, K = 64 and other multiples of 64 alone, scales
        # aligned to their element, zeros anywhere.
        + [(case_id, changes, ["ck_gemm_sparse_w4a16"]) for case_id, changes in [
            ("16:32", dict(sparsity=ck.SPARSITY_16_32)),
            ("k=64", dict(k=64, group_size=64)),
            ("k=192", dict(k=192, group_size=64, sparsity=ck.SPARSITY_16_32)),
            ("scales+2", dict(scales_ptr=S + 2)),
            ("asym-zeros+1", dict(mode=ck.INT4_ASYMMETRIC, zeros_ptr=Z + 1))]]
        # The prepacked layout: scales_prepacked and zeros_prepacked 4-byte aligned.
        + [(case_id, changes, ["ck_gemm_sparse_w4a16_prepacked"]) for case_id, changes in [
            ("scales_prepacked+4", dict(scales_ptr=S + 4)),
            ("asym-zeros_prepacked+4", dict(mode=ck.INT4_ASYMMETRIC, zeros_ptr=Z + 4))]]),
    KernelOverride(
        "CK_ATTENTION_KERNEL", ("ck_attention_forward",), ("auto", "wgmma", "mma"),
        # No keys at all (the wgmma kernel needs some: the GPU tests force it there), one
        # sequence, D 64 in bf16, MQA, lse NULL, no mask, a negative scale, empty maxima.
        [(case_id, changes, ("ck_attention_forward",)) for case_id, changes in [
            ("no-keys", dict(total_k=0, max_seqlen_k=0)),
            ("one-sequence", dict(ONE_SEQUENCE, batch=1)),
            ("one-sequence-batch=0", dict(ONE_SEQUENCE, batch=0)),
            ("d64-bf16", dict(head_dim=64, dtype=DType.BF16)),
            ("mqa", dict(num_heads_kv=1)),
            ("no-lse", dict(lse_ptr=0)),
            ("non-causal", dict(causal=0)),
            ("scale", dict(softmax_scale=-0.5)),
            ("max-seqlen-0", dict(max_seqlen_q=0, max_seqlen_k=0))]]),
]


def refused_names(override):
    """Names `override` must refuse: made-up ones, each of its own in capitals (names are
    case-sensitive), and the names that only the other overrides accept."""
    others = {name for other in KERNEL_OVERRIDES for name in other.accepts}
    return (["bogus", "cublas"] + [name.upper() for name in override.accepts]
            + sorted(others - set(override.accepts)))


def override_params(cases):
    """pytest params (env, function, *case) over every override and entry point it governs;
    cases(override, function) gives (id or None, *case) tuples."""
    return [pytest.param(override.env, function, *case,
                         id="-".join(part for part in (override.env, function, case_id) if part))
            for override in KERNEL_OVERRIDES for function in override.functions
            for case_id, *case in cases(override, function)]


def override_rejection(monkeypatch, env, function, changes, value="bogus"):
    """Calls `function` with its valid arguments changed by `changes` and `env` set to the unknown
    name `value`: the INVALID_VALUE about it, asserted here, shows that the arguments passed
    validation and that nothing reached CUDA. Returns the CKError."""
    monkeypatch.setenv(env, value)
    error = rejection(function, changes)
    assert error.status == Status.INVALID_VALUE, error.message
    assert error.message.startswith(function + ": "), error.message
    assert env in error.message and value in error.message, error.message
    assert error.cuda_error == 0 and ck.raw.last_cuda_error() == 0
    return error


def test_kernel_override_table_covers_the_gemms_and_attention():
    governed = [function for override in KERNEL_OVERRIDES for function in override.functions]
    assert sorted(governed) == sorted(set(governed))
    assert set(governed) == {name for name in ENTRY_POINTS if name.startswith("ck_gemm_")} | {
        "ck_attention_forward"}


def test_every_override_the_sources_read_is_unset_before_each_test():
    """conftest.KERNEL_OVERRIDES (unset before every test) names every variable the library
    reads to force a kernel: a caller's shell cannot steer a test."""
    import conftest
    here = os.path.dirname(os.path.abspath(__file__))
    root = os.path.dirname(here)
    sources = [os.path.join(root, "cuda_kernels.cu")] + [
        os.path.join(d, f) for d, _, files in os.walk(os.path.join(root, "kernels"))
        for f in files if f.endswith((".cu", ".cuh"))]
    read = set()
    for path in sources:
        with open(path) as f:
            read |= set(re.findall(r'"(CK_[A-Z0-9_]+_(?:KERNEL|ROWS|SPLIT))"', f.read()))
    assert {"CK_GEMM_FP8_KERNEL", "CK_GEMM_W4A8_KERNEL"} <= read, sorted(read)
    assert read <= set(conftest.KERNEL_OVERRIDES), sorted(read - set(conftest.KERNEL_OVERRIDES))


@pytest.mark.parametrize("env, function, value", override_params(
    lambda override, _: [(value, value) for value in refused_names(override)]))
def test_kernel_override_rejects_unknown_names(lib, monkeypatch, env, function, value):
    override_rejection(monkeypatch, env, function, {}, value)


@pytest.mark.parametrize("env, function, changes", override_params(
    lambda override, function: [(case_id, changes) for case_id, changes, functions
                                in override.valid_calls if function in functions]))
def test_valid_arguments_pass_validation(lib, monkeypatch, env, function, changes):
    override_rejection(monkeypatch, env, function, changes)


@pytest.mark.parametrize("env, function", override_params(lambda override, _: [(None,)]))
def test_argument_errors_come_before_the_kernel_override(lib, monkeypatch, env, function):
    """Every bad-argument case of the entry point is reported as without the override."""
    monkeypatch.setenv(env, "bogus")
    for case_id, changes, status, names in ENTRY_POINTS[function][1]:
        try:
            assert_rejected_as(rejection(function, changes), function, changes, status, names)
        except AssertionError as e:
            raise AssertionError("%s with %s=bogus: %s" % (case_id, env, e)) from None


@pytest.mark.parametrize("env, function", override_params(lambda override, _: [(None,)]))
def test_entry_points_ignore_the_other_overrides(lib, monkeypatch, env, function):
    """An override belongs to its entry points: the others' unknown names fail nothing here."""
    for other in KERNEL_OVERRIDES:
        monkeypatch.setenv(other.env, "bogus")
    error = override_rejection(monkeypatch, env, function, {})
    for other in KERNEL_OVERRIDES:
        assert other.env == env or other.env not in error.message, error.message


def test_next_rejection_replaces_the_message(lib):
    first = rejection("ck_quantize_int4", dict(group_size=48)).message
    second = rejection("ck_dequantize_int8", dict(rows=0)).message
    assert mentions(first, "group_size") and first != second
    assert ck.last_error_message() == second
    assert "group_size" not in second


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
        valid, _ = ENTRY_POINTS[function]
        barrier.wait()
        for _ in range(300):
            try:
                raw_function(function)(**dict(valid, **changes), stream=0)
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


# The prepacked sparse 2:4 layout: N16 = ceil(N / 16) * 16 rows of K 3 / 8 bytes (codes and
# metadata) and N16 (K / group_size) scales (and zeros); K a multiple of 128, group 64 or 128.
@pytest.mark.parametrize("n, k, nbytes", [
    (1, 128, 16 * 48),              # one tile: 16 rows x 128 k, the rows padded
    (16, 128, 16 * 48), (17, 256, 32 * 96), (64, 4096, 64 * 1536), (28672, 8192, 28672 * 3072),
    (1, SPARSE_PACK_MOST_K, 6 * SPARSE_PACK_MOST_K),
])
def test_sparse_w4a16_prepacked_bytes(lib, n, k, nbytes):
    assert lib.ck_sparse_w4a16_prepacked_bytes(n, k) == nbytes


@pytest.mark.parametrize("n, k", [
    (0, 128), (-1, 128), (16, 0), (16, -128), (16, 64), (16, 96), (16, 192), (16, 4160),
    (2**63 - 1, 128), (2**62, 2**62), (1, SPARSE_PACK_MOST_K + 128)])
def test_sparse_w4a16_prepacked_bytes_invalid_is_zero(lib, n, k):
    assert lib.ck_sparse_w4a16_prepacked_bytes(n, k) == 0


@pytest.mark.parametrize("n, k, group_size, values", [
    (1, 128, 64, 16 * 2), (1, 128, 128, 16), (17, 256, 64, 32 * 4), (4096, 4096, 128, 4096 * 32),
])
def test_sparse_w4a16_prepacked_groups(lib, n, k, group_size, values):
    assert lib.ck_sparse_w4a16_prepacked_groups(n, k, group_size) == values


@pytest.mark.parametrize("n, k, group_size", [
    (0, 128, 128), (16, 128, 32), (16, 128, ck.GROUP_ROW), (16, 128, 256), (16, 128, 0),
    (16, 64, 64), (16, 192, 64), (2**62, 2**62, 128)])
def test_sparse_w4a16_prepacked_groups_invalid_is_zero(lib, n, k, group_size):
    assert lib.ck_sparse_w4a16_prepacked_groups(n, k, group_size) == 0


@pytest.mark.parametrize("fmt, blocksize", [("nf4", 32), ("nf4", 64), ("nf4", 128),
                                             ("mxfp4", 32), ("nvfp4", 16)])
@pytest.mark.parametrize("n, k", [(1, 128), (9, 128), (64, 256), (6144, 4096), (10240, 8192),
                                  (13, 384)])
def test_block4_prepacked_scales_bytes(lib, fmt, blocksize, n, k):
    """ck_block4_prepacked_scales_bytes: the header's layout (reference.block4_prepacked_sizes);
    the codes take ck_w4a16_prepacked_bytes."""
    if k % blocksize:
        return
    enum = getattr(ck, "BLOCK4_" + fmt.upper())
    w_bytes, s_bytes = block4_prepacked_sizes(fmt, n, k, blocksize)
    assert lib.ck_block4_prepacked_scales_bytes(enum, n, k, blocksize) == s_bytes
    assert lib.ck_w4a16_prepacked_bytes(n, k) == w_bytes


@pytest.mark.parametrize("fmt, n, k, blocksize", [
    (ck.BLOCK4_NF4, 0, 128, 64), (ck.BLOCK4_NF4, 8, 96, 64), (ck.BLOCK4_NF4, 8, 128, 256),
    (ck.BLOCK4_NF4, 8, 48, 16), (ck.BLOCK4_MXFP4, 8, 128, 16), (ck.BLOCK4_NVFP4, 8, 128, 32),
    (ck.BLOCK4_NVFP4, 8, 16, 16), (3, 8, 128, 32), (-1, 8, 128, 32),
    (ck.BLOCK4_MXFP4, 2**62, 2**62, 32), (ck.BLOCK4_NF4, 2**41, 128, 64)])
def test_block4_prepacked_scales_bytes_invalid_is_zero(lib, fmt, n, k, blocksize):
    assert lib.ck_block4_prepacked_scales_bytes(fmt, n, k, blocksize) == 0


# ------------------------------------------------------------------------------------------------
# Mixture of experts: the prepacked sizes (E times one expert's) and the workspace query
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("experts", [1, 2, 8, 64, 1024])
@pytest.mark.parametrize("n, k", [(1, 32), (9, 128), (64, 256), (2 * 1408, 2048), (2048, 1408),
                                  (28672, 4096), (4096, 14336)])
def test_moe_prepacked_sizes(lib, experts, n, k):
    """experts times one expert's prepacked bytes and scales, by the library's single-weight
    functions and by the layout of the header (reference.w4a16_prepacked_sizes)."""
    nbytes = lib.ck_moe_prepacked_bytes(experts, n, k)
    assert nbytes == experts * lib.ck_w4a16_prepacked_bytes(n, k) > 0
    assert nbytes == experts * w4a16_prepacked_sizes(n, k, 32)[0]
    for group_size in (32, 64, 128, ck.GROUP_ROW):
        values = lib.ck_moe_prepacked_groups(experts, n, k, group_size)
        assert values == experts * lib.ck_w4a16_prepacked_groups(n, k, group_size) > 0
        assert values == experts * w4a16_prepacked_sizes(n, k, group_size)[1]
    assert ck.raw.moe_prepacked_bytes(experts, n, k) == nbytes


@pytest.mark.parametrize("experts, n, k", [
    (0, 64, 256), (-1, 64, 256), (-2**63, 64, 256), (8, 0, 256), (8, -8, 256), (8, 64, 0),
    (8, 64, 48), (8, 64, 100), (8, 2**62, 2**62),
    (2**40, 4096, 4096),    # 2^23 bytes per expert: 2^63 in all overflows int64
])
def test_moe_prepacked_bytes_invalid_is_zero(lib, experts, n, k):
    assert lib.ck_moe_prepacked_bytes(experts, n, k) == 0


@pytest.mark.parametrize("experts, n, k, group_size", [
    (0, 64, 256, 128), (-3, 64, 256, 128), (8, 64, 256, 48), (8, 64, 256, 0), (8, 64, 48, 32),
    (8, 0, 256, 32), (2**50, 4096, 4096, 32),   # 2^19 values per expert: 2^69 overflows
])
def test_moe_prepacked_groups_invalid_is_zero(lib, experts, n, k, group_size):
    assert lib.ck_moe_prepacked_groups(experts, n, k, group_size) == 0


def test_moe_workspace_size_depends_on_the_sizes_only(lib):
    """The size is positive (the T * k pairs are grouped by expert in it) and depends on T, H, I,
    E, k and dtype alone: not on the routing, the mode, the group size, renormalization, the
    router's dtype or the pointers (none of which it validates: all NULL is fine)."""
    base = moe_workspace_size(MOE_WORKSPACE_SIZE)
    assert base > 0
    assert ck.raw.moe_workspace_size(moe_params(MOE_WORKSPACE_SIZE)) == base
    no_pointers = {key: 0 for key in MOE_WORKSPACE_SIZE if key.endswith("_ptr")}
    for changes in (dict(GIVEN_IDS), ASYM_MOE, dict(group_size=32),
                    dict(group_size=ck.GROUP_ROW), dict(renormalize=0),
                    dict(router_dtype=DType.BF16), no_pointers,
                    dict(no_pointers, mode=ck.INT4_ASYMMETRIC)):
        assert moe_workspace_size(dict(MOE_WORKSPACE_SIZE, **changes)) == base, changes
    assert ck.moe_workspace_size(4, 256, 128, 8, 2, "fp16") == base


def test_moe_forward_rejects_a_workspace_below_the_query(lib):
    """workspace_bytes one short of ck_moe_workspace_size's answer (and half of it) is refused
    on the host: CK_STATUS_INVALID_VALUE naming workspace_bytes and the value."""
    need = moe_workspace_size(MOE_WORKSPACE_SIZE)
    for have in (need - 1, need // 2):
        changes = dict(workspace_bytes=have)
        assert_rejected_as(rejection("ck_moe_forward", changes), "ck_moe_forward", changes,
                           INVALID, ["workspace_bytes"])


def test_attention_decode_workspace_size_follows_the_split_rule(lib):
    """The size query's answer is cuda_kernels.h's formula (fuzz_support's model of it) for the
    automatic and forced splits, 0 for one split, and the same without any pointer."""
    import fuzz_support as fz
    cases = [dict(), dict(num_splits=1), dict(num_splits=3), dict(num_splits=64),
             dict(batch=64, num_heads_q=32, num_heads_kv=8, seqlen_q=1),   # 512 CTAs: 1 split
             dict(batch=1, num_heads_q=32, num_heads_kv=8, seqlen_q=1, max_seqlen_k=32768,
                  max_blocks_per_seq=2048),
             dict(seqlen_q=16, num_heads_q=64, num_heads_kv=8, head_dim=64),  # 2 row groups
             dict(CONTIGUOUS, max_seqlen_k=4096),
             dict(CONTIGUOUS, max_seqlen_k=4096, **PER_HEAD_INT8),
             dict(batch=1, num_heads_q=32, num_heads_kv=8, seqlen_q=1, max_seqlen_k=32768,
                  max_blocks_per_seq=2048, **PER_TOKEN_FP8)]
    for changes in cases:
        fields = dict(ATTENTION_DECODE_WORKSPACE_SIZE, **changes)
        model = {name[:-4] if name.endswith("_ptr") else name: value
                 for name, value in fields.items()}
        model["struct_size"] = DECODE_SIZEOF
        want = fz.decode_workspace_bytes(model)
        assert attention_decode_workspace_size(fields) == want, changes
        no_pointers = {key: (0 if key.endswith("_ptr") and key != "block_table_ptr" else value)
                       for key, value in fields.items()}
        assert attention_decode_workspace_size(no_pointers) == want, changes
    assert attention_decode_workspace_size(dict(ATTENTION_DECODE_WORKSPACE_SIZE,
                                                num_splits=1)) == 0
    # 8 splits x 4 sequences x 2 tokens x 8 heads = 512 rows: O_s 512 x 128 x 4 bytes, lse_s
    # 512 x 4.
    assert attention_decode_workspace_size(ATTENTION_DECODE_WORKSPACE_SIZE) == 262144 + 2048
    assert ck.attention_decode_workspace_size((4, 2, 8, 128), (300, 16, 2, 128), (4, 100),
                                              max_seqlen_k=1000) == 262144 + 2048
    # One sequence: the rule stops at 16 splits (32 would cost the same waves), pages of 16
    # keys too; 16 x 32 heads rows of O_s and lse_s.
    for keys in (4096, 32768):
        assert ck.attention_decode_workspace_size((1, 1, 32, 128), (1, keys, 8, 128)) == \
            16 * 32 * 128 * 4 + 2048, keys
        assert ck.attention_decode_workspace_size((1, 1, 32, 128), (keys // 16, 16, 8, 128),
                                                  (1, keys // 16), max_seqlen_k=keys) == \
            16 * 32 * 128 * 4 + 2048, keys


def test_attention_decode_rejects_a_workspace_below_the_query(lib):
    need = attention_decode_workspace_size(ATTENTION_DECODE_WORKSPACE_SIZE)
    for have in (need - 1, need // 2):
        changes = dict(workspace_bytes=have)
        assert_rejected_as(rejection("ck_attention_decode", changes), "ck_attention_decode",
                           changes, INVALID, ["workspace_bytes"])


def decode_params_pass(changes):
    """ck_attention_decode with its valid call changed by `changes` passes every check of its
    params: probed with a workspace_bytes of 1, whose error comes after them (and before any
    CUDA call); the changes must leave the call several splits."""
    changes = dict(changes, workspace_bytes=1)
    assert_rejected_as(rejection("ck_attention_decode", changes), "ck_attention_decode",
                       changes, INVALID, ["workspace_bytes"])


def test_attention_decode_accepts_its_first_struct_version(lib):
    """The first ck_attention_decode_params_t ends at num_splits: its struct_size is accepted,
    the fields appended since then are not read (whatever the bytes past it hold: the cache
    holds fp16/bf16 values), and the size query answers as for the whole struct with those
    fields zero. Other sizes, between the versions' or past them, are refused."""
    import fuzz_support as fz
    assert DECODE_V1_SIZEOF == ck.AttentionDecodeParams.num_splits.offset + 4 == 152
    unread = dict(kv_format=99, kv_scaling=-5, k_scale_ptr=3, v_scale_ptr=DKS + 1)
    zero = dict(kv_format=0, kv_scaling=0, k_scale_ptr=0, v_scale_ptr=0)
    for changes in (dict(), dict(num_splits=1), dict(num_splits=3), dict(num_splits=64),
                    dict(CONTIGUOUS, max_seqlen_k=4096), dict(head_dim=64, seqlen_q=16)):
        fields = dict(ATTENTION_DECODE_WORKSPACE_SIZE, **changes)
        want = attention_decode_workspace_size(dict(fields, **zero))
        for old in (zero, unread):
            v1 = dict(fields, **old, struct_size=DECODE_V1_SIZEOF)
            assert attention_decode_workspace_size(v1) == want, (changes, old)
            model = {name[:-4] if name.endswith("_ptr") else name: value
                     for name, value in v1.items()}
            assert fz.decode_workspace_bytes(model) == want, (changes, old)
    decode_params_pass(dict(unread, struct_size=DECODE_V1_SIZEOF))
    changes = dict(unread, workspace_bytes=1)   # read where the struct has them
    assert_rejected_as(rejection("ck_attention_decode", changes), "ck_attention_decode",
                       changes, INVALID, ["kv_format"])
    for size in (DECODE_V1_SIZEOF - 4, DECODE_V1_SIZEOF - 1, DECODE_V1_SIZEOF + 1,
                 DECODE_V1_SIZEOF + 4, DECODE_V1_SIZEOF + 8, DECODE_V1_SIZEOF + 16,
                 DECODE_SIZEOF - 1, DECODE_SIZEOF + 1, 2 * DECODE_V1_SIZEOF):
        changes = dict(struct_size=size)
        for function in ("ck_attention_decode_workspace_size", "ck_attention_decode"):
            assert_rejected_as(rejection(function, changes), function, changes, INVALID,
                               ["struct_size"])


def test_attention_decode_workspace_size_reads_no_scales(lib):
    """The size query checks a quantized cache's format and scaling but not its scales: NULL
    or misaligned ones give the answer of valid ones."""
    for fmt in (PER_HEAD_INT8, PER_TOKEN_FP8):
        for changes in (dict(), dict(batch=1, num_heads_q=32, num_heads_kv=8, seqlen_q=1,
                                     max_seqlen_k=32768, max_blocks_per_seq=2048)):
            fields = dict(ATTENTION_DECODE_WORKSPACE_SIZE, **fmt, **changes)
            want = attention_decode_workspace_size(fields)
            for scales in (dict(k_scale_ptr=0, v_scale_ptr=0), dict(k_scale_ptr=DKS + 1,
                                                                    v_scale_ptr=DVS + 2)):
                assert attention_decode_workspace_size(dict(fields, **scales)) == want, \
                    (fmt, changes, scales)


def test_quantized_cache_holds_one_byte_per_element(lib):
    """The overlap checks count a quantized cache at 1 byte per element: out (or lse) right
    after the codes of v_cache (k_cache) is clear of them, where it overlaps fp16 values; the
    scales span Hkv floats per head, or one float per cache row of a head per token."""
    codes = DECODE_CACHE_ROWS * DECODE_ROW_ELEMENTS
    for name, base, cache in (("out", DV, "v_cache"), ("lse", DK, "k_cache")):
        after = {name + "_ptr": base + codes}
        for fmt in (PER_HEAD_INT8, PER_TOKEN_FP8):
            decode_params_pass(dict(fmt, **after))
        assert_rejected_as(rejection("ck_attention_decode", after), "ck_attention_decode",
                           after, INVALID, [name, cache])
    per_token_bytes = DECODE_CACHE_ROWS * 2 * 4   # rows x Hkv float32
    decode_params_pass(dict(PER_HEAD_INT8, out_ptr=DVS + 16))   # past the 2 per-head floats
    decode_params_pass(dict(PER_TOKEN_FP8, out_ptr=DVS + per_token_bytes))
    changes = dict(PER_TOKEN_FP8, out_ptr=DVS + 16)
    assert_rejected_as(rejection("ck_attention_decode", changes), "ck_attention_decode",
                       changes, INVALID, ["out", "v_scale"])


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
    (lambda: ck.gemm_fp8_scaled(I8, I8.astype(np.uint8), 1.0, 1.0), TypeError),
    (lambda: ck.gemm_fp8_scaled(I8.astype(np.uint8), I8.astype(np.uint8), 1.0, 1.0,
                                out_dtype="int32"), ValueError),
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
        "activation", "out_dtype", "scaled-layout", "fp8-int8", "fp8-out-int32",
        "linear-float64",
        "linear-uint16", "linear-activation", "int8_matmul-float32", "w4a16-float64",
        "w4a16-uint16", "w4a16-activation", "w4a16-w-unpacked", "w4a16-w-int8",
        "w4a16-scales-count", "w4a16-scales-float32", "w4a16-zeros-int8", "w4a16-zeros-count",
        "w4a16-group_size", "w4a16-bias-count"])
def test_wrapper_gemm_rejects_before_any_copy(lib, call, error):
    with pytest.raises(error):
        call()


# W4A8 operands as foreign device arrays (never copied, never dereferenced): M=4, K=64, N=8,
# group 128 (one group per row).
A8 = FakeCudaArray((4, 64), "|u1")
SA8 = FakeCudaArray((4,), "<f4", ptr=SA)
W8 = FakeCudaArray((8, 32), "|u1", ptr=B)
WS8 = FakeCudaArray((8, 1), "<f2", ptr=S)


@pytest.mark.parametrize("call, error", [
    (lambda: ck.gemm_w4a8(FakeCudaArray((4, 64), "|i1"), SA8, W8, WS8), TypeError),
    (lambda: ck.gemm_w4a8(FakeCudaArray((4, 64), "|u1", strides=(1, 4)), SA8, W8, WS8),
     ValueError),
    (lambda: ck.gemm_w4a8(A8, SA8, FakeCudaArray((8, 64), "|u1"), WS8), ValueError),
    (lambda: ck.gemm_w4a8(A8, SA8, FakeCudaArray((8, 32), "|i1"), WS8), TypeError),
    (lambda: ck.gemm_w4a8(A8, FakeCudaArray((3,), "<f4"), W8, WS8), ValueError),
    (lambda: ck.gemm_w4a8(A8, FakeCudaArray((4,), "<f8"), W8, WS8), TypeError),
    (lambda: ck.gemm_w4a8(A8, SA8, W8, FakeCudaArray((8, 2), "<f2")), ValueError),
    (lambda: ck.gemm_w4a8(A8, SA8, W8, FakeCudaArray((8, 1), "<f4")), TypeError),
    (lambda: ck.gemm_w4a8(A8, SA8, W8, FakeCudaArray((8, 1), "<u2")), TypeError),
    (lambda: ck.gemm_w4a8(A8, SA8, W8, WS8, group_size=48), ValueError),
    (lambda: ck.gemm_w4a8(A8, SA8, W8, WS8, activation="gelu"), ValueError),
    (lambda: ck.gemm_w4a8(A8, SA8, W8, WS8, out_dtype="int32"), ValueError),
    (lambda: ck.gemm_w4a8(A8, SA8, W8, WS8, bias=FakeCudaArray((7,), "<f2")), ValueError),
    (lambda: ck.W4A8Linear.from_float(FakeCudaArray((8, 64), "<f2"), group_size=64),
     ValueError),
    (lambda: ck.QuantizedLinear.from_float(FakeCudaArray((8, 64), "<f2"), activations="fp8",
                                           symmetric=False), ValueError),
    (lambda: ck.QuantizedLinear.from_float(FakeCudaArray((8, 64), "<f2"), activations="fp8",
                                           sparsity="2:4"), ValueError),
    (lambda: ck.QuantizedLinear.from_float(FakeCudaArray((8, 64), "<f2"), activations="int8"),
     ValueError),
], ids=["a-int8", "a-strided", "w-unpacked", "w-int8", "scale_a-count", "scale_a-float64",
        "w_scales-count", "w_scales-float32", "w_scales-uint16-without-bf16", "group_size",
        "activation", "out_dtype", "bias-count", "layer-group_size", "layer-asymmetric",
        "layer-sparse", "layer-activations"])
def test_wrapper_w4a8_rejects_before_any_copy(lib, call, error):
    with pytest.raises(error):
        call()


def test_wrapper_w4a8_leaves_group_sizes_32_and_64_to_the_library(lib):
    """INT4's group sizes 32 and 64 pass the wrapper's shape checks (their scales have the
    right count); the library refuses them, on the host."""
    for group_size in (32, 64):
        scales = FakeCudaArray((8, 64 // group_size), "<f2", ptr=S)
        with pytest.raises(CKError) as info:
            ck.gemm_w4a8(A8, SA8, W8, scales, group_size=group_size,
                         out=FakeCudaArray((4, 8), "<f2", ptr=O))
        assert info.value.status == Status.UNSUPPORTED, info.value.message
        assert mentions(info.value.message, "group_size"), info.value.message


# MoE operands as foreign device arrays (never copied, never dereferenced): T=4, H=64, E=8, k=2.
X16_MOE = FakeCudaArray((4, 64), "<f2")
W_MOE = (FakeCudaArray((1024,), "|u1", ptr=W13), FakeCudaArray((64,), "<f2", ptr=W13S), None)


@pytest.mark.parametrize("call, error", [
    (lambda: ck.moe_route(FakeCudaArray((4, 8)), 0), ValueError),
    (lambda: ck.moe_route(FakeCudaArray((4, 8), "<f8"), 2), TypeError),
    (lambda: ck.moe_route(FakeCudaArray((2, 4, 8)), 2), ValueError),
    (lambda: ck.moe_prepack(FakeCudaArray((8, 16), "|u1"), S16), ValueError),
    (lambda: ck.moe_prepack(FakeCudaArray((2, 8, 16), "|u1"), FakeCudaArray((2, 8, 1), "<f4")),
     TypeError),
    (lambda: ck.moe_forward(X16_MOE, W_MOE, W_MOE, 8, 32), ValueError),
    (lambda: ck.moe_forward(X16_MOE, W_MOE, W_MOE, 8, 32,
                            router_logits=FakeCudaArray((4, 8)), top_k=2,
                            topk_ids=FakeCudaArray((4, 2), "<i4"),
                            topk_weights=FakeCudaArray((4, 2))), ValueError),
    (lambda: ck.moe_forward(X16_MOE, W_MOE, W_MOE, 8, 32,
                            topk_ids=FakeCudaArray((4, 2), "<i4")), ValueError),
    (lambda: ck.moe_forward(X16_MOE, W_MOE[:2], W_MOE, 8, 32,
                            router_logits=FakeCudaArray((4, 8)), top_k=2), TypeError),
], ids=["route-top_k=0", "route-float64", "route-3d", "prepack-2d", "prepack-scales-float32",
        "forward-no-routing", "forward-two-routings", "forward-ids-without-weights",
        "forward-weight-pair"])
def test_wrapper_moe_rejects_before_any_copy(lib, call, error):
    with pytest.raises(error):
        call()


# Attention operands as foreign device arrays (never copied, never dereferenced): total_q=8,
# total_k=16, Hq=4, Hkv=2, D=64.
Q_ATT, KV_ATT = FakeCudaArray((8, 4, 64), "<f2"), FakeCudaArray((16, 2, 64), "<f2")
CU_ATT = FakeCudaArray((3,), "<i4")


@pytest.mark.parametrize("call, error", [
    (lambda: ck.attention(Q_ATT, KV_ATT, KV_ATT, softmax_scale=0.0), ValueError),
    (lambda: ck.attention(Q_ATT, KV_ATT, KV_ATT, cu_seqlens_q=CU_ATT), ValueError),
    (lambda: ck.attention(FakeCudaArray((8, 256), "<f2"), KV_ATT, KV_ATT), ValueError),
    (lambda: ck.attention(Q_ATT, KV_ATT, FakeCudaArray((16, 1, 64), "<f2")), ValueError),
    (lambda: ck.attention(FakeCudaArray((8, 4, 128), "<f2"), KV_ATT, KV_ATT), ValueError),
    (lambda: ck.attention(Q_ATT, FakeCudaArray((16, 2, 64)), KV_ATT), TypeError),
    (lambda: ck.attention(Q_ATT, KV_ATT, KV_ATT, cu_seqlens_q=FakeCudaArray((2, 2), "<i4"),
                          cu_seqlens_k=CU_ATT), ValueError),
    (lambda: ck.attention(Q_ATT, KV_ATT, KV_ATT, cu_seqlens_q=CU_ATT,
                          cu_seqlens_k=FakeCudaArray((4,), "<i4")), ValueError),
], ids=["scale-zero", "cu_seqlens_q-alone", "q-2d", "v-shape", "head-dims", "k-float32",
        "cu_seqlens-2d", "cu_seqlens-counts"])
def test_wrapper_attention_rejects_before_any_copy(lib, call, error):
    with pytest.raises(error):
        call()


# Decode operands as foreign device arrays (never copied, never dereferenced): batch 2, 1 new
# token, Hq 4, Hkv 2, D 64; a contiguous cache of 32 keys, or 8 pages of 16 keys with a block
# table of 2 pages per sequence.
Q_DEC, KV_DEC = FakeCudaArray((2, 1, 4, 64), "<f2"), FakeCudaArray((2, 32, 2, 64), "<f2")
PAGES_DEC, TABLE_DEC = FakeCudaArray((8, 16, 2, 64), "<f2"), FakeCudaArray((2, 2), "<i4")
SEQ_DEC = FakeCudaArray((2,), "<i4")


@pytest.mark.parametrize("call, error", [
    (lambda: ck.attention_decode(Q_DEC, KV_DEC, KV_DEC, SEQ_DEC, softmax_scale=0.0), ValueError),
    (lambda: ck.attention_decode(FakeCudaArray((2, 4, 64), "<f2"), KV_DEC, KV_DEC, SEQ_DEC),
     ValueError),
    (lambda: ck.attention_decode(Q_DEC, KV_DEC, FakeCudaArray((2, 32, 1, 64), "<f2"), SEQ_DEC),
     ValueError),
    (lambda: ck.attention_decode(FakeCudaArray((2, 1, 4, 128), "<f2"), KV_DEC, KV_DEC, SEQ_DEC),
     ValueError),
    (lambda: ck.attention_decode(Q_DEC, FakeCudaArray((2, 32, 2, 64)), KV_DEC, SEQ_DEC),
     TypeError),
    (lambda: ck.attention_decode(FakeCudaArray((3, 1, 4, 64), "<f2"), KV_DEC, KV_DEC,
                                 FakeCudaArray((3,), "<i4")), ValueError),
    (lambda: ck.attention_decode(Q_DEC, KV_DEC, KV_DEC, FakeCudaArray((3,), "<i4")),
     ValueError),
    (lambda: ck.attention_decode(Q_DEC, KV_DEC, KV_DEC, FakeCudaArray((2,), "<f4")), TypeError),
    (lambda: ck.attention_decode(Q_DEC, KV_DEC, KV_DEC, SEQ_DEC, max_seqlen_k=16), ValueError),
    (lambda: ck.attention_decode(Q_DEC, PAGES_DEC, PAGES_DEC, SEQ_DEC,
                                 block_table=FakeCudaArray((3, 2), "<i4")), ValueError),
    (lambda: ck.attention_decode(Q_DEC, PAGES_DEC, PAGES_DEC, SEQ_DEC,
                                 block_table=FakeCudaArray((2, 2), "<i8")), TypeError),
], ids=["scale-zero", "q-3d", "v-shape", "head-dims", "k-float32", "cache-batch",
        "seqlens-shape", "seqlens-float32", "contiguous-max_seqlen_k", "table-batch",
        "table-int64"])
def test_wrapper_attention_decode_rejects_before_any_copy(lib, call, error):
    with pytest.raises(error):
        call()


# A quantized cache of the same shapes (E4M3 bytes, int8 codes), its scales per head [2] or
# per token [2, 32, 2]; new keys and values [3, 2, 64] for kv_cache_append, slots int64 [3].
KV8_DEC, KVI8_DEC = FakeCudaArray((2, 32, 2, 64), "|u1"), FakeCudaArray((2, 32, 2, 64), "|i1")
HEAD_SCALE, TOKEN_SCALE = FakeCudaArray((2,)), FakeCudaArray((2, 32, 2))
NEW_KV, SLOTS = FakeCudaArray((3, 2, 64), "<f2"), FakeCudaArray((3,), "<i8")


@pytest.mark.parametrize("call, error", [
    (lambda: ck.attention_decode(Q_DEC, KV8_DEC, KV8_DEC, SEQ_DEC), ValueError),
    (lambda: ck.attention_decode(Q_DEC, KV8_DEC, KV8_DEC, SEQ_DEC, k_scale=HEAD_SCALE,
                                 v_scale=TOKEN_SCALE), ValueError),
    (lambda: ck.attention_decode(Q_DEC, KV8_DEC, KV8_DEC, SEQ_DEC, k_scale=FakeCudaArray((3,)),
                                 v_scale=FakeCudaArray((3,))), ValueError),
    (lambda: ck.attention_decode(Q_DEC, KV8_DEC, KV8_DEC, SEQ_DEC, k_scale=HEAD_SCALE,
                                 v_scale=HEAD_SCALE, kv_format="int8"), TypeError),
    (lambda: ck.attention_decode(Q_DEC, KV8_DEC, KVI8_DEC, SEQ_DEC, k_scale=HEAD_SCALE,
                                 v_scale=HEAD_SCALE), TypeError),
    (lambda: ck.attention_decode(Q_DEC, KV8_DEC, KV8_DEC, SEQ_DEC, k_scale=HEAD_SCALE,
                                 v_scale=HEAD_SCALE, kv_format="fp8_e5m2"), ValueError),
    (lambda: ck.kv_cache_append(NEW_KV, NEW_KV, SLOTS, np.zeros((2, 32, 2, 64), np.float16),
                                KV_DEC), TypeError),
    (lambda: ck.kv_cache_append(NEW_KV, NEW_KV, FakeCudaArray((3,), "<i4"), KV_DEC, KV_DEC),
     TypeError),
    (lambda: ck.kv_cache_append(NEW_KV, NEW_KV, FakeCudaArray((4,), "<i8"), KV_DEC, KV_DEC),
     ValueError),
    (lambda: ck.kv_cache_append(NEW_KV, FakeCudaArray((3, 1, 64), "<f2"), SLOTS, KV_DEC,
                                KV_DEC), ValueError),
    (lambda: ck.kv_cache_append(NEW_KV, NEW_KV, SLOTS, FakeCudaArray((2, 32, 2, 128), "<f2"),
                                FakeCudaArray((2, 32, 2, 128), "<f2")), ValueError),
    (lambda: ck.kv_cache_append(NEW_KV, NEW_KV, SLOTS, KV8_DEC, KV_DEC), ValueError),
    (lambda: ck.kv_cache_append(NEW_KV, NEW_KV, SLOTS, KV8_DEC, KV8_DEC), ValueError),
    (lambda: ck.kv_cache_append(NEW_KV, NEW_KV, SLOTS, KV8_DEC, KV8_DEC, k_scale=HEAD_SCALE,
                                v_scale=FakeCudaArray((2,), "<f2")), TypeError),
], ids=["no-scales", "scale-kinds", "scale-shape", "format-vs-dtype", "k-v-dtypes",
        "format-name", "host-cache", "slots-int32", "slots-count", "v-shape", "cache-head-dim",
        "caches-differ", "append-no-scales", "scale-dtype"])
def test_wrapper_quantized_cache_rejects_before_any_copy(lib, call, error):
    with pytest.raises(error):
        call()


# FP8 operands as foreign device arrays: x [130, 300] float32, q [130, 300] uint8; the scales of
# each granularity: (1,), (130,), (130, 3), (2, 3).
X_FP8, Q_FP8 = FakeCudaArray((130, 300)), FakeCudaArray((130, 300), "|u1")


@pytest.mark.parametrize("call, error", [
    (lambda: ck.quantize_fp8(X_FP8, format="e3m4"), ValueError),
    (lambda: ck.quantize_fp8(X_FP8, format=2), ValueError),
    (lambda: ck.quantize_fp8(X_FP8, granularity="block"), ValueError),
    (lambda: ck.quantize_fp8(X_FP8, granularity=4), ValueError),
    (lambda: ck.quantize_fp8(X_FP8, granularity="block1x128",
                             scales=FakeCudaArray((2, 3))), ValueError),
    (lambda: ck.quantize_fp8(X_FP8, scales=FakeCudaArray((1,), "<f2")), TypeError),
    (lambda: ck.dequantize_fp8(Q_FP8, FakeCudaArray((3, 3))), ValueError),
    (lambda: ck.dequantize_fp8(Q_FP8, FakeCudaArray((130, 3)), granularity="block128x128"),
     ValueError),
    (lambda: ck.dequantize_fp8(FakeCudaArray((130, 300), "|i1"), FakeCudaArray((1,))),
     TypeError),
    (lambda: ck.dequantize_fp8(Q_FP8, FakeCudaArray((1,)), format="fp8"), ValueError),
], ids=["format-name", "format-int", "granularity-name", "granularity-int", "scales-count",
        "scales-fp16", "scales-shape", "scales-count-given", "q-int8", "dq-format"])
def test_wrapper_fp8_rejects_before_any_copy(lib, call, error):
    with pytest.raises(error):
        call()


def test_wrapper_fp8_infers_the_granularity_of_each_scale_shape():
    for gran, shape in ((ck.PER_TENSOR, (1,)), (ck.PER_TENSOR, ()), (ck.PER_ROW, (130,)),
                        (ck.PER_BLOCK_1X128, (130, 3)), (ck.PER_BLOCK_128X128, (2, 3))):
        assert ck._fp8_inferred_granularity(shape, 130, 300) == gran, shape
        if shape:
            assert ck._fp8_scale_shape(130, 300, gran) == (shape if len(shape) == 2 or
                                                           gran != ck.PER_TENSOR else (1,))
    # One row: its block scales are 1-D, as quantize_fp8 returns them for a 1-D x.
    assert ck._fp8_inferred_granularity((3,), 1, 300) == ck.PER_BLOCK_1X128
    assert ck._fp8_scale_shape(1, 300, ck.PER_BLOCK_128X128, one_d=True) == (3,)


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
