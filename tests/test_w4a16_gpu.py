"""GPU tests of the weight-only INT4 linear layer ck_gemm_w4a16 against tests/reference.py.

- The weight is made on the host in the library's interchange format, either by the reference
  quantizer (ref.quantize_int4) from random float weights, or as uniformly random bytes (every
  nibble value, -8 and 15 included) with random positive scales and random zero points.
- The output is compared with the float64 reference ref.gemm_w4a16_f64 (x times the weight
  dequantized exactly as ck_dequantize_int4 does, rounded to dtype) under a tolerance derived
  from float32 accumulation plus half an ulp of the output dtype; ||err|| / ||ref|| is printed.
- dtype fp16/bf16 x mode sym/asym x group 32/64/128/row x kernel variant (CK_GEMM_W4A16_KERNEL =
  reference, small_m for M <= 16, tc, wgmma on compute capability 9.0, auto) x shapes
  with partial tiles in M, N and K (and partial last groups), bias or not, ReLU or not; full-size
  layers; small_m and reference agree on the same data; a forced variant that cannot serve is
  CK_STATUS_UNSUPPORTED; auto picks wgmma for M > 16 on compute capability 9.0, tc elsewhere.
  The wgmma kernel's block rows (64, 128, 256) and K splits (1, 2, 4, 8 blocks per tile, a
  share of K each, partials summed in distributed shared memory) are forced one by one.
- Every output is poisoned and sits between guard regions (gpu_support.GuardedBuffer):
  an unwritten element or an out-of-bounds write fails. CUDA graph capture and replay. The
  wrapper's ck.gemm_w4a16 (NumPy in/out, DeviceArray in/out, out=) against the raw call.

The tests skip without a CUDA device. CK_SANITIZE=1 drops the largest shapes. Each test draws a
seed from os.urandom, prints it and names it in its messages; CK_TEST_SEED=<seed> replays it.
"""

import math

import numpy as np
import pytest

import cuda_wrapper as ck
import reference as ref
from gpu_support import (
    CK_ACTIVATION, CK_DTYPE, CK_INT4_MODE, GROUP_IDS, GuardedBuffer, KernelCall, POISON, U32,
    assert_bitwise_equal, assert_capture_records_then_replay_writes,
    assert_forced_variant_unsupported, assert_graph_replays, assert_meets_reference,
    assert_override_read_on_every_call, assert_relu_output, assert_within, compute_capability,
    dot_float32_error, dtype_arg, force_variant, output_tolerance, ptr_or_null, random_normal,
    shape_id, small_enough, synchronize, write_buffers,
)

pytestmark = pytest.mark.gpu

KERNEL_ENV = "CK_GEMM_W4A16_KERNEL"
# Each variant is (entry point, CK_GEMM_W4A16_KERNEL): "plain" is ck_gemm_w4a16 on the
# interchange layout, "packed" ck_gemm_w4a16_prepacked on what ck_w4a16_prepack made of it.
VARIANTS = (("plain", "reference"), ("plain", "small_m"), ("plain", "auto"),
            ("packed", "reference"), ("packed", "small_m"), ("packed", "tc"), ("packed", "wgmma"),
            ("packed", "auto"))
FORCED = {v for v in VARIANTS if v[1] != "auto"}
SMALL_M_MAX = 16  # the small_m kernel serves m <= 16 (compute capability 8.0+)


def variant_id(variant):
    return f"{variant[0]}-{variant[1]}"


# ---------------------------------------------------------------------------------------------
# Tolerance
# ---------------------------------------------------------------------------------------------
# The products x * w' are exact in float32 (x and w' are fp16 or bf16 values: 11 + 11 or 8 + 8
# significand bits, fewer than 24). Their float32 sum, in any order, blocked or split along K, is
# within gamma_{K+1} * sum_k |x_k w'_k| of the exact sum (Higham, Thm. 3.1); the bias add is one
# more rounding (u |pre-activation|); ReLU is exact and 1-Lipschitz. Tensor cores accumulate
# float32 with truncation rather than rounding to nearest on some GPUs (Fasi et al., "Numerical
# behavior of NVIDIA tensor cores", 2021): the unit roundoff is then 2u, which this bound assumes.
# It is a worst case; real errors are ~sqrt(K) times smaller, while accumulating in fp16 or
# losing a product would be orders of magnitude larger. The rounding to fp16/bf16 then adds half
# an ulp of the output dtype (output_tolerance).
TENSOR_CORE_ROUNDOFF = 2 * U32
# The norm-wise sanity bound: gpu_support.assert_meets_reference.


def w4a16_float32_error(x_f64, w_f64, pre_activation):
    """The bound on |v32 - v| of ck_gemm_w4a16's float32 value (see the comment above)."""
    return dot_float32_error(x_f64, w_f64, pre_activation, TENSOR_CORE_ROUNDOFF)


# ---------------------------------------------------------------------------------------------
# Fixtures and helpers
# ---------------------------------------------------------------------------------------------
def use_variant(monkeypatch, variant, m):
    """Forces the kernel through CK_GEMM_W4A16_KERNEL; skips small_m and tc where the GPU has no
    such kernel. The M rule is the parametrization's business: asserted. variant: a kernel name
    or an (entry point, kernel) pair; returns whether it is prepacked."""
    entry, kernel = variant if isinstance(variant, tuple) else ("plain", variant)
    assert kernel != "small_m" or m <= SMALL_M_MAX, "small_m serves m <= 16"
    force_variant(monkeypatch, KERNEL_ENV, kernel)
    return entry == "packed"


def random_activations(rng, m, k, dtype):
    """x ~ N(0, 1) in dtype."""
    return random_normal(rng, (m, k), dtype)


def random_weight(rng, n, k, dtype, mode, group_size, source):
    """(w_packed, scales, zeros) of an [N, K] weight whose dequantized values are ~ N(0, 1/K)
    (outputs ~ N(0, 1), far inside fp16's range).

    source 'quantized': ref.quantize_int4 of random float weights (ref.random_input: rows of
    widely different magnitudes, all-positive and all-negative rows, outlier columns).
    source 'codes': uniformly random bytes (every code), random zero points in [0, 15] and
    positive scales spread over a factor of 10.
    """
    if source == "quantized":
        w = ref.random_input(rng, (n, k), dtype, scale=1.0 / math.sqrt(k))
        return ref.quantize_int4(w, dtype, group_size, mode)
    groups = ref.int4_groups_per_row(k, group_size)
    packed = rng.integers(0, 256, size=(n, k // 2), dtype=np.uint8)
    typical_code = 5.0  # |q - zero| of uniform codes is ~4.6 on average (rms)
    scales = (10.0 ** rng.uniform(-0.5, 0.5, (n, groups)) / (typical_code * math.sqrt(k)))
    scales = ref.to_dtype(scales.astype(np.float32), dtype)
    zeros = rng.integers(0, 16, size=(n, groups), dtype=np.uint8) if mode == "asym" else None
    return packed, scales, zeros


class W4A16Call(KernelCall):
    """One ck_gemm_w4a16 call: its guarded device buffers, its launch and its check.
    refill() writes fresh random inputs into the same buffers (as a graph replay needs)."""

    def __init__(self, x, weight, group_size, bias, activation, dtype, misalign=(0, 0, 0, 0, 0),
                 prepacked=False):
        """misalign: extra bytes before x, w_packed, scales, bias and out. prepacked: the call
        is ck_gemm_w4a16_prepacked on the weight ck_w4a16_prepack made on the device (into
        poisoned, guarded buffers) from the same interchange buffers."""
        self.group_size, self.activation, self.dtype = group_size, activation, dtype
        self.prepacked = prepacked
        w_packed, scales, zeros = weight
        m, k = x.shape
        n = w_packed.shape[0]
        assert w_packed.shape == (n, k // 2)
        assert scales.shape == (n, ref.int4_groups_per_row(k, group_size))
        self.mode = "sym" if zeros is None else "asym"
        self.mnk = (m, n, k)
        self.inputs = (x, w_packed, scales, zeros, bias)
        self.x = GuardedBuffer.input(x, misalign[0])
        self.w = GuardedBuffer.input(w_packed, misalign[1])
        self.scales = GuardedBuffer.input(scales, misalign[2])
        self.zeros = None if zeros is None else GuardedBuffer.input(zeros, 1)  # any address
        self.bias = None if bias is None else GuardedBuffer.input(bias, misalign[3])
        self.out = GuardedBuffer.output((m, n), ref.NUMPY_DTYPE[dtype], POISON, misalign[4])
        self.outputs = {"out": self.out}
        if prepacked:
            nbytes, nvalues = ref.w4a16_prepacked_sizes(n, k, group_size)
            self.w_pre = GuardedBuffer.output((nbytes,), np.uint8, POISON)
            self.scales_pre = GuardedBuffer.output((nvalues,), ref.NUMPY_DTYPE[dtype], POISON)
            self.zeros_pre = (None if zeros is None else
                              GuardedBuffer.output((nvalues,), np.uint8, POISON))
            self.prepack()

    def prepack(self, stream=0):
        """ck_w4a16_prepack of the interchange buffers into the prepacked ones."""
        m, n, k = self.mnk
        ck.raw.w4a16_prepack(self.w.ptr, self.scales.ptr, ptr_or_null(self.zeros),
                             CK_DTYPE[self.dtype], n, k, self.group_size, CK_INT4_MODE[self.mode],
                             self.w_pre.ptr, self.scales_pre.ptr, ptr_or_null(self.zeros_pre),
                             stream)

    def launch(self, stream=0):
        m, n, k = self.mnk
        if self.prepacked:
            ck.raw.gemm_w4a16_prepacked(
                self.x.ptr, CK_DTYPE[self.dtype], self.w_pre.ptr, self.scales_pre.ptr,
                ptr_or_null(self.zeros_pre), self.group_size, CK_INT4_MODE[self.mode],
                ptr_or_null(self.bias), CK_ACTIVATION[self.activation], m, n, k, self.out.ptr,
                stream)
            return
        ck.raw.gemm_w4a16(self.x.ptr, CK_DTYPE[self.dtype], self.w.ptr, self.scales.ptr,
                          ptr_or_null(self.zeros), self.group_size, CK_INT4_MODE[self.mode],
                          ptr_or_null(self.bias), CK_ACTIVATION[self.activation], m, n, k,
                          self.out.ptr, stream)

    def refill(self, rng, source="codes"):
        m, n, k = self.mnk
        x = random_activations(rng, m, k, self.dtype)
        w_packed, scales, zeros = random_weight(rng, n, k, self.dtype, self.mode,
                                                self.group_size, source)
        bias = None if self.bias is None else random_normal(rng, n, self.dtype)
        write_buffers((self.x, self.w, self.scales, self.zeros, self.bias),
                      (x, w_packed, scales, zeros, bias))
        self.inputs = (x, w_packed, scales, zeros, bias)
        if self.prepacked:   # outside any graph: the captured launch reads the new weight
            self.prepack()

    def check(self, ctx):
        """Compares with the float64 reference; returns (output in float64, reference, raw
        output). Prints ||err|| / ||ref|| and the largest |err|."""
        synchronize()
        x, w_packed, scales, zeros, bias = self.inputs
        k = self.mnk[2]
        w_deq = ref.dequantized_int4_weight(w_packed, scales, zeros, self.group_size, k,
                                            self.dtype)
        pre = ref.linear_f64(x, w_deq, bias, "none", self.dtype)
        value = ref.activate(pre, self.activation)
        error32 = w4a16_float32_error(ref.to_f32(x, self.dtype).astype(np.float64),
                                      ref.to_f32(w_deq, self.dtype).astype(np.float64), pre)
        out = self.out.read(f"out, {ctx}")
        got = ref.to_f32(out, self.dtype).astype(np.float64)
        assert_meets_reference(got, value, error32, self.dtype, ctx)
        if self.activation == "relu":
            assert_relu_output(got, pre, error32, f"out, {ctx}")
        return got, value, out


def make_call(rng, shape, dtype, mode, group_size, source="quantized", bias=True,
              activation="relu", misalign=(0, 0, 0, 0, 0), prepacked=False):
    m, n, k = shape
    x = random_activations(rng, m, k, dtype)
    weight = random_weight(rng, n, k, dtype, mode, group_size, source)
    bias_values = random_normal(rng, n, dtype) if bias else None
    return W4A16Call(x, weight, group_size, bias_values, activation, dtype, misalign, prepacked)


# ---------------------------------------------------------------------------------------------
# Every variant, dtype and mode over shapes with partial tiles
# ---------------------------------------------------------------------------------------------
# (M, N, K): M in {1, 2, 5, 8, 9, 16, 17, 33, 65, 100, 129, 257}, N in {1, 7, 8, 9, 64, 100,
# 136, 1000, 4096}, K in {32, 64, 96, 160, 1024, 4096}, each value several times, paired so that
# tiles are partial in every dimension and the last group of a row is partial (K = 96 with
# groups of 64, K = 160 with groups of 64 and 128). M <= 16 runs on small_m as well as on the
# reference kernel; wgmma runs every M (64-row blocks up to 64, then 128: 65, 129 and 257 leave
# one row over), its K split wherever the tiles alone leave SMs idle.
SHAPES = [
    (1, 1, 32), (1, 4096, 1024), (1, 100, 4096), (2, 7, 64), (2, 1000, 160), (5, 9, 96),
    (5, 64, 4096), (8, 8, 32), (8, 100, 1024), (9, 1000, 64), (9, 7, 4096), (16, 4096, 96),
    (16, 9, 160), (17, 64, 1024), (17, 1, 32), (33, 100, 160), (33, 4096, 64), (100, 8, 96),
    (100, 1000, 1024), (65, 7, 160), (129, 136, 1024), (257, 4096, 96), (65, 1000, 4096),
]
# Each shape gets one group size, one weight source, bias or not and ReLU or not, rotated so
# that every value meets every variant, dtype and mode (test_gemm_w4a16_group_sizes crosses the
# group sizes with everything on two shapes).
GROUP_ROTATION = (128, 32, ref.GROUP_ROW, 64)
SOURCE_ROTATION = ("quantized", "codes")
BIAS_ROTATION = (True, True, False)
ACTIVATION_ROTATION = ("relu", "none")


# The forced kernels run every dtype and mode on every shape; auto (which picks one of them)
# runs one pair per shape, rotated.
DTYPE_MODES = [(dtype, mode) for dtype in ref.W4A16_DTYPES for mode in ref.INT4_MODES]


def variant_serves(variant, m):
    return variant[1] != "small_m" or m <= SMALL_M_MAX


def main_cases():
    for i, shape in enumerate(SHAPES):
        if not small_enough(*shape):
            continue
        group = GROUP_ROTATION[i % len(GROUP_ROTATION)]
        source = SOURCE_ROTATION[i % len(SOURCE_ROTATION)]
        bias = BIAS_ROTATION[i % len(BIAS_ROTATION)]
        activation = ACTIVATION_ROTATION[(i // 2) % len(ACTIVATION_ROTATION)]
        for variant in VARIANTS:
            if not variant_serves(variant, shape[0]):
                continue
            pairs = DTYPE_MODES if variant in FORCED else [DTYPE_MODES[i % len(DTYPE_MODES)]]
            for dtype, mode in pairs:
                yield pytest.param(
                        variant, dtype, mode, shape, group, source, bias, activation,
                        id=f"{variant_id(variant)}-{dtype}-{mode}-{shape_id(shape)}-"
                           f"{GROUP_IDS[group]}-{source}-{'bias' if bias else 'nobias'}-"
                           f"{activation}")


@pytest.mark.parametrize("variant, dtype, mode, shape, group_size, source, bias, activation",
                         list(main_cases()))
def test_gemm_w4a16(variant, dtype, mode, shape, group_size, source, bias, activation,
                    monkeypatch, seed):
    prepacked = use_variant(monkeypatch, variant, shape[0])
    rng = np.random.default_rng(seed)
    call = make_call(rng, shape, dtype, mode, group_size, source, bias, activation,
                     prepacked=prepacked)
    call.launch()
    call.check(f"{variant_id(variant)}, seed={seed}")


# K = 160: a partial last group of 64 and of 128; K = 4096: many groups. The two alternate
# over the group sizes. wgmma also takes the same N and K with more rows (128-row blocks).
GROUP_SHAPES = [(9, 100, 160), (3, 72, 4096)]
GROUP_SHAPES_LARGE_M = [(137, 100, 160), (67, 72, 4096)]


def group_cases():
    for variant in (("plain", "reference"), ("plain", "small_m"), ("packed", "small_m"),
                    ("packed", "tc"), ("packed", "wgmma")):
        for dtype, mode in DTYPE_MODES:
            for i, group in enumerate(ref.INT4_GROUP_SIZES):
                shapes = GROUP_SHAPES + (GROUP_SHAPES_LARGE_M if variant[1] == "wgmma" else [])
                shape = shapes[(i + len(mode)) % len(shapes)]
                yield pytest.param(variant, dtype, mode, group, shape,
                                   id=f"{variant_id(variant)}-{dtype}-{mode}-"
                                      f"{GROUP_IDS[group]}-{shape_id(shape)}")


@pytest.mark.parametrize("variant, dtype, mode, group_size, shape", list(group_cases()))
def test_gemm_w4a16_group_sizes(variant, dtype, mode, group_size, shape, monkeypatch, seed):
    """Every group size on both kernels, every dtype and mode, with a weight whose scales
    differ a lot between groups (codes source)."""
    prepacked = use_variant(monkeypatch, variant, shape[0])
    rng = np.random.default_rng(seed)
    call = make_call(rng, shape, dtype, mode, group_size, "codes", bias=True, activation="none",
                     prepacked=prepacked)
    call.launch()
    call.check(f"{variant_id(variant)}, seed={seed}")


LARGE = [(("plain", "small_m"), (16, 14336, 4096)), (("plain", "auto"), (1, 14336, 4096)),
         (("plain", "reference"), (64, 4096, 4096)), (("packed", "small_m"), (16, 14336, 4096)),
         (("packed", "auto"), (1, 4096, 14336)), (("packed", "tc"), (256, 14336, 4096)),
         (("packed", "auto"), (1000, 4096, 4096)), (("packed", "wgmma"), (256, 14336, 4096)),
         (("packed", "wgmma"), (1000, 4096, 4096))]


@pytest.mark.parametrize("variant, shape", [
    pytest.param(v, s, id=f"{variant_id(v)}-{shape_id(s)}") for v, s in LARGE
    if small_enough(*s)])
@pytest.mark.parametrize("dtype", ref.W4A16_DTYPES)
def test_gemm_w4a16_large(variant, shape, dtype, monkeypatch, seed):
    """Full-size layers (the DESIGN shapes): group 128, asymmetric, bias and ReLU."""
    prepacked = use_variant(monkeypatch, variant, shape[0])
    rng = np.random.default_rng(seed)
    call = make_call(rng, shape, dtype, "asym", 128, "codes", bias=True, activation="relu",
                     prepacked=prepacked)
    call.launch()
    call.check(f"{variant_id(variant)}, seed={seed}")


@pytest.mark.parametrize("dtype", ref.W4A16_DTYPES)
@pytest.mark.parametrize("mode", ref.INT4_MODES)
def test_gemm_w4a16_element_aligned_pointers(dtype, mode, monkeypatch, seed):
    """x and w_packed 16-byte aligned (not 256), scales, bias and out only element aligned,
    zeros at an odd address: the least the header requires, on every kernel (wgmma with 70
    rows, the others with 7)."""
    rng = np.random.default_rng(seed)
    for variant in (("plain", "reference"), ("plain", "small_m"), ("packed", "small_m"),
                    ("packed", "tc"), ("packed", "wgmma")):
        m = 70 if variant[1] == "wgmma" else 7
        if variant[1] == "wgmma" and compute_capability() != (9, 0):
            continue  # use_variant would skip the whole test
        prepacked = use_variant(monkeypatch, variant, m)
        call = make_call(rng, (m, 73, 224), dtype, mode, 64, "quantized",
                         misalign=(16, 48, 2, 6, 2), prepacked=prepacked)
        call.launch()
        call.check(f"{variant_id(variant)}, seed={seed}")


# ---------------------------------------------------------------------------------------------
# small_m and reference agree; the override
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("shape", [(1, 4096, 1024), (16, 1000, 4096), (5, 7, 160)], ids=shape_id)
@pytest.mark.parametrize("dtype", ref.W4A16_DTYPES)
def test_small_m_and_reference_agree(dtype, shape, monkeypatch, seed):
    """The two kernels on the same device buffers: each within tolerance of the reference, and
    within the sum of their tolerances of each other (their float32 sums may differ in order)."""
    rng = np.random.default_rng(seed)
    call = make_call(rng, shape, dtype, "asym", 128, "quantized", bias=True, activation="none")
    results = {}
    for variant in ("reference", "small_m"):
        use_variant(monkeypatch, variant, shape[0])
        call.poison_outputs()
        call.launch()
        results[variant] = call.check(f"{variant}, seed={seed}")
    (a, value, _), (b, _, _) = results["reference"], results["small_m"]
    x, w_packed, scales, zeros, bias = call.inputs
    w_deq = ref.dequantized_int4_weight(w_packed, scales, zeros, 128, shape[2], dtype)
    error32 = w4a16_float32_error(ref.to_f32(x, dtype).astype(np.float64),
                                  ref.to_f32(w_deq, dtype).astype(np.float64), value)
    tol = 2 * output_tolerance(value, error32, dtype)
    assert_within(b, a, tol, f"small_m vs reference, seed={seed}")
    diff = np.linalg.norm(a - b) / max(np.linalg.norm(value), 1e-30)
    print(f"||small_m - reference|| / ||ref|| = {diff:.3g}")


@pytest.mark.parametrize("m", [17, 100])
def test_forced_small_m_beyond_16_rows_is_unsupported(m, monkeypatch, seed):
    """small_m serves m <= 16 only: forced beyond, CK_STATUS_UNSUPPORTED, nothing written."""
    monkeypatch.setenv(KERNEL_ENV, "small_m")
    call = make_call(np.random.default_rng(seed), (m, 64, 64), "fp16", "sym", 32)
    assert_forced_variant_unsupported(call, KERNEL_ENV, "small_m")


def test_kernel_override_is_read_on_every_call(monkeypatch, seed):
    if compute_capability() < (8, 0):
        pytest.skip("small_m needs compute capability 8.0+")
    call = make_call(np.random.default_rng(seed), (20, 64, 128), "bf16", "asym", 64)
    assert_override_read_on_every_call(call, monkeypatch, KERNEL_ENV, seed)


# ---------------------------------------------------------------------------------------------
# CUDA graphs
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("variant", VARIANTS, ids=variant_id)
@pytest.mark.parametrize("dtype", ref.W4A16_DTYPES)
def test_cuda_graph_replay(variant, dtype, monkeypatch, seed):
    """Capture records the launch without running it; each replay reads the new contents of
    the same buffers and writes the whole output."""
    rng = np.random.default_rng(seed)
    m = {"small_m": 9, "auto": 9, "wgmma": 72}.get(variant[1], 40)
    prepacked = use_variant(monkeypatch, variant, m)
    call = make_call(rng, (m, 136, 288), dtype, "asym", 32, prepacked=prepacked)
    assert_graph_replays(call, rng, seed)


def test_prepack_is_captured_in_a_graph(seed):
    """ck_w4a16_prepack itself is capturable: recorded, not run; the replay writes it all."""
    rng = np.random.default_rng(seed)
    call = make_call(rng, (3, 40, 96), "fp16", "asym", 32, prepacked=True)
    call.w_pre.poison()
    assert_capture_records_then_replay_writes(call.prepack, call.w_pre, "the prepack")
    _, w_packed, scales, zeros, _ = call.inputs
    want, _, _ = ref.w4a16_prepack(w_packed, scales, zeros, 40, 96, 32)
    assert_bitwise_equal(call.w_pre.read("w_prepacked"), want, f"replayed prepack, seed={seed}")


# ---------------------------------------------------------------------------------------------
# The prepack: bit for bit the layout of cuda_kernels.h (ref.w4a16_prepack), padding included;
# nothing written past its buffers.
# ---------------------------------------------------------------------------------------------
PREPACK_SHAPES = [(1, 32), (8, 128), (9, 96), (40, 160), (100, 4096), (1000, 224)]


@pytest.mark.parametrize("n, k", PREPACK_SHAPES, ids=lambda v: str(v))
@pytest.mark.parametrize("group_size", ref.INT4_GROUP_SIZES, ids=lambda g: GROUP_IDS[g])
@pytest.mark.parametrize("mode", ref.INT4_MODES)
@pytest.mark.parametrize("dtype", ref.W4A16_DTYPES)
def test_prepack_layout(dtype, mode, group_size, n, k, seed):
    rng = np.random.default_rng(seed)
    call = make_call(rng, (1, n, k), dtype, mode, group_size, "codes", prepacked=True)
    synchronize()
    _, w_packed, scales, zeros, _ = call.inputs
    want_w, want_s, want_z = ref.w4a16_prepack(w_packed, scales, zeros, n, k, group_size)
    ctx = f"{dtype}-{mode}-g{group_size}-{n}x{k}, seed={seed}"
    assert_bitwise_equal(call.w_pre.read("w_prepacked"), want_w, f"w_prepacked, {ctx}")
    assert_bitwise_equal(call.scales_pre.read("scales_prepacked"), want_s,
                         f"scales_prepacked, {ctx}")
    if want_z is not None:
        assert_bitwise_equal(call.zeros_pre.read("zeros_prepacked"), want_z,
                             f"zeros_prepacked, {ctx}")


@pytest.mark.parametrize("shape", [(1, 4096, 1024), (16, 1000, 4096), (5, 7, 160),
                                   (64, 1000, 1024)], ids=shape_id)
@pytest.mark.parametrize("dtype", ref.W4A16_DTYPES)
def test_prepacked_and_plain_agree(dtype, shape, monkeypatch, seed):
    """On the same weight, ck_gemm_w4a16_prepacked's fast kernel and ck_gemm_w4a16's
    reference kernel each meet the reference, and agree within the sum of their tolerances;
    the prepacked reference kernel returns exactly the plain reference kernel's bits (the same
    operations in the same order on the same values)."""
    rng = np.random.default_rng(seed)
    plain = make_call(rng, shape, dtype, "asym", 64, "quantized", bias=True, activation="none")
    x, w_packed, scales, zeros, bias = plain.inputs
    packed = W4A16Call(x, (w_packed, scales, zeros), 64, bias, "none", dtype, prepacked=True)
    use_variant(monkeypatch, "reference", shape[0])
    plain.launch()
    a, value, a_raw = plain.check(f"plain reference, seed={seed}")
    packed.launch()
    _, _, p_raw = packed.check(f"prepacked reference, seed={seed}")
    assert_bitwise_equal(p_raw, a_raw, f"prepacked vs plain reference kernel, seed={seed}")
    monkeypatch.setenv(KERNEL_ENV, "auto")
    packed.poison_outputs()
    packed.launch()
    b, _, _ = packed.check(f"prepacked auto, seed={seed}")
    w_deq = ref.dequantized_int4_weight(w_packed, scales, zeros, 64, shape[2], dtype)
    error32 = w4a16_float32_error(ref.to_f32(x, dtype).astype(np.float64),
                                  ref.to_f32(w_deq, dtype).astype(np.float64), value)
    assert_within(b, a, 2 * output_tolerance(value, error32, dtype),
                  f"prepacked auto vs plain reference, seed={seed}")


@pytest.mark.parametrize("kernel, m", [("tc", 40), ("wgmma", 100)])
def test_forced_tc_on_the_plain_layout_is_unsupported(kernel, m, monkeypatch, seed):
    """tc and wgmma read only the prepacked layout: forced on ck_gemm_w4a16,
    CK_STATUS_UNSUPPORTED (on any GPU)."""
    monkeypatch.setenv(KERNEL_ENV, kernel)
    call = make_call(np.random.default_rng(seed), (m, 64, 64), "fp16", "sym", 32)
    assert_forced_variant_unsupported(call, KERNEL_ENV, kernel, must_say="prepacked")


def check_twice(call, ctx):
    """Checks a launched call, then launches it again on poisoned outputs: the same bits (the
    kernels add their partial sums in a fixed order)."""
    _, _, first = call.check(ctx)
    call.poison_outputs()
    call.launch()
    _, _, again = call.check(f"{ctx}, second launch")
    assert_bitwise_equal(again, first, f"{ctx}: two launches")


# The wgmma kernel's three block shapes (64, 128 or 256 rows of x), forced: K of 1 to 8 chunks
# (96, 128, 256, 384, 1024: the steps of one chunk still in flight while the next is
# dequantized), partial tiles in M and N, every group size, both modes. Its automatic choice
# takes 256 only on large outputs (test_gemm_w4a16_large).
WGMMA_ROWS_ENV = "CK_GEMM_W4A16_WGMMA_ROWS"
WGMMA_SPLIT_ENV = "CK_GEMM_W4A16_WGMMA_SPLIT"
WGMMA_TILE_SHAPES = [(300, 128, 256), (512, 128, 384), (700, 136, 1024), (65, 1000, 96),
                     (1792, 128, 256), (257, 512, 128)]


@pytest.mark.parametrize("mode", ref.INT4_MODES)
@pytest.mark.parametrize("group_size", ref.INT4_GROUP_SIZES, ids=lambda g: GROUP_IDS[g])
@pytest.mark.parametrize("shape", [s for s in WGMMA_TILE_SHAPES if small_enough(*s)], ids=shape_id)
@pytest.mark.parametrize("rows", [64, 128, 256])
def test_wgmma_block_rows(rows, shape, group_size, mode, monkeypatch, seed):
    use_variant(monkeypatch, ("packed", "wgmma"), shape[0])
    monkeypatch.setenv(WGMMA_ROWS_ENV, str(rows))
    rng = np.random.default_rng(seed)
    dtype = ref.W4A16_DTYPES[(WGMMA_TILE_SHAPES.index(shape) + rows // 64) % 2]
    call = make_call(rng, shape, dtype, mode, group_size, "codes", bias=True, activation="none",
                     prepacked=True)
    call.launch()
    call.check(f"wgmma {rows} rows, {dtype}, seed={seed}")


# K split over a cluster of 1, 2, 4 or 8 blocks, forced, on the block rows the call picks
# (64 up to M = 64): K of 1 chunk (96: most blocks of a split have no chunk at all) to 32, M of
# 1 to 300 (a 64-row block holding 1 or 5 rows: the blocks whose 8-row sums have no rows skip
# them), partial tiles in N, both modes and dtypes, group sizes rotated. Two launches on the
# same inputs give the same bits (the sum's order is fixed).
WGMMA_SPLIT_SHAPES = [(1, 136, 96), (5, 1000, 1024), (64, 128, 4096), (37, 264, 384),
                      (100, 136, 1024), (300, 128, 640)]


@pytest.mark.parametrize("dtype", ref.W4A16_DTYPES)
@pytest.mark.parametrize("mode", ref.INT4_MODES)
@pytest.mark.parametrize("shape", [s for s in WGMMA_SPLIT_SHAPES if small_enough(*s)], ids=shape_id)
@pytest.mark.parametrize("split", [1, 2, 4, 8])
def test_wgmma_split_k(split, shape, mode, dtype, monkeypatch, seed):
    use_variant(monkeypatch, ("packed", "wgmma"), shape[0])
    monkeypatch.setenv(WGMMA_SPLIT_ENV, str(split))
    rng = np.random.default_rng(seed)
    i = WGMMA_SPLIT_SHAPES.index(shape) + split
    group_size = ref.INT4_GROUP_SIZES[i % len(ref.INT4_GROUP_SIZES)]
    call = make_call(rng, shape, dtype, mode, group_size, "codes", bias=i % 2 == 0,
                     activation=ACTIVATION_ROTATION[i % 2], prepacked=True)
    call.launch()
    check_twice(call, f"wgmma split {split}, seed={seed}")


# The weight-streaming kernel's block shapes, forced: 2, 4, 6 or 8 tiles of 8 columns
# (CK_GEMM_W4A16_STREAM_TILES) and at most 4, 6 or 8 warps (CK_GEMM_W4A16_STREAM_WARPS), at the
# three x row classes (1, 8 and 16 rows); N leaves the last tile group partial or one tile
# group alone, K gives fewer chunks than warps (96, 384) or several per warp (4096). Two
# launches on the same inputs give the same bits (the warps' partial sums add in a fixed order).
STREAM_TILES_ENV = "CK_GEMM_W4A16_STREAM_TILES"
STREAM_WARPS_ENV = "CK_GEMM_W4A16_STREAM_WARPS"
STREAM_SHAPES = [(1, 136, 4096), (5, 1000, 384), (16, 72, 1024), (9, 264, 96), (16, 520, 4096)]


@pytest.mark.parametrize("mode", ref.INT4_MODES)
@pytest.mark.parametrize("shape", [s for s in STREAM_SHAPES if small_enough(*s)], ids=shape_id)
@pytest.mark.parametrize("warps", [4, 6, 8])
@pytest.mark.parametrize("tiles", [2, 4, 6, 8])
def test_stream_block_shapes(tiles, warps, shape, mode, monkeypatch, seed):
    use_variant(monkeypatch, ("packed", "small_m"), shape[0])
    monkeypatch.setenv(STREAM_TILES_ENV, str(tiles))
    monkeypatch.setenv(STREAM_WARPS_ENV, str(warps))
    rng = np.random.default_rng(seed)
    i = STREAM_SHAPES.index(shape) + tiles + warps
    dtype = ref.W4A16_DTYPES[i % 2]
    group_size = ref.INT4_GROUP_SIZES[i % len(ref.INT4_GROUP_SIZES)]
    call = make_call(rng, shape, dtype, mode, group_size, "codes", bias=i % 3 != 0,
                     activation=ACTIVATION_ROTATION[i % 2], prepacked=True)
    call.launch()
    check_twice(call, f"stream {tiles} tiles, <= {warps} warps, {dtype}, g{group_size}, "
                      f"seed={seed}")


@pytest.mark.parametrize("m", [17, 64, 65, 200])
def test_auto_chooses_wgmma_past_16_rows_on_hopper(m, monkeypatch, seed):
    """auto on a prepacked weight: wgmma for M > 16 on compute capability 9.0, tc otherwise
    (another GPU): the same bits as that variant forced (the kernels sum in different orders,
    so equality shows which one ran)."""
    if compute_capability() < (8, 0):
        pytest.skip("tc needs compute capability 8.0+")
    expected = "wgmma" if compute_capability() == (9, 0) else "tc"
    rng = np.random.default_rng(seed)
    call = make_call(rng, (m, 136, 1024), "fp16", "asym", 128, "codes", prepacked=True)
    results = {}
    for kernel in (expected, "auto"):
        monkeypatch.setenv(KERNEL_ENV, kernel)
        call.poison_outputs()
        call.launch()
        results[kernel] = call.check(f"{kernel}, seed={seed}")[2]
    assert_bitwise_equal(results["auto"], results[expected], f"auto vs {expected}, seed={seed}")


# ---------------------------------------------------------------------------------------------
# The wrapper: NumPy in -> NumPy out, device arrays in -> DeviceArray out, out=; bitwise what
# the raw call writes (the wrapper does no arithmetic).
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("mode", ref.INT4_MODES)
@pytest.mark.parametrize("dtype", ref.W4A16_DTYPES)
def test_wrapper_gemm_w4a16(dtype, mode, seed):
    rng = np.random.default_rng(seed)
    m, n, k = 6, 40, 192
    raw_call = make_call(rng, (m, n, k), dtype, mode, 64, "quantized", bias=True,
                         activation="relu")
    raw_call.launch()
    _, _, want = raw_call.check(f"raw, seed={seed}")
    x, w_packed, scales, zeros, bias = raw_call.inputs
    got = ck.gemm_w4a16(x, w_packed, scales, zeros, group_size=64, bias=bias,
                        activation="relu", dtype=dtype_arg(dtype))
    assert isinstance(got, np.ndarray)
    assert_bitwise_equal(got, want, f"numpy, seed={seed}")
    ck_dtype = CK_DTYPE[dtype]
    xd, sd, bd = (ck.DeviceArray.from_numpy(v, ck_dtype=ck_dtype) for v in (x, scales, bias))
    wd = ck.DeviceArray.from_numpy(w_packed)
    zd = None if zeros is None else ck.DeviceArray.from_numpy(zeros)
    got_d = ck.gemm_w4a16(xd, wd, sd, zd, group_size=64, bias=bd, activation="relu")
    assert isinstance(got_d, ck.DeviceArray) and got_d.shape == (m, n)
    assert got_d.ck_dtype == ck_dtype
    assert_bitwise_equal(got_d.to_numpy(), want, f"device, seed={seed}")
    out = ck.DeviceArray.empty((m, n), x.dtype, ck_dtype).fill_byte(POISON)
    assert ck.gemm_w4a16(xd, wd, sd, zd, group_size=64, bias=bd, activation="relu",
                         out=out) is out
    assert_bitwise_equal(out.to_numpy(), want, f"device out=, seed={seed}")
    row = ck.gemm_w4a16(x[2], w_packed, scales, zeros, group_size=64, bias=bias,
                        activation="relu", dtype=dtype_arg(dtype))   # a 1-D x is one row: [N] out
    assert row.shape == (n,)
    assert_bitwise_equal(row, want[2], f"1-D x, seed={seed}")


def test_wrapper_gemm_w4a16_no_bias_and_library_rules(seed):
    rng = np.random.default_rng(seed)
    x = random_activations(rng, 3, 64, "fp16")
    packed, scales, _ = random_weight(rng, 16, 64, "fp16", "sym", ref.GROUP_ROW, "quantized")
    got = ck.gemm_w4a16(x, packed, scales, group_size=ck.GROUP_ROW)
    want = ref.gemm_w4a16_f64(x, packed, scales, None, ref.GROUP_ROW, 64, "fp16")
    w_deq = ref.dequantized_int4_weight(packed, scales, None, ref.GROUP_ROW, 64, "fp16")
    error32 = w4a16_float32_error(x.astype(np.float64), w_deq.astype(np.float64), want)
    assert_within(got.astype(np.float64), want, output_tolerance(want, error32, "fp16"),
                  f"no bias, seed={seed}")
    with pytest.raises(ck.CKError) as info:     # the library's rule: K a multiple of 32
        ck.gemm_w4a16(np.ascontiguousarray(x[:, :48]), np.ascontiguousarray(packed[:, :24]),
                      np.ones((16, 1), np.float16),
                      group_size=ck.GROUP_ROW)
    assert info.value.status == ck.Status.UNSUPPORTED and "k" in info.value.message
    with pytest.raises(ck.CKError) as info:     # fp32 activations: not a W4A16 dtype
        ck.gemm_w4a16(x.astype(np.float32), packed, scales.astype(np.float32),
                      group_size=ck.GROUP_ROW)
    assert info.value.status == ck.Status.UNSUPPORTED


@pytest.mark.parametrize("mode", ref.INT4_MODES)
@pytest.mark.parametrize("dtype", ref.W4A16_DTYPES)
def test_wrapper_prepack_and_gemm_w4a16_prepacked(dtype, mode, seed):
    """ck.w4a16_prepack returns the layout bit for bit; ck.gemm_w4a16_prepacked returns what
    the raw call writes, for NumPy and device arrays."""
    rng = np.random.default_rng(seed)
    m, n, k = 20, 72, 320
    raw_call = make_call(rng, (m, n, k), dtype, mode, 64, "quantized", bias=True,
                         activation="relu", prepacked=True)
    raw_call.launch()
    _, _, want = raw_call.check(f"raw, seed={seed}")
    x, w_packed, scales, zeros, bias = raw_call.inputs
    w_pre, s_pre, z_pre = ck.w4a16_prepack(w_packed, scales, zeros, group_size=64,
                                           dtype=dtype_arg(dtype))
    ref_w, ref_s, ref_z = ref.w4a16_prepack(w_packed, scales, zeros, n, k, 64)
    assert_bitwise_equal(w_pre, ref_w, f"w_prepacked, seed={seed}")
    assert_bitwise_equal(s_pre, ref_s, f"scales_prepacked, seed={seed}")
    assert (z_pre is None) == (ref_z is None)
    got = ck.gemm_w4a16_prepacked(x, w_pre, s_pre, z_pre, n=n, group_size=64, bias=bias,
                                  activation="relu", dtype=dtype_arg(dtype))
    assert_bitwise_equal(got, want, f"numpy, seed={seed}")
    ck_dtype = CK_DTYPE[dtype]
    xd, bd = (ck.DeviceArray.from_numpy(v, ck_dtype=ck_dtype) for v in (x, bias))
    wd, sd, zd = ck.w4a16_prepack(
        ck.DeviceArray.from_numpy(w_packed), ck.DeviceArray.from_numpy(scales, ck_dtype=ck_dtype),
        None if zeros is None else ck.DeviceArray.from_numpy(zeros), group_size=64)
    assert isinstance(wd, ck.DeviceArray)
    got_d = ck.gemm_w4a16_prepacked(xd, wd, sd, zd, n=n, group_size=64, bias=bd,
                                    activation="relu")
    assert isinstance(got_d, ck.DeviceArray) and got_d.shape == (m, n)
    assert_bitwise_equal(got_d.to_numpy(), want, f"device, seed={seed}")


@pytest.mark.parametrize("m", [1, 16, 100])
@pytest.mark.parametrize("dtype", ref.W4A16_DTYPES)
def test_quantized_linear_from_float(dtype, m, seed):
    """QuantizedLinear.from_float quantizes on the device (ck_quantize_int4) and runs the
    prepacked GEMM: its output is the raw prepacked call's on the same quantized weight, which
    meets the float64 reference."""
    rng = np.random.default_rng(seed)
    n, k = 96, 512
    w = ref.random_input(rng, (n, k), dtype, scale=1.0 / math.sqrt(k))
    bias = random_normal(rng, n, dtype)
    layer = ck.QuantizedLinear.from_float(w, bias=bias, group_size=128, symmetric=False,
                                          dtype=dtype_arg(dtype), activation="relu")
    assert (layer.in_features, layer.out_features) == (k, n)
    x = random_activations(rng, m, k, dtype)
    got = layer(x)
    assert isinstance(got, np.ndarray) and got.shape == (m, n)
    w_packed, scales, zeros = (a.to_numpy() for a in layer.weight)
    call = W4A16Call(x, (w_packed, scales, zeros), 128, bias, "relu", dtype, prepacked=True)
    call.launch()
    _, _, want = call.check(f"QuantizedLinear m={m}, seed={seed}")
    assert_bitwise_equal(got, want, f"QuantizedLinear, seed={seed}")
    xd = ck.DeviceArray.from_numpy(x, ck_dtype=CK_DTYPE[dtype])
    got_d = layer(xd)
    assert isinstance(got_d, ck.DeviceArray)
    assert_bitwise_equal(got_d.to_numpy(), want, f"QuantizedLinear on device, seed={seed}")
    # The quantized weight is what ck.quantize_int4 makes of w, bit for bit.
    ref_packed, ref_scales, ref_zeros = ref.quantize_int4(w, dtype, 128, "asym")
    assert_bitwise_equal(w_packed, ref_packed, f"quantized weight, seed={seed}")
    assert_bitwise_equal(scales, ref_scales, f"scales, seed={seed}")
    assert_bitwise_equal(zeros, ref_zeros, f"zeros, seed={seed}")
