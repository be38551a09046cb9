"""GPU tests of the INT4 x INT4 matrix products (ck_gemm_int4, ck_gemm_int4_scaled) against
tests/reference.py and against ck_gemm_int8_scaled on the unpacked operands.

- ck_gemm_int4 must equal the exact int32 product (reference.gemm_int4_i32) bit for bit, for
  every kernel variant (CK_GEMM_INT4_KERNEL=reference, mma, small_m, wgmma on compute
  capability 9.0, auto; small_m serves M <= 16 only, and forced on a larger M it is
  CK_STATUS_UNSUPPORTED), with partial tiles in M, N and K, K from 32 up past the
  scaled-unpacking limit (K > 131040 takes the mma and small_m kernels' sign-extending path;
  wgmma refuses it), on fresh random codes that always include every nibble value.
- ck_gemm_int4_scaled computes the same int32 sums and then ck_gemm_int8_scaled's epilogue (the
  same float32 operations), so it is compared BIT FOR BIT with ck_gemm_int8_scaled run on the
  unpacked int8 codes with the same scales and bias buffers.
- Every output is poisoned before the launch and sits between poisoned guards; inputs between
  guard bytes. CUDA graph capture and replay, the kernel override, an output offset by one
  element (scalar stores), odd N, and the wrapper's NumPy functions.

The tests skip without a CUDA device. CK_SANITIZE=1 (set by `make sanitize`) drops the largest
shapes. Each test draws a seed (printed; CK_TEST_SEED=<seed> replays a failure).
"""

import numpy as np
import pytest

import cuda_wrapper as ck
import reference as ref
from gpu_support import (
    CK_ACTIVATION, CK_DTYPE, CK_GRANULARITY, POISON, GuardedBuffer, KernelCall,
    assert_bitwise_equal, assert_forced_variant_unsupported, assert_graph_replays,
    compute_capability, epilogue_cases, force_variant, ptr_or_null, random_normal,
    random_scales, scalar_store_layout, scalar_store_params, scale_count, shape_id,
    small_enough, synchronize,
)

pytestmark = pytest.mark.gpu

KERNEL_ENV = "CK_GEMM_INT4_KERNEL"
VARIANTS = ("auto", "reference", "mma", "small_m", "wgmma")
MMA_MIN_CC = (8, 0)  # mma and small_m
SMALL_M_MAX = 16  # the small_m kernel serves m <= 16
# The mma and small_m kernels unpack codes to 16 * code while K <= 131040 (256 * 64 * K < 2^31)
# and sign-extend them for longer rows: both sides of that limit are tested.
SCALED_UNPACK_MAX_K = 131040

INT4_CODES = np.arange(-8, 8, dtype=np.int8)
INT4_RMS = 4.6  # the rms of uniform int4 codes: sqrt(E[a^2]) = sqrt(21.5)


# ---------------------------------------------------------------------------------------------
# Fixtures and helpers
# ---------------------------------------------------------------------------------------------
def use_variant(monkeypatch, variant, m=1):
    """Forces the INT4 GEMM kernel through CK_GEMM_INT4_KERNEL, skipping where this GPU has no
    such kernel. small_m's shape rule (m <= 16) is the parametrization's business: asserted
    here."""
    if variant == "small_m":
        assert m <= SMALL_M_MAX, "small_m serves m <= 16"
    force_variant(monkeypatch, KERNEL_ENV, variant)


def variant_serves(variant, m):
    """The shape rule of the forced variants (hardware rules: use_variant)."""
    return variant != "small_m" or m <= SMALL_M_MAX


def variant_m(variant, m):
    """The M a test runs a variant at: its own M, or one small_m serves (above 8, so that both
    halves of the mma fragment's rows hold real rows)."""
    return m if variant_serves(variant, m) else 13


def random_codes(rng, shape):
    """Uniform int4 codes in [-8, 7]; every one of the 16 values (-8 and 7 included) is placed
    at least once at random positions when the array has room for them."""
    q = rng.integers(-8, 8, size=shape, dtype=np.int8)
    if q.size >= INT4_CODES.size:
        q.reshape(-1)[rng.choice(q.size, INT4_CODES.size, replace=False)] = INT4_CODES
    return q


def pack(q):
    return ref.pack_int4(q, signed=True)


def random_int4_scales(rng, count, k):
    return random_scales(rng, count, k, INT4_RMS)


# ---------------------------------------------------------------------------------------------
# One call of each entry point (gpu_support.KernelCall): its device buffers, launch and check
# ---------------------------------------------------------------------------------------------
class GemmInt4Call(KernelCall):
    """ck_gemm_int4 on int4 codes a [M, K], b [N, K] (uploaded packed). misalign: extra bytes
    before a, b and c."""

    def __init__(self, a, b, misalign=(0, 0, 0)):
        (m, k), n = a.shape, b.shape[0]
        assert b.shape == (n, k) and k % 2 == 0
        self.mnk = (m, n, k)
        self.inputs = (a, b)
        self.a = GuardedBuffer.input(pack(a), misalign[0])
        self.b = GuardedBuffer.input(pack(b), misalign[1])
        self.out = GuardedBuffer.output((m, n), np.int32, POISON, misalign[2])
        self.outputs = {"c": self.out}

    def launch(self, stream=0):
        ck.raw.gemm_int4(self.a.ptr, self.b.ptr, *self.mnk, self.out.ptr, stream)

    def refill(self, rng):
        self.inputs = (random_codes(rng, self.inputs[0].shape),
                       random_codes(rng, self.inputs[1].shape))
        self.a.write(pack(self.inputs[0]))
        self.b.write(pack(self.inputs[1]))

    def check(self, ctx):
        synchronize()
        a, b = self.inputs
        want = ref.gemm_int4_i32(pack(a), pack(b), self.mnk[2])
        got = self.out.read(f"c, {ctx}")
        assert_bitwise_equal(got, want, f"c, {ctx}")
        return got


class GemmInt4ScaledCall(KernelCall):
    """ck_gemm_int4_scaled; check() runs ck_gemm_int8_scaled on the unpacked codes with the same
    scale and bias buffers and wants the same bits. misalign: extra bytes before a, b, out and
    bias (scales 4-byte aligned at +4 when bias is misaligned)."""

    def __init__(self, a, b, scale_a, scale_b, bias, activation, out_dtype, granularities,
                 misalign=(0, 0, 0, 0)):
        (m, k), n = a.shape, b.shape[0]
        assert b.shape == (n, k)
        assert scale_a.size == scale_count(granularities[0], m)
        assert scale_b.size == scale_count(granularities[1], n)
        self.activation, self.out_dtype, self.granularities = activation, out_dtype, granularities
        self.misalign = misalign
        self.mnk = (m, n, k)
        self.inputs = (a, b)
        self.a = GuardedBuffer.input(pack(a), misalign[0])
        self.b = GuardedBuffer.input(pack(b), misalign[1])
        self.scale_a = GuardedBuffer.input(scale_a, 4 if misalign[3] else 0)
        self.scale_b = GuardedBuffer.input(scale_b, 4 if misalign[3] else 0)
        self.bias = None if bias is None else GuardedBuffer.input(bias, misalign[3])
        self.out = GuardedBuffer.output((m, n), ref.NUMPY_DTYPE[out_dtype], POISON, misalign[2])
        self.outputs = {"out": self.out}

    def _epilogue_args(self):
        return (self.scale_a.ptr, CK_GRANULARITY[self.granularities[0]], self.scale_b.ptr,
                CK_GRANULARITY[self.granularities[1]], ptr_or_null(self.bias),
                CK_ACTIVATION[self.activation])

    def launch(self, stream=0):
        ck.raw.gemm_int4_scaled(self.a.ptr, self.b.ptr, *self.mnk, *self._epilogue_args(),
                                self.out.ptr, CK_DTYPE[self.out_dtype], stream)

    def refill(self, rng):
        m, n, k = self.mnk
        self.inputs = (random_codes(rng, (m, k)), random_codes(rng, (n, k)))
        self.a.write(pack(self.inputs[0]))
        self.b.write(pack(self.inputs[1]))
        self.scale_a.write(random_int4_scales(rng, self.scale_a.shape[0], k))
        self.scale_b.write(random_int4_scales(rng, self.scale_b.shape[0], k))
        if self.bias is not None:
            self.bias.write(random_normal(rng, n, self.out_dtype, 2.0))

    def int8_result(self):
        """ck_gemm_int8_scaled of the unpacked codes, same scale/bias buffers, same alignment
        of the output (so the same store path)."""
        a8 = GuardedBuffer.input(self.inputs[0])
        b8 = GuardedBuffer.input(self.inputs[1])
        want = GuardedBuffer.output(self.out.shape, self.out.dtype, POISON, self.misalign[2])
        ck.raw.gemm_int8_scaled(a8.ptr, b8.ptr, ck.LAYOUT_NK, *self.mnk, *self._epilogue_args(),
                                want.ptr, CK_DTYPE[self.out_dtype], 0)
        synchronize()
        return want.read("int8 out")

    def check(self, ctx):
        synchronize()
        got = self.out.read(f"out, {ctx}")
        want = self.int8_result()
        assert_bitwise_equal(got, want, f"out ({self.out_dtype}) vs gemm_int8_scaled, {ctx}")
        if self.activation == "relu":
            assert not (ref.to_f32(got, self.out_dtype) < 0).any(), f"ReLU, {ctx}"
        return got


def make_int4_call(rng, shape, misalign=(0, 0, 0)):
    m, n, k = shape
    return GemmInt4Call(random_codes(rng, (m, k)), random_codes(rng, (n, k)), misalign)


def make_scaled_call(rng, shape, out_dtype, granularities=("row", "row"), bias=True,
                     activation="relu", misalign=(0, 0, 0, 0)):
    m, n, k = shape
    return GemmInt4ScaledCall(
        random_codes(rng, (m, k)), random_codes(rng, (n, k)),
        random_int4_scales(rng, scale_count(granularities[0], m), k),
        random_int4_scales(rng, scale_count(granularities[1], n), k),
        random_normal(rng, n, out_dtype, 2.0) if bias else None, activation, out_dtype,
        granularities, misalign)


# ---------------------------------------------------------------------------------------------
# ck_gemm_int4: every variant, partial tiles; exact
# ---------------------------------------------------------------------------------------------
# (M, N, K): M from 1 to 300 and 1000, N odd and even, K in {32, 64, 96, 160, 4096}, paired so
# that tiles are partial in every dimension (the kernels' tiles: 64 or 128 rows and columns,
# 128 k per step; small_m: 16 columns, 128 k per lane quad, rows 0-7 and 8-15 of the fragment).
INT32_SHAPES = [
    (1, 1, 32), (1, 129, 96), (2, 15, 4096), (7, 8, 32), (8, 24, 160), (9, 40, 4096),
    (16, 33, 96), (16, 1000, 160), (17, 1, 4096),
    (64, 24, 32), (65, 127, 96), (100, 200, 4096), (128, 128, 64), (129, 255, 32),
    (255, 17, 96), (300, 301, 4096), (1000, 129, 160), (257, 1001, 32),
]
# Full-size problems (skipped under the sanitizer).
INT32_LARGE = [("auto", (1024, 4096, 4096)), ("mma", (512, 14336, 4096)),
               ("reference", (256, 4096, 4096)), ("small_m", (16, 14336, 4096)),
               ("auto", (1, 14336, 4096)), ("wgmma", (2048, 4096, 8192)),
               ("wgmma", (200, 14336, 4096))]


def int32_cases():
    for variant in VARIANTS:
        for shape in INT32_SHAPES:
            if variant_serves(variant, shape[0]) and small_enough(*shape):
                yield pytest.param(variant, shape, id=f"{variant}-{shape_id(shape)}")
    for variant, shape in INT32_LARGE:
        if small_enough(*shape):
            yield pytest.param(variant, shape, id=f"{variant}-{shape_id(shape)}-large")


@pytest.mark.parametrize("variant, shape", list(int32_cases()))
def test_gemm_int4_exact(variant, shape, monkeypatch, seed):
    use_variant(monkeypatch, variant, shape[0])
    call = make_int4_call(np.random.default_rng(seed), shape)
    call.launch()
    call.check(f"{variant}, seed={seed}")


@pytest.mark.parametrize("k", [8192, SCALED_UNPACK_MAX_K, SCALED_UNPACK_MAX_K + 32])
@pytest.mark.parametrize("variant", VARIANTS)
def test_gemm_int4_large_k_extremes_are_exact(variant, k, monkeypatch, seed):
    """Row 0 of a and b all -8: c[0, 0] = 64 K, the largest sum there is (at K = 131040 the mma
    and small_m kernels' scaled accumulator 256 * 64 K is just below 2^31; one step more they
    sign-extend). Row 1 of b all 7: c[0, 1] = -56 K. The other rows are random."""
    rng = np.random.default_rng(seed)
    m, n = 3, 40
    use_variant(monkeypatch, variant, m)
    a, b = random_codes(rng, (m, k)), random_codes(rng, (n, k))
    a[0] = -8
    b[0] = -8
    b[1] = 7
    call = GemmInt4Call(a, b)
    if variant == "wgmma" and k > SCALED_UNPACK_MAX_K:   # no sign-extending path: refused
        assert_forced_variant_unsupported(call, KERNEL_ENV, variant, f"k={k}")
        return
    call.launch()
    c = call.check(f"{variant}, K={k}, seed={seed}")
    assert c[0, 0] == 64 * k and c[0, 1] == -56 * k


@pytest.mark.parametrize("variant", VARIANTS)
def test_gemm_int4_minimally_aligned_pointers(variant, monkeypatch, seed):
    """a and b only 16-byte aligned (the header's requirement), c only 4-byte aligned."""
    m = variant_m(variant, 100)
    use_variant(monkeypatch, variant, m)
    call = make_int4_call(np.random.default_rng(seed), (m, 136, 1024), misalign=(16, 48, 4))
    call.launch()
    call.check(f"{variant}, seed={seed}")


# ---------------------------------------------------------------------------------------------
# ck_gemm_int4_scaled: bit for bit ck_gemm_int8_scaled of the unpacked codes
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("shape, out_dtype, granularities, bias, activation",
                         epilogue_cases([(7, 201, 96), (100, 129, 1024)]))
def test_gemm_int4_scaled_epilogue(shape, out_dtype, granularities, bias, activation, seed):
    call = make_scaled_call(np.random.default_rng(seed), shape, out_dtype, granularities, bias,
                            activation)
    call.launch()
    call.check(f"auto, seed={seed}")


@pytest.mark.parametrize("full", [False, True], ids=["tensor-plain", "row-bias-relu"])
@pytest.mark.parametrize("out_dtype", ref.DTYPES)
@pytest.mark.parametrize("variant", VARIANTS)
def test_gemm_int4_scaled_variants(variant, out_dtype, full, monkeypatch, seed):
    """Each kernel variant's epilogue: the plainest and the fullest combination."""
    m = variant_m(variant, 100)
    use_variant(monkeypatch, variant, m)
    call = make_scaled_call(np.random.default_rng(seed), (m, 200, 1024), out_dtype,
                            ("row", "row") if full else ("tensor", "tensor"), bias=full,
                            activation="relu" if full else "none")
    call.launch()
    call.check(f"{variant}, seed={seed}")


@pytest.mark.parametrize("variant, out_dtype, case", scalar_store_params(VARIANTS))
def test_gemm_int4_scalar_store_path(variant, out_dtype, case, monkeypatch, seed):
    rng = np.random.default_rng(seed)
    n, offset = scalar_store_layout(case, out_dtype)
    m, k = variant_m(variant, 33), 160
    use_variant(monkeypatch, variant, m)
    if out_dtype == "int32":
        call = make_int4_call(rng, (m, n, k), misalign=(0, 0, offset))
    else:
        call = make_scaled_call(rng, (m, n, k), out_dtype, misalign=(0, 0, offset, offset))
    call.launch()
    call.check(f"{variant}, {case}, seed={seed}")


@pytest.mark.parametrize("out_dtype", ref.DTYPES)
@pytest.mark.parametrize("shape", [(1024, 4096, 4096), (16, 14336, 4096)], ids=shape_id)
def test_gemm_int4_scaled_large(shape, out_dtype, seed):
    """Full-size products on auto: the mma tiles (M = 1024) and the small_m kernel (M = 16)."""
    if not small_enough(*shape):
        pytest.skip("too large for the sanitizer run")
    call = make_scaled_call(np.random.default_rng(seed), shape, out_dtype)
    call.launch()
    call.check(f"auto, seed={seed}")


# ---------------------------------------------------------------------------------------------
# The kernel override
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("variant, m", [("mma", 40), ("small_m", 16), ("small_m", 17),
                                        ("small_m", 1000), ("wgmma", 40), ("wgmma", 3)])
@pytest.mark.parametrize("entry", ["gemm_int4", "gemm_int4_scaled"])
def test_forced_variant_serves_or_is_unsupported(entry, variant, m, monkeypatch, seed):
    """A forced variant serves every call it can (compute capability 8.0+; small_m: M <= 16),
    checked against the reference; any other call is CK_STATUS_UNSUPPORTED and writes nothing."""
    monkeypatch.setenv(KERNEL_ENV, variant)
    rng = np.random.default_rng(seed)
    shape = (m, 40, 64)
    call = (make_int4_call(rng, shape) if entry == "gemm_int4"
            else make_scaled_call(rng, shape, "fp16"))
    serves = compute_capability() >= MMA_MIN_CC and (variant != "small_m" or m <= SMALL_M_MAX)
    if variant == "wgmma":
        serves = compute_capability() == (9, 0)
    if serves:
        call.launch()
        call.check(f"forced {variant}, seed={seed}")
    else:
        assert_forced_variant_unsupported(call, KERNEL_ENV, variant)


def test_kernel_override_is_read_on_every_call(monkeypatch, seed):
    """The override is read on every call: an unknown name is refused (and writes nothing),
    each valid setting (and none) serves the same call again without rebuilding anything."""
    call = make_int4_call(np.random.default_rng(seed), (70, 136, 288))
    mma_ok = compute_capability() >= MMA_MIN_CC
    for value, status in (("no_such_kernel", ck.Status.INVALID_VALUE), (None, None),
                          ("mma", None if mma_ok else ck.Status.UNSUPPORTED), ("", None),
                          ("small_m", ck.Status.UNSUPPORTED),  # M = 70 > 16
                          ("no_such_kernel", ck.Status.INVALID_VALUE), ("reference", None),
                          ("auto", None)):
        if value is None:
            monkeypatch.delenv(KERNEL_ENV, raising=False)
        else:
            monkeypatch.setenv(KERNEL_ENV, value)
        call.poison_outputs()
        if status is None:
            call.launch()
            call.check(f"{KERNEL_ENV}={value!r}, seed={seed}")
        else:
            with pytest.raises(ck.CKError) as info:
                call.launch()
            assert info.value.status == status, (value, info.value.message)
            synchronize()
            call.assert_outputs_untouched(f"{KERNEL_ENV}={value!r}")


# ---------------------------------------------------------------------------------------------
# CUDA graphs
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("entry", ["gemm_int4", "gemm_int4_scaled"])
@pytest.mark.parametrize("variant", VARIANTS)
def test_cuda_graph_replay(variant, entry, monkeypatch, seed):
    rng = np.random.default_rng(seed)
    m = variant_m(variant, 70)
    use_variant(monkeypatch, variant, m)
    call = (make_int4_call(rng, (m, 136, 288)) if entry == "gemm_int4"
            else make_scaled_call(rng, (m, 136, 288), "fp16"))
    assert_graph_replays(call, rng, seed)


# ---------------------------------------------------------------------------------------------
# The wrapper's functions (no arithmetic of their own: the raw call's bits)
# ---------------------------------------------------------------------------------------------
def test_wrapper_gemm_int4(seed):
    rng = np.random.default_rng(seed)
    m, n, k = 33, 48, 160
    a, b = random_codes(rng, (m, k)), random_codes(rng, (n, k))
    want = ref.gemm_int4_i32(pack(a), pack(b), k)
    c = ck.gemm_int4(pack(a), pack(b))
    assert isinstance(c, np.ndarray) and c.shape == (m, n) and c.dtype == np.int32
    assert_bitwise_equal(c, want, f"numpy, seed={seed}")
    out = np.full((m, n), -1, np.int32)
    assert ck.gemm_int4(pack(a), pack(b), out=out) is out
    assert_bitwise_equal(out, want, f"out=, seed={seed}")


@pytest.mark.parametrize("out_dtype", ref.DTYPES)
def test_wrapper_gemm_int4_scaled(out_dtype, seed):
    rng = np.random.default_rng(seed)
    m, n, k = 20, 48, 96
    a, b = random_codes(rng, (m, k)), random_codes(rng, (n, k))
    scale_a, scale_b = random_int4_scales(rng, m, k), random_int4_scales(rng, n, k)
    bias = random_normal(rng, n, out_dtype, 2.0)
    got = ck.gemm_int4_scaled(pack(a), pack(b), scale_a, scale_b, bias=bias, activation="relu",
                              out_dtype=out_dtype)
    want = ck.gemm_int8_scaled(a, b, scale_a, scale_b, bias=bias, activation="relu",
                               out_dtype=out_dtype)
    assert_bitwise_equal(got, want, f"vs gemm_int8_scaled, seed={seed}")
