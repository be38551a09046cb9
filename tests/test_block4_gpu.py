"""GPU tests of the block 4-bit formats (NF4, MXFP4, NVFP4), bit for bit against tests/reference.py.

Every entry point (ck_quantize_nf4, ck_dequantize_nf4, ck_quantize_mxfp4, ck_dequantize_mxfp4,
ck_quantize_nvfp4, ck_dequantize_nvfp4) runs over fp32/fp16/bf16 and many shapes on fresh random
data: odd column counts (the padding nibble), partial last blocks, one row, long rows and many
rows, every NF4 block size, NaN / infinity / -0.0 / subnormal inputs, E2M1 rounding ties, NVFP4's
computed and given global scales, and every scale byte in the dequantizers. Codes and scales must
equal the reference's bit patterns (the header promises bitwise equality: no tolerance); a
dequantized NaN matches a NaN of any payload (NumPy and the GPU write different NaN bits), every
other value its exact bits. Outputs are poisoned before the launch and sit between poisoned
guard regions.

The tests skip without a CUDA device. CK_SANITIZE=1 drops the largest shapes. Each test draws a
seed from os.urandom, prints it and names it in its messages; CK_TEST_SEED=<seed> replays it.
"""

import numpy as np
import pytest

import cuda_wrapper as ck
import reference as ref
from gpu_support import (
    CK_DTYPE, POISON, POISON_QUANTIZED, SANITIZE, GuardedBuffer, KernelCall,
    assert_bitwise_equal, assert_graph_replays, assert_same_values, dtype_arg, shape_id,
    synchronize, to_device, to_host,
)

pytestmark = pytest.mark.gpu

# One row, odd columns (the padding nibble), partial last blocks of 16 and 32, whole blocks, long
# rows (vectorized and not), many short rows.
SHAPES = [
    (1, 1), (1, 7), (3, 5), (2, 15), (4, 17), (5, 31), (2, 33), (6, 63), (3, 100), (7, 255),
    (300, 136), (64, 4096), (1, 4097), (2, 12_289), (20_000, 24), (1, 1_000_003), (5, 40_000),
]
if SANITIZE:
    SHAPES = [shape for shape in SHAPES if shape[0] * shape[1] <= 100_000]
# NF4 runs every block size: fewer shapes, each with partial last blocks for most sizes.
NF4_SHAPES = [(1, 1), (3, 5), (2, 33), (7, 255), (4, 4097), (33, 8192 + 8), (1, 100_001)]
if SANITIZE:
    NF4_SHAPES = NF4_SHAPES[:5]
FORMATS = ("nf4", "mxfp4", "nvfp4")
BLOCK = {"mxfp4": ref.MXFP4_BLOCK, "nvfp4": ref.NVFP4_BLOCK}
SCALE_DTYPE = {"nf4": np.float32, "mxfp4": np.uint8, "nvfp4": np.uint8}


def format_cases(shapes_of_nf4=NF4_SHAPES, shapes=SHAPES):
    """pytest params (format, shape, dtype, blocksize): every NF4 block size on NF4_SHAPES,
    MXFP4 and NVFP4 on SHAPES."""
    cases = [pytest.param("nf4", shape, dtype, bs, id=f"nf4-b{bs}-{shape_id(shape)}-{dtype}")
             for bs in ref.NF4_BLOCK_SIZES for shape in shapes_of_nf4 for dtype in ref.DTYPES]
    cases += [pytest.param(fmt, shape, dtype, BLOCK[fmt], id=f"{fmt}-{shape_id(shape)}-{dtype}")
              for fmt in ("mxfp4", "nvfp4") for shape in shapes for dtype in ref.DTYPES]
    return cases


# ---------------------------------------------------------------------------------------------
# Inputs and comparisons
# ---------------------------------------------------------------------------------------------
SPECIALS = np.array([np.nan, np.inf, -np.inf, -0.0, 0.0, 1e-40, -3e-39, 6e-8, 7e4, -1e30],
                    dtype=np.float32)


def with_specials(rng, x, dtype, fraction=0.01):
    """x with about `fraction` of its elements replaced by NaN, +-inf, +-0, float32 subnormals,
    fp16 subnormals and large values (each rounded to dtype), and one block of zeros."""
    xf = ref.to_f32(x, dtype).copy()
    hit = rng.random(xf.shape) < fraction
    xf[hit] = rng.choice(SPECIALS, size=int(hit.sum()))
    rows, cols = xf.shape
    r, c0 = rng.integers(rows), rng.integers(cols) // 16 * 16
    xf[r, c0:c0 + 32] = 0.0
    with np.errstate(over="ignore"):
        return ref.to_dtype(xf, dtype)


def ties_input(rng, shape, dtype):
    """Multiples of 0.25 in [-8, 8]: under MXFP4's scale 1 (amax in [4, 8)) they hit every E2M1
    rounding tie (0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5) and the saturation past 6."""
    x = (rng.integers(-32, 33, size=shape) * 0.25).astype(np.float32)
    x[:, ::16] = 4.0 + 0.25 * rng.integers(0, 16, size=x[:, ::16].shape)
    return ref.to_dtype(x, dtype)


def reference_quantize(fmt, x, dtype, blocksize, global_scale=None):
    """(packed, scales[, global_scale]) of the reference."""
    if fmt == "nf4":
        return ref.quantize_nf4(x, dtype, blocksize)
    if fmt == "mxfp4":
        return ref.quantize_mxfp4(x, dtype)
    return ref.quantize_nvfp4(x, dtype, global_scale)


def reference_dequantize(fmt, packed, scales, global_scale, cols, blocksize, out_dtype):
    if fmt == "nf4":
        return ref.dequantize_nf4(packed, scales, cols, blocksize, out_dtype)
    if fmt == "mxfp4":
        return ref.dequantize_mxfp4(packed, scales, cols, out_dtype)
    return ref.dequantize_nvfp4(packed, scales, global_scale, cols, out_dtype)


def random_scales(rng, fmt, shape):
    """Scales of every kind a dequantizer can be given: NF4 absmax from 1e-3 to 1e3 with zeros,
    infinities and NaN among them; every byte of E8M0 (0xFF NaN, 0x00 the subnormal 2^-127,
    0xFE past the float32 range) and of E4M3 (0x7F, 0xFF NaN, subnormals, -0)."""
    if fmt != "nf4":
        return rng.integers(0, 256, size=shape, dtype=np.uint8)
    absmax = (10.0 ** rng.uniform(-3, 3, shape)).astype(np.float32)
    special = rng.random(shape)
    absmax[special < 0.03] = 0.0
    absmax[(special >= 0.03) & (special < 0.04)] = np.inf
    absmax[(special >= 0.04) & (special < 0.05)] = np.nan
    return absmax


# ---------------------------------------------------------------------------------------------
# One call of each entry point (gpu_support.KernelCall)
# ---------------------------------------------------------------------------------------------
class Block4Call(KernelCall):
    """What both calls share: `offsets` ({buffer name: bytes}) moves a pointer off its buffer's
    start (the misalignment tests, whose calls are rejected before any launch)."""

    offsets = {}

    def ptr(self, name):
        return getattr(self, name).ptr + self.offsets.get(name, 0)

    def check_launch(self, ctx):
        self.launch()
        return self.check(ctx)


class QuantizeCall(Block4Call):
    """ck_quantize_<fmt> on guarded buffers. global_scale (NVFP4): None computes it on the
    device (CK_SCALE_DYNAMIC), a float32 [1] is given (CK_SCALE_STATIC). misalign: elements
    before x, bytes before packed and scales (both break the vectorized path)."""

    def __init__(self, fmt, x, dtype, blocksize, global_scale=None, misalign=0):
        rows, cols = x.shape
        self.fmt, self.dtype, self.blocksize = fmt, dtype, blocksize
        self.inputs = (x, global_scale)
        self.x = GuardedBuffer.input(x, misalign * x.dtype.itemsize)
        self.packed = GuardedBuffer.output((rows, (cols + 1) // 2), np.uint8, POISON_QUANTIZED,
                                           misalign)
        scale_dtype = np.dtype(SCALE_DTYPE[fmt])
        self.scales = GuardedBuffer.output((rows, ref.block_count(cols, blocksize)), scale_dtype,
                                           POISON_QUANTIZED, misalign * scale_dtype.itemsize)
        self.outputs = {"packed": self.packed, "scales": self.scales}
        self.global_scale = None
        if fmt == "nvfp4":
            if global_scale is None:
                self.global_scale = GuardedBuffer.output((1,), np.float32, POISON_QUANTIZED)
                self.outputs["global_scale"] = self.global_scale
            else:
                self.global_scale = GuardedBuffer.input(global_scale)

    def launch(self, stream=0):
        rows, cols = self.x.shape
        dt, x, packed, scales = CK_DTYPE[self.dtype], self.ptr("x"), self.ptr("packed"), \
            self.ptr("scales")
        if self.fmt == "nf4":
            ck.raw.quantize_nf4(x, dt, rows, cols, self.blocksize, packed, scales, stream)
        elif self.fmt == "mxfp4":
            ck.raw.quantize_mxfp4(x, dt, rows, cols, packed, scales, stream)
        else:
            mode = ck.DYNAMIC if self.inputs[1] is None else ck.STATIC
            ck.raw.quantize_nvfp4(x, dt, rows, cols, mode, self.ptr("global_scale"), packed,
                                  scales, stream)

    def refill(self, rng):
        x = with_specials(rng, ref.random_input(rng, self.x.shape, self.dtype), self.dtype)
        self.x.write(x)
        self.inputs = (x, self.inputs[1])

    def check(self, ctx):
        synchronize()
        x, global_scale = self.inputs
        want = reference_quantize(self.fmt, x, self.dtype, self.blocksize, global_scale)
        assert_bitwise_equal(self.packed.read(f"packed, {ctx}"), want[0], f"packed, {ctx}")
        assert_bitwise_equal(self.scales.read(f"scales, {ctx}"), want[1], f"scales, {ctx}")
        if "global_scale" in self.outputs:
            assert_bitwise_equal(self.global_scale.read(f"global_scale, {ctx}"), want[2],
                                 f"global_scale, {ctx}")
        return want


class DequantizeCall(Block4Call):
    """ck_dequantize_<fmt> on guarded buffers; misalign: bytes before packed and scales,
    elements before out."""

    def __init__(self, fmt, packed, scales, global_scale, cols, blocksize, out_dtype, misalign=0):
        self.fmt, self.cols, self.blocksize, self.out_dtype = fmt, cols, blocksize, out_dtype
        self.inputs = (packed, scales, global_scale)
        self.packed = GuardedBuffer.input(packed, misalign)
        self.scales = GuardedBuffer.input(scales, misalign * scales.dtype.itemsize)
        self.global_scale = None if global_scale is None else GuardedBuffer.input(global_scale)
        out_np = np.dtype(ref.NUMPY_DTYPE[out_dtype])
        self.out = GuardedBuffer.output((packed.shape[0], cols), out_np, POISON,
                                        misalign * out_np.itemsize)
        self.outputs = {"out": self.out}

    def launch(self, stream=0):
        rows, dt = self.packed.shape[0], CK_DTYPE[self.out_dtype]
        packed, scales, out = self.ptr("packed"), self.ptr("scales"), self.ptr("out")
        if self.fmt == "nf4":
            ck.raw.dequantize_nf4(packed, scales, rows, self.cols, self.blocksize, out, dt, stream)
        elif self.fmt == "mxfp4":
            ck.raw.dequantize_mxfp4(packed, scales, rows, self.cols, out, dt, stream)
        else:
            ck.raw.dequantize_nvfp4(packed, scales, self.ptr("global_scale"), rows, self.cols,
                                    out, dt, stream)

    def refill(self, rng):
        packed = rng.integers(0, 256, size=self.packed.shape, dtype=np.uint8)
        scales = random_scales(rng, self.fmt, self.scales.shape).astype(self.scales.dtype)
        self.packed.write(packed)
        self.scales.write(scales)
        self.inputs = (packed, scales, self.inputs[2])

    def check(self, ctx):
        synchronize()
        packed, scales, global_scale = self.inputs
        want = reference_dequantize(self.fmt, packed, scales, global_scale, self.cols,
                                    self.blocksize, self.out_dtype)
        assert_same_values(self.out.read(f"out, {ctx}"), want, f"out, {ctx}")


def random_dequantize_call(rng, fmt, shape, blocksize, out_dtype, misalign=0):
    rows, cols = shape
    packed = rng.integers(0, 256, size=(rows, (cols + 1) // 2), dtype=np.uint8)
    scales = random_scales(rng, fmt, (rows, ref.block_count(cols, blocksize)))
    g = np.array([10.0 ** rng.uniform(-3, 3)], np.float32) if fmt == "nvfp4" else None
    return DequantizeCall(fmt, packed, scales, g, cols, blocksize, out_dtype, misalign)


# ---------------------------------------------------------------------------------------------
# Quantization
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("fmt, shape, dtype, blocksize", format_cases())
def test_quantize(fmt, shape, dtype, blocksize, seed):
    rng = np.random.default_rng(seed)
    x = ref.random_input(rng, shape, dtype, zero_rows=[0] if shape[0] > 2 else ())
    QuantizeCall(fmt, x, dtype, blocksize).check_launch(f"seed={seed}")


@pytest.mark.parametrize("fmt, shape, dtype, blocksize", format_cases(
    NF4_SHAPES[:5], [s for s in SHAPES if s[0] * s[1] <= 300_000]))
def test_quantize_nan_inf_zero_subnormal(fmt, shape, dtype, blocksize, seed):
    rng = np.random.default_rng(seed)
    x = with_specials(rng, ref.random_input(rng, shape, dtype), dtype, fraction=0.02)
    QuantizeCall(fmt, x, dtype, blocksize).check_launch(f"seed={seed}")


@pytest.mark.parametrize("fmt", ["mxfp4", "nvfp4"])
@pytest.mark.parametrize("dtype", ref.DTYPES)
def test_quantize_rounding_ties(fmt, dtype, seed):
    rng = np.random.default_rng(seed)
    x = ties_input(rng, (37, 1000), dtype)
    QuantizeCall(fmt, x, dtype, BLOCK[fmt]).check_launch(f"seed={seed}")


# Given global scales: a calibrated one, ones that push block scales into E4M3's subnormals
# (or to 0: all-zero blocks), past 448 (saturation), and float32's extremes.
NVFP4_GIVEN_SCALES = [1.0, 0.37, 2688.0, 1e-6, 1e-3, 1e5, 1e30, 1e-30]


@pytest.mark.parametrize("global_scale", NVFP4_GIVEN_SCALES)
@pytest.mark.parametrize("dtype", ref.DTYPES)
def test_quantize_nvfp4_given_global_scale(global_scale, dtype, seed):
    rng = np.random.default_rng(seed)
    x = with_specials(rng, ref.random_input(rng, (19, 333), dtype), dtype)
    g = np.array([global_scale], np.float32)
    QuantizeCall("nvfp4", x, dtype, ref.NVFP4_BLOCK, g).check_launch(f"seed={seed}")


@pytest.mark.parametrize("case, dtype", [
    (case, dtype) for case in ("zeros", "tiny", "inf", "nan") for dtype in ref.DTYPES
    if not (case == "tiny" and dtype == "fp16")])   # 2688 / fp16's least subnormal is finite
def test_quantize_nvfp4_global_scale_fallback(case, dtype, seed):
    """The computed global scale where 2688 / amax is not a positive finite number: 1 (amax 0,
    all NaN, amax inf, or an amax so small that the quotient overflows)."""
    rng = np.random.default_rng(seed)
    xf = {"zeros": np.zeros((3, 40), np.float32),
          "tiny": np.full((3, 40), 1e-44 if dtype == "fp32" else 1e-40, np.float32),
          "inf": np.where(rng.random((3, 40)) < 0.1, np.inf, 1.0).astype(np.float32),
          "nan": np.full((3, 40), np.nan, np.float32)}[case]
    call = QuantizeCall("nvfp4", ref.to_dtype(xf, dtype), dtype, ref.NVFP4_BLOCK)
    want = call.check_launch(f"seed={seed}")
    assert want[2][0] == 1.0, want[2]


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("dtype", ref.DTYPES)
@pytest.mark.parametrize("cols", [4096, 4099])
def test_quantize_scalar_path(fmt, dtype, cols, seed):
    """x one element past 16-byte alignment and packed one byte past 4: the element-wise path,
    the same bits."""
    rng = np.random.default_rng(seed)
    x = with_specials(rng, ref.random_input(rng, (5, cols), dtype), dtype)
    QuantizeCall(fmt, x, dtype, BLOCK.get(fmt, 64), misalign=1).check_launch(f"seed={seed}")


@pytest.mark.parametrize("fmt", FORMATS)
def test_quantize_graph_replays(fmt, seed):
    rng = np.random.default_rng(seed)
    x = ref.random_input(rng, (33, 1000), "fp16")
    assert_graph_replays(QuantizeCall(fmt, x, "fp16", BLOCK.get(fmt, 64)), rng, seed)


# ---------------------------------------------------------------------------------------------
# Dequantization
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("fmt, shape, dtype, blocksize", format_cases())
def test_dequantize(fmt, shape, dtype, blocksize, seed):
    """Every code under every kind of scale (NaN, infinite, zero and subnormal ones included)."""
    rng = np.random.default_rng(seed)
    random_dequantize_call(rng, fmt, shape, blocksize, dtype).check_launch(f"seed={seed}")


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("out_dtype", ref.DTYPES)
@pytest.mark.parametrize("cols", [4096, 4099])
def test_dequantize_scalar_path(fmt, out_dtype, cols, seed):
    rng = np.random.default_rng(seed)
    call = random_dequantize_call(rng, fmt, (5, cols), BLOCK.get(fmt, 64), out_dtype, misalign=1)
    call.check_launch(f"seed={seed}")


@pytest.mark.parametrize("fmt", FORMATS)
def test_dequantize_graph_replays(fmt, seed):
    rng = np.random.default_rng(seed)
    call = random_dequantize_call(rng, fmt, (17, 999), BLOCK.get(fmt, 64), "bf16")
    assert_graph_replays(call, rng, seed)


@pytest.mark.parametrize("fmt, shape, dtype, blocksize", format_cases(
    NF4_SHAPES[:4], SHAPES[:10]))
def test_round_trip(fmt, shape, dtype, blocksize, seed):
    """The dequantizer reads what the quantizer wrote: dequantize(quantize(x)) as the reference
    computes it, in every output dtype."""
    rng = np.random.default_rng(seed)
    x = with_specials(rng, ref.random_input(rng, shape, dtype), dtype)
    want = QuantizeCall(fmt, x, dtype, blocksize).check_launch(f"seed={seed}")
    g = want[2] if fmt == "nvfp4" else None
    for out_dtype in ref.DTYPES:
        DequantizeCall(fmt, want[0], want[1], g, shape[1], blocksize,
                       out_dtype).check_launch(f"{out_dtype}, seed={seed}")


# ---------------------------------------------------------------------------------------------
# Rejections: misaligned pointers launch nothing and write nothing
# ---------------------------------------------------------------------------------------------
def misaligned_calls(rng):
    """(what, call, the pointer's field, bytes off): pointers the header requires aligned."""
    x16 = ref.random_input(rng, (4, 64), "fp16")
    x32 = ref.random_input(rng, (4, 64), "fp32")
    yield "nf4-x-fp16", QuantizeCall("nf4", x16, "fp16", 64), "x", 1
    yield "nf4-x-fp32", QuantizeCall("nf4", x32, "fp32", 64), "x", 2
    yield "nf4-absmax", QuantizeCall("nf4", x16, "fp16", 64), "scales", 2
    yield "mxfp4-x-bf16", QuantizeCall("mxfp4", x16.view(np.uint16), "bf16", 32), "x", 1
    yield "nvfp4-x-fp32", QuantizeCall("nvfp4", x32, "fp32", 16), "x", 3
    yield "nvfp4-global_scale", QuantizeCall("nvfp4", x32, "fp32", 16), "global_scale", 2
    yield ("nvfp4-global_scale-static",
           QuantizeCall("nvfp4", x32, "fp32", 16, np.array([1.0], np.float32)), "global_scale", 1)
    for fmt in FORMATS:
        call = random_dequantize_call(rng, fmt, (4, 64), BLOCK.get(fmt, 64), "fp16")
        yield f"de{fmt}-out-fp16", call, "out", 1
    call = random_dequantize_call(rng, "nf4", (4, 64), 64, "fp32")
    yield "denf4-absmax", call, "scales", 1
    call = random_dequantize_call(rng, "nvfp4", (4, 64), 16, "fp32")
    yield "denvfp4-global_scale", call, "global_scale", 2


def test_misaligned_pointers_are_rejected(seed):
    rng = np.random.default_rng(seed)
    for what, call, field, offset in misaligned_calls(rng):
        call.offsets = {field: offset}
        with pytest.raises(ck.CKError) as info:
            call.launch()
        name = "absmax" if field == "scales" and "nf4" in what else field
        assert info.value.status == ck.Status.MISALIGNED, (what, info.value.message)
        assert name in info.value.message, (what, info.value.message)
        synchronize()
        call.assert_outputs_untouched(f"{what}: a rejected call")


# ---------------------------------------------------------------------------------------------
# The Python wrapper: NumPy in, NumPy out; device arrays in, DeviceArrays out
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", ref.DTYPES)
def test_wrapper_functions(dtype, seed):
    rng = np.random.default_rng(seed)
    x = with_specials(rng, ref.random_input(rng, (9, 301), dtype), dtype)
    cols = x.shape[1]
    packed, absmax = ck.quantize_nf4(x, blocksize=128, dtype=dtype_arg(dtype))
    want = ref.quantize_nf4(x, dtype, 128)
    assert_bitwise_equal(packed, want[0], "nf4 packed")
    assert_bitwise_equal(absmax, want[1], "nf4 absmax")
    out = ck.dequantize_nf4(packed, absmax, cols, blocksize=128, out_dtype=dtype)
    assert_same_values(out, ref.dequantize_nf4(*want, cols, 128, dtype), "nf4 out")

    xd = to_device(x, dtype)
    packed, scales = ck.quantize_mxfp4(xd)
    assert isinstance(packed, ck.DeviceArray) and isinstance(scales, ck.DeviceArray)
    want = ref.quantize_mxfp4(x, dtype)
    assert_bitwise_equal(to_host(packed), want[0], "mxfp4 packed")
    assert_bitwise_equal(to_host(scales), want[1], "mxfp4 scales")
    out = ck.dequantize_mxfp4(packed, scales, cols, out_dtype=dtype)
    assert isinstance(out, ck.DeviceArray)
    assert_same_values(to_host(out), ref.dequantize_mxfp4(*want, cols, dtype), "mxfp4 out")

    packed, scales, g = ck.quantize_nvfp4(x, dtype=dtype_arg(dtype))
    want = ref.quantize_nvfp4(x, dtype)
    for got, expected, what in zip((packed, scales, g), want, ("packed", "scales", "g")):
        assert_bitwise_equal(got, expected, f"nvfp4 {what}")
    packed, scales, g = ck.quantize_nvfp4(x, global_scale=0.5, dtype=dtype_arg(dtype))
    want = ref.quantize_nvfp4(x, dtype, np.array([0.5], np.float32))
    for got, expected, what in zip((packed, scales, g), want, ("packed", "scales", "g")):
        assert_bitwise_equal(got, expected, f"nvfp4 given {what}")
    out = ck.dequantize_nvfp4(packed, scales, g, cols, out_dtype=dtype)
    assert_same_values(out, ref.dequantize_nvfp4(*want, cols, dtype), "nvfp4 out")


def test_wrapper_one_dimensional(seed):
    """A 1-D tensor is one row (bitsandbytes blocks a flattened tensor so): 1-D results."""
    rng = np.random.default_rng(seed)
    x = ref.random_input(rng, (1, 1001), "fp32")[0]
    packed, absmax = ck.quantize_nf4(x)
    want = ref.quantize_nf4(x[None], "fp32")
    assert packed.shape == (501,) and absmax.shape == (16,)
    assert_bitwise_equal(packed, want[0][0], "packed")
    out = ck.dequantize_nf4(packed, absmax, 1001)
    assert out.shape == (1001,)
    assert_same_values(out, ref.dequantize_nf4(*want, 1001, 64, "fp32")[0], "out")
