"""GPU tests of the matrix products (ck_gemm_int8, ck_gemm_int8_scaled, ck_linear) against
tests/reference.py.

- ck_gemm_int8 must equal the exact int32 product bit for bit, for every kernel variant
  (CK_GEMM_INT8_KERNEL=reference, mma, small_m, wgmma, auto), both weight layouts and shapes
  with partial tiles in M, N and K, on fresh random data over the whole int8 range.
- ck_gemm_int8_scaled and ck_linear compute in float32 and round once: they are compared with the
  float64 reference under tolerances derived below from the roundings the header allows.
- Every output is poisoned before the launch (an unwritten element cannot pass) and sits between
  two poisoned guard regions (a write out of bounds shows). Inputs sit between guard bytes too.
- CUDA graph capture and replay, two streams, the kernel override, and the wrapper's NumPy and
  device-array functions (gemm_int8, gemm_int8_scaled, linear, the seed's int8_matmul).

The tests skip without a CUDA device. CK_SANITIZE=1 (set by `make sanitize`) drops the largest
shapes. Each test draws a seed from os.urandom, prints it and names it in its messages;
CK_TEST_SEED=<seed> replays a failure.
"""

import math

import numpy as np
import pytest

import cuda_wrapper as ck
import reference as ref
from gpu_support import (
    CK_ACTIVATION, CK_DTYPE, CK_GRANULARITY, CK_LAYOUT, GuardedBuffer, KernelCall, POISON,
    SANITIZE, SECOND_ORDER_SLACK, U32, assert_bitwise_equal, assert_graph_replays,
    assert_override_read_on_every_call, assert_relu_output, assert_within, compute_capability,
    dot_float32_error, dtype_arg, epilogue_cases, force_variant, output_tolerance, ptr_or_null,
    random_normal, random_scales, refill_scaled_gemm, scalar_store_layout, scalar_store_params,
    scale_count, shape_id,
    small_enough, synchronize, to_host, write_buffers,
)

pytestmark = pytest.mark.gpu

KERNEL_ENV = "CK_GEMM_INT8_KERNEL"
VARIANTS = ("auto", "reference", "mma", "small_m", "wgmma")
SMALL_M_MAX = 16  # the small_m kernel serves m <= 16 (and CK_LAYOUT_NK only)
INT8_RMS = 74.0  # the rms of uniform int8 codes: sqrt(E[a^2]) = 73.9

# ---------------------------------------------------------------------------------------------
# Tolerances of the float outputs (U32, the unit roundoff of float32, and the shared bounds:
# gpu_support)
# ---------------------------------------------------------------------------------------------
# ck_gemm_int8_scaled: the epilogue is float32 arithmetic on the exact int32 acc. The product
# p = acc * scale_a * scale_b takes at most three roundings (float(acc), then the two
# multiplications, in any order or with the second fused into the bias add), the sum with the
# bias at most one more; the activation is exact and 1-Lipschitz. So the float32 value v32 of
# the exact v = act(p + bias) satisfies |v32 - v| <= (3 |p| + |p + bias|) u, to first order.
EPILOGUE_PRODUCT_ROUNDINGS = 3
EPILOGUE_SUM_ROUNDINGS = 1
# ck_linear: float32 accumulation of K products in any order, then the bias add
# (dot_float32_error with u = U32).
# Rounding to fp16/bf16 adds half an ulp of the output type at |v| + (the float32 error); fp32
# outputs have no further rounding (the last float32 operation is it): output_tolerance.
# fp32 linear must not round its inputs to TF32 (10-bit mantissa, relative error 2^-11 per
# product, ~3e-4 of the result on random data); fp32 accumulation stays near 1e-7: a relative
# Frobenius error below 1e-5 separates them by more than an order of magnitude either way.
FP32_NOT_TF32_MAX_REL = 1e-5


def epilogue_float32_error(product, pre_activation):
    """The bound on |v32 - v| of the INT8 epilogue (see EPILOGUE_PRODUCT_ROUNDINGS)."""
    return (EPILOGUE_PRODUCT_ROUNDINGS * np.abs(product)
            + EPILOGUE_SUM_ROUNDINGS * np.abs(pre_activation)) * U32 * SECOND_ORDER_SLACK


# ---------------------------------------------------------------------------------------------
# Fixtures and helpers
# ---------------------------------------------------------------------------------------------
def use_variant(monkeypatch, variant, m=1, layout="nk"):
    """Forces the INT8 GEMM kernel variant through CK_GEMM_INT8_KERNEL, skipping where this GPU
    has no such kernel. The shape rules of small_m and wgmma are the parametrization's business:
    asserted here."""
    if variant == "small_m":
        assert m <= SMALL_M_MAX and layout == "nk", "small_m serves m <= 16, CK_LAYOUT_NK"
    if variant == "wgmma":
        assert layout == "nk", "wgmma serves CK_LAYOUT_NK"
    force_variant(monkeypatch, KERNEL_ENV, variant)


def variant_serves(variant, m, layout):
    """The shape rules of the forced variants (hardware rules: use_variant)."""
    if variant == "small_m":
        return m <= SMALL_M_MAX and layout == "nk"
    if variant == "wgmma":
        return layout == "nk"
    return True


def weight_shape(layout, n, k):
    return (n, k) if layout == "nk" else (k, n)


def kn_n(n):
    """The N a [K, N] weight is tested with: rounded up to the multiple of 16 the rules want."""
    return 16 * -(-n // 16)


def random_int8(rng, shape):
    """Uniform over the whole int8 range, -128 included."""
    return rng.integers(-128, 128, size=shape, dtype=np.int8)


# ---------------------------------------------------------------------------------------------
# One call of each entry point (gpu_support.KernelCall): its device buffers, launch and check
# ---------------------------------------------------------------------------------------------
class GemmInt8Call(KernelCall):
    """ck_gemm_int8. misalign: extra bytes before a, b and c."""

    def __init__(self, a, b, layout, misalign=(0, 0, 0)):
        self.layout = layout
        m, k = a.shape
        n = b.shape[0] if layout == "nk" else b.shape[1]
        assert b.shape == weight_shape(layout, n, k)
        self.mnk = (m, n, k)
        self.inputs = (a, b)
        self.a = GuardedBuffer.input(a, misalign[0])
        self.b = GuardedBuffer.input(b, misalign[1])
        self.out = GuardedBuffer.output((m, n), np.int32, POISON, misalign[2])
        self.outputs = {"c": self.out}

    def launch(self, stream=0):
        ck.raw.gemm_int8(self.a.ptr, self.b.ptr, CK_LAYOUT[self.layout], *self.mnk, self.out.ptr,
                         stream)

    def refill(self, rng):
        self.inputs = (random_int8(rng, self.a.shape), random_int8(rng, self.b.shape))
        self.a.write(self.inputs[0])
        self.b.write(self.inputs[1])

    def check(self, ctx):
        synchronize()
        want = ref.gemm_int8(*self.inputs, self.layout)
        got = self.out.read(f"c, {ctx}")
        assert_bitwise_equal(got, want, f"c, {ctx}")
        return got


def random_int8_scales(rng, count, k):
    return random_scales(rng, count, k, INT8_RMS)


class GemmInt8ScaledCall(KernelCall):
    """ck_gemm_int8_scaled. granularities: ('tensor' | 'row', 'tensor' | 'row') of scale_a and
    scale_b; misalign: extra bytes before a, b, out and bias (scales are 4-byte aligned at +4)."""

    def __init__(self, a, b, layout, scale_a, scale_b, bias, activation, out_dtype,
                 granularities, misalign=(0, 0, 0, 0)):
        self.layout, self.activation, self.out_dtype = layout, activation, out_dtype
        self.granularities = granularities
        m, k = a.shape
        n = b.shape[0] if layout == "nk" else b.shape[1]
        assert b.shape == weight_shape(layout, n, k)
        assert scale_a.size == scale_count(granularities[0], m)
        assert scale_b.size == scale_count(granularities[1], n)
        self.mnk = (m, n, k)
        self.inputs = (a, b, scale_a, scale_b, bias)
        self.a = GuardedBuffer.input(a, misalign[0])
        self.b = GuardedBuffer.input(b, misalign[1])
        self.scale_a = GuardedBuffer.input(scale_a, 4 if misalign[3] else 0)
        self.scale_b = GuardedBuffer.input(scale_b, 4 if misalign[3] else 0)
        self.bias = None if bias is None else GuardedBuffer.input(bias, misalign[3])
        self.out = GuardedBuffer.output((m, n), ref.NUMPY_DTYPE[out_dtype], POISON, misalign[2])
        self.outputs = {"out": self.out}

    def launch(self, stream=0):
        ck.raw.gemm_int8_scaled(
            self.a.ptr, self.b.ptr, CK_LAYOUT[self.layout], *self.mnk, self.scale_a.ptr,
            CK_GRANULARITY[self.granularities[0]], self.scale_b.ptr,
            CK_GRANULARITY[self.granularities[1]], ptr_or_null(self.bias),
            CK_ACTIVATION[self.activation], self.out.ptr, CK_DTYPE[self.out_dtype], stream)

    def refill(self, rng):
        refill_scaled_gemm(self, rng, random_int8, random_int8_scales)

    def check(self, ctx):
        synchronize()
        a, b, scale_a, scale_b, bias = self.inputs
        acc = ref.gemm_int8(a, b, self.layout)
        product = ref.int8_epilogue_f64(acc, scale_a, scale_b)
        pre = ref.int8_epilogue_f64(acc, scale_a, scale_b, bias, "none", self.out_dtype)
        value = ref.activate(pre, self.activation)
        error32 = epilogue_float32_error(product, pre)
        out = self.out.read(f"out, {ctx}")
        got = ref.to_f32(out, self.out_dtype).astype(np.float64)
        assert_within(got, value, output_tolerance(value, error32, self.out_dtype),
                      f"out ({self.out_dtype}), {ctx}")
        if self.activation == "relu":
            assert_relu_output(got, pre, error32, f"out, {ctx}")
        return out


def random_linear_inputs(rng, m, n, k, dtype, with_bias):
    """x ~ N(0, 1), w ~ N(0, 1/K) (outputs ~ N(0, 1), well inside fp16), bias ~ N(0, 1)."""
    x = random_normal(rng, (m, k), dtype)
    w = random_normal(rng, (n, k), dtype, 1 / math.sqrt(k))
    bias = random_normal(rng, n, dtype) if with_bias else None
    return x, w, bias


class LinearCall(KernelCall):
    """ck_linear. misalign: extra bytes (multiples of 16) before x, w, out and bias."""

    def __init__(self, x, w, bias, activation, dtype, misalign=(0, 0, 0, 0)):
        self.activation, self.dtype = activation, dtype
        m, k = x.shape
        n = w.shape[0]
        self.mnk = (m, n, k)
        self.inputs = (x, w, bias)
        self.x = GuardedBuffer.input(x, misalign[0])
        self.w = GuardedBuffer.input(w, misalign[1])
        self.bias = None if bias is None else GuardedBuffer.input(bias, misalign[3])
        self.out = GuardedBuffer.output((m, n), ref.NUMPY_DTYPE[dtype], POISON, misalign[2])
        self.outputs = {"out": self.out}

    def launch(self, stream=0):
        m, n, k = self.mnk
        ck.raw.linear(self.x.ptr, self.w.ptr, ptr_or_null(self.bias), CK_DTYPE[self.dtype], m, n,
                      k, CK_ACTIVATION[self.activation], self.out.ptr, stream)

    def refill(self, rng):
        self.inputs = random_linear_inputs(rng, *self.mnk, self.dtype, self.bias is not None)
        write_buffers((self.x, self.w, self.bias), self.inputs)

    def check(self, ctx):
        """Returns (the output in float64, the exact float64 reference)."""
        synchronize()
        x, w, bias = self.inputs
        pre = ref.linear_f64(x, w, bias, "none", self.dtype)
        value = ref.activate(pre, self.activation)
        error32 = dot_float32_error(ref.to_f32(x, self.dtype).astype(np.float64),
                                    ref.to_f32(w, self.dtype).astype(np.float64), pre)
        got = ref.to_f32(self.out.read(f"out, {ctx}"), self.dtype).astype(np.float64)
        assert_within(got, value, output_tolerance(value, error32, self.dtype),
                      f"out ({self.dtype}), {ctx}")
        if self.activation == "relu":
            assert_relu_output(got, pre, error32, f"out, {ctx}")
        return got, value


def make_int8_call(rng, layout_shape):
    """A GemmInt8Call on fresh data for layout_shape = (layout, (m, n, k))."""
    layout, (m, n, k) = layout_shape
    return GemmInt8Call(random_int8(rng, (m, k)), random_int8(rng, weight_shape(layout, n, k)),
                        layout)


def make_scaled_call(rng, layout, shape, out_dtype, granularities=("row", "row"), bias=True,
                     activation="relu", misalign=(0, 0, 0, 0)):
    m, n, k = shape
    a, b = random_int8(rng, (m, k)), random_int8(rng, weight_shape(layout, n, k))
    scale_a = random_int8_scales(rng, scale_count(granularities[0], m), k)
    scale_b = random_int8_scales(rng, scale_count(granularities[1], n), k)
    bias_values = random_normal(rng, n, out_dtype, 2.0) if bias else None
    return GemmInt8ScaledCall(a, b, layout, scale_a, scale_b, bias_values, activation, out_dtype,
                              granularities, misalign)


# ---------------------------------------------------------------------------------------------
# ck_gemm_int8: every variant, both layouts, partial tiles; exact
# ---------------------------------------------------------------------------------------------
# (M, N, K): M in {1, 2, 7, 16, 17, 64, 100, 129, 255, 1000}, N in {1, 8, 15, 16, 24, 100, 129,
# 200, 1000, 4096}, K in {16, 32, 48, 80, 144, 1008, 4096}, each value several times, paired so
# that tiles are partial in every dimension (the kernels' tiles: 64 or 128 rows, 8 to 256
# columns, K steps of 64 or 128 bytes). CK_LAYOUT_KN rounds N up to a multiple of 16.
INT32_SHAPES = [
    (1, 1, 16), (1, 129, 1008), (1, 4096, 80), (2, 15, 32), (2, 1000, 144), (7, 8, 48),
    (7, 200, 4096), (16, 16, 16), (16, 100, 80), (16, 24, 1008), (17, 1, 144), (17, 129, 48),
    (64, 24, 32), (64, 4096, 144), (64, 200, 4096), (100, 15, 1008), (100, 200, 16),
    (129, 8, 4096), (129, 1000, 80), (255, 100, 48), (255, 16, 144), (1000, 129, 32),
    (1000, 1, 16), (1000, 1000, 1008),
]
# Full-size problems on the paths that serve them in production (skipped under the sanitizer).
INT32_LARGE = [
    ("auto", "nk", (1024, 4096, 4096)), ("wgmma", "nk", (1024, 4096, 4096)),
    ("mma", "kn", (1024, 4096, 4096)), ("reference", "nk", (256, 4096, 4096)),
    ("small_m", "nk", (16, 14336, 4096)), ("auto", "nk", (1, 14336, 4096)),
]


def int32_cases():
    for variant in VARIANTS:
        for layout in ref.LAYOUTS:
            for m, n, k in INT32_SHAPES:
                n = n if layout == "nk" else kn_n(n)
                if variant_serves(variant, m, layout) and small_enough(m, n, k):
                    yield pytest.param(variant, layout, (m, n, k),
                                       id=f"{variant}-{layout}-{shape_id((m, n, k))}")
    for variant, layout, shape in INT32_LARGE:
        if small_enough(*shape):
            yield pytest.param(variant, layout, shape,
                               id=f"{variant}-{layout}-{shape_id(shape)}-large")


@pytest.mark.parametrize("variant, layout, shape", list(int32_cases()))
def test_gemm_int8_exact(variant, layout, shape, monkeypatch, seed):
    use_variant(monkeypatch, variant, shape[0], layout)
    call = make_int8_call(np.random.default_rng(seed), (layout, shape))
    call.launch()
    call.check(f"{variant}, {layout}, seed={seed}")


def variant_layout_params(layouts=ref.LAYOUTS, m=1):
    return [pytest.param(v, lay, id=f"{v}-{lay}") for v in VARIANTS for lay in layouts
            if variant_serves(v, m, lay)]


@pytest.mark.parametrize("variant, layout", variant_layout_params())
def test_gemm_int8_large_k_sums_stay_exact(variant, layout, monkeypatch, seed):
    """K = 8192 with values near +-127 and signs that line up: sums reach ~1.3e8, far past the
    2^24 where float32 stops holding every integer, still inside int32."""
    rng = np.random.default_rng(seed)
    small = variant == "small_m" or SANITIZE
    m, n, k = (16, 272, 8192) if small else (130, 208, 8192)
    use_variant(monkeypatch, variant, m, layout)
    a = rng.choice(np.array([-128, -127, 126, 127], np.int8), size=(m, k))
    b_nk = rng.choice(np.array([-127, -126, 126, 127], np.int8), size=(n, k))
    # A third of the weight rows (n % 3 == 0) follow the signs of row n % m of a: c[n % m, n]
    # is about +-K * 127^2 = +-1.3e8; half of those (n % 6 == 3) the opposite signs.
    aligned = np.arange(n) % 3 == 0
    b_nk[aligned] = np.abs(b_nk[aligned]) * np.sign(a[np.arange(n)[aligned] % m]).astype(np.int8)
    b_nk[3::6] = -b_nk[3::6]
    call = GemmInt8Call(a, b_nk if layout == "nk" else np.ascontiguousarray(b_nk.T), layout)
    call.launch()
    c = call.check(f"{variant}, {layout}, seed={seed}")
    assert np.abs(c.astype(np.int64)).max() > 2**26, f"the data must make large sums, seed={seed}"
    assert c.min() < -(2**26), f"the data must make large negative sums, seed={seed}"


@pytest.mark.parametrize("variant, layout", variant_layout_params())
def test_gemm_int8_sums_wrap_modulo_2_32(variant, layout, monkeypatch):
    """The header: int32 sums wrap like int32 addition. K = 131088 of (-128)(-128) sums to
    2^31 + 262144, which wraps to -2147221504; (-128)(127) rows stay in range."""
    m, n, k = 2, 16, 131088
    use_variant(monkeypatch, variant, m, layout)
    a = np.full((m, k), -128, np.int8)
    a[1, 1::2] = 127
    b_nk = np.full((n, k), -128, np.int8)
    b_nk[1] = 127
    b_nk[2:] = np.random.default_rng(n).integers(-128, 128, size=(n - 2, k), dtype=np.int8)
    call = GemmInt8Call(a, b_nk if layout == "nk" else np.ascontiguousarray(b_nk.T), layout)
    call.launch()
    c = call.check(f"{variant}, {layout}")
    assert c[0, 0] == -2147221504 and c[0, 1] == -128 * 127 * k


@pytest.mark.parametrize("variant", VARIANTS)
def test_gemm_int8_minimally_aligned_pointers(variant, monkeypatch, seed):
    """a and b only 16-byte aligned (the header's requirement, not cudaMalloc's 256), c only
    4-byte aligned with an even N: the kernels must not assume more."""
    rng = np.random.default_rng(seed)
    m, n, k = (9, 136, 1008) if variant == "small_m" else (100, 136, 1008)
    use_variant(monkeypatch, variant, m, "nk")
    call = GemmInt8Call(random_int8(rng, (m, k)), random_int8(rng, (n, k)), "nk",
                        misalign=(16, 48, 4))
    call.launch()
    call.check(f"{variant}, seed={seed}")


# ---------------------------------------------------------------------------------------------
# ck_gemm_int8_scaled: the fused epilogue
# ---------------------------------------------------------------------------------------------
# M <= 16 takes the small-M kernel on auto, larger M the tensor-core tiles (wgmma on Hopper).
@pytest.mark.parametrize("shape, out_dtype, granularities, bias, activation",
                         epilogue_cases([(7, 200, 144), (100, 129, 1008)]))
def test_gemm_int8_scaled_epilogue(shape, out_dtype, granularities, bias, activation, seed):
    call = make_scaled_call(np.random.default_rng(seed), "nk", shape, out_dtype, granularities,
                            bias, activation)
    call.launch()
    call.check(f"auto, seed={seed}")


@pytest.mark.parametrize("full", [False, True], ids=["tensor-plain", "row-bias-relu"])
@pytest.mark.parametrize("out_dtype", ref.DTYPES)
@pytest.mark.parametrize("variant, layout", variant_layout_params())
def test_gemm_int8_scaled_variants(variant, layout, out_dtype, full, monkeypatch, seed):
    """Each kernel variant's own epilogue: the plainest and the fullest combination."""
    m, n, k = (13, 200, 1008) if variant == "small_m" else (100, 200, 1008)
    n = n if layout == "nk" else kn_n(n)
    use_variant(monkeypatch, variant, m, layout)
    granularities = ("row", "row") if full else ("tensor", "tensor")
    call = make_scaled_call(np.random.default_rng(seed), layout, (m, n, k), out_dtype,
                            granularities, bias=full, activation="relu" if full else "none")
    call.launch()
    call.check(f"{variant}, {layout}, seed={seed}")


@pytest.mark.parametrize("out_dtype", ref.DTYPES)
@pytest.mark.parametrize("layout", ref.LAYOUTS)
def test_gemm_int8_scaled_same_bits_in_every_variant(layout, out_dtype, monkeypatch, seed):
    """The header defines the epilogue's float32 operations exactly (fma(acc * scale_a, scale_b,
    bias)), so every variant that serves a call must produce the same bits."""
    m, n, k = 13, kn_n(200), 1008
    call = make_scaled_call(np.random.default_rng(seed), layout, (m, n, k), out_dtype)
    results = {}
    for variant in VARIANTS:
        if not variant_serves(variant, m, layout):
            continue
        try:
            use_variant(monkeypatch, variant, m, layout)
        except pytest.skip.Exception:
            continue  # not on this GPU
        call.poison_outputs()
        call.launch()
        results[variant] = call.check(f"{variant}, {layout}, seed={seed}")
    first = next(iter(results))
    for variant, out in results.items():
        assert_bitwise_equal(out, results[first], f"{variant} vs {first}, {layout}, seed={seed}")


@pytest.mark.parametrize("variant, out_dtype, case", scalar_store_params(VARIANTS))
def test_gemm_int8_scalar_store_path(variant, out_dtype, case, monkeypatch, seed):
    rng = np.random.default_rng(seed)
    n, offset = scalar_store_layout(case, out_dtype)
    m, k = (5 if variant == "small_m" else 33), 144
    use_variant(monkeypatch, variant, m, "nk")
    if out_dtype == "int32":
        call = GemmInt8Call(random_int8(rng, (m, k)), random_int8(rng, (n, k)), "nk",
                            misalign=(0, 0, offset))
    else:
        call = make_scaled_call(rng, "nk", (m, n, k), out_dtype, ("row", "row"), True, "relu",
                                misalign=(0, 0, offset, offset))
    call.launch()
    call.check(f"{variant}, {case}, seed={seed}")


@pytest.mark.parametrize("out_dtype", ref.DTYPES)
@pytest.mark.parametrize("shape", [(1, 1, 16), (1, 40, 32), (40, 1, 32)], ids=shape_id)
def test_gemm_int8_scaled_per_row_of_length_one(shape, out_dtype, seed):
    """M == 1 or N == 1 with CK_PER_ROW: one scale that is also the whole vector."""
    call = make_scaled_call(np.random.default_rng(seed), "nk", shape, out_dtype, ("row", "row"),
                            True, "none")
    call.launch()
    call.check(f"seed={seed}")


@pytest.mark.parametrize("variant, layout, shape, out_dtype", [
    pytest.param("auto", "nk", (1024, 4096, 4096), "bf16", id="auto-nk-1024x4096x4096-bf16"),
    pytest.param("mma", "kn", (512, 4096, 4096), "fp16", id="mma-kn-512x4096x4096-fp16"),
    pytest.param("small_m", "nk", (16, 14336, 4096), "fp16", id="small_m-nk-16x14336x4096-fp16"),
])
def test_gemm_int8_scaled_large(variant, layout, shape, out_dtype, monkeypatch, seed):
    if not small_enough(*shape):
        pytest.skip("too large for the sanitizer run")
    use_variant(monkeypatch, variant, shape[0], layout)
    call = make_scaled_call(np.random.default_rng(seed), layout, shape, out_dtype)
    call.launch()
    call.check(f"{variant}, {layout}, seed={seed}")


def test_gemm_int8_scaled_large_k_fp32(seed):
    """|acc| up to ~1.3e8 > 2^24: float(acc) rounds, within the epilogue tolerance."""
    rng = np.random.default_rng(seed)
    m, n, k = (16 if SANITIZE else 64), 256, 8192
    a = rng.choice(np.array([-127, 127], np.int8), size=(m, k))
    signs = np.where(np.arange(n) % 2 == 0, 1, -1).astype(np.int8)[:, None]
    b = a[np.arange(n) % m] * signs  # row n is +-row (n % m) of a: c[n % m, n] = +-K * 127^2
    scale_a = np.full(m, 1e-4, np.float32)
    scale_b = random_int8_scales(rng, n, k)
    call = GemmInt8ScaledCall(a, b, "nk", scale_a, scale_b, None, "none", "fp32",
                              ("row", "row"))
    call.launch()
    call.check(f"seed={seed}")
    assert np.abs(ref.gemm_int8(a, b)).max() > 2**26, f"the sums must be large, seed={seed}"


# ---------------------------------------------------------------------------------------------
# The kernel override
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("variant, m, layout", [
    ("small_m", 17, "nk"), ("small_m", 1000, "nk"), ("small_m", 4, "kn"), ("wgmma", 64, "kn"),
])
@pytest.mark.parametrize("entry", ["gemm_int8", "gemm_int8_scaled"])
def test_forced_variant_that_cannot_serve_is_unsupported(entry, variant, m, layout, monkeypatch,
                                                         seed):
    """A forced variant outside its rules returns CK_STATUS_UNSUPPORTED and writes nothing."""
    monkeypatch.setenv(KERNEL_ENV, variant)
    rng = np.random.default_rng(seed)
    if entry == "gemm_int8":
        call = make_int8_call(rng, (layout, (m, 32, 64)))
    else:
        call = make_scaled_call(rng, layout, (m, 32, 64), "fp16")
    with pytest.raises(ck.CKError) as info:
        call.launch()
    assert info.value.status == ck.Status.UNSUPPORTED, info.value.message
    assert KERNEL_ENV in info.value.message and variant in info.value.message
    synchronize()
    call.assert_outputs_untouched("a rejected call")


def test_wgmma_availability_follows_the_gpu(monkeypatch, seed):
    """Forced wgmma runs on compute capability 9.0 (the build includes sm_90a code) and is
    CK_STATUS_UNSUPPORTED elsewhere."""
    monkeypatch.setenv(KERNEL_ENV, "wgmma")
    call = make_int8_call(np.random.default_rng(seed), ("nk", (64, 64, 64)))
    if compute_capability() == (9, 0):
        call.launch()
        call.check(f"seed={seed}")
    else:
        with pytest.raises(ck.CKError) as info:
            call.launch()
        assert info.value.status == ck.Status.UNSUPPORTED, info.value.message


def test_kernel_override_is_read_on_every_call(monkeypatch, seed):
    if compute_capability() < (8, 0):
        pytest.skip("small_m needs compute capability 8.0+")
    call = make_int8_call(np.random.default_rng(seed), ("nk", (32, 64, 64)))
    assert_override_read_on_every_call(call, monkeypatch, KERNEL_ENV, seed)


# ---------------------------------------------------------------------------------------------
# ck_linear
# ---------------------------------------------------------------------------------------------
def linear_shapes(dtype):
    """Partial shapes the rules allow: K and N multiples of v = 16 / itemsize, any M."""
    v = 16 // np.dtype(ref.NUMPY_DTYPE[dtype]).itemsize
    return [(1, v, v), (7, 3 * v, 9 * v), (100, 200, 1024), (257, 1000, 72), (64, 4096, 4096)]


LINEAR_CASES = [
    pytest.param(dtype, shape, id=f"{dtype}-{shape_id(shape)}")
    for dtype in ref.DTYPES for shape in linear_shapes(dtype) if small_enough(*shape)
]


@pytest.mark.cublas
@pytest.mark.parametrize("activation", ref.ACTIVATIONS)
@pytest.mark.parametrize("bias", [False, True], ids=["nobias", "bias"])
@pytest.mark.parametrize("dtype, shape", LINEAR_CASES)
def test_linear(dtype, shape, bias, activation, seed):
    rng = np.random.default_rng(seed)
    call = LinearCall(*random_linear_inputs(rng, *shape, dtype, bias), activation, dtype)
    call.launch()
    call.check(f"seed={seed}")


@pytest.mark.cublas
@pytest.mark.parametrize("shape", [(64, 256, 1024), (300, 512, 4096)], ids=shape_id)
def test_linear_fp32_is_not_tf32(shape, seed):
    """fp32 inputs are not rounded to TF32: the relative error stays at fp32 accumulation's."""
    rng = np.random.default_rng(seed)
    call = LinearCall(*random_linear_inputs(rng, *shape, "fp32", True), "none", "fp32")
    call.launch()
    got, want = call.check(f"seed={seed}")
    rel = np.linalg.norm(got - want) / np.linalg.norm(want)
    assert rel < FP32_NOT_TF32_MAX_REL, f"relative error {rel:.3g} (TF32?), seed={seed}"


@pytest.mark.cublas
@pytest.mark.parametrize("dtype", ref.DTYPES)
def test_linear_16_byte_aligned_pointers(dtype, seed):
    """Every pointer 16-byte aligned, none 256-byte aligned: what the header requires."""
    rng = np.random.default_rng(seed)
    call = LinearCall(*random_linear_inputs(rng, 33, 136, 264, dtype, True), "relu", dtype,
                      misalign=(16, 48, 16, 32))
    call.launch()
    call.check(f"seed={seed}")


# ---------------------------------------------------------------------------------------------
# CUDA graphs and streams
# ---------------------------------------------------------------------------------------------
def make_graph_call(entry, variant, dtype, rng):
    m = 9 if variant == "small_m" else 70
    if entry == "gemm_int8":
        return make_int8_call(rng, ("nk", (m, 136, 272)))
    if entry == "gemm_int8_scaled":
        return make_scaled_call(rng, "nk", (m, 136, 272), dtype)
    return LinearCall(*random_linear_inputs(rng, 70, 136, 272, dtype, True), "relu", dtype)


GRAPH_CASES = (
    [pytest.param(e, v, "fp16", id=f"{e}-{v}") for e in ("gemm_int8", "gemm_int8_scaled")
     for v in VARIANTS]
    + [pytest.param("linear", "auto", d, id=f"linear-{d}", marks=pytest.mark.cublas)
       for d in ref.DTYPES]
)


@pytest.mark.parametrize("entry, variant, dtype", GRAPH_CASES)
def test_cuda_graph_replay(entry, variant, dtype, monkeypatch, seed):
    rng = np.random.default_rng(seed)
    call = make_graph_call(entry, variant, dtype, rng)
    if entry != "linear":
        use_variant(monkeypatch, variant, call.mnk[0], "nk")
    assert_graph_replays(call, rng, seed)


@pytest.mark.cublas
def test_two_streams_run_gemm_and_linear_concurrently(seed):
    rng = np.random.default_rng(seed)
    scale = 4 if SANITIZE else 1  # a sixteenth of the work under the sanitizer
    calls = [make_scaled_call(rng, "nk", (512 // scale, 2048 // scale, 1024), "bf16"),
             LinearCall(*random_linear_inputs(rng, 256 // scale, 1024 // scale, 2048, "fp16",
                                              True), "relu", "fp16"),
             make_int8_call(rng, ("nk", (8, 4096 // scale, 4096 // scale)))]
    streams = [ck.cuda.stream_create(non_blocking=True) for _ in range(2)]
    try:
        for _ in range(3):  # repeated so that the streams' kernels overlap
            calls[0].launch(streams[0])
            calls[1].launch(streams[1])
            calls[2].launch(streams[0])
        for stream in streams:
            ck.cuda.stream_synchronize(stream)
        for i, call in enumerate(calls):
            call.check(f"call {i}, seed={seed}")
    finally:
        for stream in streams:
            ck.cuda.stream_destroy(stream)


# ---------------------------------------------------------------------------------------------
# ck_int8_prepack: [K, N] -> [N, K], bit for bit, then the [N, K] GEMM gives the [K, N] one's bits
# ---------------------------------------------------------------------------------------------
# K and N multiples of 16 around the kernel's 64 x 64 tiles: partial tiles in either dimension,
# one row or column of tiles, more tiles than the grid's blocks.
PREPACK_SHAPES = [(16, 16), (48, 80), (64, 64), (1008, 16), (16, 2000), (4096, 1040),
                  (14336, 4096)]


@pytest.mark.parametrize("k, n", [s for s in PREPACK_SHAPES if not SANITIZE or s[0] * s[1] <= 2**22],
                         ids=lambda v: str(v))
def test_int8_prepack_transposes_bit_for_bit(k, n, seed):
    """b_nk = b_kn.T on every byte value; nothing written around b_nk (guards), b_kn intact."""
    rng = np.random.default_rng(seed)
    b_kn = rng.integers(-128, 128, size=(k, n), dtype=np.int8)
    src = GuardedBuffer.input(b_kn)
    dst = GuardedBuffer.output((n, k), np.int8, POISON)
    ck.raw.int8_prepack(src.ptr, k, n, dst.ptr)
    synchronize()
    assert_bitwise_equal(dst.read("b_nk"), np.ascontiguousarray(b_kn.T), f"seed={seed}")
    assert_bitwise_equal(src.read("b_kn"), b_kn, f"b_kn intact, seed={seed}")


@pytest.mark.parametrize("variant", ["small_m", "mma", "wgmma"])
def test_int8_prepack_gives_the_kn_products(variant, monkeypatch, seed):
    """ck_gemm_int8 on the prepacked [N, K] weight (the fast kernels' layout) gives the bits of
    the [K, N] call, exact int32 either way."""
    rng = np.random.default_rng(seed)
    m = 9 if variant == "small_m" else 200
    k, n = 1008, 336
    a, b_kn = random_int8(rng, (m, k)), random_int8(rng, (k, n))
    b_nk = ck.int8_prepack(b_kn)
    assert b_nk.shape == (n, k) and b_nk.dtype == np.int8
    assert_bitwise_equal(b_nk, np.ascontiguousarray(b_kn.T), f"wrapper, seed={seed}")
    want = ck.gemm_int8(a, b_kn, layout="kn")
    assert_bitwise_equal(want, ref.gemm_int8(a, b_kn, "kn"), f"kn, seed={seed}")
    force_variant(monkeypatch, KERNEL_ENV, variant)
    got = ck.gemm_int8(a, b_nk, layout="nk")
    assert_bitwise_equal(got, want, f"{variant} on the prepacked weight, seed={seed}")
    bd = ck.int8_prepack(ck.DeviceArray.from_numpy(b_kn))
    assert isinstance(bd, ck.DeviceArray) and bd.shape == (n, k)
    assert_bitwise_equal(bd.to_numpy(), b_nk, f"device, seed={seed}")


# ---------------------------------------------------------------------------------------------
# The wrapper's functions: NumPy in -> NumPy out, device arrays in -> DeviceArray out, out=.
# The wrapper does no arithmetic, so each result equals the raw call's bit for bit.
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("layout", ref.LAYOUTS)
def test_wrapper_gemm_int8(layout, seed):
    rng = np.random.default_rng(seed)
    m, n, k = 33, 48, 160
    a, b = random_int8(rng, (m, k)), random_int8(rng, weight_shape(layout, n, k))
    want = ref.gemm_int8(a, b, layout)
    c = ck.gemm_int8(a, b, layout=layout)
    assert isinstance(c, np.ndarray)
    assert_bitwise_equal(c, want, f"numpy, seed={seed}")
    ad, bd = ck.DeviceArray.from_numpy(a), ck.DeviceArray.from_numpy(b)
    cd = ck.gemm_int8(ad, bd, layout=layout)
    assert isinstance(cd, ck.DeviceArray) and cd.shape == (m, n) and cd.dtype == np.int32
    assert_bitwise_equal(cd.to_numpy(), want, f"device, seed={seed}")
    out = np.full((m, n), -1, np.int32)
    assert ck.gemm_int8(a, b, layout=layout, out=out) is out
    assert_bitwise_equal(out, want, f"out=, seed={seed}")
    row = ck.gemm_int8(a[3], b, layout=layout)  # a 1-D a is one row: the result is [N]
    assert_bitwise_equal(row, want[3], f"1-D a, seed={seed}")


@pytest.mark.parametrize("out_dtype", ref.DTYPES)
def test_wrapper_gemm_int8_scaled(out_dtype, seed):
    rng = np.random.default_rng(seed)
    m, n, k = 20, 48, 96  # N a multiple of 16: the [K, N] call below needs it
    raw_call = make_scaled_call(rng, "nk", (m, n, k), out_dtype)
    raw_call.launch()
    want = raw_call.check(f"raw, seed={seed}")
    a, b, scale_a, scale_b, bias = raw_call.inputs
    got = ck.gemm_int8_scaled(a, b, scale_a, scale_b, bias=bias, activation="relu",
                              out_dtype=out_dtype)
    assert_bitwise_equal(got, want, f"numpy, seed={seed}")
    devices = [ck.DeviceArray.from_numpy(v, ck_dtype=(ck.DType.BF16 if v is bias and
                                                      out_dtype == "bf16" else None))
               for v in (a, b, scale_a, scale_b, bias)]
    got_d = ck.gemm_int8_scaled(*devices[:4], bias=devices[4], activation="relu",
                                out_dtype=out_dtype)
    assert isinstance(got_d, ck.DeviceArray) and got_d.ck_dtype == CK_DTYPE[out_dtype]
    assert_bitwise_equal(got_d.to_numpy(), want, f"device, seed={seed}")
    # [K, N] weights, Python floats as per-tensor scales, no bias, no activation.
    b_kn = np.ascontiguousarray(b.T)
    sa, sb = float(scale_a[0]), float(scale_b[0])
    got_kn = ck.gemm_int8_scaled(a, b_kn, sa, sb, out_dtype=out_dtype, layout="kn")
    assert got_kn.dtype == ref.NUMPY_DTYPE[out_dtype] and got_kn.shape == (m, n)
    exact = ref.gemm_int8_scaled_f64(a, b, "nk", np.float32([sa]), np.float32([sb]))
    tol = output_tolerance(exact, epilogue_float32_error(exact, exact), out_dtype)
    assert_within(ref.to_f32(got_kn, out_dtype).astype(np.float64), exact, tol,
                  f"kn, per-tensor floats, seed={seed}")


def test_wrapper_gemm_int8_scaled_single_row_and_column(seed):
    """M == 1 with one scale_a value and N == 1 with one scale_b value: per tensor, the same."""
    rng = np.random.default_rng(seed)
    a, b = random_int8(rng, (1, 64)), random_int8(rng, (1, 64))
    got = ck.gemm_int8_scaled(a, b, np.float32([0.5]), np.float32([0.25]))
    assert got.shape == (1, 1)
    assert got[0, 0] == np.float32(ref.gemm_int8(a, b)[0, 0]) * np.float32(0.125)


def test_wrapper_gemm_argument_errors(seed):
    rng = np.random.default_rng(seed)
    a, b = random_int8(rng, (4, 32)), random_int8(rng, (8, 32))
    with pytest.raises(ValueError):
        ck.gemm_int8(a, random_int8(rng, (8, 48)))            # K differs
    with pytest.raises(ValueError):
        ck.gemm_int8(a, b, layout="kn")                       # b is [8, 32]: K would be 8
    with pytest.raises(ValueError):
        ck.gemm_int8_scaled(a, b, np.ones(3, np.float32), 1.0)   # 3 scales for M = 4
    with pytest.raises(ValueError):
        ck.gemm_int8_scaled(a, b, 1.0, np.ones(4, np.float32))   # 4 scales for N = 8
    with pytest.raises(TypeError):
        ck.gemm_int8_scaled(a, b, np.ones(4, np.float64), 1.0)   # float64 scales
    with pytest.raises(TypeError):
        ck.gemm_int8_scaled(a, b, 1.0, 1.0, bias=np.ones(8, np.float32), out_dtype="fp16")
    with pytest.raises(ValueError):
        ck.gemm_int8_scaled(a, b, 1.0, 1.0, bias=np.ones(7, np.float32))
    with pytest.raises(ck.CKError) as info:                   # the library's rule: K % 16
        ck.gemm_int8(random_int8(rng, (4, 24)), random_int8(rng, (8, 24)))
    assert info.value.status == ck.Status.UNSUPPORTED
    with pytest.raises(TypeError):
        ck.linear(np.ones((4, 32), np.float32), np.ones((8, 32), np.float16))
    with pytest.raises(ck.CKError) as info:                   # fp16: N a multiple of 8
        ck.linear(np.ones((4, 32), np.float16), np.ones((4, 32), np.float16))
    assert info.value.status == ck.Status.UNSUPPORTED


@pytest.mark.cublas
@pytest.mark.parametrize("dtype", ref.DTYPES)
def test_wrapper_linear(dtype, seed):
    rng = np.random.default_rng(seed)
    raw_call = LinearCall(*random_linear_inputs(rng, 12, 64, 128, dtype, True), "relu", dtype)
    raw_call.launch()
    raw_call.check(f"raw, seed={seed}")
    want = raw_call.out.read("raw")
    x, w, bias = raw_call.inputs
    got = ck.linear(x, w, bias, activation="relu", dtype=dtype_arg(dtype))
    assert_bitwise_equal(got, want, f"numpy, seed={seed}")
    ck_dtype = CK_DTYPE[dtype]
    xd, wd, bd = (ck.DeviceArray.from_numpy(v, ck_dtype=ck_dtype) for v in (x, w, bias))
    out = ck.DeviceArray.empty((12, 64), x.dtype, ck_dtype).fill_byte(POISON)
    assert ck.linear(xd, wd, bd, activation="relu", out=out) is out
    assert_bitwise_equal(out.to_numpy(), want, f"device out=, seed={seed}")


@pytest.mark.parametrize("device", [False, True], ids=["numpy", "device"])
def test_wrapper_int8_matmul(device, seed):
    """The seed API: A [M, K] x B [K, N] -> float32 (A @ B) * scale_a * scale_b, and requantized
    to int8 with a static per-tensor scale_c."""
    rng = np.random.default_rng(seed)
    m, n, k = 33, 80, 256
    A, B = random_int8(rng, (m, k)), random_int8(rng, (k, n))
    scale_a, scale_b = 0.002, random_int8_scales(rng, n, k)
    args = (A, B) if not device else (ck.DeviceArray.from_numpy(A), ck.DeviceArray.from_numpy(B))
    c = to_host(ck.int8_matmul(*args, scale_a=scale_a, scale_b=scale_b))
    assert c.dtype == np.float32 and c.shape == (m, n)
    exact = ref.gemm_int8_scaled_f64(A, B, "kn", np.float32([scale_a]), scale_b)
    assert_within(c.astype(np.float64), exact,
                  output_tolerance(exact, epilogue_float32_error(exact, exact), "fp32"),
                  f"C, seed={seed}")
    scale_c = float(np.abs(c).max()) / 150  # the largest values saturate at +-127
    q = ck.int8_matmul(*args, scale_a=scale_a, scale_b=scale_b, scale_c=scale_c)
    assert isinstance(q, ck.DeviceArray) == device
    want_q, _ = ref.quantize_int8(c, "fp32", "tensor", np.float32([scale_c]))
    assert_bitwise_equal(to_host(q), want_q, f"requantized, seed={seed}")
    assert (want_q == 127).any() or (want_q == -127).any()
    ones = to_host(ck.int8_matmul(*args))  # default scales 1.0: the exact int sums as float32
    assert_bitwise_equal(ones, ref.gemm_int8(A, B, "kn").astype(np.float32), f"seed={seed}")
