"""GPU tests of ck_gemm_fp8_scaled (FP8 E4M3 x E4M3, float32 sums, the scaled epilogue of
ck_gemm_int8_scaled) against tests/reference.py (gemm_fp8: the exact sums, in float64).

- Every kernel variant (CK_GEMM_FP8_KERNEL=reference, small_m, wgmma, auto) on shapes with
  partial tiles in M, N and K, every output dtype, scale granularity, bias and activation, on
  fresh random E4M3 operands; outputs poisoned before the launch and between guard regions.
- The accumulation bound (below) is checked element by element, on random data and on K = 8192
  of same-signed products, where sums that kept the tensor cores' few bits over the whole of K
  (no float32 accumulators) would miss it by an order of magnitude.
- NaN operands make NaN sums in their rows and columns only; graph capture and replay.

The tests skip without a CUDA device and on GPUs without FP8 tensor cores (before 8.9), where
the entry point answers CK_STATUS_UNSUPPORTED (tests/test_abi.py and test_fuzz_abi.py check the
argument rules on any machine).
"""

import numpy as np
import pytest

import cuda_wrapper as ck
import reference as ref
from gpu_support import (
    CK_ACTIVATION, CK_DTYPE, CK_GRANULARITY, GuardedBuffer, KernelCall, POISON, SANITIZE,
    SECOND_ORDER_SLACK, U32, assert_graph_replays, assert_relu_output, assert_within,
    compute_capability, force_variant, output_tolerance, ptr_or_null, random_normal,
    refill_scaled_gemm, scale_count, shape_id, synchronize,
)

pytestmark = pytest.mark.gpu

KERNEL_ENV = "CK_GEMM_FP8_KERNEL"
# The granularities of ck_gemm_fp8_scaled's scales (the block ones come as a pair).
FP8_GRANULARITY = dict(CK_GRANULARITY, block1x128=ck.PER_BLOCK_1X128,
                       block128x128=ck.PER_BLOCK_128X128)
BLOCK_GRANULARITIES = ("block1x128", "block128x128")
VARIANTS = ("auto", "reference", "small_m", "wgmma")
SMALL_M_MAX = 16

# ---------------------------------------------------------------------------------------------
# The accumulation bound. Every E4M3 product is exact in float32. The reference kernel adds them
# one at a time in float32: within gamma_K sum_k |a_k b_k| of the exact sum (Higham, Thm. 3.1).
# The tensor-core kernels take sums of at most 256 products on the tensor cores, which add each
# instruction's 32 products into their accumulators with fewer bits than float32, then add those
# sums into float32 accumulators: within TENSOR_CORE_REL sum |a_k b_k| + gamma_{K/32} sum
# |a_k b_k|. Measured on the H100 (benchmarks/NOTES.md): the wgmma kernel's sums of 128 products
# are off by up to 2^-10.0 of sum |a b| on same-signed operands (2^-14 on signed ones), the
# errors of cuBLASLt's default FP8 GEMM on the same data; the mma.sync stream by 2^-22. Sums
# kept on the tensor cores over all of K (cuBLASLt's fast accumulation) were off by 2^-5.8 at
# K = 1024 and 2^-2.9 at K = 8192 of same-signed products: far past TENSOR_CORE_REL = 2^-9.
# ---------------------------------------------------------------------------------------------
TENSOR_CORE_REL = 2.0**-9


def accumulation_error(variant, abs_sums, k):
    gamma = k * U32 / (1 - k * U32)
    if variant == "reference":
        return gamma * abs_sums
    return (TENSOR_CORE_REL + gamma) * abs_sums


def use_variant(monkeypatch, variant, m):
    """Forces the variant (auto: the library's choice), skipping below FP8 tensor cores."""
    cc = compute_capability()
    if cc < (8, 9):
        pytest.skip(f"FP8 GEMMs need compute capability 8.9+ (this GPU: {cc})")
    if variant == "small_m":
        assert m <= SMALL_M_MAX, "small_m serves m <= 16"
    force_variant(monkeypatch, KERNEL_ENV, variant)


def random_e4m3(rng, shape, scale=1.0, positive=False):
    """E4M3 codes of scale * N(0, 1) values (or their magnitudes), rounded to nearest even: a
    spread of exponents and mantissas, no NaN."""
    x = rng.standard_normal(shape) * scale
    return ref.e4m3_encode(np.abs(x) if positive else x)


def random_fp8_scales(rng, count, k):
    """Positive float32 scales that bring |acc| (~ sqrt(K) for N(0, 1) operands) near 1."""
    return ((1.0 / k**0.25) * 10.0 ** rng.uniform(-1, 0.5, count)).astype(np.float32)


class GemmFp8Call(KernelCall):
    """ck_gemm_fp8_scaled on guarded buffers; misalign: extra bytes before a, b and out."""

    def __init__(self, variant, a, b, scale_a, scale_b, bias, activation, out_dtype,
                 granularities, misalign=(0, 0, 0)):
        self.variant, self.activation, self.out_dtype = variant, activation, out_dtype
        self.granularities = granularities
        m, k = a.shape
        n = b.shape[0]
        self.mnk = (m, n, k)
        self.inputs = (a, b, scale_a, scale_b, bias)
        self.a = GuardedBuffer.input(a, misalign[0])
        self.b = GuardedBuffer.input(b, misalign[1])
        self.scale_a = GuardedBuffer.input(scale_a)
        self.scale_b = GuardedBuffer.input(scale_b)
        self.bias = None if bias is None else GuardedBuffer.input(bias)
        self.out = GuardedBuffer.output((m, n), ref.NUMPY_DTYPE[out_dtype], POISON, misalign[2])
        self.outputs = {"out": self.out}

    def launch(self, stream=0):
        ck.raw.gemm_fp8_scaled(
            self.a.ptr, self.b.ptr, *self.mnk, self.scale_a.ptr,
            FP8_GRANULARITY[self.granularities[0]], self.scale_b.ptr,
            FP8_GRANULARITY[self.granularities[1]], ptr_or_null(self.bias),
            CK_ACTIVATION[self.activation], self.out.ptr, CK_DTYPE[self.out_dtype], stream)

    def refill(self, rng):
        refill_scaled_gemm(self, rng, random_e4m3, random_fp8_scales)

    def check(self, ctx):
        synchronize()
        a, b, scale_a, scale_b, bias = self.inputs
        k = self.mnk[2]
        acc = ref.gemm_fp8(a, b)
        abs_sums = ref.gemm_fp8_abs_sums(a, b)
        scales = ref.scaled_epilogue_f64(np.ones_like(acc), scale_a, scale_b)  # |sa sb|
        pre = ref.scaled_epilogue_f64(acc, scale_a, scale_b, bias, "none", self.out_dtype)
        value = ref.activate(pre, self.activation)
        product = acc * scales
        # The sums' error scaled by the epilogue, then the epilogue's own float32 roundings
        # (those of ck_gemm_int8_scaled: three on the product, one on the sum).
        error32 = (accumulation_error(self.variant, abs_sums, k) * scales
                   + (3 * np.abs(product) + np.abs(pre)) * U32) * SECOND_ORDER_SLACK
        out = self.out.read(f"out, {ctx}")
        got = ref.to_f32(out, self.out_dtype).astype(np.float64)
        assert_within(got, value, output_tolerance(value, error32, self.out_dtype),
                      f"out ({self.out_dtype}), {ctx}")
        if self.activation == "relu":
            assert_relu_output(got, pre, error32, f"out, {ctx}")
        return got


def make_call(rng, variant, shape, out_dtype="fp16", granularities=("row", "row"), bias=True,
              activation="relu", misalign=(0, 0, 0)):
    m, n, k = shape
    a, b = random_e4m3(rng, (m, k)), random_e4m3(rng, (n, k))
    scale_a = random_fp8_scales(rng, scale_count(granularities[0], m), k)
    scale_b = random_fp8_scales(rng, scale_count(granularities[1], n), k)
    bias_values = random_normal(rng, n, out_dtype, 2.0) if bias else None
    return GemmFp8Call(variant, a, b, scale_a, scale_b, bias_values, activation, out_dtype,
                       granularities, misalign)


# (M, N, K): partial tiles in every dimension (the kernels' tiles: 16 or 64/128 rows, 16 to 128
# columns, K steps of 64 or 128 bytes), K down to one 16-byte vector.
SMALL_SHAPES = [(1, 1, 16), (1, 200, 1008), (2, 24, 48), (7, 129, 144), (16, 136, 4096),
                (13, 8, 80)]
LARGE_SHAPES = [(17, 129, 48), (64, 256, 1008), (100, 200, 4096), (129, 1000, 144),
                (255, 136, 80), (1000, 24, 1040)]


def variant_shapes(scales, shapes):
    """(scales, variant, shape) params: every variant on every shape it serves."""
    for variant in VARIANTS:
        for shape in shapes:
            if variant != "small_m" or shape[0] <= SMALL_M_MAX:
                yield pytest.param(scales, variant, shape,
                                   id=f"{scales}-{variant}-{shape_id(shape)}")


# Block scales: see make_block_call below.
BLOCK_SHAPES = [(1, 200, 1008), (5, 136, 4096), (16, 300, 80), (100, 264, 1040),
                (130, 136, 8192), (300, 520, 272)]


@pytest.mark.parametrize("scales, variant, shape",
                         list(variant_shapes("rows", SMALL_SHAPES + LARGE_SHAPES))
                         + list(variant_shapes("blocks", BLOCK_SHAPES)))
def test_gemm_fp8_shapes(scales, variant, shape, monkeypatch, seed):
    use_variant(monkeypatch, variant, shape[0])
    make = make_block_call if scales == "blocks" else make_call
    call = make(np.random.default_rng(seed), variant, shape)
    call.launch()
    call.check(f"{variant}, {scales}, seed={seed}")


@pytest.mark.parametrize("full", [False, True], ids=["tensor-plain", "row-bias-relu"])
@pytest.mark.parametrize("out_dtype", ref.DTYPES)
@pytest.mark.parametrize("variant", VARIANTS)
def test_gemm_fp8_epilogues(variant, out_dtype, full, monkeypatch, seed):
    m, n, k = (13, 200, 1008) if variant == "small_m" else (100, 200, 1008)
    use_variant(monkeypatch, variant, m)
    granularities = ("row", "row") if full else ("tensor", "tensor")
    call = make_call(np.random.default_rng(seed), variant, (m, n, k), out_dtype, granularities,
                     bias=full, activation="relu" if full else "none")
    call.launch()
    call.check(f"{variant}, {out_dtype}, seed={seed}")


@pytest.mark.parametrize("variant", VARIANTS)
def test_gemm_fp8_long_same_signed_sums(variant, monkeypatch, seed):
    """K = 8192 of positive products, sums ~K: float32 accumulators must carry them (the
    tensor cores' own sums, kept over the whole of K, would drift far past the bound)."""
    rng = np.random.default_rng(seed)
    m, n, k = (16, 136, 8192) if variant == "small_m" or SANITIZE else (130, 264, 8192)
    use_variant(monkeypatch, variant, m)
    a = random_e4m3(rng, (m, k), positive=True)
    b = random_e4m3(rng, (n, k), positive=True)
    ones_a, ones_b = np.ones(1, np.float32), np.ones(1, np.float32)
    call = GemmFp8Call(variant, a, b, ones_a, ones_b, None, "none", "fp32",
                       ("tensor", "tensor"))
    call.launch()
    got = call.check(f"{variant}, seed={seed}")
    assert got.min() > 0.5 * k * (2 / np.pi), f"sums of |N(0,1)|^2 products ~0.64 K, seed={seed}"


@pytest.mark.parametrize("variant", VARIANTS)
def test_gemm_fp8_minimally_aligned_pointers(variant, monkeypatch, seed):
    """a and b 16-byte aligned only, out 4-byte aligned with an even N."""
    m, n, k = (9, 136, 1008) if variant == "small_m" else (100, 136, 1008)
    use_variant(monkeypatch, variant, m)
    call = make_call(np.random.default_rng(seed), variant, (m, n, k), "fp32",
                     misalign=(16, 48, 4))
    call.launch()
    call.check(f"{variant}, seed={seed}")


@pytest.mark.parametrize("variant", VARIANTS)
def test_gemm_fp8_nan_codes_stay_in_their_rows_and_columns(variant, monkeypatch, seed):
    """0x7F / 0xFF (E4M3 NaN) in a[i, :] makes row i NaN, in b[j, :] column j; the rest is
    finite and within the bound."""
    rng = np.random.default_rng(seed)
    m, n, k = (5, 136, 272) if variant == "small_m" else (70, 136, 272)
    use_variant(monkeypatch, variant, m)
    a, b = random_e4m3(rng, (m, k)), random_e4m3(rng, (n, k))
    a[3, 17], b[100, 200] = 0x7F, 0xFF
    scale_a, scale_b = random_fp8_scales(rng, m, k), random_fp8_scales(rng, n, k)
    call = GemmFp8Call(variant, a, b, scale_a, scale_b, None, "none", "fp32", ("row", "row"))
    call.launch()
    synchronize()
    got = call.out.read(f"out, {variant}")
    nan = np.zeros((m, n), bool)
    nan[3, :], nan[:, 100] = True, True
    assert np.isnan(got[nan]).all(), f"row 3 and column 100 must be NaN, seed={seed}"
    clean = ~nan
    a_clean, b_clean = a.copy(), b.copy()
    a_clean[3, 17], b_clean[100, 200] = 0, 0
    value = ref.scaled_epilogue_f64(ref.gemm_fp8(a_clean, b_clean), scale_a, scale_b)
    scales = ref.scaled_epilogue_f64(np.ones((m, n)), scale_a, scale_b)
    tol = (accumulation_error(variant, ref.gemm_fp8_abs_sums(a_clean, b_clean), k) * scales
           + 4 * np.abs(value) * U32) * SECOND_ORDER_SLACK + 2.0**-149
    assert_within(got[clean], value[clean], tol[clean], f"finite outputs, {variant}")


# ---------------------------------------------------------------------------------------------
# Block scales (DeepSeek-V3's scheme): scale_a [M, ceil(K / 128)], scale_b [ceil(N / 128),
# ceil(K / 128)]. Each k-block's sums (within the bound above, on their own abs sums) are scaled,
# one more rounding each (the scale product, the fma): 3 u of sum_kb |scale| sum |a b|.
# ---------------------------------------------------------------------------------------------
class GemmFp8BlockCall(GemmFp8Call):
    """ck_gemm_fp8_scaled with block scales."""

    def __init__(self, variant, a, b, scale_a, scale_b, bias, activation, out_dtype):
        (m, k), n = a.shape, b.shape[0]
        assert scale_a.shape == ref.fp8_scale_shape(m, k, BLOCK_GRANULARITIES[0])
        assert scale_b.shape == ref.fp8_scale_shape(n, k, BLOCK_GRANULARITIES[1])
        super().__init__(variant, a, b, scale_a, scale_b, bias, activation, out_dtype,
                         BLOCK_GRANULARITIES)

    def refill(self, rng):
        refill_scaled_gemm(self, rng, random_e4m3, random_block_scales)

    def check(self, ctx):
        synchronize()
        a, b, scale_a, scale_b, bias = self.inputs
        k = self.mnk[2]
        pre = ref.gemm_fp8_block_scaled_f64(a, b, scale_a, scale_b, bias, "none", self.out_dtype)
        value = ref.activate(pre, self.activation)
        abs_sums = ref.gemm_fp8_block_abs_sums(a, b, scale_a, scale_b)
        error32 = (accumulation_error(self.variant, abs_sums, k) + 3 * U32 * abs_sums
                   + U32 * np.abs(pre)) * SECOND_ORDER_SLACK
        got = ref.to_f32(self.out.read(f"out, {ctx}"), self.out_dtype).astype(np.float64)
        assert_within(got, value, output_tolerance(value, error32, self.out_dtype),
                      f"out ({self.out_dtype}), block scales, {ctx}")
        return got


def random_block_scales(rng, rows, k):
    """Block scales of `rows` block rows over K, spread over a factor of 100: a scale that did
    not apply, or applied to the wrong k-block, shows."""
    return (10.0 ** rng.uniform(-2, 0, (rows, -(-k // ref.FP8_BLOCK)))).astype(np.float32)


def make_block_call(rng, variant, shape, out_dtype="bf16", bias=True, activation="none"):
    """Scales in the shapes ck.quantize_fp8 gives them: [M, ceil(K / 128)] and
    [ceil(N / 128), ceil(K / 128)]."""
    m, n, k = shape
    a, b = random_e4m3(rng, (m, k)), random_e4m3(rng, (n, k))
    scales = random_block_scales(rng, m, k), random_block_scales(rng, -(-n // ref.FP8_BLOCK), k)
    bias_values = random_normal(rng, n, out_dtype, 2.0) if bias else None
    return GemmFp8BlockCall(variant, a, b, *scales, bias_values, activation, out_dtype)


@pytest.mark.parametrize("out_dtype", ref.DTYPES)
@pytest.mark.parametrize("variant", VARIANTS)
def test_gemm_fp8_block_scales_epilogue(variant, out_dtype, monkeypatch, seed):
    m, n, k = (9, 200, 528) if variant == "small_m" else (70, 200, 528)
    use_variant(monkeypatch, variant, m)
    call = make_block_call(np.random.default_rng(seed), variant, (m, n, k), out_dtype, True,
                           "relu")
    call.launch()
    call.check(f"{variant}, {out_dtype}, seed={seed}")


def test_gemm_fp8_block_scales_wrapper_from_quantize_fp8(seed):
    """ck.quantize_fp8 (block1x128 activations, block128x128 weights) into ck.gemm_fp8_scaled:
    the product of the dequantized operands."""
    if compute_capability() < (8, 9):
        pytest.skip("FP8 GEMMs need compute capability 8.9+")
    rng = np.random.default_rng(seed)
    m, n, k = 24, 264, 400
    x = rng.standard_normal((m, k)).astype(np.float32) * 3
    w = rng.standard_normal((n, k)).astype(np.float32) * 0.05
    qx, sx = ck.quantize_fp8(x, granularity="block1x128")
    qw, sw = ck.quantize_fp8(w, granularity="block128x128")
    got = ck.gemm_fp8_scaled(qx, qw, sx, sw, out_dtype="fp32").astype(np.float64)
    value = ref.gemm_fp8_block_scaled_f64(qx, qw, sx, sw)
    abs_sums = ref.gemm_fp8_block_abs_sums(qx, qw, sx, sw)
    tol = (accumulation_error("auto", abs_sums, k) + 4 * U32 * abs_sums) * SECOND_ORDER_SLACK
    assert_within(got, value, tol, f"block-scaled wrapper, seed={seed}")
    xq = ref.dequantize_fp8(qx, sx, "e4m3", "block1x128", "fp32").astype(np.float64)
    wq = ref.dequantize_fp8(qw, sw, "e4m3", "block128x128", "fp32").astype(np.float64)
    assert np.allclose(value, xq @ wq.T, rtol=1e-5, atol=1e-5 * np.abs(xq) @ np.abs(wq).T), \
        "the block-scaled product is the product of the dequantized operands"
    with pytest.raises(ValueError):
        ck.gemm_fp8_scaled(qx, qw, sx[:, :-1], sw)


def test_gemm_fp8_graph_replays(monkeypatch, seed):
    rng = np.random.default_rng(seed)
    use_variant(monkeypatch, "auto", 64)
    call = make_call(rng, "auto", (64, 200, 1008))
    assert_graph_replays(call, rng, seed)


def test_gemm_fp8_wrapper_numpy(seed):
    """ck.gemm_fp8_scaled on NumPy arrays: the same values as the raw call's bound allows."""
    if compute_capability() < (8, 9):
        pytest.skip("FP8 GEMMs need compute capability 8.9+")
    rng = np.random.default_rng(seed)
    m, n, k = 33, 72, 528
    a, b = random_e4m3(rng, (m, k)), random_e4m3(rng, (n, k))
    scale_a, scale_b = random_fp8_scales(rng, m, k), random_fp8_scales(rng, n, k)
    got = ck.gemm_fp8_scaled(a, b, scale_a, scale_b, out_dtype="fp32")
    value = ref.gemm_fp8_scaled_f64(a, b, scale_a, scale_b)
    scales = ref.scaled_epilogue_f64(np.ones((m, n)), scale_a, scale_b)
    tol = (accumulation_error("auto", ref.gemm_fp8_abs_sums(a, b), k) * scales
           + 4 * np.abs(value) * U32) * SECOND_ORDER_SLACK
    assert got.dtype == np.float32 and got.shape == (m, n)
    assert_within(got.astype(np.float64), value, tol, f"wrapper, seed={seed}")
    with pytest.raises((TypeError, ValueError)):
        ck.gemm_fp8_scaled(a.astype(np.int8), b, scale_a, scale_b)


# ---------------------------------------------------------------------------------------------
# Fp8Linear: the layer (the weight quantized once, each call's activations on the device)
# ---------------------------------------------------------------------------------------------
def fp8_linear_reference(x16, w16, bias16, blocks):
    """The layer's values in float64 from the quantizers' references (dynamic scales, per row
    and output channel, or 1 x 128 and 128 x 128 blocks), and their accumulation bound."""
    qx, sx = ref.quantize_fp8(x16, "fp16", "e4m3", "block1x128" if blocks else "row")
    qw, sw = ref.quantize_fp8(w16, "fp16", "e4m3", "block128x128" if blocks else "row")
    k = x16.shape[1]
    if blocks:
        pre = ref.gemm_fp8_block_scaled_f64(qx, qw, sx, sw, bias16, "none", "fp16")
        abs_sums = ref.gemm_fp8_block_abs_sums(qx, qw, sx, sw)
    else:
        pre = ref.scaled_epilogue_f64(ref.gemm_fp8(qx, qw), sx, sw, bias16, "none", "fp16")
        abs_sums = ref.gemm_fp8_abs_sums(qx, qw) * ref.scaled_epilogue_f64(
            np.ones((x16.shape[0], w16.shape[0])), sx, sw)
    error32 = (accumulation_error("auto", abs_sums, k) + 3 * U32 * abs_sums
               + 4 * U32 * np.abs(pre)) * SECOND_ORDER_SLACK
    return pre, error32


@pytest.mark.parametrize("m", [1, 37])
@pytest.mark.parametrize("blocks", [False, True], ids=["rows", "blocks"])
def test_fp8_linear_numpy(blocks, m, seed):
    if compute_capability() < (8, 9):
        pytest.skip("FP8 GEMMs need compute capability 8.9+")
    rng = np.random.default_rng(seed)
    k, n = 400, 264
    w16 = (rng.standard_normal((n, k)) * 0.05).astype(np.float16)
    x16 = rng.standard_normal((m, k)).astype(np.float16)
    bias16 = rng.standard_normal(n).astype(np.float16)
    layer = ck.Fp8Linear.from_float(w16, bias=bias16, activation="relu", blocks=blocks)
    got = layer(x16)
    assert got.dtype == np.float16 and got.shape == (m, n)
    pre, error32 = fp8_linear_reference(x16, w16, bias16, blocks)
    value = np.maximum(pre, 0)
    assert_within(got.astype(np.float64), value, output_tolerance(value, error32, "fp16"),
                  f"Fp8Linear, seed={seed}")
    # The FP8 layer is the fp16 one up to E4M3's rounding (3 mantissa bits, about 2^-4 of
    # each value): far closer than that bound on the whole.
    exact = np.maximum(x16.astype(np.float64) @ w16.astype(np.float64).T + bias16, 0)
    rel = np.linalg.norm(got.astype(np.float64) - exact) / np.linalg.norm(exact)
    assert rel < 0.06, f"relative error {rel:.3g} against the fp16 layer, seed={seed}"
    one = layer(x16[0])   # a single token, 1-D
    assert one.shape == (n,)
    assert_within(one.astype(np.float64), value[0],
                  output_tolerance(value[0], error32[0], "fp16"), f"1-D, seed={seed}")


@pytest.mark.parametrize("blocks", [False, True], ids=["rows", "blocks"])
def test_fp8_linear_torch(blocks, seed):
    """torch tensors in, torch tensors out, on the device: the NumPy call's values."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available() or compute_capability() < (8, 9):
        pytest.skip("needs torch on a GPU with FP8 tensor cores")
    rng = np.random.default_rng(seed)
    m, k, n = 20, 528, 136
    w16 = (rng.standard_normal((n, k)) * 0.05).astype(np.float16)
    x16 = rng.standard_normal((m, k)).astype(np.float16)
    layer = ck.Fp8Linear.from_float(torch.from_numpy(w16).cuda(), blocks=blocks)
    assert isinstance(layer.weight, torch.Tensor) and layer.weight.is_cuda
    y = layer(torch.from_numpy(x16).cuda())
    assert isinstance(y, torch.Tensor) and y.is_cuda and y.dtype == torch.float16
    torch.cuda.synchronize()
    pre, error32 = fp8_linear_reference(x16, w16, None, blocks)
    assert_within(y.cpu().numpy().astype(np.float64), pre,
                  output_tolerance(pre, error32, "fp16"), f"torch, seed={seed}")
