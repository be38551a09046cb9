"""GPU tests of the weight-only GEMM on block 4-bit weights (ck_block4_prepack,
ck_gemm_block4_prepacked) against tests/reference.py.

- Weights: the reference quantizers' output (ref.quantize_nf4 / quantize_mxfp4 / quantize_nvfp4)
  of random float weights, or raw random codes with random scales over a wide range (NF4 absmax
  log-uniform, MXFP4 E8M0 2^-17 .. 2^8 so that fp16 w' reach its subnormals, NVFP4 every finite
  E4M3 byte and a random global scale).
- The prepack runs on the device into poisoned, guarded buffers; its two outputs must be
  bitwise ref.block4_prepack (padding included).
- The output is compared with the float64 reference ref.gemm_block4_f64 (x times w', the weight
  as ck_dequantize_<format> writes it in dtype) under the tolerance of float32 accumulation plus
  half an ulp of the output dtype (test_w4a16_gpu.py derives it); ||err|| / ||ref|| is printed.
- format (NF4 32/64/128, MXFP4, NVFP4) x dtype (fp16, bf16) x variant (CK_GEMM_BLOCK4_KERNEL =
  small_m for M <= 16, wgmma on compute capability 9.0, reference, auto) x shapes: odd M, M on
  both sides of 16, N not a multiple of the 8-row tile nor of the reference's 64, K at
  block-size multiples (32 .. 4096), bias or not, ReLU or not; the Llama-3-8B QKV and 70B
  shapes at M = 1 and 16, and the 8B shape at M = 300 (auto: wgmma on Hopper).
- The wgmma kernel's block rows (64, 128, 256) and K splits (1 ... 8 blocks per output tile),
  forced, in every format; a split call gives the same bits twice; auto takes it past 16 rows.
- w' bit for bit: one-hot rows of x select weight columns, which the GEMM returns exactly (a
  single non-zero product), and they equal ck_dequantize_<format>'s output on the device.
- The small-M and wgmma kernels' fast and fallback dequantization, every w' bit for bit: MXFP4
  (scales up to 2 and past it, alone and mixed in one call) and NVFP4 (global scales on either
  side of its per-tensor bound; in fp16 past it, the +-inf outputs as the reference's).
- Where the formats coincide (an MXFP4 weight with codes of magnitude <= 3 is a symmetric INT4
  g32 weight with q = 2 value and scale 2^(e - 1)), ck_gemm_block4_prepacked and
  ck_gemm_w4a16_prepacked give the same bits at M <= 16 (the same streaming kernel and plan)
  and past it on Hopper (the same wgmma kernel and plan).
- Non-finite w': a NaN scale and (fp16) an MXFP4 scale past fp16's range give NaN / +-inf
  outputs exactly where the reference has them.
- CUDA graph capture and replay; the override read on every call; small_m refusing M > 16; the
  wrapper's block4_prepack / gemm_block4_prepacked against the raw calls.

The tests skip without a CUDA device. CK_SANITIZE=1 drops the largest shapes. Each test draws a
seed, prints it and names it in its messages; CK_TEST_SEED=<seed> replays it.
"""

import math

import numpy as np
import pytest

import cuda_wrapper as ck
import reference as ref
from gpu_support import (
    CK_ACTIVATION, CK_DTYPE, GuardedBuffer, KernelCall, POISON, U32, assert_bitwise_equal,
    assert_forced_variant_unsupported, assert_graph_replays, assert_meets_reference,
    assert_override_read_on_every_call, assert_relu_output, assert_within, compute_capability,
    dot_float32_error, dtype_arg, force_variant, output_tolerance, ptr_or_null, random_normal,
    shape_id, small_enough, synchronize, to_host, write_buffers,
)

pytestmark = pytest.mark.gpu

KERNEL_ENV = "CK_GEMM_BLOCK4_KERNEL"
VARIANTS = ("small_m", "wgmma", "reference", "auto")
SMALL_M_MAX = 16
CK_FORMAT = {"nf4": ck.BLOCK4_NF4, "mxfp4": ck.BLOCK4_MXFP4, "nvfp4": ck.BLOCK4_NVFP4}
FORMAT_BLOCKS = [("nf4", 32), ("nf4", 64), ("nf4", 128), ("mxfp4", 32), ("nvfp4", 16)]


def fb_id(fmt, blocksize):
    return f"{fmt}-b{blocksize}"


# ---------------------------------------------------------------------------------------------
# Tolerance (the argument of test_w4a16_gpu.py): x and w' are fp16/bf16 values, so every product
# is exact in float32; the float32 sum of K of them, in any order and on tensor cores that may
# truncate (unit roundoff 2u), is within gamma_{K+1} sum |x w'| of the exact sum, plus one
# rounding for the bias; the output rounding adds half an ulp of the dtype.
# ---------------------------------------------------------------------------------------------
TENSOR_CORE_ROUNDOFF = 2 * U32


# ---------------------------------------------------------------------------------------------
# Weights
# ---------------------------------------------------------------------------------------------
E4M3_NAN_BYTES = (0x7F, 0xFF)


def random_weight(rng, fmt, blocksize, n, k, dtype, source):
    """(packed, scales, global_scale or None) of an [N, K] weight in the format's native storage,
    its dequantized values ~ N(0, 1/K) for 'quantized' (outputs ~ N(0, 1)).

    'quantized': the reference quantizer of ref.random_input (rows of very different magnitudes,
    all-positive and all-negative rows, outlier columns), from `dtype` data.
    'codes': uniformly random code bytes and random scales (see the module doc)."""
    if source == "quantized":
        w = ref.random_input(rng, (n, k), dtype, scale=1.0 / math.sqrt(k))
        return ref.quantize_block4(fmt, w, dtype, blocksize)
    packed = rng.integers(0, 256, size=(n, k // 2), dtype=np.uint8)
    blocks = k // blocksize
    if fmt == "nf4":
        absmax = (10.0 ** rng.uniform(-1, 1, (n, blocks)) / (0.5 * math.sqrt(k)))
        return packed, absmax.astype(np.float32), None
    if fmt == "mxfp4":
        e = rng.integers(-17, 9, size=(n, blocks)) - int(round(math.log2(math.sqrt(k))))
        return packed, (e + ref.E8M0_BIAS).astype(np.uint8), None
    scales = rng.integers(0, 256, size=(n, blocks), dtype=np.uint8)
    scales[np.isin(scales, E4M3_NAN_BYTES)] = 0x38   # 1.0: every finite byte, no NaN
    g = np.array([448.0 * 6 * math.sqrt(k) * 10.0 ** rng.uniform(-0.5, 0.5)], np.float32)
    return packed, scales, g


class Block4Call(KernelCall):
    """One ck_gemm_block4_prepacked call on a weight that ck_block4_prepack converted on the
    device (from guarded copies of the native storage into poisoned buffers)."""

    def __init__(self, x, weight, fmt, blocksize, bias, activation, dtype):
        self.fmt, self.blocksize, self.activation, self.dtype = fmt, blocksize, activation, dtype
        packed, scales, g = weight
        m, k = x.shape
        n = packed.shape[0]
        self.mnk = (m, n, k)
        self.inputs = (x, packed, scales, g, bias)
        self.x = GuardedBuffer.input(x)
        self.packed = GuardedBuffer.input(packed)
        self.scales = GuardedBuffer.input(scales)
        self.g = None if g is None else GuardedBuffer.input(g)
        self.bias = None if bias is None else GuardedBuffer.input(bias)
        self.out = GuardedBuffer.output((m, n), ref.NUMPY_DTYPE[dtype], POISON)
        self.outputs = {"out": self.out}
        w_bytes, s_bytes = ref.block4_prepacked_sizes(fmt, n, k, blocksize)
        self.w_pre = GuardedBuffer.output((w_bytes,), np.uint8, POISON)
        self.s_pre = GuardedBuffer.output((s_bytes,), np.uint8, POISON)
        self.prepack()

    def prepack(self, stream=0):
        m, n, k = self.mnk
        ck.raw.block4_prepack(CK_FORMAT[self.fmt], self.packed.ptr, self.scales.ptr, n, k,
                              self.blocksize, self.w_pre.ptr, self.s_pre.ptr, stream)

    def check_prepack(self, ctx):
        """The device's prepacked bytes are the reference's, every byte."""
        synchronize()
        _, packed, scales, _, _ = self.inputs
        m, n, k = self.mnk
        w_want, s_want = ref.block4_prepack(self.fmt, packed, scales, n, k, self.blocksize)
        assert_bitwise_equal(self.w_pre.read(f"w_prepacked, {ctx}"), w_want, f"w_prepacked, {ctx}")
        assert_bitwise_equal(self.s_pre.read(f"scales_prepacked, {ctx}"), s_want,
                             f"scales_prepacked, {ctx}")

    def launch(self, stream=0):
        m, n, k = self.mnk
        ck.raw.gemm_block4_prepacked(
            self.x.ptr, CK_DTYPE[self.dtype], CK_FORMAT[self.fmt], self.w_pre.ptr, self.s_pre.ptr,
            ptr_or_null(self.g), self.blocksize, ptr_or_null(self.bias),
            CK_ACTIVATION[self.activation], m, n, k, self.out.ptr, stream)

    def refill(self, rng, source="codes"):
        m, n, k = self.mnk
        x = random_normal(rng, (m, k), self.dtype)
        packed, scales, g = random_weight(rng, self.fmt, self.blocksize, n, k, self.dtype, source)
        bias = None if self.bias is None else random_normal(rng, n, self.dtype)
        write_buffers((self.x, self.packed, self.scales, self.g, self.bias),
                      (x, packed, scales, g, bias))
        self.inputs = (x, packed, scales, g, bias)
        self.prepack()   # outside any graph: the captured launch reads the new weight

    def weight(self):
        _, packed, scales, g, _ = self.inputs
        return ref.dequantized_block4_weight(self.fmt, packed, scales, g, self.mnk[2],
                                             self.blocksize, self.dtype)

    def check(self, ctx):
        """Compares with the float64 reference; returns (output in float64, reference)."""
        synchronize()
        x, _, _, _, bias = self.inputs
        w_deq = self.weight()
        pre = ref.linear_f64(x, w_deq, bias, "none", self.dtype)
        value = ref.activate(pre, self.activation)
        error32 = dot_float32_error(ref.to_f32(x, self.dtype).astype(np.float64),
                                    ref.to_f32(w_deq, self.dtype).astype(np.float64), pre,
                                    TENSOR_CORE_ROUNDOFF)
        got = ref.to_f32(self.out.read(f"out, {ctx}"), self.dtype).astype(np.float64)
        assert_meets_reference(got, value, error32, self.dtype, ctx)
        if self.activation == "relu":
            assert_relu_output(got, pre, error32, f"out, {ctx}")
        return got, value


def make_call(rng, shape, fmt, blocksize, dtype, source="quantized", bias=True,
              activation="relu"):
    m, n, k = shape
    x = random_normal(rng, (m, k), dtype)
    weight = random_weight(rng, fmt, blocksize, n, k, dtype, source)
    bias_values = random_normal(rng, n, dtype) if bias else None
    return Block4Call(x, weight, fmt, blocksize, bias_values, activation, dtype)


def use_variant(monkeypatch, variant, m):
    assert variant != "small_m" or m <= SMALL_M_MAX, "small_m serves m <= 16"
    force_variant(monkeypatch, KERNEL_ENV, variant)


# ---------------------------------------------------------------------------------------------
# Every format, dtype and variant over shapes with partial tiles
# ---------------------------------------------------------------------------------------------
# (M, N, K): M on both sides of 16 and odd, N partial in the 8-row tiles and in the reference's
# 64-column tiles, K from one 32-k slice to 4096 (a shape's K is rounded up to the case's block:
# every K here is a multiple of 32; 96 and 160 are not multiples of 64 or 128).
SHAPES = [
    (1, 1, 32), (1, 1000, 4096), (1, 100, 160), (2, 7, 64), (3, 136, 384), (5, 9, 96),
    (7, 64, 1024), (8, 8, 128), (9, 1000, 256), (13, 7, 4096), (16, 4096, 96), (16, 9, 160),
    (17, 64, 1024), (17, 1, 32), (33, 100, 160), (65, 136, 384), (100, 1000, 1024),
    (129, 7, 128),
]
SOURCE_ROTATION = ("quantized", "codes")
BIAS_ROTATION = (True, True, False)
ACTIVATION_ROTATION = ("relu", "none")


def fit_k(k, blocksize):
    """K rounded up to a multiple of the block (and of 32)."""
    step = max(32, blocksize)
    return -(-k // step) * step


def main_cases():
    for i, (m, n, k) in enumerate(SHAPES):
        source = SOURCE_ROTATION[i % len(SOURCE_ROTATION)]
        bias = BIAS_ROTATION[i % len(BIAS_ROTATION)]
        activation = ACTIVATION_ROTATION[(i // 2) % len(ACTIVATION_ROTATION)]
        for fmt, blocksize in FORMAT_BLOCKS:
            shape = (m, n, fit_k(k, blocksize))
            if not small_enough(*shape):
                continue
            for variant in VARIANTS:
                if variant == "small_m" and m > SMALL_M_MAX:
                    continue
                for dtype in ref.BLOCK4_GEMM_DTYPES:
                    yield pytest.param(
                        variant, fmt, blocksize, dtype, shape, source, bias, activation,
                        id=f"{variant}-{fb_id(fmt, blocksize)}-{dtype}-{shape_id(shape)}-"
                           f"{source}-{'bias' if bias else 'nobias'}-{activation}")


@pytest.mark.parametrize("variant, fmt, blocksize, dtype, shape, source, bias, activation",
                         list(main_cases()))
def test_gemm_block4(variant, fmt, blocksize, dtype, shape, source, bias, activation,
                     monkeypatch, seed):
    use_variant(monkeypatch, variant, shape[0])
    rng = np.random.default_rng(seed)
    call = make_call(rng, shape, fmt, blocksize, dtype, source, bias, activation)
    call.check_prepack(f"seed={seed}")
    call.launch()
    call.check(f"{variant}, seed={seed}")


# The layer shapes of the benchmark rows: Llama-3-8B's QKV projection (K 4096, N 6144) and
# Llama-3-70B's (K 8192, N 10240), at decode M.
LAYER_SHAPES = [(1, 6144, 4096), (16, 6144, 4096), (1, 10240, 8192), (16, 10240, 8192),
                (300, 6144, 4096)]


@pytest.mark.parametrize("shape", LAYER_SHAPES, ids=shape_id)
@pytest.mark.parametrize("fmt, blocksize", FORMAT_BLOCKS[1:], ids=lambda v: str(v))
def test_gemm_block4_layer_shapes(fmt, blocksize, shape, seed):
    """The automatic choice (small_m at M <= 16, wgmma past it on Hopper) on the full layer
    shapes, fp16 and bf16."""
    if not small_enough(*shape):
        pytest.skip("CK_SANITIZE: a smaller shape suffices")
    rng = np.random.default_rng(seed)
    for dtype in ref.BLOCK4_GEMM_DTYPES:
        call = make_call(rng, shape, fmt, blocksize, dtype, "quantized", bias=False,
                         activation="none")
        call.launch()
        call.check(f"{dtype}, seed={seed}")


# ---------------------------------------------------------------------------------------------
# w' bit for bit
# ---------------------------------------------------------------------------------------------
def device_dequantize(fmt, packed, scales, g, k, blocksize, dtype):
    """ck_dequantize_<fmt> of the weight on the device (through the wrapper)."""
    out_dtype = CK_DTYPE[dtype]
    if fmt == "nf4":
        return to_host(ck.dequantize_nf4(packed, scales, k, blocksize, out_dtype=out_dtype))
    if fmt == "mxfp4":
        return to_host(ck.dequantize_mxfp4(packed, scales, k, out_dtype=out_dtype))
    return to_host(ck.dequantize_nvfp4(packed, scales, g, k, out_dtype=out_dtype))


@pytest.mark.parametrize("variant, m", [("small_m", 16), ("small_m", 5), ("reference", 37),
                                        ("wgmma", 37), ("wgmma", 130)])
@pytest.mark.parametrize("dtype", ref.BLOCK4_GEMM_DTYPES)
@pytest.mark.parametrize("fmt, blocksize", FORMAT_BLOCKS, ids=lambda v: str(v))
def test_dequantized_weight_is_bitwise_ck_dequantize(fmt, blocksize, dtype, variant, m,
                                                     monkeypatch, seed):
    """Row i of x is one-hot at column c_i: out[i, n] = w'[n, c_i] exactly (the other products
    are +-0; a w' of -0.0 comes out as +0.0). w' must be ck_dequantize_<fmt>'s bits, which the
    reference reproduces; random codes and scales over a wide range (fp16 subnormal w')."""
    use_variant(monkeypatch, variant, m)
    rng = np.random.default_rng(seed)
    n, k = 136, fit_k(512, blocksize)
    packed, scales, g = random_weight(rng, fmt, blocksize, n, k, dtype, "codes")
    w_ref = ref.dequantized_block4_weight(fmt, packed, scales, g, k, blocksize, dtype)
    assert_bitwise_equal(device_dequantize(fmt, packed, scales, g, k, blocksize, dtype), w_ref,
                         f"ck_dequantize_{fmt} ({dtype}), seed={seed}")
    cols = rng.choice(k, size=m, replace=m > k)
    x = np.zeros((m, k), np.float32)
    x[np.arange(m), cols] = 1
    call = Block4Call(ref.to_dtype(x, dtype), (packed, scales, g), fmt, blocksize, None, "none",
                      dtype)
    call.launch()
    synchronize()
    got = call.out.read(f"out, seed={seed}")
    want = ref.to_dtype(ref.to_f32(w_ref[:, cols].T, dtype) + np.float32(0), dtype)   # -0 -> +0
    assert_bitwise_equal(got, want, f"{variant} one-hot ({dtype}), seed={seed}")


# ---------------------------------------------------------------------------------------------
# The small-M and wgmma kernels' two dequantization paths (core/dequant.cuh: fast_word /
# fast_pair where every lane's blocks of a tile pair / a chunk allow it, word() / pair()
# otherwise), each bit for bit
# ---------------------------------------------------------------------------------------------
# MXFP4 takes its fast path for E8M0 <= 128 (scales up to 2). Random codes
# put almost every tile pair of the main tests on the fallback (their scales reach 2^4), so the
# scales here are drawn per regime: all blocks fast, all fallback, or both in one call, alternating by
# 16-row tile pair and 128-k chunk (each warp's steps then take both branches).
MXFP4_MAX_FAST_E8M0 = 128
MXFP4_MAX_FINITE_E8M0 = {"fp16": 140, "bf16": 252}   # 6 * 2^(s - 127) finite in dtype
PATH_REGIMES = ("fast", "fallback", "mixed")


def path_regime_weight(rng, n, k, dtype, regime):
    """(packed, E8M0 scales) of an MXFP4 weight with random codes and scales chosen for
    `regime`; w' finite."""
    packed = rng.integers(0, 256, size=(n, k // 2), dtype=np.uint8)
    blocks = k // 32
    fast = rng.integers(0, MXFP4_MAX_FAST_E8M0 + 1, size=(n, blocks))
    fast.flat[:4] = (0, 88, 89, MXFP4_MAX_FAST_E8M0)   # the ends of the fp16 cases
    slow = rng.integers(MXFP4_MAX_FAST_E8M0 + 1, MXFP4_MAX_FINITE_E8M0[dtype] + 1,
                        size=(n, blocks))
    per_chunk = 128 * blocks // k
    use_fast = {"fast": np.ones((n, blocks), bool), "fallback": np.zeros((n, blocks), bool),
                "mixed": (np.arange(n)[:, None] // 16 + np.arange(blocks)[None, :] // per_chunk)
                % 2 == 0}[regime]
    return packed, np.where(use_fast, fast, slow).astype(np.uint8)


def assert_one_hot_columns_bitwise(monkeypatch, rng, variant, rows, fmt, blocksize, weight,
                                   dtype, k, ctx):
    """Every w' of the weight (packed, scales, g), read through the small-M kernel (rows
    columns per call, M = rows; and M = 1 on a few columns) or the wgmma kernel (its vote is
    per warp and 128-k chunk) by one-hot x, equals the reference's bits."""
    packed, scales, g = weight
    w_ref = ref.dequantized_block4_weight(fmt, packed, scales, g, k, blocksize, dtype)
    assert np.isfinite(ref.to_f32(w_ref, dtype)).all()
    column_sets = [np.arange(c, c + rows) for c in range(0, k, rows)]
    column_sets += [np.array([c]) for c in rng.choice(k, size=4, replace=False)]
    for cols in column_sets:
        m = len(cols)
        use_variant(monkeypatch, variant, m)
        x = np.zeros((m, k), np.float32)
        x[np.arange(m), cols] = 1
        call = Block4Call(ref.to_dtype(x, dtype), weight, fmt, blocksize, None, "none", dtype)
        call.launch()
        synchronize()
        got = call.out.read(f"out, {ctx}")
        want = ref.to_dtype(ref.to_f32(w_ref[:, cols].T, dtype) + np.float32(0), dtype)  # -0 -> +0
        assert_bitwise_equal(got, want, f"{fmt} {variant} ({dtype}), columns {cols[0]}.., "
                                        f"m={m}, {ctx}")


@pytest.mark.parametrize("regime", PATH_REGIMES)
@pytest.mark.parametrize("dtype", ref.BLOCK4_GEMM_DTYPES)
@pytest.mark.parametrize("variant, rows", [("small_m", 16), ("wgmma", 64)])
def test_fast_and_fallback_paths_bitwise(variant, rows, dtype, regime, monkeypatch, seed):
    """MXFP4: every w' of each regime equals ck_dequantize_mxfp4's bits (the mixed regime takes
    both branches in one call)."""
    rng = np.random.default_rng(seed)
    n, k = 136, 256
    packed, scales = path_regime_weight(rng, n, k, dtype, regime)
    assert_one_hot_columns_bitwise(monkeypatch, rng, variant, rows, "mxfp4", 32,
                                   (packed, scales, None), dtype, k,
                                   f"{regime}, seed={seed}")


# NVFP4 takes its fast path for a whole tensor or not at all: where s * 2^14 is finite for
# every E4M3 byte (s = e4m3 / g), i.e. 448 / g * 2^14 < 2^128. g = 2^-104 is accepted (the
# products then reach 6 * 448 * 2^104 ~ 2^115.4, finite in bf16) and 2^-106 is not (448 * 2^120
# ~ 2^128.8); the typical g of random_weight (~2^12 .. 2^15) is far inside.
NVFP4_GLOBAL_SCALE = {"fast": 2.0 ** -104, "fallback": 2.0 ** -106}


@pytest.mark.parametrize("regime", ["fast", "fallback"])
@pytest.mark.parametrize("variant, rows", [("small_m", 16), ("wgmma", 64)])
def test_nvfp4_fast_and_fallback_paths_bitwise(variant, rows, regime, monkeypatch, seed):
    """NVFP4 at the global scales on either side of the fast path's bound, bf16 (whose range
    holds those w'): every w' equals ck_dequantize_nvfp4's bits, every E4M3 byte but NaN."""
    rng = np.random.default_rng(seed)
    n, k = 136, 256
    packed, scales, _ = random_weight(rng, "nvfp4", 16, n, k, "bf16", "codes")
    scales.flat[:2] = (0x7E, 0xFE)   # +-448, the bound's byte
    g = np.array([NVFP4_GLOBAL_SCALE[regime]], np.float32)
    assert_one_hot_columns_bitwise(monkeypatch, rng, variant, rows, "nvfp4", 16,
                                   (packed, scales, g), "bf16", k, f"{regime}, seed={seed}")


@pytest.mark.parametrize("variant, m", [("small_m", 3), ("small_m", 16), ("wgmma", 20)])
def test_nvfp4_fallback_fp16_infinities_follow_the_reference(variant, m, monkeypatch, seed):
    """NVFP4 past the fast path's bound in fp16: every non-zero code's w' is +-inf (the scales
    reach 448 * 2^106). x > 0; weight columns 0-23 have non-negative codes and scales (outputs
    +inf), 24-47 negative codes (-inf), the rest random (NaN where signs mix): every output
    non-finite exactly where and as the float64 reference has it."""
    use_variant(monkeypatch, variant, m)
    rng = np.random.default_rng(seed)
    n, k = 72, 256
    packed, scales, _ = random_weight(rng, "nvfp4", 16, n, k, "fp16", "codes")
    packed[:24] &= 0x77      # both nibbles' sign bits clear
    packed[24:48] |= 0x88    # both set
    scales[:48] &= 0x7F      # non-negative E4M3 (no NaN byte: random_weight has none)
    g = np.array([NVFP4_GLOBAL_SCALE["fallback"]], np.float32)
    x = ref.to_dtype(np.abs(ref.to_f32(random_normal(rng, (m, k), "fp16"), "fp16")) + 0.125,
                     "fp16")
    call = Block4Call(x, (packed, scales, g), "nvfp4", 16, None, "none", "fp16")
    call.launch()
    synchronize()
    got = ref.to_f32(call.out.read(f"out, seed={seed}"), "fp16").astype(np.float64)
    want = ref.gemm_block4_f64(x, "nvfp4", packed, scales, g, 16, k, "fp16")
    assert (want[:, :24] == np.inf).all() and (want[:, 24:48] == -np.inf).all(), f"seed={seed}"
    assert np.array_equal(np.isnan(got), np.isnan(want)), f"NaN pattern, seed={seed}"
    assert np.array_equal(got[~np.isnan(want)], want[~np.isnan(want)]), f"values, seed={seed}"


# ---------------------------------------------------------------------------------------------
# Where the formats coincide: MXFP4 with codes of magnitude <= 3 and symmetric INT4 g32
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("m", [1, 7, 16, 40, 300])
@pytest.mark.parametrize("dtype", ref.BLOCK4_GEMM_DTYPES)
def test_mxfp4_equals_int4_bitwise(dtype, m, seed):
    """E2M1 magnitudes 0 .. 3 (codes 0 .. 5) are q / 2 with q in {0, 1, 2, 3, 4, 6}: the MXFP4
    weight (codes, E8M0 e) and the symmetric INT4 g32 weight (+-q, scale 2^(e - 128) in dtype)
    have the same w' (both products exact), and both entry points run the same plan (the
    small-M kernel, or past 16 rows the one auto picks for both: wgmma on Hopper; elsewhere the
    block formats' reference kernel and INT4's tc, which need not agree): the same bits."""
    if m > SMALL_M_MAX and compute_capability() != (9, 0):
        pytest.skip("past 16 rows the two entry points share a kernel on Hopper only")
    rng = np.random.default_rng(seed)
    n, k = 1000, 2048
    mags = rng.integers(0, 6, size=(n, k))
    codes = mags | (rng.integers(0, 2, size=(n, k)) << 3) * (mags > 0)   # no -0 (INT4 has none)
    e = rng.integers(-10, -3, size=(n, k // 32))
    packed = ref.pack_fp4(codes.astype(np.uint8))
    scales = (e + ref.E8M0_BIAS).astype(np.uint8)
    q = (np.rint(ref.E2M1_VALUES[codes] * 2)).astype(np.int64)
    int4_packed = ref.pack_int4(q, signed=True)
    int4_scales = ref.to_dtype(np.ldexp(np.float32(1), e - 1).astype(np.float32), dtype)
    x = random_normal(rng, (m, k), dtype)
    bias = random_normal(rng, n, dtype)
    w4 = ref.dequantized_int4_weight(int4_packed, int4_scales, None, 32, k, dtype)
    mx = ref.dequantized_block4_weight("mxfp4", packed, scales, None, k, 32, dtype)
    assert_bitwise_equal(w4, mx, "the two weights' w'")
    got_mx = to_host(ck.gemm_block4_prepacked(
        x, "mxfp4", *ck.block4_prepack("mxfp4", packed, scales), n=n, bias=bias,
        activation="relu", dtype=dtype_arg(dtype)))
    got_w4 = to_host(ck.gemm_w4a16_prepacked(
        x, *ck.w4a16_prepack(int4_packed, int4_scales, None, 32, dtype=dtype_arg(dtype))[:2],
        n=n, group_size=32, bias=bias, activation="relu", dtype=dtype_arg(dtype)))
    assert_bitwise_equal(got_mx, got_w4, f"mxfp4 vs int4 ({dtype}, m={m}), seed={seed}")


# ---------------------------------------------------------------------------------------------
# Non-finite w'
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("variant, m", [("small_m", 3), ("reference", 20), ("wgmma", 20)])
@pytest.mark.parametrize("dtype", ref.BLOCK4_GEMM_DTYPES)
def test_non_finite_weights_follow_the_reference(dtype, variant, m, monkeypatch, seed):
    """MXFP4 rows with a NaN scale (0xFF) and, in fp16, a scale past its range (E8M0 150):
    outputs NaN or +-inf exactly where the float64 reference is (IEEE sums of +-inf and NaN do
    not depend on the order); the other outputs within tolerance."""
    use_variant(monkeypatch, variant, m)
    rng = np.random.default_rng(seed)
    n, k = 72, 256
    packed, scales, _ = random_weight(rng, "mxfp4", 32, n, k, dtype, "codes")
    scales[3, 2] = ref.E8M0_NAN
    scales[10, 0] = 150    # 2^23: +-inf in fp16 for every non-zero code; finite in bf16
    x = random_normal(rng, (m, k), dtype)
    call = Block4Call(x, (packed, scales, None), "mxfp4", 32, None, "none", dtype)
    call.launch()
    synchronize()
    got = ref.to_f32(call.out.read(f"out, seed={seed}"), dtype).astype(np.float64)
    want = ref.gemm_block4_f64(x, "mxfp4", packed, scales, None, 32, k, dtype)
    finite = np.isfinite(want)
    assert np.array_equal(np.isnan(got), np.isnan(want)), f"NaN pattern, seed={seed}"
    assert np.array_equal(got[np.isinf(want)], want[np.isinf(want)]), f"inf, seed={seed}"
    assert not finite[:, 3].any() and finite.sum() > 0
    assert np.isinf(want[:, 10]).any() or np.isnan(want[:, 10]).any() or dtype == "bf16"
    w = ref.to_f32(call.weight(), dtype).astype(np.float64)
    xf = ref.to_f32(x, dtype).astype(np.float64)
    rows = np.isfinite(w).all(axis=1)
    pre = xf @ w[rows].T
    error32 = dot_float32_error(xf, w[rows], pre, TENSOR_CORE_ROUNDOFF)
    assert_within(got[:, rows], pre, output_tolerance(pre, error32, dtype), f"finite, seed={seed}")


def check_forced_plan(monkeypatch, seed, variant, overrides, i, shape, fmt, blocksize, what):
    """Forces the variant and the plan's overrides ({variable: value}), then launches a call of
    `shape` (K fitted to the block) twice, the second time on poisoned outputs: right both times
    and the same bits (the kernels add their partial sums in a fixed order). i rotates the
    dtype, the weight's source, the bias and the activation."""
    use_variant(monkeypatch, variant, shape[0])
    for name, value in overrides.items():
        monkeypatch.setenv(name, str(value))
    dtype = ref.BLOCK4_GEMM_DTYPES[i % 2]
    rng = np.random.default_rng(seed)
    m, n, k = shape
    call = make_call(rng, (m, n, fit_k(k, blocksize)), fmt, blocksize, dtype,
                     SOURCE_ROTATION[i % 2], bias=i % 3 != 2,
                     activation=ACTIVATION_ROTATION[i % 2])
    ctx = f"{what}, {dtype}, seed={seed}"
    call.launch()
    call.check(ctx)
    first = call.out.read(ctx).copy()
    call.poison_outputs()
    call.launch()
    call.check(f"{ctx}, second launch")
    assert_bitwise_equal(call.out.read(ctx), first, f"{ctx}: two launches")


# ---------------------------------------------------------------------------------------------
# The wgmma kernel's plans, forced (CK_GEMM_W4A16_WGMMA_ROWS / _SPLIT apply to the block formats)
# ---------------------------------------------------------------------------------------------
# (block rows, blocks per output tile, shape): each block shape, K from 1 chunk (96: most blocks
# of a split get none) to 32, M partial in the blocks, N partial in the 128-row tiles.
WGMMA_PLANS = [(64, 1, (37, 136, 1024)), (64, 4, (5, 1000, 1024)), (64, 8, (64, 128, 4096)),
               (128, 1, (300, 128, 384)), (128, 2, (200, 264, 2048)), (128, 8, (17, 136, 96)),
               (256, 1, (700, 136, 1024)), (256, 2, (257, 128, 512))]


@pytest.mark.parametrize("rows, split, shape",
                         [p for p in WGMMA_PLANS if small_enough(*p[2])],
                         ids=lambda v: shape_id(v) if isinstance(v, tuple) else str(v))
@pytest.mark.parametrize("fmt, blocksize", FORMAT_BLOCKS, ids=lambda v: str(v))
def test_wgmma_plans(fmt, blocksize, rows, split, shape, monkeypatch, seed):
    check_forced_plan(monkeypatch, seed, "wgmma",
                      {"CK_GEMM_W4A16_WGMMA_ROWS": rows, "CK_GEMM_W4A16_WGMMA_SPLIT": split},
                      WGMMA_PLANS.index((rows, split, shape)), shape, fmt, blocksize,
                      f"wgmma {rows} rows, split {split}")


# The weight-streaming kernel's block shapes, forced (CK_GEMM_W4A16_STREAM_TILES / _WARPS apply
# to the block formats): 2, 4, 6 or 8 tiles per block, at most 4, 6 or 8 warps, at the three x
# row classes; the last tile group partial, K of fewer chunks than warps or of several per warp.
STREAM_SHAPES = [(1, 136, 4096), (5, 1000, 384), (16, 72, 1024), (16, 264, 128)]


@pytest.mark.parametrize("shape", [s for s in STREAM_SHAPES if small_enough(*s)],
                         ids=lambda v: shape_id(v))
@pytest.mark.parametrize("warps", [4, 6, 8])
@pytest.mark.parametrize("tiles", [2, 4, 6, 8])
@pytest.mark.parametrize("fmt, blocksize", FORMAT_BLOCKS, ids=lambda v: str(v))
def test_stream_block_shapes(fmt, blocksize, tiles, warps, shape, monkeypatch, seed):
    check_forced_plan(monkeypatch, seed, "small_m",
                      {"CK_GEMM_W4A16_STREAM_TILES": tiles, "CK_GEMM_W4A16_STREAM_WARPS": warps},
                      STREAM_SHAPES.index(shape) + tiles + warps, shape, fmt, blocksize,
                      f"stream {tiles} tiles, <= {warps} warps")


@pytest.mark.parametrize("m", [17, 64, 65, 200])
def test_auto_chooses_wgmma_past_16_rows_on_hopper(m, monkeypatch, seed):
    """auto: wgmma for M > 16 on compute capability 9.0 (the same bits as wgmma forced; the
    reference kernel sums in another order), the reference kernel elsewhere."""
    expected = "wgmma" if compute_capability() == (9, 0) else "reference"
    rng = np.random.default_rng(seed)
    call = make_call(rng, (m, 136, 1024), "nvfp4", 16, "fp16", "codes")
    results = {}
    for kernel in (expected, "auto"):
        monkeypatch.setenv(KERNEL_ENV, kernel)
        call.poison_outputs()
        call.launch()
        call.check(f"{kernel}, seed={seed}")
        results[kernel] = call.out.read(f"out, {kernel}").copy()
    assert_bitwise_equal(results["auto"], results[expected], f"auto vs {expected}, seed={seed}")


# ---------------------------------------------------------------------------------------------
# Graphs, the override, the wrapper
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("fmt, blocksize", FORMAT_BLOCKS, ids=lambda v: str(v))
@pytest.mark.parametrize("m", [4, 40])
def test_graph_capture_and_replay(fmt, blocksize, m, seed):
    rng = np.random.default_rng(seed)
    call = make_call(rng, (m, 200, fit_k(512, blocksize)), fmt, blocksize, "bf16")
    assert_graph_replays(call, rng, seed)


def test_override_read_on_every_call(monkeypatch, seed):
    rng = np.random.default_rng(seed)
    call = make_call(rng, (17, 100, 256), "nvfp4", 16, "fp16")
    assert_override_read_on_every_call(call, monkeypatch, KERNEL_ENV, seed)


def test_small_m_refuses_m_past_16(monkeypatch, seed):
    rng = np.random.default_rng(seed)
    call = make_call(rng, (17, 64, 128), "nf4", 64, "fp16")
    force_variant(monkeypatch, KERNEL_ENV, "small_m")
    call.poison_outputs()
    assert_forced_variant_unsupported(call, KERNEL_ENV, "small_m", "m=17")


@pytest.mark.parametrize("fmt, blocksize", FORMAT_BLOCKS, ids=lambda v: str(v))
def test_wrapper_matches_raw_calls(fmt, blocksize, seed):
    """ck.block4_prepack and ck.gemm_block4_prepacked (NumPy in and out; NVFP4's global scale as
    a Python float too) give the raw calls' bits."""
    rng = np.random.default_rng(seed)
    dtype = "fp16"
    call = make_call(rng, (6, 72, fit_k(256, blocksize)), fmt, blocksize, dtype)
    call.launch()
    synchronize()
    want = call.out.read("out").copy()
    x, packed, scales, g, bias = call.inputs
    w_pre, s_pre = ck.block4_prepack(fmt, packed, scales, blocksize=blocksize)
    assert_bitwise_equal(to_host(w_pre), call.w_pre.read("w_prepacked"), "w_prepacked")
    assert_bitwise_equal(to_host(s_pre), call.s_pre.read("scales_prepacked"), "scales_prepacked")
    for global_scale in ([g] if g is None else [g, float(g[0])]):
        got = ck.gemm_block4_prepacked(x, fmt, w_pre, s_pre, n=packed.shape[0],
                                       blocksize=blocksize, global_scale=global_scale, bias=bias,
                                       activation="relu")
        assert_bitwise_equal(to_host(got), want, f"wrapper {fmt}, seed={seed}")
