"""GPU tests of the quantization kernels, bit for bit against tests/reference.py.

Every entry point (ck_quantize_int8, ck_dequantize_int8, ck_quantize_int4, ck_dequantize_int4)
runs over fp32/fp16/bf16 and many shapes, odd ones included, on fresh random data. Codes, scales,
zero points and outputs must equal the reference's bit patterns: the header promises bitwise
equality, so there is no tolerance. Each output is poisoned before the launch (an unwritten
element cannot match) and sits between two poisoned guard regions (a write out of bounds shows).

The tests skip without a CUDA device. CK_SANITIZE=1 (set by `make sanitize`) drops the largest
shapes so that the compute-sanitizer run stays short. Each test draws a seed from os.urandom,
prints it and names it in its messages; CK_TEST_SEED=<seed> replays a failure.
"""

import numpy as np
import pytest

import cuda_wrapper as ck
import reference as ref
from gpu_support import (
    CK_DTYPE, CK_GRANULARITY, CK_INT4_MODE, GuardedBuffer, KernelCall, POISON, POISON_CODES,
    POISON_QUANTIZED, SANITIZE, assert_bitwise_equal, assert_graph_replays, ptr_or_null, shape_id,
    synchronize, write_buffers,
)

pytestmark = pytest.mark.gpu

SHAPES = [
    (1, 1), (3, 5), (1, 1_000_003), (2, 4097), (7, 100), (64, 4096), (33, 8192), (300, 136),
    (1, 16384 + 24), (5, 40000),
    # The largest per-tensor inputs of the one-launch path: 16384 fp16/bf16 or 8192 fp32 values.
    (2, 8192), (4, 2048),
]
if SANITIZE:
    SHAPES = [shape for shape in SHAPES if shape[1] < 40000]
# Extra INT4 shapes: partial last groups for every group size, odd column counts.
INT4_SHAPES = SHAPES + [(4, 33), (2, 65), (3, 127), (1, 129), (6, 255)]
# Every INT4 format on them: (shape, dtype, group size, mode).
INT4_CASES = [
    pytest.param(shape, dtype, group_size, mode,
                 id=f"{shape_id(shape)}-{dtype}-{group_size}-{mode}")
    for shape in INT4_SHAPES for dtype in ref.DTYPES for group_size in ref.INT4_GROUP_SIZES
    for mode in ref.INT4_MODES
]

CK_GROUP = {32: 32, 64: 64, 128: 128, ref.GROUP_ROW: ck.GROUP_ROW}

# Poison bytes (gpu_support): POISON_CODES for int8 codes, POISON_QUANTIZED for scales, zero
# points and packed int4, POISON for the float outputs.

# ---------------------------------------------------------------------------------------------
# Inputs
# ---------------------------------------------------------------------------------------------
def random_int8_codes(rng, shape):
    return rng.integers(-127, 128, size=shape, dtype=np.int8)


def random_int8_scales(rng, count):
    return (10.0 ** rng.uniform(-4, 1, count)).astype(np.float32)


def random_int4_inputs(rng, rows, cols, group_size, mode, dtype):
    """Random codes (packed), positive scales in `dtype`, and zero points for 'asym'."""
    groups = ref.int4_groups_per_row(cols, group_size)
    lo, hi = ref.INT4_SYM_RANGE if mode == "sym" else ref.INT4_ASYM_RANGE
    packed = ref.pack_int4(rng.integers(lo, hi + 1, size=(rows, cols)), signed=(mode == "sym"))
    scales = ref.to_dtype(10.0 ** rng.uniform(-3, 1, (rows, groups)), dtype)
    zeros = rng.integers(0, 16, size=(rows, groups), dtype=np.uint8) if mode == "asym" else None
    return packed, scales, zeros


# ---------------------------------------------------------------------------------------------
# One call of each entry point (gpu_support.KernelCall): its device buffers, launch and check
# ---------------------------------------------------------------------------------------------
class QuantizeInt8Call(KernelCall):
    def __init__(self, x, dtype, granularity, static_scales=None, misalign=0):
        rows, cols = x.shape
        self.dtype, self.granularity = dtype, granularity
        self.inputs = (x, static_scales)
        self.x = GuardedBuffer.input(x, misalign * x.dtype.itemsize)
        self.q = GuardedBuffer.output((rows, cols), np.int8, POISON_CODES, misalign)
        if static_scales is None:
            n_scales = 1 if granularity == "tensor" else rows
            self.scales = GuardedBuffer.output((n_scales,), np.float32, POISON_QUANTIZED,
                                               misalign * 4)
            self.outputs = {"q": self.q, "scales": self.scales}
        else:
            self.scales = GuardedBuffer.input(static_scales, misalign * 4)
            self.outputs = {"q": self.q}

    def launch(self, stream=0):
        rows, cols = self.x.shape
        scale_mode = ck.DYNAMIC if self.inputs[1] is None else ck.STATIC
        ck.raw.quantize_int8(self.x.ptr, CK_DTYPE[self.dtype], rows, cols,
                             CK_GRANULARITY[self.granularity], scale_mode, self.scales.ptr,
                             self.q.ptr, stream)

    def refill(self, rng):
        x = ref.random_input(rng, self.x.shape, self.dtype)
        self.x.write(x)
        self.inputs = (x, self.inputs[1])

    def check(self, ctx):
        synchronize()
        x, static_scales = self.inputs
        want_q, want_scales = ref.quantize_int8(x, self.dtype, self.granularity, static_scales)
        assert_bitwise_equal(self.q.read(f"q, {ctx}"), want_q, f"q, {ctx}")
        assert_bitwise_equal(self.scales.read(f"scales, {ctx}"), want_scales, f"scales, {ctx}")
        return want_q, want_scales


class DequantizeInt8Call(KernelCall):
    def __init__(self, q, scales, granularity, out_dtype, misalign=0):
        self.granularity, self.out_dtype = granularity, out_dtype
        self.inputs = (q, scales)
        self.q = GuardedBuffer.input(q, misalign)
        self.scales = GuardedBuffer.input(scales, misalign * 4)
        out_np = np.dtype(ref.NUMPY_DTYPE[out_dtype])
        self.out = GuardedBuffer.output(q.shape, out_np, POISON, misalign * out_np.itemsize)
        self.outputs = {"out": self.out}

    def launch(self, stream=0):
        rows, cols = self.q.shape
        ck.raw.dequantize_int8(self.q.ptr, self.scales.ptr, rows, cols,
                               CK_GRANULARITY[self.granularity], self.out.ptr,
                               CK_DTYPE[self.out_dtype], stream)

    def refill(self, rng):
        q, scales = random_int8_codes(rng, self.q.shape), random_int8_scales(rng, self.scales.shape)
        self.q.write(q)
        self.scales.write(scales)
        self.inputs = (q, scales)

    def check(self, ctx):
        synchronize()
        want = ref.dequantize_int8(*self.inputs, self.granularity, self.out_dtype)
        assert_bitwise_equal(self.out.read(f"out, {ctx}"), want, f"out, {ctx}")


class QuantizeInt4Call(KernelCall):
    def __init__(self, x, dtype, group_size, mode, misalign=0):
        rows, cols = x.shape
        self.dtype, self.group_size, self.mode = dtype, group_size, mode
        self.inputs = (x,)
        itemsize = x.dtype.itemsize
        groups = ref.int4_groups_per_row(cols, group_size)
        self.x = GuardedBuffer.input(x, misalign * itemsize)
        self.packed = GuardedBuffer.output((rows, (cols + 1) // 2), np.uint8, POISON_QUANTIZED,
                                           misalign)
        self.scales = GuardedBuffer.output((rows, groups), x.dtype, POISON_QUANTIZED,
                                           misalign * itemsize)
        self.outputs = {"packed": self.packed, "scales": self.scales}
        self.zeros = None
        if mode == "asym":
            self.zeros = GuardedBuffer.output((rows, groups), np.uint8, POISON_QUANTIZED, misalign)
            self.outputs["zeros"] = self.zeros

    def launch(self, stream=0):
        rows, cols = self.x.shape
        ck.raw.quantize_int4(self.x.ptr, CK_DTYPE[self.dtype], rows, cols,
                             CK_GROUP[self.group_size], CK_INT4_MODE[self.mode], self.packed.ptr,
                             self.scales.ptr, ptr_or_null(self.zeros), stream)

    def refill(self, rng):
        x = ref.random_input(rng, self.x.shape, self.dtype)
        self.x.write(x)
        self.inputs = (x,)

    def check(self, ctx):
        synchronize()
        want = ref.quantize_int4(self.inputs[0], self.dtype, self.group_size, self.mode)
        want_packed, want_scales, want_zeros = want
        assert_bitwise_equal(self.packed.read(f"packed, {ctx}"), want_packed, f"packed, {ctx}")
        assert_bitwise_equal(self.scales.read(f"scales, {ctx}"), want_scales, f"scales, {ctx}")
        if self.zeros is not None:
            assert_bitwise_equal(self.zeros.read(f"zeros, {ctx}"), want_zeros, f"zeros, {ctx}")
        return want


class DequantizeInt4Call(KernelCall):
    def __init__(self, packed, scales, zeros, cols, group_size, mode, out_dtype, misalign=0):
        self.cols, self.group_size, self.mode, self.out_dtype = cols, group_size, mode, out_dtype
        self.inputs = (packed, scales, zeros)
        itemsize = scales.dtype.itemsize
        self.packed = GuardedBuffer.input(packed, misalign)
        self.scales = GuardedBuffer.input(scales, misalign * itemsize)
        self.zeros = None if zeros is None else GuardedBuffer.input(zeros, misalign)
        out_shape = (packed.shape[0], cols)
        self.out = GuardedBuffer.output(out_shape, scales.dtype, POISON, misalign * itemsize)
        self.outputs = {"out": self.out}

    def launch(self, stream=0):
        rows = self.packed.shape[0]
        ck.raw.dequantize_int4(self.packed.ptr, self.scales.ptr, ptr_or_null(self.zeros), rows,
                               self.cols, CK_GROUP[self.group_size], CK_INT4_MODE[self.mode],
                               self.out.ptr, CK_DTYPE[self.out_dtype], stream)

    def refill(self, rng):
        rows = self.packed.shape[0]
        self.inputs = random_int4_inputs(rng, rows, self.cols, self.group_size, self.mode,
                                         self.out_dtype)
        write_buffers((self.packed, self.scales, self.zeros), self.inputs)

    def check(self, ctx):
        synchronize()
        want = ref.dequantize_int4(*self.inputs, self.cols, self.group_size, self.mode,
                                   self.out_dtype)
        assert_bitwise_equal(self.out.read(f"out, {ctx}"), want, f"out, {ctx}")


# Quantizers for the special-input tests:
# name -> ("int8", granularity) or ("int4", mode, group_size).
QUANTIZERS = {
    "int8-tensor": ("int8", "tensor"),
    "int8-row": ("int8", "row"),
    "int4-sym-g32": ("int4", "sym", 32),
    "int4-asym-g128": ("int4", "asym", 128),
    "int4-sym-row": ("int4", "sym", ref.GROUP_ROW),
    "int4-asym-row": ("int4", "asym", ref.GROUP_ROW),
}


def make_quantize_call(quantizer, x, dtype, misalign=0):
    kind, *params = QUANTIZERS[quantizer]
    if kind == "int8":
        (granularity,) = params
        return QuantizeInt8Call(x, dtype, granularity, misalign=misalign)
    mode, group_size = params
    return QuantizeInt4Call(x, dtype, group_size, mode, misalign)


def decoded(call, want):
    """The dequantized float32 values of a quantize call's reference outputs."""
    if isinstance(call, QuantizeInt8Call):
        q, scales = want
        return ref.dequantize_int8(q, scales, call.granularity, "fp32")
    packed, scales, zeros = want
    scales_f32 = ref.to_dtype(ref.to_f32(scales, call.dtype), "fp32")
    cols = call.x.shape[1]
    return ref.dequantize_int4(packed, scales_f32, zeros, cols, call.group_size, call.mode, "fp32")


# ---------------------------------------------------------------------------------------------
# Every kernel, every dtype, many shapes
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("scale_mode", ["dynamic", "static"])
@pytest.mark.parametrize("granularity", ref.GRANULARITIES)
@pytest.mark.parametrize("dtype", ref.DTYPES)
@pytest.mark.parametrize("shape", SHAPES, ids=shape_id)
def test_quantize_int8(shape, dtype, granularity, scale_mode, seed):
    rng = np.random.default_rng(seed)
    x = ref.random_input(rng, shape, dtype)
    static_scales = None
    if scale_mode == "static":
        # Around the dynamic scales, half of them smaller: those spans saturate.
        _, dynamic_scales = ref.quantize_int8(x, dtype, granularity)
        factors = rng.uniform(0.5, 2.0, dynamic_scales.size).astype(np.float32)
        static_scales = dynamic_scales * factors
    call = QuantizeInt8Call(x, dtype, granularity, static_scales)
    call.launch()
    call.check(f"seed={seed}")


@pytest.mark.parametrize("granularity", ref.GRANULARITIES)
@pytest.mark.parametrize("out_dtype", ref.DTYPES)
@pytest.mark.parametrize("shape", SHAPES, ids=shape_id)
def test_dequantize_int8(shape, out_dtype, granularity, seed):
    rng = np.random.default_rng(seed)
    scales = random_int8_scales(rng, 1 if granularity == "tensor" else shape[0])
    call = DequantizeInt8Call(random_int8_codes(rng, shape), scales, granularity, out_dtype)
    call.launch()
    call.check(f"seed={seed}")


@pytest.mark.parametrize("shape, dtype, group_size, mode", INT4_CASES)
def test_quantize_int4(shape, dtype, group_size, mode, seed):
    rng = np.random.default_rng(seed)
    call = QuantizeInt4Call(ref.random_input(rng, shape, dtype), dtype, group_size, mode)
    call.launch()
    call.check(f"seed={seed}")


@pytest.mark.parametrize("shape, out_dtype, group_size, mode", INT4_CASES)
def test_dequantize_int4(shape, out_dtype, group_size, mode, seed):
    rng = np.random.default_rng(seed)
    rows, cols = shape
    packed, scales, zeros = random_int4_inputs(rng, rows, cols, group_size, mode, out_dtype)
    call = DequantizeInt4Call(packed, scales, zeros, cols, group_size, mode, out_dtype)
    call.launch()
    call.check(f"seed={seed}")


def test_int4_groups_per_row_matches_reference():
    for cols in (1, 31, 32, 33, 100, 4097, 1_000_003):
        for group_size in ref.INT4_GROUP_SIZES:
            want = ref.int4_groups_per_row(cols, group_size)
            assert ck.raw.int4_groups_per_row(cols, CK_GROUP[group_size]) == want


# ---------------------------------------------------------------------------------------------
# Special inputs
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("granularity", ref.GRANULARITIES)
@pytest.mark.parametrize("dtype", ref.DTYPES)
def test_int8_static_scale_saturates(dtype, granularity, seed):
    rng = np.random.default_rng(seed)
    x = ref.random_input(rng, (16, 1000), dtype, scale=10.0)
    tiny = np.full(1 if granularity == "tensor" else 16, 0.01, np.float32)
    call = QuantizeInt8Call(x, dtype, granularity, static_scales=tiny)
    call.launch()
    q, _ = call.check(f"seed={seed}")
    assert (q == 127).any() and (q == -127).any(), f"the test data must saturate, seed={seed}"


@pytest.mark.parametrize("quantizer", list(QUANTIZERS))
@pytest.mark.parametrize("dtype", ref.DTYPES)
def test_nan_inputs_encode_as_zero(quantizer, dtype, seed):
    rng = np.random.default_rng(seed)
    xf = ref.to_f32(ref.random_input(rng, (8, 1000), dtype), dtype)
    nan_at = rng.random(xf.shape) < 0.05
    nan_at[3] = True  # a row of NaN only: absmax, min and max ignore NaN, so its scale is 1
    call = make_quantize_call(quantizer, ref.to_dtype(np.where(nan_at, np.nan, xf), dtype), dtype)
    call.launch()
    want = call.check(f"seed={seed}")
    assert (decoded(call, want)[nan_at] == 0).all(), f"NaN must encode as 0, seed={seed}"


@pytest.mark.parametrize("quantizer", list(QUANTIZERS))
@pytest.mark.parametrize("dtype", ref.DTYPES)
def test_zero_rows_get_scale_one(quantizer, dtype, seed):
    rng = np.random.default_rng(seed)
    x = ref.random_input(rng, (6, 300), dtype, zero_rows=[0, 4])
    call = make_quantize_call(quantizer, x, dtype)
    call.launch()
    want = call.check(f"seed={seed}")
    if isinstance(call, QuantizeInt4Call):
        assert (ref.to_f32(want[1], dtype)[[0, 4]] == 1).all(), f"seed={seed}"
    elif call.granularity == "row":  # (a per-tensor scale also covers the non-zero rows)
        assert (want[1][[0, 4]] == 1).all(), f"seed={seed}"
    back = decoded(call, want)
    assert not np.isnan(back).any() and (back[[0, 4]] == 0).all(), f"seed={seed}"


@pytest.mark.parametrize("shape", [(5, 4096), (3, 1001), (2, 136)], ids=shape_id)
@pytest.mark.parametrize("quantizer", list(QUANTIZERS))
@pytest.mark.parametrize("dtype", ref.DTYPES)
def test_quantize_element_aligned_pointers(quantizer, dtype, shape, seed):
    """Pointers aligned to their element but not to 16 bytes must take a correct (scalar) path."""
    rng = np.random.default_rng(seed)
    call = make_quantize_call(quantizer, ref.random_input(rng, shape, dtype), dtype, misalign=1)
    call.launch()
    call.check(f"seed={seed}")


@pytest.mark.parametrize("shape", [(5, 4096), (3, 1001)], ids=shape_id)
@pytest.mark.parametrize("int4_mode", [None, "sym", "asym"])
@pytest.mark.parametrize("out_dtype", ref.DTYPES)
def test_dequantize_element_aligned_pointers(out_dtype, int4_mode, shape, seed):
    rng = np.random.default_rng(seed)
    rows, cols = shape
    if int4_mode is None:
        codes, scales = random_int8_codes(rng, shape), random_int8_scales(rng, rows)
        call = DequantizeInt8Call(codes, scales, "row", out_dtype, misalign=1)
    else:
        packed, scales, zeros = random_int4_inputs(rng, rows, cols, 64, int4_mode, out_dtype)
        call = DequantizeInt4Call(packed, scales, zeros, cols, 64, int4_mode, out_dtype, misalign=1)
    call.launch()
    call.check(f"seed={seed}")


# ---------------------------------------------------------------------------------------------
# CUDA graphs, streams, the NumPy-level API
# ---------------------------------------------------------------------------------------------
GRAPH_SHAPE = (33, 1000)  # 1000 is not a multiple of 64 or 128: partial int4 groups


def make_graph_call(entry, dtype, rng):
    rows, cols = GRAPH_SHAPE
    if entry == "quantize_int8":
        return QuantizeInt8Call(ref.random_input(rng, GRAPH_SHAPE, dtype), dtype, "row")
    if entry == "dequantize_int8":
        codes, scales = random_int8_codes(rng, GRAPH_SHAPE), random_int8_scales(rng, rows)
        return DequantizeInt8Call(codes, scales, "row", dtype)
    if entry == "quantize_int4":
        return QuantizeInt4Call(ref.random_input(rng, GRAPH_SHAPE, dtype), dtype, 128, "asym")
    packed, scales, zeros = random_int4_inputs(rng, rows, cols, 128, "asym", dtype)
    return DequantizeInt4Call(packed, scales, zeros, cols, 128, "asym", dtype)


@pytest.mark.parametrize("dtype", ref.DTYPES)
@pytest.mark.parametrize(
    "entry", ["quantize_int8", "dequantize_int8", "quantize_int4", "dequantize_int4"]
)
def test_cuda_graph_replay(entry, dtype, seed):
    rng = np.random.default_rng(seed)
    call = make_graph_call(entry, dtype, rng)
    assert_graph_replays(call, rng, seed)


def test_two_streams_run_different_quantizations_concurrently(seed):
    rng = np.random.default_rng(seed)
    int8_call = QuantizeInt8Call(ref.random_input(rng, (256, 8192), "fp16"), "fp16", "row")
    int4_call = QuantizeInt4Call(ref.random_input(rng, (512, 4096), "bf16"), "bf16", 128, "asym")
    streams = [ck.cuda.stream_create(), ck.cuda.stream_create()]
    try:
        for _ in range(3):  # repeated so that the two streams' kernels overlap
            int8_call.launch(streams[0])
            int4_call.launch(streams[1])
        for stream in streams:
            ck.cuda.stream_synchronize(stream)
        int8_call.check(f"stream 0, seed={seed}")
        int4_call.check(f"stream 1, seed={seed}")
    finally:
        for stream in streams:
            ck.cuda.stream_destroy(stream)


@pytest.mark.parametrize("shape", [(1, 1), (7, 100), (64, 4096)], ids=shape_id)
def test_quantize_tensor_round_trip(shape, seed):
    rng = np.random.default_rng(seed)
    x = ref.random_input(rng, shape, "fp32")
    q, scale = ck.quantize_tensor(x)
    want_q, want_scales = ref.quantize_int8(x, "fp32", "tensor")
    assert_bitwise_equal(np.asarray(q), want_q, f"q, seed={seed}")
    assert_bitwise_equal(np.array([scale], np.float32), want_scales, f"scale, seed={seed}")
    back = ck.dequantize_tensor(q, scale)
    want_back = ref.dequantize_int8(want_q, want_scales, "tensor", "fp32")
    assert_bitwise_equal(np.asarray(back), want_back, f"dequantized, seed={seed}")
    # Round trip: half a step, plus float32 rounding of 1/scale, x/scale and q*scale, which adds
    # at most ~2.3e-5 of a step (1e-4 is a safe bound).
    err = np.abs(x - np.asarray(back))
    assert (err <= scale * (0.5 + 1e-4)).all(), f"max err/scale {err.max() / scale}, seed={seed}"
