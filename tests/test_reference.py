"""CPU tests of tests/reference.py: the references must have the properties the header promises.

They run everywhere (no GPU). Data is fresh every run: each test draws a seed from os.urandom,
prints it and names it in its assertion messages; CK_TEST_SEED=<seed> replays a failure.
"""


import numpy as np
import pytest

import reference as ref

# Named tolerance: a round trip x -> q -> x' is off by at most half a quantization step, plus the
# float32 rounding of inv = 1/scale, of x * inv and of q * scale. Those add at most about 2.3e-5
# of a step (a few ulps of 127); 1e-4 of a step is a safe bound.
ROUND_TRIP_SLACK = 1e-4

INT4_SHAPES = [(1, 1), (3, 5), (5, 100), (4, 257), (2, 1000)]


def with_nans(rng, shape, dtype, all_nan):
    """Random `dtype` data with about one value in ten NaN, and NaN everywhere at the index
    `all_nan`: (the data, where its NaNs are, the same data with 0 for each NaN)."""
    xf = ref.to_f32(ref.random_input(rng, shape, dtype), dtype)
    nan_at = rng.random(xf.shape) < 0.1
    nan_at[all_nan] = True
    return (ref.to_dtype(np.where(nan_at, np.nan, xf), dtype), nan_at,
            ref.to_dtype(np.where(nan_at, 0, xf), dtype))


def group_scales_per_column(scales_f32, cols, group_size):
    """[rows, groups] -> [rows, cols]: the scale that applies to each element."""
    width = cols if group_size == ref.GROUP_ROW else group_size
    return scales_f32[:, np.arange(cols) // width]


# ---------------------------------------------------------------------------------------------
# Floating-point representations
# ---------------------------------------------------------------------------------------------
def test_bf16_ties_round_to_even():
    cases = {  # float32 bits -> expected bfloat16 bits
        0x3F808000: 0x3F80,  # 1 + half an ulp: tie, 0x3F80 is even
        0x3F818000: 0x3F82,  # tie, 0x3F81 is odd: round up
        0x3F808001: 0x3F81,  # just above the tie
        0x3F807FFF: 0x3F80,  # just below the tie
        0xBF818000: 0xBF82,  # negative tie
        0x7F7F8000: 0x7F80,  # tie at the top of the range rounds to +inf (0x7F7F is odd)
        0x7F7F7FFF: 0x7F7F,  # largest value that stays finite
        0x7F800000: 0x7F80,  # +inf
        0xFF800000: 0xFF80,  # -inf
        0x00008000: 0x0000,  # subnormal tie to even (zero)
        0x00018000: 0x0002,
        0x80000000: 0x8000,  # -0
    }
    x = np.array(list(cases), dtype=np.uint32).view(np.float32)
    got = ref.f32_to_bf16_bits(x)
    want = np.array(list(cases.values()), dtype=np.uint16)
    assert np.array_equal(got, want), [f"{a:#x}->{b:#x}" for a, b in zip(cases, got)]


def test_bf16_nan_stays_nan():
    nan_bits = np.array([0x7FC00000, 0xFFC00000, 0x7F800001, 0x7FFFFFFF, 0xFFFFFFFF], np.uint32)
    got = ref.bf16_bits_to_f32(ref.f32_to_bf16_bits(nan_bits.view(np.float32)))
    assert np.isnan(got).all(), got


def test_bf16_rounding_picks_the_nearer_neighbour(seed):
    rng = np.random.default_rng(seed)
    bits = rng.integers(0, 2**32, size=200_000, dtype=np.uint64).astype(np.uint32)
    bits = bits[~np.isnan(bits.view(np.float32)) & ~np.isinf(bits.view(np.float32))]
    bits = bits[(bits & 0x7F7F0000) != 0x7F7F0000]  # the top binade may round to inf: see above
    x = bits.view(np.float32).astype(np.float64)
    got = ref.bf16_bits_to_f32(ref.f32_to_bf16_bits(bits.view(np.float32))).astype(np.float64)
    # The two bfloat16 neighbours of x (truncation and the next one away from zero), in float64.
    below = ref.bf16_bits_to_f32((bits >> 16).astype(np.uint16)).astype(np.float64)
    above = ref.bf16_bits_to_f32(((bits >> 16) + 1).astype(np.uint16)).astype(np.float64)
    d_below, d_above = np.abs(x - below), np.abs(above - x)
    even_is_below = ((bits >> 16) & 1) == 0
    tie_winner = np.where(even_is_below, below, above)
    want = np.where(d_below < d_above, below, np.where(d_above < d_below, above, tie_winner))
    assert np.array_equal(got, want), f"seed={seed}"


def test_bf16_round_trip_of_every_bf16_value():
    all_bits = np.arange(2**16, dtype=np.uint32).astype(np.uint16)
    values = ref.bf16_bits_to_f32(all_bits)
    keep = ~np.isnan(values)
    assert np.array_equal(ref.f32_to_bf16_bits(values)[keep], all_bits[keep])


def test_fp16_ties_round_to_even():
    x = np.array([2049, 2051, -2049, 65519, 65520], dtype=np.float32)  # ulp 2 above 2048
    got = ref.to_f32(ref.to_dtype(x, "fp16"), "fp16")
    assert np.array_equal(got, np.array([2048, 2052, -2048, 65504, np.inf], dtype=np.float32)), got


@pytest.mark.parametrize("dtype", ref.DTYPES)
def test_random_input_is_representable_and_varied(dtype, seed):
    rng = np.random.default_rng(seed)
    x = ref.random_input(rng, (64, 256), dtype)
    assert x.dtype == ref.NUMPY_DTYPE[dtype]
    xf = ref.to_f32(x, dtype)
    assert np.array_equal(ref.to_dtype(xf, dtype).view(np.uint8), x.view(np.uint8)), f"seed={seed}"
    assert np.isfinite(xf).all(), f"seed={seed}"
    row_absmax = np.abs(xf).max(axis=1)
    # About 16 of the 64 rows are scaled by 10**U(-3, 2): the largest and smallest row then
    # differ by more than 10x unless all of them land in [0.1, 10] (probability ~0.4**16).
    assert row_absmax.max() > 10 * row_absmax.min(), f"rows differ in scale, seed={seed}"
    zeroed = ref.random_input(rng, (4, 8), dtype, zero_rows=[1, 3])
    assert (ref.to_f32(zeroed, dtype)[[1, 3]] == 0).all()


# ---------------------------------------------------------------------------------------------
# Packed INT4
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("cols", [1, 2, 7, 8, 33, 100])
@pytest.mark.parametrize("signed", [True, False])
def test_pack_unpack_identity(cols, signed, seed):
    rng = np.random.default_rng(seed)
    lo, hi = ref.INT4_SYM_RANGE if signed else ref.INT4_ASYM_RANGE
    q = rng.integers(lo, hi + 1, size=(3, cols)).astype(np.int8)
    packed = ref.pack_int4(q, signed)
    assert packed.dtype == np.uint8 and packed.shape == (3, (cols + 1) // 2)
    assert np.array_equal(ref.unpack_int4(packed, cols, signed), q), f"seed={seed}"
    if cols % 2:
        assert (packed[:, -1] >> 4 == 0).all(), "the last high nibble of an odd row must be 0"


def test_pack_int4_layout():
    # element 2i in the low nibble, 2i+1 in the high nibble, two's complement: -2 is 0xE
    assert ref.pack_int4(np.array([[1, -2, 3]]), signed=True).tolist() == [[0xE1, 0x03]]
    assert ref.pack_int4(np.array([[15, 0, 4, 9]]), signed=False).tolist() == [[0x0F, 0x94]]
    assert ref.unpack_int4(np.array([[0x8F]], np.uint8), 2, signed=True).tolist() == [[-1, -8]]


@pytest.mark.parametrize("signed, bad", [(True, 8), (True, -9), (False, 16), (False, -1)])
def test_pack_int4_rejects_out_of_range(signed, bad):
    with pytest.raises(ValueError):
        ref.pack_int4(np.array([[0, bad]]), signed)


@pytest.mark.parametrize(
    "cols, group_size, groups",
    [(100, 32, 4), (128, 128, 1), (129, 128, 2), (1, 32, 1), (64, 64, 1), (5, -1, 1),
     (40000, -1, 1)],
)
def test_int4_groups_per_row(cols, group_size, groups):
    assert ref.int4_groups_per_row(cols, group_size) == groups


# ---------------------------------------------------------------------------------------------
# INT8
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("granularity", ref.GRANULARITIES)
@pytest.mark.parametrize("dtype", ref.DTYPES)
def test_int8_round_trip_within_half_a_step(dtype, granularity, seed):
    rng = np.random.default_rng(seed)
    x = ref.random_input(rng, (33, 300), dtype)
    q, scales = ref.quantize_int8(x, dtype, granularity)
    assert q.dtype == np.int8 and scales.dtype == np.float32
    assert scales.shape == ((1,) if granularity == "tensor" else (33,))
    assert (np.abs(q.astype(np.int16)) <= 127).all()
    xf = ref.to_f32(x, dtype)
    back = ref.dequantize_int8(q, scales, granularity, "fp32")
    step = np.broadcast_to(scales[:, None], xf.shape)
    err = np.abs(xf - back)
    worst = np.max(err / step)
    assert (err <= step * (0.5 + ROUND_TRIP_SLACK)).all(), f"max err/step {worst}, seed={seed}"
    # Dynamic scales are absmax / 127: the largest element of each scale's span maps to +-127.
    span_max = np.abs(q.astype(np.int16)).max(axis=None if granularity == "tensor" else 1)
    assert (span_max == 127).all(), f"seed={seed}"
    # The output dtype rounding is the last step.
    assert np.array_equal(
        ref.dequantize_int8(q, scales, granularity, dtype).view(np.uint8),
        ref.to_dtype(back, dtype).view(np.uint8),
    )


@pytest.mark.parametrize("dtype", ref.DTYPES)
def test_int8_ties_round_to_even(dtype):
    x = ref.to_dtype(np.array([[0.5, 1.5, 2.5, -0.5, -1.5, -2.5, 3.5, 126.5]], np.float32), dtype)
    q, _ = ref.quantize_int8(x, dtype, "tensor", scales=np.array([1.0], np.float32))
    assert q.tolist() == [[0, 2, 2, 0, -2, -2, 4, 126]]


@pytest.mark.parametrize("granularity", ref.GRANULARITIES)
@pytest.mark.parametrize("dtype", ref.DTYPES)
def test_int8_static_scale_saturates(dtype, granularity, seed):
    rng = np.random.default_rng(seed)
    x = ref.random_input(rng, (4, 500), dtype, scale=10.0)
    n_scales = 1 if granularity == "tensor" else 4
    tiny = np.full(n_scales, 0.01, np.float32)
    q, scales = ref.quantize_int8(x, dtype, granularity, scales=tiny)
    assert np.array_equal(scales, tiny), "static scales are returned as given"
    xf = ref.to_f32(x, dtype)
    big = np.abs(xf * np.float32(100)) >= 127.5
    assert big.any(), f"seed={seed}"
    assert np.array_equal(q[big], np.where(xf[big] > 0, 127, -127)), f"seed={seed}"
    assert q.min() >= -127, "never -128"


@pytest.mark.parametrize("granularity", ref.GRANULARITIES)
@pytest.mark.parametrize("dtype", ref.DTYPES)
def test_int8_zero_absmax_gives_scale_one(dtype, granularity, seed):
    rng = np.random.default_rng(seed)
    if granularity == "tensor":  # the whole tensor is zero
        x = ref.to_dtype(np.zeros((3, 40), np.float32), dtype)
        zero_rows, zero_scales = [0, 1, 2], [0]
    else:  # one row is zero
        x = ref.random_input(rng, (3, 40), dtype, zero_rows=[1])
        zero_rows, zero_scales = [1], [1]
    q, scales = ref.quantize_int8(x, dtype, granularity)
    assert (scales[zero_scales] == 1).all() and (q[zero_rows] == 0).all(), f"seed={seed}"
    back = ref.to_f32(ref.dequantize_int8(q, scales, granularity, dtype), dtype)
    assert not np.isnan(back).any() and (back[zero_rows] == 0).all(), f"seed={seed}"


@pytest.mark.parametrize("granularity", ref.GRANULARITIES)
@pytest.mark.parametrize("dtype", ref.DTYPES)
def test_int8_nan_encodes_as_zero_and_is_ignored(dtype, granularity, seed):
    # Row 2 all NaN: its absmax is 0, its scale 1.
    with_nan, nan_at, clean = with_nans(np.random.default_rng(seed), (4, 64), dtype, 2)
    q, scales = ref.quantize_int8(with_nan, dtype, granularity)
    q_clean, scales_clean = ref.quantize_int8(clean, dtype, granularity)
    assert (q[nan_at] == 0).all(), f"seed={seed}"
    assert np.array_equal(q, q_clean) and np.array_equal(scales, scales_clean), f"seed={seed}"
    assert np.isfinite(scales).all()


# ---------------------------------------------------------------------------------------------
# INT4
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("shape", INT4_SHAPES)
@pytest.mark.parametrize("group_size", ref.INT4_GROUP_SIZES)
@pytest.mark.parametrize("mode", ref.INT4_MODES)
@pytest.mark.parametrize("dtype", ref.DTYPES)
def test_int4_round_trip_within_half_a_step(dtype, mode, group_size, shape, seed):
    rng = np.random.default_rng(seed)
    rows, cols = shape
    groups = ref.int4_groups_per_row(cols, group_size)
    x = ref.random_input(rng, shape, dtype)
    packed, scales, zeros = ref.quantize_int4(x, dtype, group_size, mode)
    assert packed.shape == (rows, (cols + 1) // 2) and packed.dtype == np.uint8
    assert scales.shape == (rows, groups) and scales.dtype == ref.NUMPY_DTYPE[dtype]
    if mode == "sym":
        assert zeros is None
    else:
        assert zeros.shape == (rows, groups) and zeros.dtype == np.uint8 and zeros.max() <= 15

    xf = ref.to_f32(x, dtype)
    scales_f32 = ref.to_f32(scales, dtype)
    assert (scales_f32 > 0).all() and np.isfinite(scales_f32).all(), f"seed={seed}"
    step = group_scales_per_column(scales_f32, cols, group_size)
    scales_fp32 = ref.to_dtype(scales_f32, "fp32")  # dequantize to fp32 takes fp32 scales
    back = ref.dequantize_int4(packed, scales_fp32, zeros, cols, group_size, mode, "fp32")
    # Codes stay in range: saturation happens only where the unclamped code leaves it.
    q = ref.unpack_int4(packed, cols, signed=(mode == "sym")).astype(np.int16)
    lo, hi = ref.INT4_SYM_RANGE if mode == "sym" else ref.INT4_ASYM_RANGE
    unclamped = np.rint(xf * (np.float32(1) / step))
    if mode == "asym":
        unclamped += group_scales_per_column(zeros.astype(np.float32), cols, group_size)
    saturated = (unclamped < lo) | (unclamped > hi)
    assert np.array_equal(q[saturated], np.where(unclamped[saturated] < lo, lo, hi))
    err = np.abs(xf - back)
    assert (err[~saturated] <= (step * (0.5 + ROUND_TRIP_SLACK))[~saturated]).all(), (
        f"max err/step {np.max(err / step)}, seed={seed}"
    )
    # Saturation happens only in asym mode, at the top of the range when both the zero point and
    # hi * inv round up (and the stored scale rounded down): the error stays under one step.
    assert mode == "asym" or not saturated.any(), f"seed={seed}"
    assert (err[saturated] <= step[saturated]).all(), f"seed={seed}"
    # Dequantizing to the input dtype is the float32 result rounded once more.
    assert np.array_equal(
        ref.dequantize_int4(packed, scales, zeros, cols, group_size, mode, dtype).view(np.uint8),
        ref.to_dtype(back, dtype).view(np.uint8),
    )


@pytest.mark.parametrize("dtype", ref.DTYPES)
def test_int4_ties_round_to_even(dtype):
    # sym: absmax 7 -> scale exactly 1 in every dtype
    x = ref.to_dtype(np.array([[7, 0.5, 1.5, 2.5, -2.5, -0.5, -6.5]], np.float32), dtype)
    packed, scales, _ = ref.quantize_int4(x, dtype, ref.GROUP_ROW, "sym")
    assert ref.to_f32(scales, dtype).tolist() == [[1.0]]
    assert ref.unpack_int4(packed, 7, signed=True).tolist() == [[7, 0, 2, 2, -2, 0, -6]]
    # asym: lo = -2.5, hi = 12.5 -> scale exactly 1, zero = rint(2.5) = 2
    x = ref.to_dtype(np.array([[-2.5, 12.5, 0.5, 1.5, 2.5, -1.5]], np.float32), dtype)
    packed, scales, zeros = ref.quantize_int4(x, dtype, ref.GROUP_ROW, "asym")
    assert ref.to_f32(scales, dtype).tolist() == [[1.0]] and zeros.tolist() == [[2]]
    assert ref.unpack_int4(packed, 6, signed=False).tolist() == [[0, 14, 2, 4, 4, 0]]


@pytest.mark.parametrize("mode", ref.INT4_MODES)
@pytest.mark.parametrize("dtype", ref.DTYPES)
def test_int4_zero_group_gives_scale_one(dtype, mode, seed):
    rng = np.random.default_rng(seed)
    xf = ref.to_f32(ref.random_input(rng, (3, 96), dtype, zero_rows=[0]), dtype)
    xf[2, 32:64] = 0  # one zero group inside a non-zero row
    packed, scales, zeros = ref.quantize_int4(ref.to_dtype(xf, dtype), dtype, 32, mode)
    scales_f32 = ref.to_f32(scales, dtype)
    assert (scales_f32[0] == 1).all() and scales_f32[2, 1] == 1, f"seed={seed}"
    q = ref.unpack_int4(packed, 96, signed=(mode == "sym"))
    assert (q[0] == 0).all() and (q[2, 32:64] == 0).all()
    if mode == "asym":
        assert (zeros[0] == 0).all() and zeros[2, 1] == 0
    back = ref.to_f32(ref.dequantize_int4(packed, scales, zeros, 96, 32, mode, dtype), dtype)
    assert not np.isnan(back).any() and (back[0] == 0).all() and (back[2, 32:64] == 0).all()


@pytest.mark.parametrize("mode", ref.INT4_MODES)
@pytest.mark.parametrize("dtype", ref.DTYPES)
def test_int4_nan_encodes_as_zero_and_is_ignored(dtype, mode, seed):
    # Two groups of NaN only (row 1, columns 0 to 63).
    with_nan, nan_at, clean_x = with_nans(np.random.default_rng(seed), (4, 128), dtype,
                                          (1, slice(0, 64)))
    packed, scales, zeros = ref.quantize_int4(with_nan, dtype, 32, mode)
    clean = ref.quantize_int4(clean_x, dtype, 32, mode)
    assert np.array_equal(scales, clean[1]) and (mode == "sym" or np.array_equal(zeros, clean[2]))
    back = ref.to_f32(ref.dequantize_int4(packed, scales, zeros, 128, 32, mode, dtype), dtype)
    assert (back[nan_at] == 0).all(), f"NaN must encode as the code of 0, seed={seed}"
    assert not np.isnan(back).any()


@pytest.mark.parametrize("cols", [100, 33, 7])
@pytest.mark.parametrize("group_size", [32, 64, 128])
@pytest.mark.parametrize("mode", ref.INT4_MODES)
@pytest.mark.parametrize("dtype", ref.DTYPES)
def test_int4_groups_are_independent(dtype, mode, group_size, cols, seed):
    """Each group (the last one partial) quantizes as if it were a whole row of its own."""
    rng = np.random.default_rng(seed)
    x = ref.random_input(rng, (3, cols), dtype)
    packed, scales, zeros = ref.quantize_int4(x, dtype, group_size, mode)
    signed = mode == "sym"
    q = ref.unpack_int4(packed, cols, signed)
    groups = ref.int4_groups_per_row(cols, group_size)
    assert scales.shape == (3, groups)
    for g in range(groups):
        in_group = slice(g * group_size, (g + 1) * group_size)
        part = x[:, in_group]
        p_packed, p_scales, p_zeros = ref.quantize_int4(part, dtype, ref.GROUP_ROW, mode)
        assert np.array_equal(scales[:, g : g + 1], p_scales), f"group {g}, seed={seed}"
        assert signed or np.array_equal(zeros[:, g : g + 1], p_zeros), f"group {g}, seed={seed}"
        p_q = ref.unpack_int4(p_packed, part.shape[1], signed)
        assert np.array_equal(q[:, in_group], p_q), f"group {g}, seed={seed}"


def test_int4_partial_group_scale():
    # cols = 100, group 32: groups of 32, 32, 32 and 4; the last scale comes from 4 values.
    x = np.zeros((1, 100), np.float32)
    x[0, :96] = 70.0
    x[0, 96:] = [0.7, -1.4, 0.0, 0.35]
    packed, scales, _ = ref.quantize_int4(x, "fp32", 32, "sym")
    assert scales.shape == (1, 4)
    full, partial = np.float32(70) / np.float32(7), np.float32(1.4) / np.float32(7)
    assert scales[0].tolist() == [full, full, full, partial]
    assert ref.unpack_int4(packed, 100, signed=True)[0, 96:].tolist() == [4, -7, 0, 2]


def test_int4_odd_cols_pack_a_zero_high_nibble():
    x = np.array([[1.0, -1.0, 7.0], [7.0, 7.0, 7.0]], np.float32)
    packed, scales, zeros = ref.quantize_int4(x, "fp32", ref.GROUP_ROW, "asym")
    assert packed.shape == (2, 2)
    assert (packed[:, 1] >> 4 == 0).all()
    packed, _, _ = ref.quantize_int4(x, "fp32", ref.GROUP_ROW, "sym")
    assert packed.tolist() == [[0xF1, 0x07], [0x77, 0x07]]


def test_int4_large_row_is_vectorized(seed):
    """1 x 1_000_003 (odd, not a multiple of any group): shapes and the round-trip bound."""
    rng = np.random.default_rng(seed)
    cols = 1_000_003
    x = ref.random_input(rng, (1, cols), "bf16")
    packed, scales, zeros = ref.quantize_int4(x, "bf16", 128, "asym")
    assert packed.shape == (1, 500_002) and scales.shape == (1, 7813) and zeros.shape == (1, 7813)
    back = ref.to_f32(ref.dequantize_int4(packed, ref.to_dtype(ref.to_f32(scales, "bf16"), "fp32"),
                                          zeros, cols, 128, "asym", "fp32"), "fp32")
    step = group_scales_per_column(ref.to_f32(scales, "bf16"), cols, 128)
    # Asymmetric saturation (see test_int4_round_trip_within_half_a_step): within one step.
    assert (np.abs(ref.to_f32(x, "bf16") - back) <= step).all(), f"seed={seed}"


# ---------------------------------------------------------------------------------------------
# Matrix products: gemm_int8, gemm_int8_scaled, linear
# ---------------------------------------------------------------------------------------------
def brute_force_int_matmul(a, b_nk):
    """Python integers, one dot product at a time: slow, obviously right."""
    return [[sum(int(x) * int(y) for x, y in zip(row, col)) for col in b_nk] for row in a]


def random_int8(rng, shape):
    return rng.integers(-128, 128, size=shape, dtype=np.int8)


def test_gemm_int8_hand_computed():
    a = np.array([[1, 2, 3], [-4, 5, -6]], np.int8)
    b_nk = np.array([[1, 0, 0], [0, 1, 0], [1, 1, 1], [-128, 127, -1]], np.int8)
    want = [[1, 2, 6, -128 + 254 - 3], [-4, 5, -5, 512 + 635 + 6]]
    got = ref.gemm_int8(a, b_nk, "nk")
    assert got.dtype == np.int32 and got.shape == (2, 4)
    assert got.tolist() == want
    assert ref.gemm_int8(a, np.ascontiguousarray(b_nk.T), "kn").tolist() == want


@pytest.mark.parametrize("shape", [(1, 1, 1), (3, 5, 16), (7, 9, 33), (16, 24, 64), (5, 3, 200)])
def test_gemm_int8_matches_brute_force(shape, seed):
    rng = np.random.default_rng(seed)
    m, n, k = shape
    a, b_nk = random_int8(rng, (m, k)), random_int8(rng, (n, k))
    want = brute_force_int_matmul(a, b_nk)
    assert ref.gemm_int8(a, b_nk, "nk").tolist() == want, f"seed={seed}"
    assert ref.gemm_int8(a, np.ascontiguousarray(b_nk.T), "kn").tolist() == want, f"seed={seed}"


def test_gemm_int8_extremes_are_exact():
    k = 4096
    a = np.full((2, k), -128, np.int8)
    a[1, ::2] = 127
    b = np.full((3, k), -128, np.int8)
    b[1] = 127
    got = ref.gemm_int8(a, b, "nk")
    assert got[0, 0] == k * 16384 and got[0, 1] == -k * 128 * 127
    assert got[1, 0] == k // 2 * (16384 - 127 * 128)
    assert got[1, 1] == k // 2 * (127 * 127 - 128 * 127)


def test_wrap_int32():
    x = np.array([2**31, -(2**31) - 1, 2**32 + 5, -1, 2**31 - 1, -(2**31), 3 * 2**32 - 7])
    assert ref.wrap_int32(x).tolist() == [-(2**31), 2**31 - 1, 5, -1, 2**31 - 1, -(2**31), -7]
    assert ref.wrap_int32(x).dtype == np.int32


def test_gemm_int8_wraps_like_int32_addition():
    """The header: sums wrap modulo 2**32; K <= 131071 never does, K = 131072 can."""
    assert ref.INT32_EXACT_K_MAX == 131071
    for k, want in ((131071, 131071 * 16384), (131072, -(2**31)), (131088, -(2**31) + 16 * 16384)):
        a = np.full((1, k), -128, np.int8)
        got = ref.gemm_int8(a, a, "nk")
        assert got.tolist() == [[want]], k
    # The most negative sum: (-128) * 127 * k, within int32 for k = 131071 and wrapped beyond.
    k = 2**17 + 16
    a, b = np.full((1, k), -128, np.int8), np.full((1, k), 127, np.int8)
    assert ref.gemm_int8(a, b, "nk")[0, 0] == ref.wrap_int32(-128 * 127 * k)[()]


def test_int_matmul_exact_falls_back_to_int64():
    """Entries too large for float64 to hold every partial sum take the int64 path."""
    a = np.array([[2**40, 2**40 + 1]], np.int64)
    b = np.array([[2**20, 3]], np.int64)
    assert ref.int_matmul_exact(a, b).tolist() == [[2**60 + 3 * (2**40 + 1)]]


def test_gemm_int8_rejects_bad_inputs():
    a = np.zeros((2, 16), np.int8)
    with pytest.raises(TypeError):
        ref.gemm_int8(a.astype(np.int16), a, "nk")
    with pytest.raises(ValueError):
        ref.gemm_int8(a, np.zeros((3, 32), np.int8), "nk")
    with pytest.raises(ValueError):
        ref.gemm_int8(a, a, "tn")


def test_int8_epilogue_hand_computed():
    acc = np.array([[10, -20], [3, 0]], np.int32)
    sa = np.array([0.5, 2.0], np.float32)
    sb = np.array([2.0, 0.25], np.float32)
    assert ref.int8_epilogue_f64(acc, sa, sb).tolist() == [[10.0, -2.5], [12.0, 0.0]]
    bias = np.array([1.0, 1.0], np.float16)
    v = ref.int8_epilogue_f64(acc, sa, sb, bias, "none", "fp16")
    assert v.tolist() == [[11.0, -1.5], [13.0, 1.0]]
    v = ref.int8_epilogue_f64(acc, sa, sb, bias, "relu", "fp16")
    assert v.tolist() == [[11.0, 0.0], [13.0, 1.0]]
    bias_bf16 = ref.to_dtype(np.array([-100.0, 0.5], np.float32), "bf16")
    v = ref.int8_epilogue_f64(acc, np.float32(1), np.float32(1), bias_bf16, "relu", "bf16")
    assert v.tolist() == [[0.0, 0.0], [0.0, 0.5]]
    assert ref.gemm_int8_scaled(np.eye(2, 16, dtype=np.int8), np.eye(2, 16, dtype=np.int8), "nk",
                                np.float32(3), np.float32(0.5), None, "none", "fp16").tolist() \
        == [[1.5, 0.0], [0.0, 1.5]]


def test_int8_epilogue_broadcasts_scales(seed):
    rng = np.random.default_rng(seed)
    acc = rng.integers(-(2**31), 2**31, size=(5, 7), dtype=np.int64).astype(np.int32)
    sa, sb = np.float32(0.003), np.float32(1.7e-5)
    per_tensor = ref.int8_epilogue_f64(acc, np.array([sa]), np.array([sb]))
    per_row = ref.int8_epilogue_f64(acc, np.full(5, sa), np.full(7, sb))
    assert np.array_equal(per_tensor, per_row), f"seed={seed}"
    # Per-row scale_a scales rows, per-column scale_b scales columns.
    ra, rb = rng.uniform(0.1, 10, 5).astype(np.float32), rng.uniform(0.1, 10, 7).astype(np.float32)
    got = ref.int8_epilogue_f64(acc, ra, rb)
    want = acc.astype(np.float64) * ra.astype(np.float64)[:, None] * rb.astype(np.float64)
    assert np.allclose(got, want, rtol=1e-15, atol=0), f"seed={seed}"
    # M == 1 or N == 1: one value is both per tensor and per row.
    one = acc[:1, :1]
    assert ref.int8_epilogue_f64(one, ra[:1], rb[:1]).tolist() == \
        [[float(one[0, 0]) * float(ra[0]) * float(rb[0])]]


def test_int8_epilogue_rejects_bad_scales():
    acc = np.zeros((3, 4), np.int32)
    with pytest.raises(ValueError):
        ref.int8_epilogue_f64(acc, np.ones(2, np.float32), np.ones(1, np.float32))
    with pytest.raises(ValueError):
        ref.int8_epilogue_f64(acc, np.ones(3, np.float32), np.ones(3, np.float32))
    with pytest.raises(TypeError):
        ref.int8_epilogue_f64(acc, np.ones(3, np.float64), np.ones(4, np.float32))
    with pytest.raises(ValueError):
        ref.int8_epilogue_f64(acc, np.ones(1, np.float32), np.ones(1, np.float32),
                              bias=np.ones(3, np.float32))
    with pytest.raises(ValueError):
        ref.int8_epilogue_f64(acc, np.ones(1, np.float32), np.ones(1, np.float32),
                              activation="gelu")


@pytest.mark.parametrize("out_dtype", ref.DTYPES)
@pytest.mark.parametrize("layout", ref.LAYOUTS)
def test_gemm_int8_scaled_relu_and_rounding(layout, out_dtype, seed):
    rng = np.random.default_rng(seed)
    a, b_nk = random_int8(rng, (9, 48)), random_int8(rng, (11, 48))
    b = b_nk if layout == "nk" else np.ascontiguousarray(b_nk.T)
    sa = rng.uniform(1e-3, 1e-2, 9).astype(np.float32)
    sb = np.array([2e-3], np.float32)
    bias = ref.to_dtype(rng.standard_normal(11).astype(np.float32), out_dtype)
    v = ref.gemm_int8_scaled_f64(a, b, layout, sa, sb, bias, "none", out_dtype)
    v_relu = ref.gemm_int8_scaled_f64(a, b, layout, sa, sb, bias, "relu", out_dtype)
    assert (v < 0).any() and (v > 0).any(), f"the data must have both signs, seed={seed}"
    assert np.array_equal(v_relu, np.maximum(v, 0)), f"seed={seed}"
    out = ref.gemm_int8_scaled(a, b, layout, sa, sb, bias, "relu", out_dtype)
    assert out.dtype == ref.NUMPY_DTYPE[out_dtype] and out.shape == (9, 11)
    got = ref.to_f32(out, out_dtype).astype(np.float64)
    assert (got >= 0).all() and (got[v < 0] == 0).all(), f"seed={seed}"
    # Rounded once, to nearest: within half an ulp of the output type.
    assert (np.abs(got - v_relu) <= 0.5 * ref.ulp(v_relu, out_dtype)).all(), f"seed={seed}"


def test_round_f64_to_dtype_rounds_once():
    """Values just above a tie of the output type: a float32 intermediate would make a tie of
    them (and round to even, down); one rounding goes up."""
    fp16 = np.array([1 + 2**-11 + 2**-40, -(1 + 2**-11 + 2**-40), 1 + 2**-11, 1 + 3 * 2**-11])
    assert ref.round_f64_to_dtype(fp16, "fp16").tolist() == [1 + 2**-10, -(1 + 2**-10), 1.0,
                                                             1 + 2**-9]
    bf16 = np.array([1 + 2**-8 + 2**-30, 1 + 2**-8, 1 + 3 * 2**-8, -(1 + 2**-8 + 2**-30)])
    assert [hex(b) for b in ref.round_f64_to_dtype(bf16, "bf16")] == \
        ["0x3f81", "0x3f80", "0x3f82", "0xbf81"]
    fp32 = np.array([1 + 2**-24 + 2**-40, 1 + 2**-24])
    assert ref.round_f64_to_dtype(fp32, "fp32").tolist() == [1 + 2**-23, 1.0]


def test_round_f64_to_bf16_special_values():
    max_bf16 = float(ref.bf16_bits_to_f32(np.array([0x7F7F], np.uint16))[0])
    # Half an ulp above the largest finite value is a tie: 0x7F7F is odd, so it rounds to inf.
    v = np.array([max_bf16, max_bf16 + 2.0**119 - 2.0**90, max_bf16 + 2.0**119, 2.0**128, 1e300,
                  -1e300, np.inf, 0.0, -0.0, 1.5 * 2.0**-133, 2.5 * 2.0**-133, 2.0**-140, np.nan])
    got = ref.round_f64_to_dtype(v, "bf16")
    assert [hex(b) for b in got[:-1]] == ["0x7f7f", "0x7f7f", "0x7f80", "0x7f80", "0x7f80",
                                          "0xff80", "0x7f80", "0x0", "0x8000", "0x2", "0x2",
                                          "0x0"]
    assert np.isnan(ref.bf16_bits_to_f32(got[-1:]))[0]


def test_round_f64_to_bf16_agrees_with_float32_rounding(seed):
    """For float32 inputs one rounding is the rounding f32_to_bf16_bits makes."""
    rng = np.random.default_rng(seed)
    bits = rng.integers(0, 2**32, size=100_000, dtype=np.uint64).astype(np.uint32)
    x = bits.view(np.float32)
    x = x[np.isfinite(x)]
    assert np.array_equal(ref.round_f64_to_dtype(x.astype(np.float64), "bf16"),
                          ref.f32_to_bf16_bits(x)), f"seed={seed}"


def test_ulp():
    assert ref.ulp(1.0, "fp32") == 2.0**-23 and ref.ulp(1.0, "fp16") == 2.0**-10
    assert ref.ulp(1.0, "bf16") == 2.0**-7 and ref.ulp(-1.5, "bf16") == 2.0**-7
    assert ref.ulp(65504.0, "fp16") == 32.0 and ref.ulp(2.0**-20, "fp16") == 2.0**-24
    assert ref.ulp(0.0, "fp16") == 2.0**-24 and ref.ulp(0.0, "fp32") == 2.0**-149
    assert ref.ulp(0.0, "bf16") == 2.0**-133 and ref.ulp(3.0e38, "fp32") == 2.0**104


@pytest.mark.parametrize("dtype", ref.DTYPES)
def test_linear_hand_computed(dtype):
    x = ref.to_dtype(np.array([[1, 2], [3, 4]], np.float32), dtype)
    w = ref.to_dtype(np.array([[1, 0], [0, 1], [1, 1]], np.float32), dtype)
    assert ref.linear_f64(x, w, dtype=dtype).tolist() == [[1, 2, 3], [3, 4, 7]]
    bias = ref.to_dtype(np.array([-10, 0, 0.5], np.float32), dtype)
    assert ref.linear_f64(x, w, bias, "none", dtype).tolist() == [[-9, 2, 3.5], [-7, 4, 7.5]]
    out = ref.linear(x, w, bias, "relu", dtype)
    assert out.dtype == ref.NUMPY_DTYPE[dtype]
    assert ref.to_f32(out, dtype).tolist() == [[0, 2, 3.5], [0, 4, 7.5]]
    assert ref.dtype_of(x) == dtype


def test_linear_of_integers_is_the_int8_product(seed):
    """linear on integer-valued floats computes the same sums as gemm_int8 (two specs agree)."""
    rng = np.random.default_rng(seed)
    a, b_nk = random_int8(rng, (6, 64)), random_int8(rng, (10, 64))
    got = ref.linear_f64(a.astype(np.float32), b_nk.astype(np.float32))
    assert np.array_equal(got, ref.gemm_int8(a, b_nk, "nk").astype(np.float64)), f"seed={seed}"


def test_linear_rejects_mismatched_shapes():
    x = np.zeros((2, 8), np.float32)
    with pytest.raises(ValueError):
        ref.linear_f64(x, np.zeros((3, 16), np.float32))
    with pytest.raises(ValueError):
        ref.linear_f64(x, np.zeros((3, 8), np.float32), np.zeros(4, np.float32))
    with pytest.raises(TypeError):
        ref.linear_f64(x, np.zeros((3, 8), np.float16))


# ---------------------------------------------------------------------------------------------
# W4A16: x times a packed INT4 weight dequantized as ck_dequantize_int4 does
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", ref.W4A16_DTYPES)
def test_gemm_w4a16_hand_computed(dtype):
    """One group of 32 per row: symmetric codes 1..., scale 0.5; asymmetric with zero 8."""
    k = 32
    codes = np.zeros((2, k), np.int8)
    codes[0, :2] = (1, -2)      # w'[0] = 0.5, -1.0, 0, ...
    codes[1, 31] = 7            # w'[1, 31] = 3.5
    packed = ref.pack_int4(codes, signed=True)
    scales = ref.to_dtype(np.full((2, 1), 0.5, np.float32), dtype)
    x = np.zeros((1, k), np.float32)
    x[0, 0], x[0, 1], x[0, 31] = 4, 1, 2
    x = ref.to_dtype(x, dtype)
    got = ref.gemm_w4a16_f64(x, packed, scales, None, 32, k, dtype)
    assert got.tolist() == [[4 * 0.5 - 1.0, 2 * 3.5]]
    bias = ref.to_dtype(np.array([-2, 1], np.float32), dtype)
    out = ref.gemm_w4a16(x, packed, scales, None, 32, k, dtype, bias, "relu")
    assert out.dtype == ref.NUMPY_DTYPE[dtype]
    assert ref.to_f32(out, dtype).tolist() == [[0, 8]]
    # The same weight, asymmetric: codes + 8 with zero point 8.
    zeros = np.full((2, 1), 8, np.uint8)
    packed_asym = ref.pack_int4((codes + 8).astype(np.int8), signed=False)
    assert ref.gemm_w4a16_f64(x, packed_asym, scales, zeros, 32, k, dtype).tolist() == \
        got.tolist()


@pytest.mark.parametrize("group_size", ref.INT4_GROUP_SIZES)
@pytest.mark.parametrize("mode", ref.INT4_MODES)
@pytest.mark.parametrize("dtype", ref.W4A16_DTYPES)
def test_gemm_w4a16_is_linear_of_the_dequantized_weight(dtype, mode, group_size, seed):
    """The spec in two sentences of the header: w' = dequantize_int4(...) rounded to dtype, then
    linear(x, w') with the bias and activation; quantized from random float weights."""
    rng = np.random.default_rng(seed)
    m, n, k = 5, 7, 160        # 160: partial last group of 64 and of 128
    w = ref.random_input(rng, (n, k), dtype)
    packed, scales, zeros = ref.quantize_int4(w, dtype, group_size, mode)
    x = ref.random_input(rng, (m, k), dtype)
    bias = ref.random_input(rng, (1, n), dtype).reshape(-1)
    w_deq = ref.dequantize_int4(packed, scales, zeros, k, group_size, mode, dtype)
    assert np.array_equal(ref.dequantized_int4_weight(packed, scales, zeros, group_size, k,
                                                      dtype), w_deq)
    for activation in ref.ACTIVATIONS:
        want = ref.linear_f64(x, w_deq, bias, activation, dtype)
        got = ref.gemm_w4a16_f64(x, packed, scales, zeros, group_size, k, dtype, bias,
                                 activation)
        assert np.array_equal(got, want), f"seed={seed}"
        rounded = ref.gemm_w4a16(x, packed, scales, zeros, group_size, k, None, bias, activation)
        assert np.array_equal(rounded, ref.round_f64_to_dtype(want, dtype)), f"seed={seed}"
    # The dequantized weight is close to the float weight: within half a step of its group
    # (a whole step for asym, where the rounded zero point can push the top code past 15 into
    # the clamp), plus the rounding of w' to dtype.
    step = group_scales_per_column(ref.to_f32(scales, dtype), k, group_size)
    wf = ref.to_f32(w, dtype)
    err = np.abs(ref.to_f32(w_deq, dtype) - wf)
    steps = 0.5 if mode == "sym" else 1.0
    assert np.all(err <= steps * step * (1 + 1e-2) + ref.ulp(np.abs(wf) + step, dtype)), \
        f"seed={seed}"


def test_gemm_w4a16_relu_is_never_negative(seed):
    rng = np.random.default_rng(seed)
    w = ref.random_input(rng, (9, 64), "bf16")
    packed, scales, zeros = ref.quantize_int4(w, "bf16", 32, "asym")
    x = ref.random_input(rng, (4, 64), "bf16")
    out = ref.to_f32(ref.gemm_w4a16(x, packed, scales, zeros, 32, 64, "bf16", None, "relu"),
                     "bf16")
    assert np.all(out >= 0) and np.any(out > 0), f"seed={seed}"


def test_gemm_w4a16_rejects_bad_inputs():
    x = np.zeros((2, 32), np.float16)
    packed = np.zeros((3, 16), np.uint8)
    scales = np.ones((3, 1), np.float16)
    with pytest.raises(ValueError):      # fp32 is not a W4A16 dtype
        ref.gemm_w4a16_f64(x.astype(np.float32), packed, scales.astype(np.float32), None, 32, 32)
    with pytest.raises(ValueError):      # K of x differs from k
        ref.gemm_w4a16_f64(x, packed, scales, None, 32, 64)
    with pytest.raises(ValueError):      # scales are [N, groups]
        ref.gemm_w4a16_f64(x, packed, np.ones((3, 2), np.float16), None, 32, 32)
    with pytest.raises(ValueError):      # group size
        ref.gemm_w4a16_f64(x, packed, scales, None, 48, 32)
    with pytest.raises(ValueError):      # bias has N values
        ref.gemm_w4a16_f64(x, packed, scales, None, 32, 32, bias=np.zeros(2, np.float16))


# ---------------------------------------------------------------------------------------------
# INT4 x INT4 GEMM: the int8 product of the unpacked signed codes
# ---------------------------------------------------------------------------------------------
def test_gemm_int4_hand_computed():
    codes = np.arange(-8, 8, dtype=np.int8)                  # every code, K = 16 (reference only)
    a = np.stack([codes, np.full(16, -8, np.int8)])          # [2, 16]
    b = np.stack([codes, np.ones(16, np.int8), codes[::-1]])  # [3, 16]
    got = ref.gemm_int4_i32(ref.pack_int4(a, True), ref.pack_int4(b, True), 16)
    squares = int((codes.astype(np.int64) ** 2).sum())       # 344
    reversed_ = int((codes.astype(np.int64) * codes[::-1]).sum())
    want = np.array([[squares, -8, reversed_], [64, -128, 64]], np.int32)
    assert got.dtype == np.int32 and np.array_equal(got, want), got


@pytest.mark.parametrize("shape", [(1, 1, 32), (5, 7, 96), (33, 17, 256)], ids=str)
def test_gemm_int4_matches_brute_force(shape, seed):
    rng = np.random.default_rng(seed)
    m, n, k = shape
    a = rng.integers(-8, 8, size=(m, k), dtype=np.int8)
    b = rng.integers(-8, 8, size=(n, k), dtype=np.int8)
    want = np.array([[sum(int(x) * int(y) for x, y in zip(a[i], b[j])) for j in range(n)]
                     for i in range(m)], np.int64)
    got = ref.gemm_int4_i32(ref.pack_int4(a, True), ref.pack_int4(b, True), k)
    assert np.array_equal(got, want.astype(np.int32)), f"seed={seed}"
    assert np.array_equal(got, ref.gemm_int8(a, b)), f"seed={seed}"


def test_gemm_int4_rejects_a_wrong_row_length():
    with pytest.raises(ValueError):  # 64 codes pack into 32 bytes, not 16
        ref.gemm_int4_i32(np.zeros((2, 16), np.uint8), np.zeros((3, 16), np.uint8), 64)
