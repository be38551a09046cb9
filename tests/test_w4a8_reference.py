"""CPU tests of the W4A8 references in tests/reference.py (gemm_w4a8, gemm_w4a8_abs_sums,
gemm_w4a8_f64: ck_gemm_w4a8's symmetric INT4 weights times FP8 E4M3 activations), each against
an independent definition:

- exact rational arithmetic (fractions.Fraction) over the header's formula, element by element,
  with the nibbles, E4M3 codes (the OCP bit fields) and fp16 / bf16 scale bits decoded here;
- the product of the dequantized operands in float64 (the weight w' = q * scale per group, not
  rounded to the scale's dtype; the activations e4m3(a) * scale_a);
- hand-computed values for group 128, a partial last group and CK_GROUP_ROW.

They run everywhere (no GPU). Data is fresh every run: each test that draws data takes the `seed`
fixture (tests/conftest.py), which prints it; CK_TEST_SEED=<seed> replays a failure.
"""

import struct
from fractions import Fraction

import numpy as np
import pytest

import reference as ref
from test_fp8_reference import ocp_value

GROUP_SIZES = ref.W4A8_GROUP_SIZES
SCALE_DTYPES = ref.W4A8_SCALE_DTYPES
GROUP_IDS = {128: "g128", ref.GROUP_ROW: "grow"}
E4M3_NAN_CODES = (0x7F, 0xFF)
U64 = 2.0**-53   # the unit roundoff of float64


# ---------------------------------------------------------------------------------------------
# The header's words, decoded independently
# ---------------------------------------------------------------------------------------------
def nibble_code(packed, n, k):
    """The signed INT4 code of element k of row n: nibble k % 2 (low first) of byte k // 2, as
    4-bit two's complement."""
    byte = int(packed[n, k // 2])
    nibble = byte & 0xF if k % 2 == 0 else byte >> 4
    return nibble - 16 if nibble >= 8 else nibble


def scale_value(scales, n, g, dtype):
    """A weight scale as an exact Python float: fp16 by NumPy's conversion, bf16 as the top
    half of a float32."""
    if dtype == "fp16":
        return float(np.float16(scales[n, g]))
    return struct.unpack("<f", struct.pack("<I", int(scales[n, g]) << 16))[0]


def exact_gemm_w4a8(a, packed, scales, group_size, dtype):
    """(acc, sum_kb |s| sum |a q|) of the header's formula in exact rational arithmetic, as
    Fractions [M][N]; a has no NaN code."""
    m, k = a.shape
    n = packed.shape[0]
    acc = [[Fraction(0)] * n for _ in range(m)]
    abs_sums = [[Fraction(0)] * n for _ in range(m)]
    codes = [[nibble_code(packed, j, kk) for kk in range(k)] for j in range(n)]
    values = [[Fraction(ocp_value(int(a[i, kk]), "e4m3")) for kk in range(k)] for i in range(m)]
    for i in range(m):
        for j in range(n):
            for kb in range(-(-k // 128)):
                s = Fraction(scale_value(scales, j, 0 if group_size == ref.GROUP_ROW else kb,
                                         dtype))
                block = sum((values[i][kk] * codes[j][kk]
                             for kk in range(kb * 128, min(k, kb * 128 + 128))), Fraction(0))
                abs_block = sum((abs(values[i][kk] * codes[j][kk])
                                 for kk in range(kb * 128, min(k, kb * 128 + 128))), Fraction(0))
                acc[i][j] += s * block
                abs_sums[i][j] += abs(s) * abs_block
    return acc, abs_sums


def random_codes(rng, shape):
    """E4M3 bytes over every finite code (subnormals, 448, both zeros), no NaN."""
    a = rng.integers(0, 256, shape, dtype=np.uint8)
    a[np.isin(a, E4M3_NAN_CODES)] = 0x38   # 1.0
    return a


def random_weight(rng, n, k, group_size, dtype):
    """(packed signed codes over all of -8 .. 7, scales [N, groups] spread over 10^-3 .. 10 in
    dtype): a scale applied to the wrong block is off by orders of magnitude."""
    q = rng.integers(-8, 8, (n, k)).astype(np.int8)
    groups = ref.int4_groups_per_row(k, group_size)
    scales = ref.to_dtype((10.0 ** rng.uniform(-3, 1, (n, groups))).astype(np.float32), dtype)
    return ref.pack_int4(q, signed=True), scales, q


# ---------------------------------------------------------------------------------------------
# gemm_w4a8 and gemm_w4a8_abs_sums
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("k", [32, 160, 288])
@pytest.mark.parametrize("dtype", SCALE_DTYPES)
@pytest.mark.parametrize("group_size", GROUP_SIZES, ids=GROUP_IDS.get)
def test_gemm_w4a8_matches_exact_arithmetic(group_size, dtype, k, seed):
    """Every element against the formula in rationals: K = 32 (one partial block), 160 (a
    full block and a partial one), 288 (three blocks). The float64 sum of the blocks' exact
    scaled sums rounds at most (blocks - 1) times."""
    rng = np.random.default_rng(seed)
    m, n = 3, 4
    a = random_codes(rng, (m, k))
    packed, scales, _ = random_weight(rng, n, k, group_size, dtype)
    got = ref.gemm_w4a8(a, packed, scales, group_size, dtype)
    got_abs = ref.gemm_w4a8_abs_sums(a, packed, scales, group_size)   # dtype inferred
    exact, exact_abs = exact_gemm_w4a8(a, packed, scales, group_size, dtype)
    blocks = -(-k // 128)
    assert got.shape == got_abs.shape == (m, n) and got.dtype == np.float64
    for i in range(m):
        for j in range(n):
            bound = (blocks - 1) * U64 * float(exact_abs[i][j])
            assert abs(Fraction(got[i, j]) - exact[i][j]) <= Fraction(bound), \
                f"acc[{i}, {j}] = {got[i, j]!r}, exact {float(exact[i][j])!r}, seed={seed}"
            assert abs(Fraction(got_abs[i, j]) - exact_abs[i][j]) <= Fraction(bound), \
                f"abs_sums[{i}, {j}], seed={seed}"
            if blocks == 1:   # a single block: no rounding at all
                assert Fraction(got[i, j]) == exact[i][j], f"seed={seed}"


@pytest.mark.parametrize("dtype", SCALE_DTYPES)
def test_gemm_w4a8_hand_computed(dtype):
    """Group 128 over K = 256 (scales 0.5 and 0.25), a partial last group of 32 (K = 160,
    scale 4 on its block alone), and one scale for the row."""
    e4m3 = lambda *v: ref.e4m3_encode(np.float32(v))   # noqa: E731
    a = np.zeros((2, 256), np.uint8)
    a[0, [0, 130]] = e4m3(1.0, 2.0)
    a[1, [5, 150]] = e4m3(-0.5, 0.5)
    q = np.zeros((1, 256), np.int8)
    q[0, [0, 5, 130, 150]] = (3, 7, -8, -8)
    packed = ref.pack_int4(q, signed=True)
    scales = ref.to_dtype(np.float32([[0.5, 0.25]]), dtype)
    got = ref.gemm_w4a8(a, packed, scales, 128, dtype)
    assert got.tolist() == [[0.5 * 3 + 0.25 * (2 * -8)], [0.5 * (-0.5 * 7) + 0.25 * (0.5 * -8)]]
    row = ref.gemm_w4a8(a, packed, scales[:, :1], ref.GROUP_ROW, dtype)
    assert row.tolist() == [[0.5 * (3 - 16)], [0.5 * (-3.5 - 4)]]
    # K = 160: the second group covers k 128 .. 159 only.
    partial = ref.gemm_w4a8(a[:, :160], ref.pack_int4(q[:, :160], signed=True),
                            ref.to_dtype(np.float32([[0.5, 4.0]]), dtype), 128, dtype)
    assert partial.tolist() == [[1.5 + 4 * (2 * -8)], [0.5 * -3.5 + 4 * (0.5 * -8)]]
    sums = ref.gemm_w4a8_abs_sums(a, packed, scales, 128, dtype)
    assert sums.tolist() == [[0.5 * 3 + 0.25 * 16], [0.5 * 3.5 + 0.25 * 4]]


@pytest.mark.parametrize("k", [160, 256, 1024, 4128])
@pytest.mark.parametrize("dtype", SCALE_DTYPES)
@pytest.mark.parametrize("group_size", GROUP_SIZES, ids=GROUP_IDS.get)
def test_gemm_w4a8_is_the_product_of_the_dequantized_operands(group_size, dtype, k, seed):
    """The weight quantized by quantize_int4 (symmetric) from random float weights, the
    activations E4M3 codes: acc is e4m3(a) times w' = q * scale (in float64: the scale
    product is not rounded to the scale's dtype, as dequantize_int4 would), up to the
    float64 roundings of either sum (gamma_K of sum |a w'|)."""
    rng = np.random.default_rng(seed)
    m, n = 5, 7
    w = ref.random_input(rng, (n, k), dtype)
    packed, scales, zeros = ref.quantize_int4(w, dtype, group_size, "sym")
    assert zeros is None
    a = random_codes(rng, (m, k))
    q = ref.unpack_int4(packed, k, signed=True).astype(np.float64)
    width = k if group_size == ref.GROUP_ROW else group_size
    s = ref.to_f32(scales, dtype).astype(np.float64)[:, np.arange(k) // width]
    w_deq = q * s                                               # exact in float64
    av = ref.e4m3_decode(a).astype(np.float64)
    want = av @ w_deq.T
    got = ref.gemm_w4a8(a, packed, scales, group_size, dtype)
    abs_sums = ref.gemm_w4a8_abs_sums(a, packed, scales, group_size, dtype)
    assert np.allclose(abs_sums, np.abs(av) @ np.abs(w_deq).T, rtol=2 * k * U64, atol=0)
    tol = 2 * k * U64 * abs_sums
    assert (np.abs(got - want) <= tol).all(), f"seed={seed}"
    # The data is sensitive to the scales: a scale from a neighbouring group would show.
    if group_size == 128:
        shifted = q * ref.to_f32(scales, dtype).astype(np.float64)[
            :, np.minimum(np.arange(k) // 128 + 1, scales.shape[1] - 1)]
        assert not np.allclose(av @ shifted.T, got, rtol=1e-3, atol=0), f"seed={seed}"


def test_gemm_w4a8_nan_codes_make_their_rows_nan(seed):
    rng = np.random.default_rng(seed)
    m, n, k = 6, 9, 160
    a = random_codes(rng, (m, k))
    a[1, 3], a[4, 150] = 0x7F, 0xFF
    packed, scales, _ = random_weight(rng, n, k, 128, "bf16")
    got = ref.gemm_w4a8(a, packed, scales, 128)
    nan_rows = np.isnan(got).all(axis=1)
    assert nan_rows.tolist() == [False, True, False, False, True, False], f"seed={seed}"
    assert np.isfinite(got[~nan_rows]).all()


def test_gemm_w4a8_abs_sums_bound_the_sums(seed):
    """|acc| <= abs_sums, with equality when every product and scale is positive."""
    rng = np.random.default_rng(seed)
    a = random_codes(rng, (4, 320))
    packed, scales, q = random_weight(rng, 6, 320, ref.GROUP_ROW, "fp16")
    acc = ref.gemm_w4a8(a, packed, scales, ref.GROUP_ROW)
    sums = ref.gemm_w4a8_abs_sums(a, packed, scales, ref.GROUP_ROW)
    assert (np.abs(acc) <= sums * (1 + 4 * U64)).all() and (sums > 0).all()
    positive_a = a & 0x7F                                  # the magnitudes
    positive_q = ref.pack_int4(np.abs(np.clip(q, -7, 7)), signed=True)
    assert np.array_equal(ref.gemm_w4a8(positive_a, positive_q, scales, ref.GROUP_ROW),
                          ref.gemm_w4a8_abs_sums(positive_a, positive_q, scales, ref.GROUP_ROW))


# ---------------------------------------------------------------------------------------------
# gemm_w4a8_f64: the epilogue
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("out_dtype", ref.DTYPES)
@pytest.mark.parametrize("granularity", ref.GRANULARITIES)
def test_gemm_w4a8_epilogue(granularity, out_dtype, seed):
    """act(acc * scale_a[m or 0] + bias[n]) in float64, bias in out_dtype's representation."""
    rng = np.random.default_rng(seed)
    m, n, k = 5, 40, 256
    a = random_codes(rng, (m, k))
    packed, scales, _ = random_weight(rng, n, k, 128, "fp16")
    scale_a = (10.0 ** rng.uniform(-3, -1, 1 if granularity == "tensor" else m)).astype(
        np.float32)
    bias = ref.to_dtype(rng.standard_normal(n).astype(np.float32), out_dtype)
    acc = ref.gemm_w4a8(a, packed, scales, 128)
    sa = np.broadcast_to(scale_a.astype(np.float64), (m,))[:, None]
    bias64 = ref.to_f32(bias, out_dtype).astype(np.float64)[None, :]
    plain = ref.gemm_w4a8_f64(a, scale_a, packed, scales, 128)
    assert np.array_equal(plain, acc * sa), f"seed={seed}"
    for activation in ref.ACTIVATIONS:
        got = ref.gemm_w4a8_f64(a, scale_a, packed, scales, 128, "fp16", bias, activation,
                                out_dtype)
        want = ref.activate(acc * sa + bias64, activation)
        assert np.array_equal(got, want), f"{activation}, seed={seed}"
    relu = ref.gemm_w4a8_f64(a, scale_a, packed, scales, 128, None, bias, "relu", out_dtype)
    assert (relu >= 0).all() and (relu == 0).any() and (relu > 0).any(), f"seed={seed}"


def quantized_layer_operands(rng, m, n, k, group_size, dtype="fp16"):
    """(x, w) of a layer in dtype, and their quantized operands (qx, sx, packed, scales): the
    rows of x spread over 10^-2 .. 10^2 in magnitude, the 128-wide blocks of w alternately 10
    and 0.1 times N(0, 0.05^2), so that a scale applied to the wrong row of x or to the wrong
    block of w is far off; x per row to E4M3 (quantize_fp8), w to symmetric INT4 in groups
    (quantize_int4)."""
    x = rng.standard_normal((m, k)) * np.logspace(-2, 2, m)[:, None]
    x = ref.to_dtype(x.astype(np.float32), dtype)
    blocks = np.where(np.arange(-(-k // 128)) % 2 == 0, 10.0, 0.1)
    w = rng.standard_normal((n, k)) * 0.05 * np.repeat(blocks, 128)[None, :k]
    w = ref.to_dtype(w.astype(np.float32), dtype)
    qx, sx = ref.quantize_fp8(x, dtype, "e4m3", "row")
    packed, scales, _ = ref.quantize_int4(w, dtype, group_size, "sym")
    return x, w, qx, sx, packed, scales


@pytest.mark.parametrize("group_size", GROUP_SIZES, ids=GROUP_IDS.get)
def test_gemm_w4a8_of_quantized_operands_approximates_the_float_product(group_size, seed):
    """x quantized per row to E4M3 and w to symmetric INT4: the layer's value is x w^T up to
    the two quantizations (E4M3 keeps 3 mantissa bits, INT4 half a step of absmax / 7): a
    sanity check of the conventions (per-row scale_a, signed codes, the scales' groups); with
    scale_a or the weight's groups reversed, the value is far off."""
    rng = np.random.default_rng(seed)
    m, n, k = 8, 64, 512
    x, w, qx, sx, packed, scales = quantized_layer_operands(rng, m, n, k, group_size)
    exact = ref.to_f32(x, "fp16").astype(np.float64) @ ref.to_f32(w, "fp16").astype(
        np.float64).T

    def rel(value):
        return np.linalg.norm(value - exact) / np.linalg.norm(exact)

    got = rel(ref.gemm_w4a8_f64(qx, sx, packed, scales, group_size, "fp16"))
    assert got < 0.3, f"relative error {got:.3g}, seed={seed}"   # at most ~0.19 measured
    # Mixed up, the same value is off by about its own size (at least ~1 measured).
    assert rel(ref.gemm_w4a8_f64(qx, sx[::-1].copy(), packed, scales, group_size)) > 0.7
    if group_size == 128:
        assert rel(ref.gemm_w4a8_f64(qx, sx, packed, scales[:, ::-1].copy(), group_size)) > 0.7


def test_gemm_w4a8_rejects_bad_inputs():
    a = np.zeros((2, 64), np.uint8)
    packed = np.zeros((3, 32), np.uint8)
    scales = np.ones((3, 1), np.float16)
    for group_size in (32, 64, 48):          # ck_gemm_w4a8 takes 128 and CK_GROUP_ROW only
        with pytest.raises(ValueError, match="group_size"):
            ref.gemm_w4a8(a, packed, np.ones((3, 64 // abs(group_size) + 1), np.float16),
                          group_size)
    with pytest.raises(ValueError, match="fp32"):     # fp16 or bf16 scales
        ref.gemm_w4a8(a, packed, scales.astype(np.float32), 128)
    with pytest.raises(ValueError, match="w_scales"):  # [N, groups]
        ref.gemm_w4a8(a, packed, np.ones((3, 2), np.float16), 128)
    with pytest.raises(ValueError):                   # K / 2 bytes per row
        ref.gemm_w4a8(a, np.zeros((3, 16), np.uint8), scales, 128)
    with pytest.raises(TypeError):                    # E4M3 bytes are uint8
        ref.gemm_w4a8(a.astype(np.int8), packed, scales, 128)
    with pytest.raises(TypeError):                    # bf16 scales are uint16 bits
        ref.gemm_w4a8(a, packed, scales, 128, "bf16")
    with pytest.raises(ValueError):                   # scale_a: 1 or M values
        ref.gemm_w4a8_f64(a, np.ones(3, np.float32), packed, scales, 128)
