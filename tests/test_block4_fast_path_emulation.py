"""CPU emulation of the block 4-bit formats' cheaper dequantization in kernels/core/dequant.cuh
(Dequant<Mxfp4, T>::fast_word, which the small-M kernel of ck_gemm_block4_prepacked takes, and
Dequant<Nf4, T>::word's table offsets): the same bit operations on 32-bit words of 8 codes (shifts, masks, the sign XOR) and
the same IEEE arithmetic, done here in NumPy (float32 multiplies; a T multiply as the exact
product rounded once to T, as __hmul2_rn does), checked against the reference dequantization
(tests/reference.py's dequantize_<format>, ck_dequantize_<format>'s bits) for every code at
every nibble position:

- MXFP4: every E8M0 scale fast_ok accepts (0 .. 128) in fp16 and bf16, and the first one it
  refuses (129), where the formula does go wrong: the bound is where it has to be.
- NF4: the byte offset of each code's value (one shift and one mask) is the table index * 4.

Not a test of the GPU (tests/test_block4_gemm_gpu.py runs the kernel): it checks the reasoning
in dequant.cuh's comments on every input that reasoning is about. The constants below mirror
dequant.cuh's (E2m1InT, the shifts of e2m1_pair_signs).
"""

import numpy as np
import pytest

import reference as ref

DTYPES = ("fp16", "bf16")
U32 = np.uint64(0xFFFFFFFF)   # words are computed in uint64 and masked to 32 bits

# E2m1InT<T>: the lowest bit of the three magnitude bits in T, and the power of two they carry.
E2M1_LOW_BIT = {"fp16": 9, "bf16": 6}
E2M1_EXP = {"fp16": 14, "bf16": 126}
PAIR_SIGNS = 0x80008000
MXFP4_MAX_FAST_UNIT = 128


def shift_bits(v, k):
    """shift_bits<k>: left by k bits, right by -k for a negative k, on 32-bit words."""
    v = np.asarray(v, dtype=np.uint64)
    return ((v << np.uint64(k)) & U32) if k >= 0 else (v >> np.uint64(-k))


def words_with_every_code_everywhere():
    """16 words (8 codes each, nibble e = (c + 3e) mod 16): every code at every nibble."""
    codes = (np.arange(16)[:, None] + 3 * np.arange(8)[None, :]) % 16
    words = np.zeros(16, dtype=np.uint64)
    for e in range(8):
        words |= codes[:, e].astype(np.uint64) << np.uint64(4 * e)
    return words, codes


def t_values(bits16, dtype):
    """16-bit patterns of dtype -> their values as float64 (exact)."""
    bits16 = np.asarray(bits16, dtype=np.uint16)
    if dtype == "fp16":
        return bits16.view(np.float16).astype(np.float64)
    return ref.bf16_bits_to_f32(bits16).astype(np.float64)


def t_bits(values):
    """A 16-bit dtype's representation (float16, or uint16 for bf16) -> the bit patterns as
    uint64."""
    return np.asarray(values).view(np.uint16).astype(np.uint64)


def reference_bits(codes, dequantize):
    """The reference's 16-bit patterns of each code of `codes` [words, 8] (dequantize: codes of
    one row -> dtype values)."""
    flat = codes.reshape(-1).astype(np.uint8)
    return t_bits(dequantize(ref.pack_fp4(flat[None, :]), flat.size)).reshape(codes.shape)


def pairs(p_words):
    """[words, 4] packed pairs -> [words, 8] 16-bit patterns in nibble order (pair j holds
    nibble j in its low half and nibble j + 4 in its high half)."""
    lo, hi = p_words & np.uint64(0xFFFF), p_words >> np.uint64(16)
    return np.concatenate([lo, hi], axis=1)


# ---------------------------------------------------------------------------------------------
# MXFP4: e2m1_pair_magnitudes, __hmul2_rn by the scale in T, the sign XOR
# ---------------------------------------------------------------------------------------------
def mxfp4_fast_scale2(unit, dtype):
    """fast_block: float32 2^(s - 127 + kExp) from its bits, rounded to T (both halves alike)."""
    with np.errstate(over="ignore"):
        scaled = np.array([(unit + E2M1_EXP[dtype]) << 23], dtype=np.uint32).view(np.float32)
    return int(t_bits(ref.to_dtype(scaled, dtype))[0])


def mxfp4_fast_words(q, unit, dtype):
    """fast_word on words q: [words, 4] packed pairs."""
    low = E2M1_LOW_BIT[dtype]
    scale = t_values(mxfp4_fast_scale2(unit, dtype), dtype)
    out = []
    for j in range(4):
        mags = shift_bits(q, low - 4 * j) & np.uint64((0x7 << low) * 0x10001)
        halves = [mags & np.uint64(0xFFFF), mags >> np.uint64(16)]
        # __hmul2_rn: the exact product (at most 11 + 11 significant bits: exact in float64)
        # rounded once to T.
        with np.errstate(over="ignore", invalid="ignore"):
            prods = [t_bits(ref.round_f64_to_dtype(t_values(h, dtype) * scale, dtype))
                     for h in halves]
        signs = shift_bits(q, 12 - 4 * j) & np.uint64(PAIR_SIGNS)
        out.append(((prods[1] << np.uint64(16)) | prods[0]) ^ signs)
    return np.stack(out, axis=1)


def mxfp4_reference(codes, unit, dtype):
    return reference_bits(codes, lambda packed, cols: ref.dequantize_mxfp4(
        packed, np.full((1, -(-cols // 32)), unit, np.uint8), cols, dtype))


@pytest.mark.parametrize("dtype", DTYPES)
def test_mxfp4_fast_word_is_the_reference_for_every_accepted_scale(dtype):
    q, codes = words_with_every_code_everywhere()
    for unit in range(MXFP4_MAX_FAST_UNIT + 1):
        got = pairs(mxfp4_fast_words(q, unit, dtype))
        want = mxfp4_reference(codes, unit, dtype)
        assert np.array_equal(got, want), (
            f"{dtype}, E8M0 {unit}: fast {got[got != want][:4]} vs reference {want[got != want][:4]}")


@pytest.mark.parametrize("dtype", DTYPES)
def test_mxfp4_fast_word_needs_its_bound(dtype):
    """Past s = 128 the scale in T overflows (fp16 2^16, bf16 2^128): the formula is wrong
    there, so fast_ok's bound is needed (and the emulation can see a wrong bit)."""
    q, codes = words_with_every_code_everywhere()
    unit = MXFP4_MAX_FAST_UNIT + 1
    assert not np.array_equal(pairs(mxfp4_fast_words(q, unit, dtype)),
                              mxfp4_reference(codes, unit, dtype))


# ---------------------------------------------------------------------------------------------
# NF4: the byte offset of a code's value
# ---------------------------------------------------------------------------------------------
def test_nf4_word_table_offsets(seed):
    rng = np.random.default_rng(seed)
    q = rng.integers(0, 1 << 32, size=4096, dtype=np.uint64)
    q = np.concatenate([q, words_with_every_code_everywhere()[0]])
    for e in range(8):
        offset = shift_bits(q, 2 - 4 * e) & np.uint64(0x3C)
        assert np.array_equal(offset, ((q >> np.uint64(4 * e)) & np.uint64(0xF)) * np.uint64(4)), e
