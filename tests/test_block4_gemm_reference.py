"""CPU tests of the references of the weight-only GEMM on block 4-bit weights (tests/reference.py:
block4_prepack, dequantized_block4_weight, gemm_block4_f64), against the words of cuda_kernels.h
("Weight-only GEMM on block 4-bit weights"), and a report of each format's quantization error on
Gaussian weights beside INT4's.

They run everywhere (no GPU). Data is fresh every run (the `seed` fixture of tests/conftest.py
prints the seed; CK_TEST_SEED=<seed> replays a failure).
"""

import numpy as np
import pytest

import reference as ref

FORMAT_BLOCKS = [("nf4", 32), ("nf4", 64), ("nf4", 128), ("mxfp4", 32), ("nvfp4", 16)]


def header_code_at(w_prepacked, n, k, row, col):
    """The code of (row, col) read from the prepacked bytes by the header's formula: tile (i, c)
    at (i * K128 / 128 + c) * 512, (row r, slice s) at (4r + s) * 16, word col % 32 // 8, nibble e
    with k = 2e (e < 4) or 2(e - 4) + 1."""
    chunks = -(-k // 128)
    i, r = divmod(row, 8)
    c, kk = divmod(col, 128)
    s, ks = divmod(kk, 32)
    word_index, kw = divmod(ks, 8)
    e = kw // 2 if kw % 2 == 0 else kw // 2 + 4
    base = (i * chunks + c) * 512 + (4 * r + s) * 16 + 4 * word_index
    word = int.from_bytes(bytes(w_prepacked[base:base + 4]), "little")
    return (word >> (4 * e)) & 0xF


@pytest.mark.parametrize("fmt,blocksize", FORMAT_BLOCKS)
def test_prepack_is_the_header_layout(seed, fmt, blocksize):
    rng = np.random.default_rng(seed)
    n, k = 13, 384                      # a partial 8-row tile and a K that is not a tile multiple
    if k % blocksize:
        k = 512
    w = rng.standard_normal((n, k)).astype(np.float32)
    packed, scales, _ = ref.quantize_block4(fmt, w, "fp32", blocksize)
    w_out, s_out = ref.block4_prepack(fmt, packed, scales, n, k, blocksize)
    w_bytes, s_bytes = ref.block4_prepacked_sizes(fmt, n, k, blocksize)
    assert (w_out.size, s_out.size) == (w_bytes, s_bytes)
    codes = ref.unpack_nf4(packed, k) if fmt == "nf4" else ref.unpack_fp4(packed, k)
    rows8, k128 = -(-n // 8) * 8, -(-k // 128) * 128
    zero = ref.BLOCK4_ZERO_CODE[fmt]
    for row in range(rows8):
        for col in list(range(0, k128, 7)) + [k - 1, k128 - 1]:
            want = codes[row, col] if row < n and col < k else zero
            assert header_code_at(w_out, n, k, row, col) == want, (row, col)
    # Units: (n, j) at ((n / 8) * (K / G) + j) * 8 + n % 8, unit_bytes each.
    group = ref.block4_unit_group(fmt, blocksize)
    units, ub = k // group, ref.BLOCK4_UNIT_BYTES[fmt]
    raw_scales = np.ascontiguousarray(scales).view(np.uint8).reshape(n, -1)
    for row in range(rows8):
        for j in range(units):
            at = (((row // 8) * units + j) * 8 + row % 8) * ub
            want = raw_scales[row, j * ub:(j + 1) * ub] if row < n else np.zeros(ub, np.uint8)
            np.testing.assert_array_equal(s_out[at:at + ub], want)
    if fmt == "nvfp4":   # two E4M3 bytes per 32-k slice: blocks 2j (first) and 2j + 1
        unit0 = s_out[0:2]
        np.testing.assert_array_equal(unit0, scales[0, 0:2])


@pytest.mark.parametrize("fmt,blocksize", FORMAT_BLOCKS)
@pytest.mark.parametrize("dtype", ref.BLOCK4_GEMM_DTYPES)
def test_gemm_reference_multiplies_the_dequantized_weight(seed, fmt, blocksize, dtype):
    """One-hot rows of x pick columns of w' exactly: the GEMM's weight is ck_dequantize's."""
    rng = np.random.default_rng(seed)
    n, k = 9, 256
    w = rng.standard_normal((n, k)).astype(np.float32)
    packed, scales, g = ref.quantize_block4(fmt, w, "fp32", blocksize)
    cols = rng.choice(k, size=5, replace=False)
    x = np.zeros((5, k), np.float32)
    x[np.arange(5), cols] = 1
    y = ref.gemm_block4(ref.to_dtype(x, dtype), fmt, packed, scales, g, blocksize, k, dtype)
    w = ref.dequantized_block4_weight(fmt, packed, scales, g, k, blocksize, dtype)
    # Values, not bits: a w' of -0.0 sums to +0.0 with the other (zero) products.
    np.testing.assert_array_equal(ref.to_f32(y, dtype), ref.to_f32(w[:, cols].T, dtype))


def test_fp16_range_of_mxfp4_scales():
    """The header's words: in fp16, E8M0 142 (2^15) sends codes of magnitude >= 2 to +-inf, E8M0
    144 (2^17) every non-zero code; 143 (2^16) keeps 0.5 (32768)."""
    codes = np.arange(16, dtype=np.uint8)[None, :].repeat(3, axis=0)
    codes = np.concatenate([codes, np.zeros((3, 16), np.uint8)], axis=1)   # one block of 32
    packed = ref.pack_fp4(codes)
    scales = np.array([[142], [143], [144]], np.uint8)
    w = ref.to_f32(ref.dequantize_mxfp4(packed, scales, 32, "fp16"), "fp16")
    mags = np.abs(ref.E2M1_VALUES[codes[0, :16]])
    assert np.array_equal(np.isinf(w[0, :16]), mags >= 2)
    assert np.array_equal(np.isinf(w[1, :16]), mags >= 1)
    assert np.array_equal(np.isinf(w[2, :16]), mags > 0)


def test_quantization_error_on_gaussian_weights(seed, capsys):
    """||w - w'|| / ||w|| of a Gaussian [256, 4096] weight per format, beside INT4 g64: NF4 (a
    code table fitted to the normal distribution) and NVFP4 (fine E4M3 scales on 16-element
    blocks) beat symmetric INT4 g64; MXFP4's power-of-two scales cost it about as much as its
    smaller blocks gain."""
    rng = np.random.default_rng(seed)
    w = rng.standard_normal((256, 4096)).astype(np.float32)

    def rel(d):
        d = np.asarray(d, np.float64)
        return float(np.linalg.norm(d - w) / np.linalg.norm(w))

    errors = {}
    for mode in ref.INT4_MODES:
        p, s, z = ref.quantize_int4(w, "fp32", 64, mode)
        errors[f"int4 {mode} g64"] = rel(ref.dequantize_int4(p, s, z, 4096, 64, mode, "fp32"))
    for fmt, blocksize in FORMAT_BLOCKS:
        p, s, g = ref.quantize_block4(fmt, w, "fp32", blocksize)
        name = f"{fmt} b{blocksize}"
        errors[name] = rel(ref.dequantized_block4_weight(fmt, p, s, g, 4096, blocksize, "fp32")
                           if fmt != "nf4" else ref.dequantize_nf4(p, s, 4096, blocksize, "fp32"))
    with capsys.disabled():
        print("\nrelative quantization error, Gaussian [256, 4096]:")
        for name, e in errors.items():
            print(f"  {name:16s} {e:.4f}")
    int4 = errors["int4 sym g64"]
    assert errors["nf4 b64"] < int4 and errors["nvfp4 b16"] < int4
    assert errors["mxfp4 b32"] < 1.15 * int4
    assert errors["nf4 b32"] < errors["nf4 b64"] < errors["nf4 b128"]
    assert all(0.05 < e < 0.15 for e in errors.values())
