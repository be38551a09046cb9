"""GPU tests of ck_gemm_w4a8 (symmetric INT4 weights x FP8 E4M3 activations: float32 sums per
128-wide k-block, each scaled by its weight group's scale, then act(acc * scale_a + bias))
against tests/reference.py (gemm_w4a8: the exact sums, in float64).

- Every kernel variant (CK_GEMM_W4A8_KERNEL=reference, small_m, wgmma, auto) on shapes with
  partial tiles in M, N and K (M 1 .. 300, N 8 .. 384 and an odd N, K 32 .. 4128 with partial
  last groups), group 128 and CK_GROUP_ROW, fp16 and bf16 scales, per-tensor and per-row
  scale_a, every output dtype, bias and ReLU, on fresh random operands (INT4 codes over all of
  -8 .. 7, scales spread over a factor of 30); outputs NaN-filled before the launch, between
  guard regions. Shapes for each plan of the wgmma kernel: persistent CTAs that take several
  tiles, K split over clusters of 4 and 8 CTAs, M <= 16 on a wide weight.
- The accumulation bound (below) element by element, on random data and on K = 8192 of
  same-signed products.
- A NaN code in a row of a makes that row NaN and nothing else; minimally aligned pointers;
  CUDA graph capture and replay; the override read on every call, and forced variants that
  cannot serve a call refused.
- The wrapper (ck.gemm_w4a8 on NumPy, DeviceArrays, torch) and the layer W4A8Linear
  (QuantizedLinear.from_float(..., activations="fp8")) against the float64 reference of the
  quantized operands (ck.quantize_fp8 and ck.quantize_int4 match tests/reference.py bit for
  bit).

The tests skip without a CUDA device and on GPUs without FP8 tensor cores (before 8.9), where
the entry point answers CK_STATUS_UNSUPPORTED (tests/test_abi.py and test_fuzz_abi.py check the
argument rules on any machine).
"""

import numpy as np
import pytest

import cuda_wrapper as ck
import reference as ref
from gpu_support import (
    CK_ACTIVATION, CK_DTYPE, CK_GRANULARITY, GuardedBuffer, KernelCall, SANITIZE,
    SECOND_ORDER_SLACK, U32, assert_forced_variant_unsupported, assert_graph_replays,
    assert_override_read_on_every_call, assert_relu_output, assert_within, compute_capability,
    force_variant, output_tolerance, ptr_or_null, random_normal, scale_count, shape_id,
    small_enough, synchronize, to_device, to_host, write_buffers,
)
from test_gemm_fp8_gpu import accumulation_error, random_e4m3

pytestmark = pytest.mark.gpu

KERNEL_ENV = "CK_GEMM_W4A8_KERNEL"
VARIANTS = ("auto", "reference", "small_m", "wgmma")
SMALL_M_MAX = 16
GROUP_SIZES = ref.W4A8_GROUP_SIZES
GROUP_IDS = {128: "g128", ref.GROUP_ROW: "grow"}
SCALE_DTYPES = ref.W4A8_SCALE_DTYPES
FP8_MIN_CC = (8, 9)
# 0xFF bytes: NaN in fp32, fp16 and bf16 alike, so that an output element the kernel does not
# write cannot pass the comparison (whatever out_dtype).
NAN_POISON = 0xFF

# ---------------------------------------------------------------------------------------------
# The accumulation bound. Every product e4m3(a) * q is exact in float32 (at most 7 significant
# bits). Each 128-wide k-block's sum S_kb is taken as ck_gemm_fp8_scaled takes its sums: the
# reference kernel adds the products in float32 in k order, the tensor-core kernels sum them
# with fewer bits than float32 (within TENSOR_CORE_REL of the block's sum |a q|: see
# accumulation_error in tests/test_gemm_fp8_gpu.py). Then acc = fma(s_kb, S_kb, acc) over the
# ceil(K / 128) blocks, one rounding each: gamma_K of the abs sums covers those with the block
# sums' own (gamma_127 + gamma_blocks <= gamma_K for K >= 128; a single block has K - 1 sums
# and the fma). BLOCK_SCALE_ROUNDINGS more units cover a kernel that rounds the scaled block
# sum and then adds it (a product and a sum where the header says fma). All of it in units of
# sum_kb |s| sum |a q| (ref.gemm_w4a8_abs_sums), scaled by |scale_a|; then the epilogue's
# float32 roundings: acc * scale_a and the bias add (or one fma), u |product| + u |pre|.
# ---------------------------------------------------------------------------------------------
BLOCK_SCALE_ROUNDINGS = 2


def w4a8_accumulation_error(variant, abs_sums, k):
    """The bound on |acc32 - acc| of ck_gemm_w4a8's sums (see above)."""
    return accumulation_error(variant, abs_sums, k) + BLOCK_SCALE_ROUNDINGS * U32 * abs_sums


def use_variant(monkeypatch, variant, m):
    """Forces the variant (auto: the library's choice), skipping below FP8 tensor cores."""
    cc = compute_capability()
    if cc < FP8_MIN_CC:
        pytest.skip(f"W4A8 needs FP8 tensor cores, compute capability 8.9+ (this GPU: {cc})")
    if variant == "small_m":
        assert m <= SMALL_M_MAX, "small_m serves m <= 16"
    force_variant(monkeypatch, KERNEL_ENV, variant)


def need_fp8():
    if compute_capability() < FP8_MIN_CC:
        pytest.skip("W4A8 needs FP8 tensor cores (compute capability 8.9+)")


def need_torch_fp8():
    """torch with CUDA (skipped without it) and FP8 tensor cores: the torch module."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs torch with CUDA")
    need_fp8()
    return torch


# ---------------------------------------------------------------------------------------------
# Random operands
# ---------------------------------------------------------------------------------------------
# The rms of a code drawn uniformly from -8 .. 7: sqrt(344 / 16).
RMS_CODE = (344 / 16) ** 0.5
# Weight scales 10^U(-2.5, -1): a scale applied to the wrong block is off by up to 30x.
SCALE_EXPONENTS = (-2.5, -1.0)
TYPICAL_SCALE = 10.0 ** (sum(SCALE_EXPONENTS) / 2)


def random_weight(rng, n, k, group_size, scale_dtype, positive=False):
    """(w_packed [N, K / 2], w_scales [N, groups] in scale_dtype's representation): codes drawn
    uniformly from -8 .. 7 (0 .. 7 with positive=True), positive scales spread as above."""
    q = rng.integers(0 if positive else -8, 8, (n, k)).astype(np.int8)
    groups = ref.int4_groups_per_row(k, group_size)
    scales = 10.0 ** rng.uniform(*SCALE_EXPONENTS, (n, groups))
    return ref.pack_int4(q, signed=True), ref.to_dtype(scales.astype(np.float32), scale_dtype)


def random_scale_a(rng, count, k):
    """Positive float32 scales that bring |acc| (~ sqrt(K) RMS_CODE TYPICAL_SCALE for N(0, 1)
    activations) near 1, spread over a factor of 30."""
    return (10.0 ** rng.uniform(-1, 0.5, count)
            / (k**0.5 * RMS_CODE * TYPICAL_SCALE)).astype(np.float32)


# ---------------------------------------------------------------------------------------------
# One call on guarded buffers
# ---------------------------------------------------------------------------------------------
MISALIGN_KEYS = ("a", "w_packed", "w_scales", "scale_a", "bias", "out")


class GemmW4A8Call(KernelCall):
    """ck_gemm_w4a8 on guarded buffers; misalign: {buffer: extra bytes before it}."""

    def __init__(self, variant, a, scale_a, granularity, w_packed, w_scales, scale_dtype,
                 group_size, bias, activation, out_dtype, misalign=None):
        misalign = dict(misalign or {})
        assert set(misalign) <= set(MISALIGN_KEYS), misalign
        self.variant, self.granularity, self.scale_dtype = variant, granularity, scale_dtype
        self.group_size, self.activation, self.out_dtype = group_size, activation, out_dtype
        m, k = a.shape
        n = w_packed.shape[0]
        self.mnk = (m, n, k)
        self.inputs = (a, scale_a, w_packed, w_scales, bias)
        self.a = GuardedBuffer.input(a, misalign.get("a", 0))
        self.scale_a = GuardedBuffer.input(scale_a, misalign.get("scale_a", 0))
        self.w = GuardedBuffer.input(w_packed, misalign.get("w_packed", 0))
        self.w_scales = GuardedBuffer.input(w_scales, misalign.get("w_scales", 0))
        self.bias = None if bias is None else GuardedBuffer.input(bias, misalign.get("bias", 0))
        self.out = GuardedBuffer.output((m, n), ref.NUMPY_DTYPE[out_dtype], NAN_POISON,
                                        misalign.get("out", 0))
        self.outputs = {"out": self.out}

    def launch(self, stream=0):
        ck.raw.gemm_w4a8(
            self.a.ptr, self.scale_a.ptr, CK_GRANULARITY[self.granularity], self.w.ptr,
            self.w_scales.ptr, CK_DTYPE[self.scale_dtype], self.group_size,
            ptr_or_null(self.bias), CK_ACTIVATION[self.activation], *self.mnk, self.out.ptr,
            CK_DTYPE[self.out_dtype], stream)

    def refill(self, rng):
        """Fresh operands, scales and bias into the same buffers (a graph replay reads them)."""
        m, n, k = self.mnk
        a = random_e4m3(rng, (m, k))
        scale_a = random_scale_a(rng, self.scale_a.shape[0], k)
        w_packed, w_scales = random_weight(rng, n, k, self.group_size, self.scale_dtype)
        bias = None if self.bias is None else random_normal(rng, n, self.out_dtype, 2.0)
        write_buffers((self.a, self.scale_a, self.w, self.w_scales, self.bias),
                      (a, scale_a, w_packed, w_scales, bias))
        self.inputs = (a, scale_a, w_packed, w_scales, bias)

    def expected(self):
        """(value, pre-activation value, float32 error bound) of the inputs, in float64."""
        a, scale_a, w_packed, w_scales, bias = self.inputs
        k = self.mnk[2]
        acc = ref.gemm_w4a8(a, w_packed, w_scales, self.group_size, self.scale_dtype)
        abs_sums = ref.gemm_w4a8_abs_sums(a, w_packed, w_scales, self.group_size,
                                          self.scale_dtype)
        sa = np.abs(ref.scaled_epilogue_f64(np.ones_like(acc), scale_a, np.float32(1)))
        pre = ref.scaled_epilogue_f64(acc, scale_a, np.float32(1), bias, "none", self.out_dtype)
        error32 = (w4a8_accumulation_error(self.variant, abs_sums, k) * sa
                   + (np.abs(acc * sa) + np.abs(pre)) * U32) * SECOND_ORDER_SLACK
        return ref.activate(pre, self.activation), pre, error32

    def check(self, ctx):
        synchronize()
        value, pre, error32 = self.expected()
        got = ref.to_f32(self.out.read(f"out, {ctx}"), self.out_dtype).astype(np.float64)
        assert_within(got, value, output_tolerance(value, error32, self.out_dtype),
                      f"out ({self.out_dtype}), {ctx}")
        if self.activation == "relu":
            assert_relu_output(got, pre, error32, f"out, {ctx}")
        return got


def make_call(rng, variant, shape, group_size=128, scale_dtype="fp16", granularity="row",
              out_dtype="fp16", bias=True, activation="relu", misalign=None):
    m, n, k = shape
    a = random_e4m3(rng, (m, k))
    scale_a = random_scale_a(rng, scale_count(granularity, m), k)
    w_packed, w_scales = random_weight(rng, n, k, group_size, scale_dtype)
    bias_values = random_normal(rng, n, out_dtype, 2.0) if bias else None
    return GemmW4A8Call(variant, a, scale_a, granularity, w_packed, w_scales, scale_dtype,
                        group_size, bias_values, activation, out_dtype, misalign)


# ---------------------------------------------------------------------------------------------
# Shapes, variants, epilogues
# ---------------------------------------------------------------------------------------------
# (M, N, K): M 1 .. 16 (the weight stream) and 17 .. 300 (tiles of 64 or 128 rows, partial);
# N 8, 129 (odd: the scalar stores), 200, 384; K from one 32-wide vector of codes to 4128
# (32 blocks and a partial one), 160 = a block and a partial group.
SMALL_SHAPES = [(1, 8, 32), (1, 384, 4128), (5, 200, 160), (16, 384, 1024), (16, 8, 256),
                (13, 129, 288)]
LARGE_SHAPES = [(17, 200, 256), (64, 384, 4128), (130, 8, 1024), (300, 200, 160),
                (300, 384, 32), (17, 8, 4128), (64, 129, 160), (130, 384, 256)]


def variant_shapes(shapes):
    """(variant, shape, group_size, scale_dtype, granularity) params: every variant on every
    shape it serves, both groups; the scale dtype and scale_a's granularity alternate with the
    shape."""
    for variant in VARIANTS:
        for index, shape in enumerate(shapes):
            if (variant == "small_m" and shape[0] > SMALL_M_MAX) or not small_enough(*shape):
                continue
            scale_dtype = SCALE_DTYPES[index % 2]
            granularity = ref.GRANULARITIES[index // 2 % 2]
            for group_size in GROUP_SIZES:
                yield pytest.param(variant, shape, group_size, scale_dtype, granularity,
                                   id=f"{variant}-{shape_id(shape)}-{GROUP_IDS[group_size]}-"
                                      f"{scale_dtype}-a_{granularity}")


@pytest.mark.parametrize("variant, shape, group_size, scale_dtype, granularity",
                         list(variant_shapes(SMALL_SHAPES + LARGE_SHAPES)))
def test_gemm_w4a8_shapes(variant, shape, group_size, scale_dtype, granularity, monkeypatch,
                          seed):
    use_variant(monkeypatch, variant, shape[0])
    call = make_call(np.random.default_rng(seed), variant, shape, group_size, scale_dtype,
                     granularity)
    call.launch()
    call.check(f"{variant}, seed={seed}")


# Shapes for the wgmma kernel's plans on the H100's 132 SMs: more output tiles than SMs, so that
# each persistent CTA takes several tiles in turn (its ring's stages and phases run on across
# them): 306 tiles of 64 rows (3 chunks of K each, the last partial) and 264 tiles of 128 rows
# (2 chunks); M = 4 on a weight of 12800 rows (100 tiles of 128 columns), which auto runs on
# wgmma rather than the small-M stream; and 18 tiles of 16 chunks, which split K over clusters
# of 4 CTAs (the small shapes above with K = 4128 or 8192 split it over 8).
PLAN_SHAPES = [(1100, 2100, 288), (3072, 1408, 160), (4, 12800, 544), (64, 2304, 2048)]


@pytest.mark.parametrize("shape", PLAN_SHAPES, ids=[shape_id(s) for s in PLAN_SHAPES])
@pytest.mark.parametrize("variant", ["auto", "wgmma"])
def test_gemm_w4a8_plans(variant, shape, monkeypatch, seed):
    use_variant(monkeypatch, variant, shape[0])
    call = make_call(np.random.default_rng(seed), variant, shape, 128, "bf16", "row")
    call.launch()
    call.check(f"{variant}, {shape_id(shape)}, seed={seed}")


@pytest.mark.parametrize("full", [False, True], ids=["tensor-plain", "row-bias-relu"])
@pytest.mark.parametrize("scale_dtype", SCALE_DTYPES)
@pytest.mark.parametrize("out_dtype", ref.DTYPES)
@pytest.mark.parametrize("variant", VARIANTS)
def test_gemm_w4a8_epilogues(variant, out_dtype, scale_dtype, full, monkeypatch, seed):
    m, n, k = (13, 200, 1056) if variant == "small_m" else (100, 200, 1056)
    use_variant(monkeypatch, variant, m)
    call = make_call(np.random.default_rng(seed), variant, (m, n, k),
                     128 if full else ref.GROUP_ROW, scale_dtype, "row" if full else "tensor",
                     out_dtype, bias=full, activation="relu" if full else "none")
    call.launch()
    call.check(f"{variant}, {out_dtype}, seed={seed}")


@pytest.mark.parametrize("group_size", GROUP_SIZES, ids=GROUP_IDS.get)
@pytest.mark.parametrize("variant", VARIANTS)
def test_gemm_w4a8_long_same_signed_sums(variant, group_size, monkeypatch, seed):
    """K = 8192 of positive products, sums ~K: the blocks' sums must be carried in float32
    (the tensor cores' own sums, kept over the whole of K, would drift far past the bound)."""
    rng = np.random.default_rng(seed)
    m, n, k = (16, 136, 8192) if variant == "small_m" or SANITIZE else (130, 264, 8192)
    use_variant(monkeypatch, variant, m)
    a = random_e4m3(rng, (m, k), positive=True)
    w_packed, w_scales = random_weight(rng, n, k, group_size, "bf16", positive=True)
    call = GemmW4A8Call(variant, a, np.ones(1, np.float32), "tensor", w_packed, w_scales, "bf16",
                        group_size, None, "none", "fp32")
    call.launch()
    got = call.check(f"{variant}, seed={seed}")
    # |N(0,1)| ~ 0.8 times codes 0 .. 7 (mean 3.5) times scales >= 10^-2.5: sums ~ K
    assert got.min() > 0.5 * k * 0.8 * 3.5 * 10**SCALE_EXPONENTS[0], f"seed={seed}"


@pytest.mark.parametrize("out_dtype", ["fp32", "bf16"])
@pytest.mark.parametrize("variant", VARIANTS)
def test_gemm_w4a8_minimally_aligned_pointers(variant, out_dtype, monkeypatch, seed):
    """a and w_packed 16-byte aligned only, scale_a 4-byte, w_scales, bias and out aligned to
    their element only (N even: every row of out starts so aligned)."""
    m, n, k = (9, 136, 1056) if variant == "small_m" else (100, 136, 1056)
    use_variant(monkeypatch, variant, m)
    element = np.dtype(ref.NUMPY_DTYPE[out_dtype]).itemsize
    misalign = dict(a=16, w_packed=48, w_scales=2, scale_a=4, bias=element, out=element)
    call = make_call(np.random.default_rng(seed), variant, (m, n, k), 128, "bf16", "row",
                     out_dtype, misalign=misalign)
    call.launch()
    call.check(f"{variant}, seed={seed}")


@pytest.mark.parametrize("variant", VARIANTS)
def test_gemm_w4a8_nan_codes_stay_in_their_rows(variant, monkeypatch, seed):
    """0x7F / 0xFF (E4M3 NaN) in a[i, :] makes row i NaN (in the first block, and in the
    partial last one); every other row is finite and within the bound."""
    rng = np.random.default_rng(seed)
    m, n, k = (5, 136, 288) if variant == "small_m" else (70, 136, 288)
    use_variant(monkeypatch, variant, m)
    call = make_call(rng, variant, (m, n, k), 128, "fp16", "row", "fp32", bias=False,
                     activation="none")
    a, scale_a, w_packed, w_scales, bias = call.inputs
    nan_a = a.copy()
    nan_a[3, 17], nan_a[m - 1, k - 1] = 0x7F, 0xFF
    call.a.write(nan_a)
    call.launch()
    synchronize()
    got = call.out.read(f"out, {variant}")
    nan_rows = np.zeros(m, bool)
    nan_rows[[3, m - 1]] = True
    assert np.isnan(got[nan_rows]).all(), f"rows 3 and {m - 1} must be NaN, seed={seed}"
    call.inputs = (a[~nan_rows], scale_a[~nan_rows], w_packed, w_scales, bias)
    value, _, error32 = call.expected()
    clean = got[~nan_rows].astype(np.float64)
    assert_within(clean, value, output_tolerance(value, error32, "fp32"),
                  f"finite rows, {variant}, seed={seed}")


# ---------------------------------------------------------------------------------------------
# Graphs, the override
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("m", [5, 64])
def test_gemm_w4a8_graph_replays(m, monkeypatch, seed):
    rng = np.random.default_rng(seed)
    use_variant(monkeypatch, "auto", m)
    call = make_call(rng, "auto", (m, 200, 1056), ref.GROUP_ROW if m < 16 else 128, "bf16")
    assert_graph_replays(call, rng, seed)


def test_gemm_w4a8_override_read_on_every_call(monkeypatch, seed):
    need_fp8()
    call = make_call(np.random.default_rng(seed), "auto", (32, 64, 256))   # any variant's bound
    assert_override_read_on_every_call(call, monkeypatch, KERNEL_ENV, seed)


def test_gemm_w4a8_small_m_refuses_m_past_16(monkeypatch, seed):
    need_fp8()
    call = make_call(np.random.default_rng(seed), "small_m", (17, 64, 128))
    force_variant(monkeypatch, KERNEL_ENV, "small_m")
    call.poison_outputs()
    assert_forced_variant_unsupported(call, KERNEL_ENV, "small_m", "m=17")


def test_gemm_w4a8_wgmma_only_on_hopper(monkeypatch, seed):
    """wgmma needs a compute capability 9.0 GPU: forced there, it computes the product;
    forced elsewhere, the call is refused and writes nothing."""
    need_fp8()
    call = make_call(np.random.default_rng(seed), "wgmma", (64, 64, 128))
    monkeypatch.setenv(KERNEL_ENV, "wgmma")
    call.poison_outputs()
    if compute_capability() == (9, 0):
        call.launch()
        call.check(f"forced wgmma, seed={seed}")
    else:
        assert_forced_variant_unsupported(call, KERNEL_ENV, "wgmma")


# ---------------------------------------------------------------------------------------------
# The wrapper: ck.gemm_w4a8
# ---------------------------------------------------------------------------------------------
def assert_meets_call(call, got, ctx, row=None):
    """A wrapper's result (host data in out_dtype's representation) against the call's
    reference value and bound (all of it, or the one row `row` for a 1-D result)."""
    value, _, error32 = call.expected()
    if row is not None:
        value, error32 = value[row], error32[row]
    got64 = ref.to_f32(np.asarray(got), call.out_dtype).astype(np.float64)
    assert got64.shape == value.shape, (got64.shape, value.shape)
    assert_within(got64, value, output_tolerance(value, error32, call.out_dtype),
                  f"out ({call.out_dtype}), {ctx}")


@pytest.mark.parametrize("scale_dtype", SCALE_DTYPES)
@pytest.mark.parametrize("group_size", GROUP_SIZES, ids=GROUP_IDS.get)
def test_gemm_w4a8_wrapper_numpy(group_size, scale_dtype, seed):
    """ck.gemm_w4a8 on NumPy arrays (NumPy out; bf16 scales as uint16 with scale_dtype="bf16";
    scale_a as a Python float too, and a 1-D a with a 1-D result)."""
    need_fp8()
    rng = np.random.default_rng(seed)
    m, n, k = 33, 72, 544
    out_dtype = "bf16"
    call = make_call(rng, "auto", (m, n, k), group_size, scale_dtype, "row", out_dtype)
    a, scale_a, w_packed, w_scales, bias = call.inputs
    sd = "bf16" if scale_dtype == "bf16" else None
    got = ck.gemm_w4a8(a, scale_a, w_packed, w_scales, group_size=group_size, bias=bias,
                       activation="relu", out_dtype=out_dtype, scale_dtype=sd)
    assert isinstance(got, np.ndarray) and got.dtype == np.uint16 and got.shape == (m, n)
    assert_meets_call(call, got, f"NumPy, seed={seed}")
    one = ck.gemm_w4a8(a[0], float(scale_a[0]), w_packed, w_scales, group_size=group_size,
                       bias=bias, activation="relu", out_dtype=out_dtype, scale_dtype=sd)
    assert one.shape == (n,)
    assert_meets_call(call, one, f"1-D a, seed={seed}", row=0)
    if scale_dtype == "bf16":
        with pytest.raises(TypeError):   # uint16 scales do not say bf16 themselves
            ck.gemm_w4a8(a, scale_a, w_packed, w_scales, group_size=group_size)
    with pytest.raises(ck.CKError) as info:   # an INT4 group size ck_gemm_w4a8 does not take
        ck.gemm_w4a8(a, scale_a, w_packed, np.ones((n, -(-k // 64)), np.float16),
                     group_size=64)
    assert info.value.status == ck.Status.UNSUPPORTED, info.value.message


def test_gemm_w4a8_wrapper_device_arrays(seed):
    """DeviceArrays in, a DeviceArray out; out= written in place; per-tensor scale_a (a host
    array, uploaded), fp32 out, no bias, one scale per row of the weight."""
    need_fp8()
    rng = np.random.default_rng(seed)
    m, n, k = 20, 136, 256
    call = make_call(rng, "auto", (m, n, k), ref.GROUP_ROW, "fp16", "tensor", "fp32",
                     bias=False, activation="none")
    a, scale_a, w_packed, w_scales, _ = call.inputs
    dev = [to_device(x) for x in (a, w_packed, w_scales)]
    got = ck.gemm_w4a8(dev[0], to_device(scale_a), dev[1], dev[2], group_size=ref.GROUP_ROW,
                       out_dtype="fp32")
    assert isinstance(got, ck.DeviceArray) and got.shape == (m, n)
    synchronize()
    assert_meets_call(call, to_host(got), f"DeviceArray out, seed={seed}")
    out = ck.DeviceArray.empty((m, n), np.float32)
    same = ck.gemm_w4a8(dev[0], scale_a, dev[1], dev[2], group_size=ref.GROUP_ROW,
                        out_dtype="fp32", out=out)
    assert same is out
    synchronize()
    assert_meets_call(call, to_host(out), f"out=, seed={seed}")


def test_gemm_w4a8_wrapper_torch(seed):
    """torch tensors in (bf16 scales as torch.bfloat16, which says its dtype), a torch tensor
    out on the device."""
    torch = need_torch_fp8()
    rng = np.random.default_rng(seed)
    m, n, k = 24, 200, 288
    call = make_call(rng, "auto", (m, n, k), 128, "bf16", "row", "fp16")
    a, scale_a, w_packed, w_scales, bias = call.inputs
    cuda = lambda x: torch.from_numpy(np.ascontiguousarray(x)).cuda()   # noqa: E731
    scales_t = cuda(w_scales.view(np.int16)).view(torch.bfloat16)
    y = ck.gemm_w4a8(cuda(a), cuda(scale_a), cuda(w_packed), scales_t, bias=cuda(bias),
                     activation="relu", out_dtype="fp16")
    assert isinstance(y, torch.Tensor) and y.is_cuda and y.dtype == torch.float16
    torch.cuda.synchronize()
    assert_meets_call(call, y.cpu().numpy(), f"torch, seed={seed}")


# ---------------------------------------------------------------------------------------------
# W4A8Linear: the layer (the weight quantized once, each call's activations on the device)
# ---------------------------------------------------------------------------------------------
def w4a8_linear_reference(x, w, bias, group_size, dtype):
    """The layer's values in float64 from the quantizers' references (E4M3 per row of x,
    symmetric INT4 of w in groups) and their float32 error bound (the auto variant)."""
    qx, sx = ref.quantize_fp8(x, dtype, "e4m3", "row")
    packed, scales, _ = ref.quantize_int4(w, dtype, group_size, "sym")
    pre = ref.gemm_w4a8_f64(qx, sx, packed, scales, group_size, dtype, bias, "none", dtype)
    abs_sums = ref.gemm_w4a8_abs_sums(qx, packed, scales, group_size, dtype)
    sa = np.abs(sx.astype(np.float64))[:, None]
    acc = ref.gemm_w4a8(qx, packed, scales, group_size, dtype)
    error32 = (w4a8_accumulation_error("auto", abs_sums, x.shape[1]) * sa
               + (np.abs(acc) * sa + np.abs(pre)) * U32) * SECOND_ORDER_SLACK
    return pre, error32


@pytest.mark.parametrize("m", [1, 37])
@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
@pytest.mark.parametrize("group_size", GROUP_SIZES, ids=GROUP_IDS.get)
def test_w4a8_linear_numpy(group_size, dtype, m, seed):
    """QuantizedLinear.from_float(..., activations="fp8") on NumPy data: a W4A8Linear whose
    calls give the float64 value of the quantized operands within the bound, and the float
    layer up to the two quantizations."""
    need_fp8()
    rng = np.random.default_rng(seed)
    k, n = 416, 264
    w = ref.to_dtype((rng.standard_normal((n, k)) * 0.05).astype(np.float32), dtype)
    x = ref.to_dtype(rng.standard_normal((m, k)).astype(np.float32), dtype)
    bias = ref.to_dtype(rng.standard_normal(n).astype(np.float32), dtype)
    dtype_arg = "bf16" if dtype == "bf16" else None
    layer = ck.QuantizedLinear.from_float(w, bias=bias, group_size=group_size, dtype=dtype_arg,
                                          activation="relu", activations="fp8")
    assert isinstance(layer, ck.W4A8Linear)
    assert (layer.in_features, layer.out_features, layer.group_size) == (k, n, group_size)
    got = layer(x)
    assert isinstance(got, np.ndarray) and got.dtype == ref.NUMPY_DTYPE[dtype]
    assert got.shape == (m, n)
    pre, error32 = w4a8_linear_reference(x, w, bias, group_size, dtype)
    value = np.maximum(pre, 0)
    got64 = ref.to_f32(got, dtype).astype(np.float64)
    assert_within(got64, value, output_tolerance(value, error32, dtype),
                  f"W4A8Linear, seed={seed}")
    # E4M3 keeps 3 mantissa bits (2^-4 of each activation), INT4 half a step of absmax / 7.
    exact = np.maximum(ref.to_f32(x, dtype).astype(np.float64)
                       @ ref.to_f32(w, dtype).astype(np.float64).T
                       + ref.to_f32(bias, dtype), 0)
    rel = np.linalg.norm(got64 - exact) / np.linalg.norm(exact)
    assert rel < 0.2, f"relative error {rel:.3g} against the float layer, seed={seed}"
    one = layer(x[0])   # a single token, 1-D
    assert one.shape == (n,)
    assert_within(ref.to_f32(one, dtype).astype(np.float64), value[0],
                  output_tolerance(value[0], error32[0], dtype), f"1-D, seed={seed}")


def test_w4a8_linear_torch(seed):
    """torch tensors in, torch tensors out, on the device: the weight quantized into torch
    tensors, the values of the quantized operands."""
    torch = need_torch_fp8()
    rng = np.random.default_rng(seed)
    m, k, n = 20, 544, 136
    w16 = (rng.standard_normal((n, k)) * 0.05).astype(np.float16)
    x16 = rng.standard_normal((m, k)).astype(np.float16)
    layer = ck.QuantizedLinear.from_float(torch.from_numpy(w16).cuda(), activations="fp8")
    w_packed, w_scales = layer.weight
    assert isinstance(w_packed, torch.Tensor) and w_packed.is_cuda
    assert isinstance(w_scales, torch.Tensor) and w_scales.dtype == torch.float16
    y = layer(torch.from_numpy(x16).cuda())
    assert isinstance(y, torch.Tensor) and y.is_cuda and y.dtype == torch.float16
    torch.cuda.synchronize()
    pre, error32 = w4a8_linear_reference(x16, w16, None, 128, "fp16")
    assert_within(y.cpu().numpy().astype(np.float64), pre,
                  output_tolerance(pre, error32, "fp16"), f"torch, seed={seed}")
