"""CPU tests of tests/checkpoint_formats.py, the NumPy spec of the GPTQ and AWQ checkpoint
formats that ck_import_gptq and ck_import_awq read:

- tiny hand-checked examples: int32 words written out by hand from the formats' definitions
  (nibble order, GPTQ's stored zero - 1, AWQ's interleave, sign bit of nibble 7);
- pack/unpack round trips on random codes (every nibble value);
- the act-order g_idx: group sizes, and g_idx[perm[i]] = i // group_size;
- library_from_gptq / library_from_awq, dequantized as the interchange format
  (reference.dequantize_int4), equal the checkpoints' own dequantization bit for bit (rows
  permuted by perm for act-order), and x[:, perm] times the imported weight is x times the
  checkpoint weight.
"""

import numpy as np
import pytest

import checkpoint_formats as cf
import reference as ref

DTYPES = ref.W4A16_DTYPES   # the scale dtypes of the checkpoints
GROUP_SIZES = ref.INT4_GROUP_SIZES
SHAPES = [(32, 8), (96, 200), (256, 24), (1024, 64)]  # (K, N)


def _int32(*hex_words):
    """uint32 bit patterns -> int32 values (the checkpoint's int32 view)."""
    return np.array(hex_words, dtype=np.uint32).view(np.int32)


# ---------------------------------------------------------------------------------------------
# Hand-checked examples
# ---------------------------------------------------------------------------------------------
def test_gptq_hand_example():
    """K = 8, N = 8, one group: codes of column n go down the 8 nibbles of qweight[0, n], k in
    bits 4k .. 4k + 3; zeros stored as zero - 1 in nibble n of qzeros[0, 0]."""
    codes = np.zeros((8, 8), dtype=np.uint8)
    codes[:, 0] = np.arange(8)          # 0x76543210
    codes[:, 1] = np.arange(8, 16)      # 0xFEDCBA98: nibble 7 sets the sign bit
    codes[:, 2] = 15                    # 0xFFFFFFFF = -1
    codes[0, 3] = 15                    # k = 0: the lowest nibble, 0x0000000F
    codes[7, 4] = 8                     # k = 7: the top nibble, 0x80000000
    zeros = np.array([[1, 2, 3, 4, 5, 6, 7, 16]])  # stored 0 .. 6, 15: 0xF6543210
    scales = np.ones((1, 8), dtype=np.float16)
    qweight, qzeros, _, g_idx = cf.gptq_pack(codes, zeros, scales, group_size=8)
    assert qweight.dtype == np.int32 and qweight.shape == (1, 8)
    np.testing.assert_array_equal(
        qweight, [[1985229328, -19088744, -1, 15, -2147483648, 0, 0, 0]])
    assert qzeros.dtype == np.int32 and qzeros.shape == (1, 1)
    np.testing.assert_array_equal(qzeros, [[-162254320]])  # 0xF6543210
    np.testing.assert_array_equal(g_idx, np.zeros(8, np.int32))
    # The dequantizer's zero is stored + 1: code 0 of column 7 (zero 16) is -16 * scale.
    w = cf.gptq_unpack(qweight, qzeros, scales, g_idx, "fp16")
    assert w[0, 7] == -16 and w[7, 1] == 15 - 2 and w[0, 0] == -1


def test_gptq_hand_example_two_words_and_groups():
    """K = 16: rows 8 .. 15 go to qweight[1]; N = 16: columns 8 .. 15 to qzeros[:, 1];
    g_idx picks each row's group (scale and zero)."""
    codes = np.zeros((16, 16), dtype=np.uint8)
    codes[8, 0] = 1         # k = 8: word 1, nibble 0
    codes[15, 9] = 3        # k = 15: word 1, nibble 7 of column 9
    zeros = np.ones((2, 16), dtype=np.int64)
    zeros[1, 8] = 2         # group 1, n = 8: qzeros[1, 1] nibble 0 = 1
    zeros[0, 15] = 9        # group 0, n = 15: qzeros[0, 1] nibble 7 = 8 -> 0x80000000
    scales = np.full((2, 16), 2, dtype=np.float16)
    g_idx = np.array([0, 1] * 8, dtype=np.int32)
    qweight, qzeros, _, stored = cf.gptq_pack(codes, zeros, scales, g_idx)
    want = np.zeros((2, 16), dtype=np.int32)
    want[1, 0] = 0x1
    want[1, 9] = 0x30000000
    np.testing.assert_array_equal(qweight, want)
    np.testing.assert_array_equal(qzeros, _int32(0, 0x80000000, 0, 0x1).reshape(2, 2))
    np.testing.assert_array_equal(stored, g_idx)
    w = cf.gptq_unpack(qweight, qzeros, scales, g_idx, "fp16")
    assert w[8, 0] == (1 - 1) * 2 and w[15, 9] == (3 - 1) * 2    # rows 8, 15: groups 0, 1
    assert w[9, 8] == (0 - 2) * 2 and w[8, 15] == (0 - 9) * 2


def test_awq_hand_example():
    """K = 2, N = 8: nibble p of qweight[k, 0] holds column (0, 2, 4, 6, 1, 3, 5, 7)[p];
    the zeros are packed the same way and are the zero points themselves."""
    codes = np.zeros((2, 8), dtype=np.uint8)
    codes[0] = np.arange(8)           # nibbles p: 0, 2, 4, 6, 1, 3, 5, 7 -> 0x75316420
    codes[1] = np.arange(8, 16)       # 8, 10, 12, 14, 9, 11, 13, 15 -> 0xFDB9ECA8
    zeros = np.zeros((1, 8), dtype=np.uint8)
    zeros[0, 0] = 15                  # column 0: nibble 0
    zeros[0, 7] = 9                   # column 7: nibble 7 -> 0x9000000F
    scales = np.ones((1, 8), dtype=np.float16)
    qweight, qzeros, _ = cf.awq_pack(codes, zeros, scales)
    np.testing.assert_array_equal(qweight, [[1966171168], [-38146904]])
    np.testing.assert_array_equal(qzeros, [[-1879048177]])
    one_column = np.zeros((1, 8), dtype=np.uint8)
    one_column[0, 1] = 5              # column 1 sits in nibble 4
    np.testing.assert_array_equal(cf.awq_pack(one_column, zeros, scales)[0], [[0x50000]])
    w = cf.awq_unpack(qweight, qzeros, scales, 2, "fp16")
    assert w[0, 0] == -15 and w[1, 7] == 15 - 9 and w[1, 1] == 9


def test_library_hand_example():
    """The interchange layout: w_packed[n, k // 2], element 2i in the low nibble."""
    codes = np.zeros((32, 8), dtype=np.uint8)
    codes[0, 3], codes[1, 3], codes[31, 3] = 1, 2, 15
    zeros = np.full((1, 8), 16)
    scales = np.ones((1, 8), dtype=np.float16)
    qweight, qzeros, scales, _ = cf.gptq_pack(codes, zeros, scales, group_size=ref.GROUP_ROW)
    w_packed, s, z, perm = cf.library_from_gptq(qweight, qzeros, scales, None, ref.GROUP_ROW)
    assert perm is None and w_packed.shape == (8, 16) and w_packed.dtype == np.uint8
    assert w_packed[3, 0] == 0x21 and w_packed[3, 15] == 0xF0 and w_packed[3, 1:15].sum() == 0
    assert (w_packed[[0, 1, 2, 4, 5, 6, 7]] == 0).all()
    assert z.dtype == np.uint8 and (z == 16).all() and s.shape == (8, 1)


# ---------------------------------------------------------------------------------------------
# Round trips
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("k, n", SHAPES)
def test_gptq_round_trip(k, n):
    rng = np.random.default_rng(1000 + k + n)
    codes = cf.random_nibbles(rng, (k, n))
    zeros = cf.random_nibbles(rng, (k // 32, n), lo=1)
    assert set(np.unique(codes)) == set(range(16))
    if zeros.size >= 16:
        assert set(np.unique(zeros)) == set(range(1, 17))
    scales = cf.random_scales(rng, k // 32, n, k, "fp16")
    qweight, qzeros, s, g_idx = cf.gptq_pack(codes, zeros, scales, group_size=32)
    assert qweight.shape == (k // 8, n) and qzeros.shape == (k // 32, n // 8)
    assert qweight.dtype == np.int32 and qzeros.dtype == np.int32
    assert (qweight < 0).any() and (qzeros < 0).any()   # nibble 7 >= 8 somewhere
    got_codes, got_zeros = cf.gptq_unpack_codes(qweight, qzeros)
    np.testing.assert_array_equal(got_codes, codes)
    np.testing.assert_array_equal(got_zeros, zeros)
    np.testing.assert_array_equal(g_idx, np.arange(k) // 32)
    assert s is scales or np.array_equal(s, scales)


@pytest.mark.parametrize("k, n", SHAPES)
def test_awq_round_trip(k, n):
    rng = np.random.default_rng(2000 + k + n)
    codes = cf.random_nibbles(rng, (k, n))
    zeros = cf.random_nibbles(rng, (k // 32, n))
    qweight, qzeros, _ = cf.awq_pack(codes, zeros, cf.random_scales(rng, k // 32, n, k, "bf16"))
    assert qweight.shape == (k, n // 8) and qzeros.shape == (k // 32, n // 8)
    assert (qweight < 0).any()
    got_codes, got_zeros = cf.awq_unpack_codes(qweight, qzeros)
    np.testing.assert_array_equal(got_codes, codes)
    np.testing.assert_array_equal(got_zeros, zeros)


def test_pack_rejects_values_outside_the_format():
    codes = np.zeros((8, 8), dtype=np.uint8)
    scales = np.ones((1, 8), dtype=np.float16)
    with pytest.raises(ValueError):     # GPTQ v1 cannot store a zero point of 0
        cf.gptq_pack(codes, np.zeros((1, 8), np.int64), scales, group_size=8)
    with pytest.raises(ValueError):
        cf.gptq_pack(codes, np.full((1, 8), 17), scales, group_size=8)
    with pytest.raises(ValueError):
        cf.awq_pack(np.full((8, 8), 16), np.zeros((1, 8), np.uint8), scales)


# ---------------------------------------------------------------------------------------------
# Act-order g_idx
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("k, group_size", [(96, 64), (256, 32), (4096, 128), (160, 128),
                                           (64, ref.GROUP_ROW)])
def test_act_order_g_idx(k, group_size):
    seed = 3000 + k
    g_idx = cf.gptq_act_order_g_idx(k, group_size, np.random.default_rng(seed))
    width = k if group_size == ref.GROUP_ROW else group_size
    groups = ref.int4_groups_per_row(k, group_size)
    assert g_idx.dtype == np.int32 and g_idx.shape == (k,)
    counts = np.bincount(g_idx, minlength=groups)
    assert len(counts) == groups
    assert (counts[:-1] == width).all() and counts[-1] == k - (groups - 1) * width
    perm = np.random.default_rng(seed).permutation(k)  # the same draw
    np.testing.assert_array_equal(g_idx[perm], np.arange(k) // width)
    if groups > 1:
        assert (np.diff(g_idx) < 0).any(), "act-order groups are not runs of consecutive k"
    library_perm = cf.gptq_perm(g_idx, group_size)
    assert sorted(library_perm) == list(range(k))
    np.testing.assert_array_equal(g_idx[library_perm], np.arange(k) // width)
    for g in range(groups):  # stable: increasing k within a group
        assert (np.diff(library_perm[g * width:(g + 1) * width]) > 0).all()


def test_gptq_perm_rejects_groups_of_the_wrong_size():
    g_idx = np.zeros(64, dtype=np.int32)
    g_idx[40:] = 1          # 40 + 24 rows: not 32 + 32
    with pytest.raises(ValueError):
        cf.gptq_perm(g_idx, 32)


# ---------------------------------------------------------------------------------------------
# The library's interchange format dequantizes to the checkpoint's own weights
# ---------------------------------------------------------------------------------------------
def _library_weight(w_packed, scales, zeros, k, group_size, dtype):
    return ref.dequantize_int4(w_packed, scales, zeros, k, group_size, "asym", dtype)


@pytest.mark.parametrize("k, n", SHAPES)
@pytest.mark.parametrize("group_size", GROUP_SIZES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("g_idx_kind", ["none", "trivial", "act_order"])
def test_library_from_gptq_dequantizes_to_the_checkpoint(g_idx_kind, dtype, group_size, k, n):
    rng = np.random.default_rng(4000 + k + n + group_size)
    qweight, qzeros, scales, g_idx = cf.random_gptq_checkpoint(rng, k, n, group_size, dtype,
                                                               g_idx_kind)
    stored_g_idx = g_idx if g_idx is not None else cf.gptq_groups_g_idx(k, group_size)
    w_ckpt = cf.gptq_unpack(qweight, qzeros, scales, stored_g_idx, dtype)   # [K, N]
    w_packed, s, z, perm = cf.library_from_gptq(qweight, qzeros, scales, g_idx, group_size)
    groups = ref.int4_groups_per_row(k, group_size)
    assert w_packed.shape == (n, k // 2) and w_packed.dtype == np.uint8
    assert s.shape == (n, groups) and s.dtype == scales.dtype
    assert z.shape == (n, groups) and z.dtype == np.uint8 and z.min() >= 1 and z.max() <= 16
    if g_idx is None:
        assert perm is None
        rows = np.arange(k)
    else:
        assert perm.dtype == np.int32 and sorted(perm) == list(range(k))
        rows = perm
        if g_idx_kind == "trivial":
            np.testing.assert_array_equal(perm, np.arange(k))
    w_lib = _library_weight(w_packed, s, z, k, group_size, dtype)          # [N, K]
    np.testing.assert_array_equal(w_lib.view(np.uint16), w_ckpt[rows].T.view(np.uint16))
    # y = x W: the layer computes x[:, perm] times the imported weight.
    x = rng.standard_normal((3, k))
    want = x @ ref.to_f32(w_ckpt, dtype).astype(np.float64)
    got = x[:, rows] @ ref.to_f32(w_lib, dtype).astype(np.float64).T
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("k, n", SHAPES)
@pytest.mark.parametrize("group_size", GROUP_SIZES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_library_from_awq_dequantizes_to_the_checkpoint(dtype, group_size, k, n):
    rng = np.random.default_rng(5000 + k + n + group_size)
    qweight, qzeros, scales = cf.random_awq_checkpoint(rng, k, n, group_size, dtype)
    w_ckpt = cf.awq_unpack(qweight, qzeros, scales, group_size, dtype)
    w_packed, s, z = cf.library_from_awq(qweight, qzeros, scales, group_size)
    groups = ref.int4_groups_per_row(k, group_size)
    assert w_packed.shape == (n, k // 2) and s.shape == (n, groups) and z.shape == (n, groups)
    assert z.dtype == np.uint8 and z.max() <= 15
    w_lib = _library_weight(w_packed, s, z, k, group_size, dtype)
    np.testing.assert_array_equal(w_lib.view(np.uint16), w_ckpt.T.view(np.uint16))


def test_gptq_and_awq_of_the_same_codes_agree():
    """One set of codes, scales and zero points (1 .. 15, which both formats hold) packed in
    both formats imports to the same interchange tensors."""
    rng = np.random.default_rng(6000)
    k, n, group_size = 256, 48, 64
    codes = cf.random_nibbles(rng, (k, n))
    zeros = rng.integers(1, 16, size=(k // group_size, n)).astype(np.uint8)
    scales = cf.random_scales(rng, k // group_size, n, k, "fp16")
    gptq = cf.gptq_pack(codes, zeros, scales, group_size=group_size)
    awq = cf.awq_pack(codes, zeros, scales)
    from_gptq = cf.library_from_gptq(*gptq[:3], None, group_size)
    from_awq = cf.library_from_awq(*awq, group_size)
    for a, b in zip(from_gptq[:3], from_awq):
        np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(cf.gptq_unpack(*gptq, "fp16"),
                                  cf.awq_unpack(*awq, group_size, "fp16"))
