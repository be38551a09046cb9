"""The 4-bit checkpoint formats that ck_import_gptq and ck_import_awq read, and the Sparse-Marlin
2:4 format that reference.import_marlin24 reads, built bit-exactly from integer codes in NumPy:
the executable spec of the importers (cuda_kernels.h, "Importers from checkpoint formats";
../shared/DESIGN.md section 3).

Which published packing each function reproduces:
  gptq_pack / gptq_unpack   GPTQ's 4-bit format as AutoGPTQ and GPTQ-for-LLaMa write and read
      it (the "v1" zero convention): qweight int32 [K / 8, N], the code of (k, n) in bits
      4 (k % 8) .. 4 (k % 8) + 3 of qweight[k // 8, n] (8 consecutive input rows per word);
      qzeros int32 [G, N / 8], zero - 1 of (g, n) in bits 4 (n % 8) .. of qzeros[g, n // 8];
      scales [G, N]; g_idx int32 [K], the group of each input row (k // group_size without
      act-order, as those packers store it). Dequantization, as the GPTQ kernels compute it:
      w[k, n] = (q(k, n) - (stored_zero(g, n) + 1)) * scales[g, n] with g = g_idx[k].
  gptq_act_order_g_idx      the g_idx of a checkpoint quantized with act-order (desc_act):
      the rows are quantized in the order of a permutation, `group_size` at a time, and
      g_idx[perm[i]] = i // group_size.
  awq_pack / awq_unpack     AutoAWQ's GEMM layout (WQLinear_GEMM): qweight int32 [K, N / 8],
      nibble p of qweight[k, c] holds column n = 8 c + (0, 2, 4, 6, 1, 3, 5, 7)[p]; qzeros
      int32 [G, N / 8] packed the same way, holding the zero point itself; scales [G, N];
      groups of group_size consecutive k. w[k, n] = (q(k, n) - z(g, n)) * scales[g, n].
  marlin24_pack             Sparse-Marlin's "marlin_24" layout (vLLM's gptq_marlin_24), defined
      in reference.py beside its importer: CUTLASS' 2:4 compression of the codes, 16 x 16
      tiles permuted for the kernel's threads, reordered metadata, permuted group scales.

Words are assembled as uint32 and viewed as int32: a code >= 8 in nibble 7 sets the sign bit,
exactly as the checkpoints' int32 tensors hold it (two's complement wraparound).

library_from_gptq / library_from_awq compute the interchange tensors the importers must write,
bit for bit: w_packed uint8 [N, K / 2] (element 2i of a row in the low nibble), scales
[N, groups], zeros uint8 [N, groups] (GPTQ: stored + 1, in 1 .. 16; AWQ: as stored) and, for
GPTQ with g_idx, perm int32 [K]: the k sorted by group, stable (column j of the imported weight
is checkpoint row perm[j]).

Scales are in the NumPy representation of their dtype (tests/reference.py: float16, or uint16
bfloat16 bit patterns); the dequantized weights are float32 products rounded once to the dtype
(the product of a small integer and a 16-bit float is exact in float32, so this equals the
checkpoints' own fp16 arithmetic).
"""

import numpy as np

import reference as ref

BITS = 4
PACK = 32 // BITS  # codes per int32 word
NIBBLE = (1 << BITS) - 1
AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)  # nibble p of an AWQ word holds column 8c + AWQ_ORDER[p]
GPTQ_ZERO_RANGE = (1, 16)  # zero points a GPTQ (v1) checkpoint can hold: stored + 1
AWQ_ZERO_RANGE = (0, 15)


# ---------------------------------------------------------------------------------------------
# Nibble packing along an axis (uint32 words, viewed as int32)
# ---------------------------------------------------------------------------------------------
def _pack_words(nibbles, axis, order=None):
    """uint [.., L, ..] values in 0..15 -> int32 words [.., L / 8, ..] along `axis`: nibble p of
    a word holds element 8w + order[p] (order None: element 8w + p)."""
    nibbles = np.moveaxis(np.asarray(nibbles, dtype=np.uint32), axis, -1)
    *lead, length = nibbles.shape
    if length % PACK:
        raise ValueError(f"{length} values do not fill whole int32 words of {PACK}")
    grouped = nibbles.reshape(*lead, length // PACK, PACK)
    order = range(PACK) if order is None else order
    words = np.zeros(grouped.shape[:-1], dtype=np.uint32)
    for p, element in enumerate(order):
        words |= grouped[..., element] << np.uint32(BITS * p)
    return np.ascontiguousarray(np.moveaxis(words.view(np.int32), -1, axis))


def _unpack_words(words, axis, order=None):
    """The inverse of _pack_words: int32 words -> uint8 values 0..15, 8 per word along axis."""
    words = _require(words, np.int32, "packed int32 words")
    words = np.moveaxis(words.view(np.uint32), axis, -1)
    order = range(PACK) if order is None else order
    out = np.empty(words.shape + (PACK,), dtype=np.uint8)
    for p, element in enumerate(order):
        out[..., element] = (words >> np.uint32(BITS * p)) & np.uint32(NIBBLE)
    out = out.reshape(*words.shape[:-1], words.shape[-1] * PACK)
    return np.ascontiguousarray(np.moveaxis(out, -1, axis))


# ---------------------------------------------------------------------------------------------
# GPTQ
# ---------------------------------------------------------------------------------------------
def gptq_groups_g_idx(k, group_size):
    """g_idx of a checkpoint without act-order: k // group_size (group_size -1: one group)."""
    width = k if group_size == ref.GROUP_ROW else group_size
    return (np.arange(k) // width).astype(np.int32)


def gptq_act_order_g_idx(k, group_size, rng):
    """A random act-order g_idx [K] int32: GPTQ quantizes the rows in the order of a permutation
    (its Hessian-diagonal sort; random here), group_size rows per group, and records
    g_idx[perm[i]] = i // group_size."""
    width = k if group_size == ref.GROUP_ROW else group_size
    perm = rng.permutation(k)
    g_idx = np.empty(k, dtype=np.int32)
    g_idx[perm] = np.arange(k) // width
    return g_idx


def gptq_pack(codes, zeros, scales, g_idx=None, group_size=None):
    """codes [K, N] (0..15), zeros [G, N] (1..16), scales [G, N] -> (qweight int32 [K / 8, N],
    qzeros int32 [G, N / 8], scales, g_idx int32 [K]).

    g_idx None: groups of group_size consecutive k (then required), stored as k // group_size.
    The zeros are stored as zero - 1 (GPTQ's v1 convention), so 0 cannot be represented.
    """
    codes = _codes(codes, "codes")
    k, n = codes.shape
    zeros = np.asarray(zeros)
    if zeros.ndim != 2 or zeros.shape[1] != n:
        raise ValueError(f"zeros must be [groups, {n}], got {list(zeros.shape)}")
    lo, hi = GPTQ_ZERO_RANGE
    if zeros.size and (zeros.min() < lo or zeros.max() > hi):
        raise ValueError(f"GPTQ zero points lie in [{lo}, {hi}] (stored as zero - 1)")
    if np.asarray(scales).shape != zeros.shape:
        raise ValueError(f"scales must be {list(zeros.shape)}, got {list(np.shape(scales))}")
    if g_idx is None:
        if group_size is None:
            raise ValueError("without g_idx, group_size says which k share a group")
        g_idx = gptq_groups_g_idx(k, group_size)
    g_idx = _g_idx(g_idx, k, zeros.shape[0])
    qweight = _pack_words(codes, axis=0)
    qzeros = _pack_words(zeros.astype(np.int64) - 1, axis=1)
    return qweight, qzeros, np.asarray(scales), g_idx


def gptq_unpack_codes(qweight, qzeros):
    """(codes uint8 [K, N], zero points uint8 [G, N] = stored + 1) of a GPTQ checkpoint."""
    codes = _unpack_words(qweight, axis=0)
    zeros = _unpack_words(qzeros, axis=1) + np.uint8(1)
    return codes, zeros


def gptq_unpack(qweight, qzeros, scales, g_idx, dtype):
    """The checkpoint's own dequantization, w [K, N] in `dtype`'s representation:
    w[k, n] = (q(k, n) - (stored_zero(g, n) + 1)) * scales[g, n], g = g_idx[k]."""
    codes, zeros = gptq_unpack_codes(qweight, qzeros)
    g_idx = _g_idx(g_idx, codes.shape[0], zeros.shape[0])
    scales_f32 = ref.to_f32(scales, dtype)
    q = codes.astype(np.int16) - zeros[g_idx].astype(np.int16)
    return ref.to_dtype(q.astype(np.float32) * scales_f32[g_idx], dtype)


def gptq_perm(g_idx, group_size):
    """perm [K] int32 of an importer: the k sorted by group, stable (k increasing within a
    group). Checks the header's rule: every group but the last holds exactly group_size k."""
    g_idx = np.asarray(g_idx)
    k = g_idx.size
    width = k if group_size == ref.GROUP_ROW else group_size
    groups = ref.int4_groups_per_row(k, group_size)
    expected = np.full(groups, width)
    expected[-1] = k - (groups - 1) * width
    if g_idx.min() < 0 or g_idx.max() >= groups or \
            not np.array_equal(np.bincount(g_idx, minlength=groups), expected):
        raise ValueError(f"g_idx must put exactly {width} rows in each of its {groups} groups "
                         f"(the last: {expected[-1]})")
    return np.argsort(g_idx, kind="stable").astype(np.int32)


def library_from_gptq(qweight, qzeros, scales, g_idx, group_size):
    """The interchange tensors ck_import_gptq writes: (w_packed uint8 [N, K / 2], scales
    [N, groups], zeros uint8 [N, groups], perm int32 [K] or None). group_size 32, 64, 128 or
    -1; g_idx None: groups of consecutive k, no perm. With g_idx, column j of the weight is
    checkpoint row perm[j] and group j // group_size (= g_idx[perm[j]])."""
    codes, zeros = gptq_unpack_codes(qweight, qzeros)
    k = codes.shape[0]
    _check_groups(k, group_size, zeros.shape[0])
    perm = None
    if g_idx is not None:
        perm = gptq_perm(_g_idx(g_idx, k, zeros.shape[0]), group_size)
        codes = codes[perm]
    w_packed = ref.pack_int4(np.ascontiguousarray(codes.T), signed=False)
    return (w_packed, np.ascontiguousarray(np.asarray(scales).T),
            np.ascontiguousarray(zeros.T), perm)


# ---------------------------------------------------------------------------------------------
# AWQ
# ---------------------------------------------------------------------------------------------
def awq_pack(codes, zeros, scales):
    """codes [K, N] (0..15), zeros [G, N] (0..15), scales [G, N] -> (qweight int32 [K, N / 8],
    qzeros int32 [G, N / 8], scales), packed along N in the order (0, 2, 4, 6, 1, 3, 5, 7)."""
    codes = _codes(codes, "codes")
    zeros = _codes(zeros, "zeros")
    if zeros.shape[1] != codes.shape[1] or np.asarray(scales).shape != zeros.shape:
        raise ValueError(f"zeros and scales must be [groups, {codes.shape[1]}]")
    return (_pack_words(codes, axis=1, order=AWQ_ORDER),
            _pack_words(zeros, axis=1, order=AWQ_ORDER), np.asarray(scales))


def awq_unpack_codes(qweight, qzeros):
    """(codes uint8 [K, N], zero points uint8 [G, N]) of an AWQ checkpoint."""
    return (_unpack_words(qweight, axis=1, order=AWQ_ORDER),
            _unpack_words(qzeros, axis=1, order=AWQ_ORDER))


def awq_unpack(qweight, qzeros, scales, group_size, dtype):
    """The checkpoint's own dequantization, w [K, N] in `dtype`'s representation:
    w[k, n] = (q(k, n) - z(g, n)) * scales[g, n], g = k // group_size."""
    codes, zeros = awq_unpack_codes(qweight, qzeros)
    k = codes.shape[0]
    g = gptq_groups_g_idx(k, group_size)
    _check_groups(k, group_size, zeros.shape[0])
    q = codes.astype(np.int16) - zeros[g].astype(np.int16)
    return ref.to_dtype(q.astype(np.float32) * ref.to_f32(scales, dtype)[g], dtype)


def library_from_awq(qweight, qzeros, scales, group_size):
    """The interchange tensors ck_import_awq writes: (w_packed uint8 [N, K / 2], scales
    [N, groups], zeros uint8 [N, groups])."""
    codes, zeros = awq_unpack_codes(qweight, qzeros)
    _check_groups(codes.shape[0], group_size, zeros.shape[0])
    w_packed = ref.pack_int4(np.ascontiguousarray(codes.T), signed=False)
    return (w_packed, np.ascontiguousarray(np.asarray(scales).T),
            np.ascontiguousarray(zeros.T))


# ---------------------------------------------------------------------------------------------
# Random checkpoints (test data)
# ---------------------------------------------------------------------------------------------
def random_nibbles(rng, shape, lo=0):
    """Uniform integers in [lo, lo + 15] (uint8), every value present when there are at least
    16 elements, and the largest value at (min(7, rows - 1), 7): in both formats that is nibble
    7 of a word, so a word has its sign bit set."""
    rows, cols = shape
    values = rng.integers(lo, lo + NIBBLE + 1, size=shape, dtype=np.uint8)
    flat = values.reshape(-1)
    corner = min(PACK - 1, rows - 1) * cols + min(PACK - 1, cols - 1)
    if flat.size - 1 >= NIBBLE + 1:  # 16 distinct positions other than the corner
        at = rng.choice(flat.size - 1, NIBBLE + 1, replace=False)
        flat[at + (at >= corner)] = lo + np.arange(NIBBLE + 1)
    flat[corner] = lo + NIBBLE
    return values


def random_scales(rng, groups, n, k, dtype):
    """Positive scales spread over a factor of 10, sized so that dequantized weights times
    N(0, 1) activations give outputs ~ N(0, 1) (|q - zero| is ~5 on average)."""
    typical_code = 5.0
    scales = 10.0 ** rng.uniform(-0.5, 0.5, (groups, n)) / (typical_code * np.sqrt(k))
    return ref.to_dtype(scales.astype(np.float32), dtype)


def random_gptq_checkpoint(rng, k, n, group_size, dtype, g_idx="none"):
    """(qweight, qzeros, scales, g_idx) of a random GPTQ checkpoint. g_idx: 'none' (None: the
    importer's groups of consecutive k), 'trivial' (k // group_size, as packers store it
    without act-order) or 'act_order' (gptq_act_order_g_idx)."""
    groups = ref.int4_groups_per_row(k, group_size)
    codes = random_nibbles(rng, (k, n))
    zeros = random_nibbles(rng, (groups, n), lo=GPTQ_ZERO_RANGE[0])
    scales = random_scales(rng, groups, n, k, dtype)
    order = {"none": None, "trivial": gptq_groups_g_idx(k, group_size),
             "act_order": gptq_act_order_g_idx(k, group_size, rng)}[g_idx]
    qweight, qzeros, scales, stored = gptq_pack(codes, zeros, scales, order, group_size)
    return qweight, qzeros, scales, None if g_idx == "none" else stored


def random_awq_checkpoint(rng, k, n, group_size, dtype):
    """(qweight, qzeros, scales) of a random AWQ checkpoint."""
    groups = ref.int4_groups_per_row(k, group_size)
    return awq_pack(random_nibbles(rng, (k, n)), random_nibbles(rng, (groups, n)),
                    random_scales(rng, groups, n, k, dtype))


# ---------------------------------------------------------------------------------------------
# Helpers
# ---------------------------------------------------------------------------------------------
def _require(arr, np_dtype, what):
    arr = np.asarray(arr)
    if arr.dtype != np_dtype:
        raise TypeError(f"{what} must be {np.dtype(np_dtype).name}, got {arr.dtype.name}")
    return arr


def _codes(codes, what):
    codes = np.asarray(codes)
    if codes.ndim != 2:
        raise ValueError(f"{what} must be 2-D, got shape {codes.shape}")
    if codes.size and (codes.min() < 0 or codes.max() > NIBBLE):
        raise ValueError(f"{what} must lie in [0, {NIBBLE}]")
    return codes


def _g_idx(g_idx, k, groups):
    g_idx = np.asarray(g_idx)
    if g_idx.shape != (k,):
        raise ValueError(f"g_idx must have K={k} entries, got shape {g_idx.shape}")
    if g_idx.size and (g_idx.min() < 0 or g_idx.max() >= groups):
        raise ValueError(f"g_idx values must lie in [0, {groups})")
    return g_idx.astype(np.int32)


def _check_groups(k, group_size, groups):
    want = ref.int4_groups_per_row(k, group_size)
    if groups != want:
        raise ValueError(f"K={k} with group_size={group_size} has {want} groups, not {groups}")


# ---------------------------------------------------------------------------------------------
# Sparse-Marlin 2:4 ("marlin_24")
# ---------------------------------------------------------------------------------------------
# The layout is defined beside its importer (reference.py, "Importer: Sparse-Marlin"); this is
# the packer that writes it, step by step as the published one does: remove the bias 8, compress
# each output's K codes to 2 per block of 4 with CUTLASS' choice of positions, restore the bias,
# then lay out the codes, the metadata and the scales.
def marlin24_cutlass_positions(nonzero):
    """bool [..., 4] (which codes of a block are non-zero) -> (idx0, idx1), CUTLASS' encoding of
    2:4 metadata: the positions of the two non-zeros; with fewer, positions chosen by these
    Boolean expressions (a block of zeros names 2 and 3, a lone non-zero at 0 names 0 and 2,
    at 1: 1 and 2, at 2 or 3: 2 and 3)."""
    m0, m1, m3 = nonzero[..., 0], nonzero[..., 1], nonzero[..., 3]
    both, second_only, neither = m0 & m1, ~m0 & m1, ~m0 & ~m1
    idx0 = second_only.astype(np.uint8) | (neither.astype(np.uint8) << 1)
    idx1 = (both | neither | m3).astype(np.uint8) | ((second_only | ~m1).astype(np.uint8) << 1)
    return idx0, idx1


def marlin24_compress(codes):
    """codes [K, N] in 0..15 (uint4b8), 2:4 along K after the bias -> (Q [K/2, N] codes,
    M uint16 [N, K/16] logical metadata); see marlin24_cutlass_positions."""
    codes = _codes(codes, "marlin_24 codes")
    k, n = codes.shape
    centred = codes.T.astype(np.int16).reshape(n, k // 4, 4) - ref.MARLIN24_BIAS
    if ((centred != 0).sum(axis=2) > 2).any():
        raise ValueError("marlin_24 codes must hold at most 2 codes != 8 in every block of 4 k")
    idx0, idx1 = marlin24_cutlass_positions(centred != 0)
    kept = np.stack([idx0, idx1], axis=2).astype(np.int64)
    q = np.take_along_axis(centred, kept, axis=2).reshape(n, k // 2) + ref.MARLIN24_BIAS
    # The nibbles are the library's 2:4 metadata; M holds each 32-k word as two 16-bit halves.
    words = ref.sparse24_pack_metadata(kept.reshape(n, k // 2))
    halves = np.stack([words & np.uint32(0xFFFF), words >> np.uint32(16)], axis=2)
    return q.T.astype(np.uint8), halves.reshape(n, k // 16).astype(np.uint16)


def marlin24_pack(codes, scales, group_size):
    """codes [K, N] in 0..15 (2:4 along K after the bias 8), scales [G, N] -> (qweight int32
    [K/32, 2N], meta int16 [K/32, 2N], s [G, N]): the marlin_24 checkpoint."""
    return marlin24_layout(*marlin24_compress(codes), scales, group_size)


def marlin24_layout(q, meta, scales, group_size):
    """Q [K/2, N] codes, M uint16 [N, K/16], scales [G, N] -> the checkpoint's three tensors."""
    q = _codes(q, "marlin_24 Q")
    k, n = 2 * q.shape[0], q.shape[1]
    offsets = ref.marlin24_meta_offsets(n, k)
    if np.asarray(meta).shape != offsets.shape:
        raise ValueError(f"M must be [N, K/16] = {offsets.shape}, got {np.asarray(meta).shape}")
    if group_size not in ref.MARLIN24_GROUP_SIZES or (group_size > 0 and k % group_size):
        raise ValueError(f"group_size={group_size} must be one of {ref.MARLIN24_GROUP_SIZES} "
                         f"and divide K={k}")
    _check_groups(k, group_size, np.asarray(scales).shape[0])

    rows = ref.marlin24_tiles_to_rows(q)
    span = ref.MARLIN24_PERM_SPAN
    rows = rows.reshape(-1, span)[:, ref.marlin24_weight_perm()].reshape(rows.shape)
    qweight = _pack_words(rows, axis=1)

    flat = np.empty(offsets.size, dtype=np.uint16)
    flat[offsets.reshape(-1)] = np.asarray(meta, dtype=np.uint16).reshape(-1)
    meta_words = flat.view(np.int16).reshape(k // 32, 2 * n)

    scales = np.asarray(scales)
    if scales.shape[0] > 1:   # a single group is stored unpermuted
        perm = ref.marlin24_scale_perm()
        scales = scales.reshape(-1, len(perm))[:, perm].reshape(scales.shape)
    return qweight, meta_words, np.ascontiguousarray(scales)
