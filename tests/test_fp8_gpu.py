"""GPU tests of the FP8 quantization kernels, bit for bit against tests/reference.py.

ck_quantize_fp8 and ck_dequantize_fp8 run over both formats (E4M3, E5M2), the four
granularities (tensor, row, 1 x 128 blocks, 128 x 128 tiles), static and dynamic scales,
fp32/fp16/bf16, and shapes with partial blocks in both dimensions, odd column counts (the scalar
path), one element, long rows and many rows, on fresh random data; NaN, +-inf, huge and
subnormal inputs; every byte in the dequantizer. Codes and scales must equal the reference's
bit patterns (the header promises bitwise equality: no tolerance); a dequantized NaN matches a
NaN of any payload (NumPy and the GPU write different NaN bits), every other value its exact
bits. Each output is poisoned before the launch and sits between two poisoned guard regions (a
write out of bounds shows).

The tests skip without a CUDA device. CK_SANITIZE=1 drops the largest shapes. Each test draws a
seed from os.urandom, prints it and names it in its messages; CK_TEST_SEED=<seed> replays it.
"""

import numpy as np
import pytest

import cuda_wrapper as ck
import reference as ref
from gpu_support import (
    CK_DTYPE, POISON, POISON_QUANTIZED, SANITIZE, GuardedBuffer, KernelCall, assert_bitwise_equal,
    assert_graph_replays, assert_same_values, dtype_arg, shape_id, synchronize, to_device,
    to_host,
)

pytestmark = pytest.mark.gpu

CK_FORMAT = {"e4m3": ck.FP8_E4M3, "e5m2": ck.FP8_E5M2}
CK_GRANULARITY = {"tensor": ck.PER_TENSOR, "row": ck.PER_ROW, "block1x128": ck.PER_BLOCK_1X128,
                  "block128x128": ck.PER_BLOCK_128X128}
POISON_CODES = 0xAB   # a valid FP8 byte: a missed code is caught unless it happens to be 0xAB

# One element; odd columns (scalar path); partial 1 x 128 blocks and 128 x 128 tiles in both
# dimensions; whole tiles; rows not a multiple of 128; one long row (the per-tensor absmax pass,
# and per row the two-pass long-row kernel); many short rows; per-tensor sizes at the one-block
# limit (16384 fp16/bf16 or 8192 fp32 values) and just past it.
SHAPES = [
    (1, 1), (3, 5), (2, 127), (7, 129), (130, 300), (128, 256), (257, 136), (1, 40_008),
    (2000, 24), (1, 100_003), (2, 8192), (4, 2048), (3, 8200),
]
if SANITIZE:
    SHAPES = [shape for shape in SHAPES if shape[0] * shape[1] <= 50_000]
CASES = [pytest.param(shape, dtype, fmt, gran, id=f"{shape_id(shape)}-{dtype}-{fmt}-{gran}")
         for shape in SHAPES for dtype in ref.DTYPES for fmt in ref.FP8_FORMATS
         for gran in ref.FP8_GRANULARITIES]

SPECIALS = np.array([np.nan, -np.nan, np.inf, -np.inf, -0.0, 0.0, 1e-40, -3e-39, 6e-8, 7e4,
                     -1e30, 3e38], dtype=np.float32)


# ---------------------------------------------------------------------------------------------
# One call of each entry point (gpu_support.KernelCall)
# ---------------------------------------------------------------------------------------------
class QuantizeFp8Call(KernelCall):
    def __init__(self, x, dtype, fmt, granularity, static_scales=None, misalign=0):
        rows, cols = x.shape
        self.dtype, self.fmt, self.granularity = dtype, fmt, granularity
        self.inputs = (x, static_scales)
        self.x = GuardedBuffer.input(x, misalign * x.dtype.itemsize)
        self.q = GuardedBuffer.output((rows, cols), np.uint8, POISON_CODES, misalign)
        shape = ref.fp8_scale_shape(rows, cols, granularity)
        if static_scales is None:
            self.scales = GuardedBuffer.output(shape, np.float32, POISON_QUANTIZED, misalign * 4)
            self.outputs = {"q": self.q, "scales": self.scales}
        else:
            self.scales = GuardedBuffer.input(static_scales.reshape(shape), misalign * 4)
            self.outputs = {"q": self.q}

    def launch(self, stream=0):
        rows, cols = self.x.shape
        mode = ck.DYNAMIC if self.inputs[1] is None else ck.STATIC
        ck.raw.quantize_fp8(self.x.ptr, CK_DTYPE[self.dtype], rows, cols, CK_FORMAT[self.fmt],
                            CK_GRANULARITY[self.granularity], mode, self.scales.ptr, self.q.ptr,
                            stream)

    def refill(self, rng):
        x = with_specials(rng, ref.random_input(rng, self.x.shape, self.dtype), self.dtype)
        self.x.write(x)
        self.inputs = (x, self.inputs[1])

    def check(self, ctx):
        synchronize()
        x, static_scales = self.inputs
        want_q, want_scales = ref.quantize_fp8(x, self.dtype, self.fmt, self.granularity,
                                               static_scales)
        assert_bitwise_equal(self.q.read(f"q, {ctx}"), want_q, f"q, {ctx}")
        assert_bitwise_equal(self.scales.read(f"scales, {ctx}"), want_scales, f"scales, {ctx}")
        return want_q, want_scales


class DequantizeFp8Call(KernelCall):
    def __init__(self, q, scales, fmt, granularity, out_dtype, misalign=0):
        self.fmt, self.granularity, self.out_dtype = fmt, granularity, out_dtype
        self.inputs = (q, scales)
        self.q = GuardedBuffer.input(q, misalign)
        self.scales = GuardedBuffer.input(scales, misalign * 4)
        out_np = np.dtype(ref.NUMPY_DTYPE[out_dtype])
        self.out = GuardedBuffer.output(q.shape, out_np, POISON, misalign * out_np.itemsize)
        self.outputs = {"out": self.out}

    def launch(self, stream=0):
        rows, cols = self.q.shape
        ck.raw.dequantize_fp8(self.q.ptr, CK_FORMAT[self.fmt], self.scales.ptr, rows, cols,
                              CK_GRANULARITY[self.granularity], self.out.ptr,
                              CK_DTYPE[self.out_dtype], stream)

    def refill(self, rng):
        q, scales = random_codes_and_scales(rng, self.q.shape, self.granularity)
        self.q.write(q)
        self.scales.write(scales)
        self.inputs = (q, scales)

    def check(self, ctx):
        synchronize()
        want = ref.dequantize_fp8(*self.inputs, self.fmt, self.granularity, self.out_dtype)
        assert_same_values(self.out.read(f"out, {ctx}"), want, f"out, {ctx}")


def with_specials(rng, x, dtype, fraction=0.01):
    """x with about `fraction` of its elements replaced by NaN, +-inf, +-0, subnormals and huge
    values (rounded to dtype: 3e38 is inf in fp16), one zero 128-block and one zero row."""
    xf = ref.to_f32(x, dtype).copy()
    hit = rng.random(xf.shape) < fraction
    xf[hit] = rng.choice(SPECIALS, size=int(hit.sum()))
    rows, cols = xf.shape
    c0 = rng.integers(cols) // 128 * 128
    xf[rng.integers(rows), c0:c0 + 128] = 0.0
    xf[rng.integers(rows)] = 0.0
    with np.errstate(over="ignore"):
        return ref.to_dtype(xf, dtype)


def random_codes_and_scales(rng, shape, granularity):
    """Every byte (NaN, E5M2's infinities, subnormals, -0 included) and positive scales over
    six decades."""
    q = rng.integers(0, 256, size=shape, dtype=np.uint8)
    scale_shape = ref.fp8_scale_shape(*shape, granularity)
    return q, (10.0 ** rng.uniform(-4, 2, scale_shape)).astype(np.float32)


def static_scales_for(rng, x, dtype, fmt, granularity):
    """Around the dynamic scales, half of them smaller: those scopes saturate."""
    _, dynamic = ref.quantize_fp8(x, dtype, fmt, granularity)
    return (dynamic * rng.uniform(0.5, 2.0, dynamic.shape)).astype(np.float32)


# ---------------------------------------------------------------------------------------------
# Every format, granularity, dtype and shape
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("shape, dtype, fmt, granularity", CASES)
def test_quantize_dynamic(shape, dtype, fmt, granularity, seed):
    rng = np.random.default_rng(seed)
    call = QuantizeFp8Call(ref.random_input(rng, shape, dtype), dtype, fmt, granularity)
    call.launch()
    call.check(f"seed={seed}")


@pytest.mark.parametrize("shape, dtype, fmt, granularity", CASES)
def test_quantize_static(shape, dtype, fmt, granularity, seed):
    rng = np.random.default_rng(seed)
    x = ref.random_input(rng, shape, dtype)
    static = static_scales_for(rng, x, dtype, fmt, granularity)
    call = QuantizeFp8Call(x, dtype, fmt, granularity, static)
    call.launch()
    call.check(f"seed={seed}")


@pytest.mark.parametrize("shape, out_dtype, fmt, granularity", CASES)
def test_dequantize(shape, out_dtype, fmt, granularity, seed):
    rng = np.random.default_rng(seed)
    q, scales = random_codes_and_scales(rng, shape, granularity)
    call = DequantizeFp8Call(q, scales, fmt, granularity, out_dtype)
    call.launch()
    call.check(f"seed={seed}")


# ---------------------------------------------------------------------------------------------
# Special inputs and pointers
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("scale_mode", ["dynamic", "static"])
@pytest.mark.parametrize("granularity", ref.FP8_GRANULARITIES)
@pytest.mark.parametrize("fmt", ref.FP8_FORMATS)
@pytest.mark.parametrize("dtype", ref.DTYPES)
def test_nan_inf_huge_zero_and_subnormal_inputs(dtype, fmt, granularity, scale_mode, seed):
    """NaN (-> 0x7F, ignored by amax), +-inf (static: +-max; dynamic: an infinite scale, so its
    scope's finite values give +-0 and its infinities NaN), values past the format's range,
    zero rows and blocks (scale 1), float32 and fp16 subnormals."""
    rng = np.random.default_rng(seed)
    x = with_specials(rng, ref.random_input(rng, (260, 300), dtype), dtype, fraction=0.03)
    static = static_scales_for(rng, x, dtype, fmt, granularity) if scale_mode == "static" \
        else None
    if static is not None:
        static[~np.isfinite(static) | (static < 2.0**-126)] = 1.0   # the caller's promise
    call = QuantizeFp8Call(x, dtype, fmt, granularity, static)
    call.launch()
    q, _ = call.check(f"seed={seed}")
    assert (q == ref.FP8_NAN).any(), f"the data must hold NaN, seed={seed}"


@pytest.mark.parametrize("granularity", ref.FP8_GRANULARITIES)
@pytest.mark.parametrize("fmt", ref.FP8_FORMATS)
def test_tiny_scopes_get_scale_one(fmt, granularity, seed):
    """amax / FMAX below 2^-126 (and exactly 0) gives the scale 1, on every path."""
    rng = np.random.default_rng(seed)
    x = ref.random_input(rng, (300, 520), "fp32")
    x[:, :128] = 0.0
    x[:130, 128:256] = rng.uniform(-1e-37, 1e-37, (130, 128)).astype(np.float32)
    x[200] = 1e-38
    call = QuantizeFp8Call(x, "fp32", fmt, granularity)
    call.launch()
    _, scales = call.check(f"seed={seed}")
    if granularity in ("row", "block1x128"):
        assert (scales[200] == 1).all(), f"seed={seed}"


@pytest.mark.parametrize("fmt", ref.FP8_FORMATS)
@pytest.mark.parametrize("dtype", ref.DTYPES)
def test_static_scales_saturate(dtype, fmt, seed):
    rng = np.random.default_rng(seed)
    x = ref.random_input(rng, (16, 1000), dtype, scale=10.0)
    tiny = np.full((16, 8), 1e-4, np.float32)
    call = QuantizeFp8Call(x, dtype, fmt, "block1x128", tiny)
    call.launch()
    q, _ = call.check(f"seed={seed}")
    top = 0x7E if fmt == "e4m3" else 0x7B
    assert (q == top).any() and (q == top | 0x80).any(), f"the data must saturate, seed={seed}"


@pytest.mark.parametrize("shape", [(5, 4096), (3, 1001), (130, 136)], ids=shape_id)
@pytest.mark.parametrize("granularity", ref.FP8_GRANULARITIES)
@pytest.mark.parametrize("dtype", ref.DTYPES)
def test_element_aligned_pointers(dtype, granularity, shape, seed):
    """Pointers aligned to their element but not to 16 (or 8) bytes take the scalar path."""
    rng = np.random.default_rng(seed)
    fmt = ref.FP8_FORMATS[seed % 2]
    x = ref.random_input(rng, shape, dtype)
    call = QuantizeFp8Call(x, dtype, fmt, granularity, misalign=1)
    call.launch()
    call.check(f"dynamic, seed={seed}")
    call = QuantizeFp8Call(x, dtype, fmt, granularity,
                           static_scales_for(rng, x, dtype, fmt, granularity), misalign=1)
    call.launch()
    call.check(f"static, seed={seed}")
    q, scales = random_codes_and_scales(rng, shape, granularity)
    call = DequantizeFp8Call(q, scales, fmt, granularity, dtype, misalign=1)
    call.launch()
    call.check(f"dequantize, seed={seed}")


@pytest.mark.parametrize("fmt", ref.FP8_FORMATS)
def test_every_code_dequantizes(fmt):
    """All 256 bytes under scale 1 in every output dtype: the exact values (NaN as NaN, E5M2's
    0x7C / 0xFC as +-inf)."""
    q = np.arange(256, dtype=np.uint8).reshape(2, 128)
    for out_dtype in ref.DTYPES:
        call = DequantizeFp8Call(q, np.ones(1, np.float32), fmt, "tensor", out_dtype)
        call.launch()
        call.check(out_dtype)


# ---------------------------------------------------------------------------------------------
# CUDA graphs, streams, the NumPy-level API
# ---------------------------------------------------------------------------------------------
GRAPH_SHAPE = (130, 1000)   # partial blocks both ways; 1000 is a multiple of 8


@pytest.mark.parametrize("entry", ["quantize-dynamic", "quantize-static", "dequantize"])
@pytest.mark.parametrize("granularity", ref.FP8_GRANULARITIES)
def test_cuda_graph_replay(entry, granularity, seed):
    rng = np.random.default_rng(seed)
    dtype, fmt = ref.DTYPES[seed % 3], ref.FP8_FORMATS[seed % 2]
    if entry == "dequantize":
        q, scales = random_codes_and_scales(rng, GRAPH_SHAPE, granularity)
        call = DequantizeFp8Call(q, scales, fmt, granularity, dtype)
    else:
        x = ref.random_input(rng, GRAPH_SHAPE, dtype)
        static = static_scales_for(rng, x, dtype, fmt, granularity) \
            if entry == "quantize-static" else None
        call = QuantizeFp8Call(x, dtype, fmt, granularity, static)
    assert_graph_replays(call, rng, seed)


def test_two_streams_run_different_quantizations_concurrently(seed):
    rng = np.random.default_rng(seed)
    a = QuantizeFp8Call(ref.random_input(rng, (256, 8192), "bf16"), "bf16", "e4m3", "block1x128")
    b = QuantizeFp8Call(ref.random_input(rng, (512, 4096), "fp16"), "fp16", "e5m2",
                        "block128x128")
    streams = [ck.cuda.stream_create(), ck.cuda.stream_create()]
    try:
        for _ in range(3):
            a.launch(streams[0])
            b.launch(streams[1])
        for stream in streams:
            ck.cuda.stream_synchronize(stream)
        a.check(f"stream 0, seed={seed}")
        b.check(f"stream 1, seed={seed}")
    finally:
        for stream in streams:
            ck.cuda.stream_destroy(stream)


@pytest.mark.parametrize("device", [False, True], ids=["numpy", "device"])
@pytest.mark.parametrize("granularity", ref.FP8_GRANULARITIES)
@pytest.mark.parametrize("fmt", ref.FP8_FORMATS)
def test_wrapper_round_trip(fmt, granularity, device, seed):
    """quantize_fp8 / dequantize_fp8 on NumPy arrays and on DeviceArrays: the reference's bits,
    scales in the granularity's shape, the granularity inferred from them when dequantizing."""
    rng = np.random.default_rng(seed)
    dtype = ref.DTYPES[seed % 3]
    x = ref.random_input(rng, (130, 300), dtype)
    arg = to_device(x, dtype) if device else x
    q, scales = ck.quantize_fp8(arg, format=fmt, granularity=granularity, dtype=dtype_arg(dtype))
    want_q, want_scales = ref.quantize_fp8(x, dtype, fmt, granularity)
    assert_bitwise_equal(to_host(q), want_q, f"q, seed={seed}")
    assert_bitwise_equal(to_host(scales), want_scales, f"scales, seed={seed}")
    for gran in (None, granularity):
        back = ck.dequantize_fp8(q, scales, format=fmt, granularity=gran, out_dtype=dtype)
        want = ref.dequantize_fp8(want_q, want_scales, fmt, granularity, dtype)
        assert_same_values(to_host(back), want, f"dequantized ({gran}), seed={seed}")
    # Static: the same scales give the same codes.
    q2, _ = ck.quantize_fp8(arg, format=fmt, granularity=granularity, scales=scales,
                            dtype=dtype_arg(dtype))
    assert_bitwise_equal(to_host(q2), want_q, f"static q, seed={seed}")
