"""CPU tests of the structured-sparse INT4 references in tests/reference.py (2:4 and 16:32 along
K): pruning, compression and its metadata, quantization, 16:32 -> 2:4, the checkpoint importers
(compressed-tensors sparse-24-bitmask, and Sparse-Marlin's marlin_24 against the packer in
tests/checkpoint_formats.py).

Data is fresh every run (the `seed` fixture); CK_TEST_SEED=<seed> replays a failure.
"""

import numpy as np
import pytest

import checkpoint_formats as cf
import reference as ref

SHAPES = [(1, 32), (5, 64), (8, 256), (3, 384)]
SCHEMES = {  # name -> (block, prune, compress, decompress)
    "2:4": (ref.SPARSE24_BLOCK, ref.sparse24_prune, ref.sparse24_compress,
            ref.sparse24_decompress),
    "16:32": (ref.SPARSE1632_BLOCK, ref.sparse1632_prune, ref.sparse1632_compress,
              ref.sparse1632_decompress),
}


def every_case(test):
    """Parametrizes a test over every scheme (2:4, 16:32), shape and dtype."""
    for name, values in (("dtype", ref.DTYPES), ("shape", SHAPES), ("scheme", SCHEMES)):
        test = pytest.mark.parametrize(name, values)(test)
    return test


def bits(a):
    """The bit patterns of an array (so NaN == NaN and -0.0 != +0.0)."""
    a = np.ascontiguousarray(a)
    return a.view({1: np.uint8, 2: np.uint16, 4: np.uint32}[a.itemsize])


def blocks(a, block):
    return a.reshape(a.shape[0], -1, block)


def with_sparse_blocks(rng, x, block, dtype):
    """x with about one block in four holding fewer than half non-zeros (zero to block/2 - 1
    survivors at random positions), so that compression must store zero values."""
    xb = blocks(ref.to_f32(x, dtype).copy(), block)
    chosen = rng.random(xb.shape[:2]) < 0.25
    for r, b in np.argwhere(chosen):
        survivors = rng.choice(block, size=rng.integers(0, block // 2), replace=False)
        keep = np.zeros(block, dtype=bool)
        keep[survivors] = True
        xb[r, b, ~keep] = 0
    return ref.to_dtype(xb.reshape(x.shape), dtype)


def prune_by_loop(w, dtype, block):
    """The prune rule, one block at a time: sort positions by (-|w|, k), NaN as -1."""
    mag = ref.sparse_magnitude(w, dtype)
    out = np.full(w.shape, ref.to_dtype(np.float32(0), dtype), dtype=w.dtype)
    for r in range(w.shape[0]):
        for b0 in range(0, w.shape[1], block):
            order = sorted(range(block), key=lambda i: (-float(mag[r, b0 + i]), i))
            for i in order[: block // 2]:
                out[r, b0 + i] = w[r, b0 + i]
    return out


def kept_by_loop(w, dtype, block):
    """The compress rule, one block at a time: non-zeros, then the lowest zero positions."""
    wf = ref.to_f32(w, dtype)
    out = []
    for r in range(w.shape[0]):
        row = []
        for b0 in range(0, w.shape[1], block):
            nonzero = [i for i in range(block) if wf[r, b0 + i] != 0]
            zero = [i for i in range(block) if wf[r, b0 + i] == 0]
            row.append(sorted((nonzero + zero)[: block // 2]))
        out.append(row)
    return np.array(out)


# ---------------------------------------------------------------------------------------------
# Pruning
# ---------------------------------------------------------------------------------------------
@every_case
def test_prune_keeps_the_largest_magnitudes(dtype, shape, scheme, seed):
    block, prune, _, _ = SCHEMES[scheme]
    rng = np.random.default_rng(seed)
    w = ref.random_input(rng, shape, dtype)
    pruned = prune(w, dtype)
    assert pruned.dtype == w.dtype and pruned.shape == w.shape
    wf, pf = ref.to_f32(w, dtype), ref.to_f32(pruned, dtype)
    kept = blocks(pf != 0, block)
    assert (kept.sum(axis=2) <= block // 2).all(), f"pattern violated, seed={seed}"
    # Kept values are unchanged bit for bit; the others are +0.
    same = bits(pruned) == bits(w)
    assert np.all(same | (bits(pruned) == bits(ref.to_dtype(np.float32(0), dtype)))), f"{seed}"
    # Every kept magnitude is >= every pruned one in its block, and the kept half is the top half.
    mag = blocks(np.abs(wf), block)
    kept_same = blocks(same, block) & (mag > 0)
    min_kept = np.where(kept_same, mag, np.inf).min(axis=2)
    max_dropped = np.where(blocks(~same, block), mag, -np.inf).max(axis=2)
    assert (min_kept >= max_dropped).all(), f"seed={seed}"
    top_half = -np.sort(-mag, axis=2)[:, :, : block // 2].astype(np.float64).sum(axis=2)
    assert np.array_equal(np.where(kept_same, mag, 0).astype(np.float64).sum(axis=2), top_half)
    assert np.array_equal(bits(pruned), bits(prune_by_loop(w, dtype, block))), f"seed={seed}"


@pytest.mark.parametrize("scheme", SCHEMES)
@pytest.mark.parametrize("dtype", ref.DTYPES)
def test_prune_ties_keep_the_lower_k(dtype, scheme, seed):
    block, prune, _, _ = SCHEMES[scheme]
    rng = np.random.default_rng(seed)
    # Small integers: most blocks hold ties, +0 and -0 among them.
    xf = rng.integers(-2, 3, size=(6, 64)).astype(np.float32)
    xf[rng.random(xf.shape) < 0.1] = -0.0
    w = ref.to_dtype(xf, dtype)
    assert np.array_equal(bits(prune(w, dtype)), bits(prune_by_loop(w, dtype, block))), seed
    # Hand-made 2:4 cases: equal magnitudes keep the lower k, whatever the sign.
    if scheme == "2:4":
        x = ref.to_dtype(np.array([[1, -1, 1, -1, 0, 3, -3, 3] + [0] * 24], np.float32), dtype)
        assert ref.to_f32(prune(x, dtype), dtype)[0, :8].tolist() == [1, -1, 0, 0, 0, 3, -3, 0]


@pytest.mark.parametrize("scheme", SCHEMES)
@pytest.mark.parametrize("dtype", ref.DTYPES)
def test_prune_ranks_nan_below_every_number(dtype, scheme, seed):
    block, prune, _, _ = SCHEMES[scheme]
    rng = np.random.default_rng(seed)
    xf = ref.to_f32(ref.random_input(rng, (4, 64), dtype), dtype)
    nan_at = rng.random(xf.shape) < 0.3
    xf[nan_at] = np.nan
    xf[0, :block] = 0       # a block of zeros and NaN: the zeros are kept first
    xf[0, 1] = np.nan
    w = ref.to_dtype(xf, dtype)
    pruned = ref.to_f32(prune(w, dtype), dtype)
    assert not np.isnan(pruned[0, :block]).any(), f"seed={seed}"
    # A NaN survives only in a block where fewer than half the values are numbers.
    numbers = blocks(~np.isnan(xf), block).sum(axis=2)
    kept_nan = blocks(np.isnan(pruned), block).sum(axis=2)
    assert np.array_equal(kept_nan, np.maximum(block // 2 - numbers, 0)), f"seed={seed}"
    assert np.array_equal(bits(prune(w, dtype)), bits(prune_by_loop(w, dtype, block))), seed


# ---------------------------------------------------------------------------------------------
# Compression and metadata
# ---------------------------------------------------------------------------------------------
@every_case
def test_compress_round_trip_is_bit_exact(dtype, shape, scheme, seed):
    block, prune, compress, decompress = SCHEMES[scheme]
    rng = np.random.default_rng(seed)
    w = prune(with_sparse_blocks(rng, ref.random_input(rng, shape, dtype), block, dtype), dtype)
    values, meta = compress(w, dtype)
    rows, k = shape
    assert values.shape == (rows, k // 2) and values.dtype == w.dtype
    assert meta.shape == (rows, k // 32) and meta.dtype == np.uint32
    assert np.array_equal(bits(decompress(values, meta, dtype)), bits(w)), f"seed={seed}"
    # The stored positions: every non-zero, then the lowest zero positions, ascending.
    if scheme == "2:4":
        positions = ref.sparse24_unpack_metadata(meta).reshape(rows, -1, 2)
    else:
        positions = ref.sparse1632_positions(meta)
    assert np.array_equal(positions, kept_by_loop(w, dtype, block)), f"seed={seed}"
    assert (np.diff(positions.astype(np.int16), axis=2) > 0).all(), f"seed={seed}"
    stored = np.take_along_axis(blocks(w, block), positions.astype(np.int64), axis=2)
    assert np.array_equal(bits(values), bits(stored.reshape(values.shape))), f"seed={seed}"


def test_sparse24_metadata_layout():
    # Row 0: block 0 keeps k = 1, 3; block 1 is all zero (positions 0, 1); block 2 one non-zero
    # at k = 3 (positions 0, 3); blocks 3..7 keep k = 0, 2.
    w = np.zeros((1, 32), np.float32)
    w[0, [1, 3, 11]] = [5, -6, 7]
    w[0, 12:32:4], w[0, 14:32:4] = 1, 2
    values, meta = ref.sparse24_compress(w, "fp32")
    nibbles = [1 | 3 << 2, 0 | 1 << 2, 0 | 3 << 2] + [0 | 2 << 2] * 5
    assert int(meta[0, 0]) == sum(n << (4 * g) for g, n in enumerate(nibbles))
    assert values[0, :6].tolist() == [5, -6, 0, 0, 0, 7]
    assert ref.sparse24_unpack_metadata(meta)[0, :6].tolist() == [1, 3, 0, 1, 0, 3]
    with pytest.raises(ValueError):   # a block naming the same position twice
        ref.sparse24_unpack_metadata(np.array([[0x5]], np.uint32))


def test_sparse1632_mask_layout():
    w = np.zeros((1, 64), np.float32)
    w[0, [0, 5, 31]] = [1, 2, 3]          # block 0: 3 non-zeros, then the lowest free positions
    w[0, 32:48] = np.arange(1, 17)        # block 1: exactly 16 non-zeros
    values, masks = ref.sparse1632_compress(w, "fp32")
    want0 = sorted([0, 5, 31] + [i for i in range(32) if i not in (0, 5, 31)][:13])
    assert int(masks[0, 0]) == sum(1 << i for i in want0) and int(masks[0, 1]) == 0xFFFF
    assert values[0, :16].tolist() == [w[0, i] for i in want0]
    with pytest.raises(ValueError):
        ref.sparse1632_positions(np.array([[0xFFFFF]], np.uint32))   # 20 bits


@pytest.mark.parametrize("scheme", SCHEMES)
@pytest.mark.parametrize("dtype", ref.DTYPES)
def test_compress_rejects_a_violating_weight(dtype, scheme, seed):
    block, prune, compress, _ = SCHEMES[scheme]
    rng = np.random.default_rng(seed)
    w = prune(ref.random_input(rng, (4, 128), dtype), dtype)
    r, b = rng.integers(4), rng.integers(128 // block)
    wf = ref.to_f32(w, dtype)
    zero_at = np.flatnonzero(wf[r, b * block : (b + 1) * block] == 0)
    wf[r, b * block + rng.choice(zero_at)] = 1.5      # one non-zero too many in one block
    with pytest.raises(ValueError, match=f"row {r}, k {b * block}"):
        compress(ref.to_dtype(wf, dtype), dtype)
    with pytest.raises(ValueError):
        compress(ref.random_input(rng, (4, 128), dtype), dtype)   # dense, unpruned


# ---------------------------------------------------------------------------------------------
# INT4 quantization of the kept values
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("scheme", SCHEMES)
@pytest.mark.parametrize("group_size", ref.SPARSE_GROUP_SIZES)
@pytest.mark.parametrize("mode", ref.INT4_MODES)
@pytest.mark.parametrize("dtype", ref.DTYPES)
def test_quantize_equals_dense_int4_of_the_pruned_weight(dtype, mode, group_size, scheme, seed):
    """Pruned zeros change neither absmax nor min(., 0) nor max(., 0), so the sparse scales and
    zero points are the dense ones and every code is the dense code at its position."""
    block, prune, compress, _ = SCHEMES[scheme]
    quantize, dequantize = ((ref.sparse24_quantize, ref.sparse24_dequantize) if scheme == "2:4"
                            else (ref.sparse1632_quantize, ref.sparse1632_dequantize))
    rng = np.random.default_rng(seed)
    rows, k = 6, 256
    w = prune(with_sparse_blocks(rng, ref.random_input(rng, (rows, k), dtype), block, dtype),
              dtype)
    packed, meta, scales, zeros = quantize(w, dtype, group_size, mode)
    d_packed, d_scales, d_zeros = ref.quantize_int4(w, dtype, group_size, mode)
    assert packed.shape == (rows, k // 4) and meta.shape == (rows, k // 32)
    assert np.array_equal(bits(scales), bits(d_scales)), f"seed={seed}"
    assert (zeros is None) == (mode == "sym")
    assert mode == "sym" or np.array_equal(zeros, d_zeros), f"seed={seed}"
    signed = mode == "sym"
    codes = ref.unpack_int4(packed, k // 2, signed)
    dense_codes = ref.unpack_int4(d_packed, k, signed)
    _, same_meta = compress(w, dtype)
    assert np.array_equal(meta, same_meta)
    positions = (ref.sparse24_unpack_metadata(meta).reshape(rows, -1, 2) if scheme == "2:4"
                 else ref.sparse1632_positions(meta)).astype(np.int64)
    at_kept = np.take_along_axis(blocks(dense_codes, block), positions, axis=2)
    assert np.array_equal(codes, at_kept.reshape(codes.shape)), f"seed={seed}"
    # Dequantized: the dense dequantization of the pruned weight, pruned positions included.
    for out_dtype in (dtype, "fp32"):
        sc, dsc = (ref.to_dtype(ref.to_f32(s, dtype), out_dtype) for s in (scales, d_scales))
        back = dequantize(packed, meta, sc, zeros, k, group_size, mode, out_dtype)
        want = ref.dequantize_int4(d_packed, dsc, d_zeros, k, group_size, mode, out_dtype)
        assert np.array_equal(bits(back), bits(want)), f"{out_dtype}, seed={seed}"
        assert (ref.to_f32(back, out_dtype)[ref.to_f32(w, dtype) == 0] == 0).all()


@pytest.mark.parametrize("scheme", SCHEMES)
@pytest.mark.parametrize("mode", ref.INT4_MODES)
@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
def test_dense_int4_of_a_sparse_weight_is_the_pruned_weights(dtype, mode, scheme, seed):
    """sparse_dense_int4 (what ck_sparse_w4a16_prepack_dense prepacks) is quantize_int4 of the
    pruned weight byte for byte (kept codes at their positions, the code of 0 elsewhere), so
    sparse_prepack_dense is w4a16_prepack of that weight and its w' the sparse one's."""
    block, prune, _, _ = SCHEMES[scheme]
    quantize = ref.sparse24_quantize if scheme == "2:4" else ref.sparse1632_quantize
    rng = np.random.default_rng(seed)
    rows, k, group_size = 11, 384, 128
    w = prune(with_sparse_blocks(rng, ref.random_input(rng, (rows, k), dtype), block, dtype),
              dtype)
    packed, meta, scales, zeros = quantize(w, dtype, group_size, mode)
    d_packed, d_scales, d_zeros = ref.quantize_int4(w, dtype, group_size, mode)
    dense = ref.sparse_dense_int4(packed, meta, zeros, scheme, k, group_size)
    assert np.array_equal(dense, d_packed), f"seed={seed}"
    got = ref.sparse_prepack_dense(packed, meta, scales, zeros, scheme, k, group_size)
    want = ref.w4a16_prepack(d_packed, d_scales, d_zeros, rows, k, group_size)
    for g, e in zip(got, want):
        assert (g is None) == (e is None)
        assert g is None or np.array_equal(bits(g), bits(e)), f"seed={seed}"


def test_quantize_rejects_bad_groups():
    w = ref.sparse24_prune(np.ones((2, 96), np.float32), "fp32")
    for group_size in (32, -1, 96):
        with pytest.raises(ValueError):
            ref.sparse24_quantize(w, "fp32", group_size, "sym")
    with pytest.raises(ValueError):      # K = 96 is not a multiple of 64
        ref.sparse24_quantize(w, "fp32", 64, "sym")


# ---------------------------------------------------------------------------------------------
# 16:32 -> 2:4
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", ref.DTYPES)
def test_1632_to_24_equals_compressing_the_dense_weight(dtype, seed):
    rng = np.random.default_rng(seed)
    # A 2:4-pruned weight with no zeros left keeps exactly 2 per 4, so 16 per 32: both formats
    # store the same positions.
    xf = ref.to_f32(ref.random_input(rng, (8, 256), dtype), dtype)
    xf[xf == 0] = 1
    w = ref.sparse24_prune(ref.to_dtype(xf, dtype), dtype)
    values, meta = ref.sparse1632_to_24(*ref.sparse1632_compress(w, dtype))
    want_values, want_meta = ref.sparse24_compress(w, dtype)
    assert np.array_equal(bits(values), bits(want_values)), f"seed={seed}"
    assert np.array_equal(meta, want_meta), f"seed={seed}"
    # Quantized likewise: the codes and scales do not depend on the route.
    packed, masks, scales, zeros = ref.sparse1632_quantize(w, dtype, 128, "asym")
    packed24, meta24, scales24, zeros24 = ref.sparse24_quantize(w, dtype, 128, "asym")
    assert np.array_equal(ref.sparse1632_to_24(packed, masks)[1], meta24)
    assert np.array_equal(packed, packed24) and np.array_equal(bits(scales), bits(scales24))


def two_per_block_of_4_1632(rng, rows, k, dtype):
    """(w, kept): a weight and a 16:32 mask holding exactly 2 positions in every block of 4 (so
    it converts to 2:4), with about one kept value in four equal to 0, as a pruned checkpoint
    whose kept weights quantized to 0 stores them."""
    x = ref.to_f32(ref.random_input(rng, (rows, k), dtype), dtype)
    x[x == 0] = 1
    w = ref.to_f32(ref.sparse24_prune(ref.to_dtype(x, dtype), dtype), dtype)
    kept = w != 0
    w[kept & (rng.random(w.shape) < 0.25)] = 0
    return ref.to_dtype(w, dtype), kept


@pytest.mark.parametrize("dtype", ref.DTYPES)
def test_1632_to_24_keeps_stored_zeros_and_rejects_a_dense_mask(dtype, seed):
    rng = np.random.default_rng(seed)
    w, kept = two_per_block_of_4_1632(rng, 4, 128, dtype)
    # The 16:32 pair (values, mask) of that checkpoint: the stored zeros stay where the mask has
    # them (sparse1632_compress would move them to the lowest free positions of each 32).
    masks = np.bitwise_or.reduce(kept.reshape(4, -1, 32).astype(np.uint32)
                                 << np.arange(32, dtype=np.uint32), axis=2).astype(np.uint32)
    values = w[kept].reshape(4, -1)
    v24, meta = ref.sparse1632_to_24(values, masks)
    assert np.array_equal(bits(v24), bits(values)), f"seed={seed}"
    assert np.array_equal(ref.sparse24_unpack_metadata(meta).reshape(4, -1, 2) + 4 *
                          np.arange(128 // 4)[None, :, None],
                          np.argwhere(kept)[:, 1].reshape(4, -1, 2)), f"seed={seed}"
    assert np.array_equal(bits(ref.sparse24_decompress(v24, meta, dtype)), bits(w)), seed
    assert (ref.to_f32(v24, dtype) == 0).any(), f"seed={seed}: no stored zero drawn"
    # 16:32-pruned random data leaves some block of 4 with 3 or 4 kept values.
    w = ref.sparse1632_prune(ref.random_input(rng, (4, 128), dtype), dtype)
    with pytest.raises(ValueError, match="more than 2"):
        ref.sparse1632_to_24(*ref.sparse1632_compress(w, dtype))


# ---------------------------------------------------------------------------------------------
# Importer: compressed-tensors sparse-24-bitmask
# ---------------------------------------------------------------------------------------------
def compressed_tensors_sparse24(w, dtype):
    """The published compressor on a dense weight: mask = top-2 |w| of every 4 (our prune's
    choice stands in for torch.topk's, which is only required to pick 2 of the largest),
    compressed = w[mask].reshape(N, K/2), bitmask = packbits(mask, little), shape [[N], [K]]."""
    n, k = w.shape
    key = blocks(ref.sparse_magnitude(w, dtype), 4)
    order = np.argsort(-key, axis=2, kind="stable")[:, :, :2]
    mask = np.zeros(key.shape, dtype=bool)
    np.put_along_axis(mask, order, True, axis=2)
    mask = mask.reshape(n, k)
    return (w[mask].reshape(n, k // 2), np.packbits(mask, axis=-1, bitorder="little"),
            np.array([n, k]).reshape(-1, 1))


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("dtype", ref.DTYPES)
def test_import_compressed_tensors_sparse24(dtype, shape, seed):
    rng = np.random.default_rng(seed)
    w = ref.sparse24_prune(with_sparse_blocks(rng, ref.random_input(rng, shape, dtype), 4,
                                              dtype), dtype)
    compressed, bitmask, ct_shape = compressed_tensors_sparse24(w, dtype)
    assert bitmask.shape == (shape[0], shape[1] // 8)
    values, meta = ref.import_compressed_tensors_sparse24(compressed, bitmask, ct_shape, dtype)
    want_values, want_meta = ref.sparse24_compress(w, dtype)
    assert np.array_equal(bits(values), bits(want_values)), f"seed={seed}"
    assert np.array_equal(meta, want_meta), f"seed={seed}"
    assert np.array_equal(bits(ref.sparse24_decompress(values, meta, dtype)), bits(w)), seed
    # A mask with three positions in one block of 4 is not 2:4.
    bad = bitmask.copy()
    bad[0, 0] = 0b0111 | (bad[0, 0] & 0xF0)
    with pytest.raises(ValueError):
        ref.import_compressed_tensors_sparse24(compressed, bad, ct_shape, dtype)


# ---------------------------------------------------------------------------------------------
# Importer: Sparse-Marlin marlin_24
# ---------------------------------------------------------------------------------------------
MARLIN24_SHAPES = [(32, 64), (128, 128), (192, 64), (256, 64), (384, 192)]   # (K, N)

# The published encoding of CUTLASS' 2:4 metadata, case by case: which codes of a block of 4 are
# non-zero -> the nibble idx0 | idx1 << 2.
CUTLASS_NIBBLES = {
    (1, 1, 0, 0): 0b0100, (1, 0, 1, 0): 0b1000, (0, 1, 1, 0): 0b1001, (1, 0, 0, 1): 0b1100,
    (0, 1, 0, 1): 0b1101, (0, 0, 1, 1): 0b1110, (0, 0, 0, 0): 0b1110, (0, 0, 0, 1): 0b1110,
    (0, 0, 1, 0): 0b1110, (0, 1, 0, 0): 0b1001, (1, 0, 0, 0): 0b1000,
}


def test_marlin24_cutlass_positions_follow_the_published_table():
    for nonzero, nibble in CUTLASS_NIBBLES.items():
        idx0, idx1 = cf.marlin24_cutlass_positions(np.array(nonzero, dtype=bool))
        assert int(idx0) | int(idx1) << 2 == nibble, nonzero


def test_marlin24_permutations_are_permutations():
    assert np.array_equal(np.sort(ref.marlin24_weight_perm()), np.arange(1024))
    assert np.array_equal(np.sort(ref.marlin24_scale_perm()), np.arange(64))
    for n, k in [(64, 32), (128, 64), (192, 96), (320, 256)]:
        offsets = ref.marlin24_meta_offsets(n, k)
        assert offsets.shape == (n, k // 16)
        assert np.array_equal(np.sort(offsets.reshape(-1)), np.arange(n * k // 16))


def test_marlin24_layout_hand_example():
    """K = 256, N = 64 (group 128: 2 groups); each place below worked out by hand from the
    published definitions."""
    k, n = 256, 64
    q = (np.arange(k // 2 * n).reshape(k // 2, n) % 15 + 1).astype(np.uint8)
    meta = (np.arange(n * k // 16).reshape(n, k // 16) * 0x1111 % 0xFFFF).astype(np.uint16)
    scales = ref.to_dtype(np.arange(2 * n, dtype=np.float32).reshape(2, n) + 1, "fp16")
    qweight, meta_words, s = cf.marlin24_layout(q, meta, scales, 128)
    assert qweight.shape == meta_words.shape == (k // 32, 2 * n)
    # Word 0 of row 0: Q[0, 0], Q[8, 0], Q[0, 4], Q[8, 4], Q[1, 0], Q[9, 0], Q[1, 4], Q[9, 4].
    want = [q[0, 0], q[8, 0], q[0, 4], q[8, 4], q[1, 0], q[9, 0], q[1, 4], q[9, 4]]
    assert int(qweight.view(np.uint32)[0, 0]) == sum(int(v) << (4 * i) for i, v in enumerate(want))
    # Row 1 of qweight starts with Q rows 16 and 24 (the next band of 16).
    assert int(qweight.view(np.uint32)[1, 0]) & 0xFF == int(q[16, 0]) | int(q[24, 0]) << 4
    # Metadata: the flat buffer opens with M[0, 0], M[4, 0], M[0, 1], M[4, 1], M[1, 0], M[5, 0],
    # M[1, 1], M[5, 1]; M[2, c] is 32 rows (64 halves) on, M[8, 0] 4 rows (8 halves) on; column
    # pair 1 (M[:, 2..3]) starts after the 2N halves of pair 0.
    flat = meta_words.reshape(-1).view(np.uint16)
    rows, cols = [0, 4, 0, 4, 1, 5, 1, 5], [0, 0, 1, 1, 0, 0, 1, 1]
    assert np.array_equal(flat[:8], meta[rows, cols])
    assert flat[64] == meta[2, 0] and flat[66] == meta[2, 1] and flat[8] == meta[8, 0]
    assert flat[2 * n] == meta[0, 2]
    # Scales: each run of 64 as 0, 4, 1, 5, 2, 6, 3, 7, then 8, 12, ...
    assert np.array_equal(s[0, :10], scales[0, [0, 4, 1, 5, 2, 6, 3, 7, 8, 12]])


def random_marlin24_codes(rng, k, n):
    """Codes [K, N] in 0..15 whose centred codes (q - 8) are 2:4 along K, with blocks holding
    fewer than 2 non-zeros (every branch of CUTLASS' position choice) and every code present."""
    centred = rng.integers(-8, 8, size=(n, k)).astype(np.int16)
    sparse = ref.sparse24_prune(centred.astype(np.float32), "fp32").astype(np.int16)
    sparse = ref.to_f32(with_sparse_blocks(rng, sparse.astype(np.float32), 4, "fp32"),
                        "fp32").astype(np.int16)
    sparse[0, :4] = [-8, 0, 0, 7]
    return (sparse + ref.MARLIN24_BIAS).T.astype(np.uint8)


def marlin24_dequantized(codes, scales, group_size, dtype):
    """The checkpoint's own dequantization: w[n, k] = (q[k, n] - 8) * s[g(k), n], one float32
    product rounded to dtype (exact: a small integer times a 16-bit float)."""
    k = codes.shape[0]
    g = np.zeros(k, dtype=np.int64) if group_size == ref.GROUP_ROW else np.arange(k) // group_size
    w = (codes.astype(np.float32) - ref.MARLIN24_BIAS) * ref.to_f32(scales, dtype)[g]
    return ref.to_dtype(w.T.astype(np.float32), dtype)


# (K, N, group_size) that the format and the library's groups both hold: K = 32 has no group of
# 128, nor a library group for per-channel scales (rejected in the next test).
MARLIN24_CASES = [(k, n, g) for k, n in MARLIN24_SHAPES for g in ref.MARLIN24_GROUP_SIZES
                  if k % max(g, 64) == 0]


@pytest.mark.parametrize("k, n, group_size", MARLIN24_CASES)
@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
def test_import_marlin24(dtype, k, n, group_size, seed):
    rng = np.random.default_rng(seed)
    codes = random_marlin24_codes(rng, k, n)
    groups = 1 if group_size == ref.GROUP_ROW else k // group_size
    scales = cf.random_scales(rng, groups, n, k, dtype)
    qweight, meta, s = cf.marlin24_pack(codes, scales, group_size)

    packed, metadata, lib_scales, lib_group = ref.import_marlin24(qweight, meta, s, group_size,
                                                                  dtype)
    assert packed.shape == (n, k // 4) and metadata.shape == (n, k // 32), seed
    assert lib_group == (group_size if group_size > 0 else (128 if k % 128 == 0 else 64)), seed
    got = ref.sparse24_dequantize(packed, metadata, lib_scales, None, k, lib_group, "sym", dtype)
    assert np.array_equal(bits(got), bits(marlin24_dequantized(codes, scales, group_size,
                                                              dtype))), f"seed={seed}"
    # The dense codes agree everywhere; the stored positions are the checkpoint's (CUTLASS'
    # choice), so a block of zeros names positions 2 and 3 where sparse24_compress names 0, 1.
    dense = ref.sparse24_decompress(ref.unpack_int4(packed, k // 2, signed=True)
                                    .astype(np.float32), metadata, "fp32")
    assert np.array_equal(dense, codes.T.astype(np.float32) - ref.MARLIN24_BIAS), seed
    idx = ref.sparse24_unpack_metadata(metadata).reshape(n, -1, 2)
    assert (idx[0, 0] == [0, 3]).all(), seed


def test_import_marlin24_rejects_what_the_format_cannot_hold(seed):
    rng = np.random.default_rng(seed)
    k, n = 128, 64
    codes = random_marlin24_codes(rng, k, n)
    scales = cf.random_scales(rng, 1, n, k, "fp16")
    qweight, meta, s = cf.marlin24_pack(codes, scales, 128)
    ok = dict(qweight=qweight, meta=meta, scales=s, group_size=128, dtype="fp16")
    ref.import_marlin24(**ok)
    bad_cases = {
        "qweight dtype": (TypeError, dict(qweight=qweight.view(np.uint32))),
        "meta dtype": (TypeError, dict(meta=meta.view(np.uint16))),
        "scales dtype": (TypeError, dict(dtype="bf16")),
        "group 64": (ValueError, dict(group_size=64)),
        "scales shape": (ValueError, dict(scales=s[:, :32])),
        "meta shape": (ValueError, dict(meta=meta[:, :64])),
        "N % 64": (ValueError, dict(qweight=qweight[:, :96], meta=meta[:, :96],
                                    scales=s[:, :48])),
        "per-channel K % 64": (ValueError, dict(qweight=qweight[:1], meta=meta[:1],
                                                scales=s[:1], group_size=-1)),
    }
    for what, (error, change) in bad_cases.items():
        with pytest.raises(error):
            ref.import_marlin24(**{**ok, **change})
            pytest.fail(what)
    # Metadata naming one position twice (idx0 == idx1) is not 2:4 metadata.
    broken = meta.copy()
    broken.reshape(-1).view(np.uint16)[0] &= np.uint16(0xFFF0)
    with pytest.raises(ValueError, match="idx0 < idx1"):
        ref.import_marlin24(**{**ok, "meta": broken})
    with pytest.raises(ValueError, match="at most 2"):
        cf.marlin24_pack(np.full((k, n), 1, dtype=np.uint8), scales, 128)


def decode_prepacked(w_pre, s_pre, z_pre, n, k, group_size, dtype):
    """The dense [N, K] weight the mma.sp kernels see in a prepacked 2:4 weight, read the way
    their lanes read it (ref.sparse24_prepack's layout): each lane's code words and metadata
    halves, its two rows' scales and zero points."""
    n16 = -(-n // 16) * 16
    tiles, chunks, groups = n16 // 16, k // 128, k // group_size
    code_words = w_pre[: n16 * k // 4].view(np.uint32).reshape(tiles, chunks, 8, 4, 4)
    meta_words = w_pre[n16 * k // 4:].view(np.uint32).reshape(tiles, chunks, 8, 4, 2)
    scales = s_pre.reshape(tiles, groups, 8, 2)
    zeros = None if z_pre is None else z_pre.reshape(tiles, groups, 8, 2)
    dense = np.zeros((n16, k), np.float32)
    for tile in range(tiles):
        for g in range(8):
            for r in range(2):
                row = tile * 16 + g + 8 * r
                for kk in range(0, k, 4):
                    c, kc = kk // 128, kk % 128
                    h, ss, b = kc // 64, kc // 32 % 2, kc % 32 // 4
                    j = 2 * ss + b // 4
                    q = int(code_words[tile, c, g, b % 4, 2 * h + r])
                    e = int(meta_words[tile, c, g, 2 * ss + b // 4, h])
                    nib = e >> (16 * r + 4 * (b % 4)) & 0xF
                    scale = ref.to_f32(scales[tile, kk // group_size, g, r:r + 1], dtype)[0]
                    zero = 8 if zeros is None else int(zeros[tile, kk // group_size, g, r])
                    kept = ((nib & 3, q >> (4 * j) & 0xF), (nib >> 2, q >> (4 * j + 16) & 0xF))
                    for pos, u in kept:
                        dense[row, kk + pos] = ref.to_f32(
                            ref.to_dtype(np.float32((u - zero) * scale), dtype), dtype)
    return dense[:n]


@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
@pytest.mark.parametrize("mode", ["sym", "asym"])
@pytest.mark.parametrize("group_size", ref.SPARSE_GROUP_SIZES)
def test_prepacked_layout_decodes_to_the_dequantized_weight(dtype, mode, group_size, seed):
    """ref.sparse24_prepack's bytes, read as the kernels' lanes read them, are the weight
    sparse24_dequantize gives, at every (n, k); padding rows decode to zero."""
    rng = np.random.default_rng(seed)
    n, k = 21, 256
    w = ref.sparse24_prune(ref.random_input(rng, (n, k), dtype), dtype)
    codes, meta, scales, zeros = ref.sparse24_quantize(w, dtype, group_size, mode)
    w_pre, s_pre, z_pre = ref.sparse24_prepack(codes, meta, scales, zeros, k, group_size)
    assert w_pre.size == -(-n // 16) * 16 * k * 3 // 8
    want = ref.to_f32(ref.sparse24_dequantize(codes, meta, scales, zeros, k, group_size, mode,
                                              dtype), dtype)
    got = decode_prepacked(w_pre, s_pre, z_pre, n, k, group_size, dtype)
    np.testing.assert_array_equal(bits(got), bits(want))
