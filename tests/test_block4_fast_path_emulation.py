"""CPU emulation of the block 4-bit formats' cheaper dequantization in kernels/core/dequant.cuh
(Dequant<Mxfp4, T>::fast_word and Dequant<Nvfp4, T>::fast_word, which the small-M and wgmma kernels
of ck_gemm_block4_prepacked take, and Dequant<Nf4, T>::word's table offsets): the same bit
operations on 32-bit words of 8 codes (shifts, masks, the sign XOR) and the same IEEE arithmetic,
done here in NumPy (float32 multiplies; a T multiply as the exact product rounded once to T, as
__hmul2_rn does), checked against the reference dequantization (tests/reference.py's
dequantize_<format>, ck_dequantize_<format>'s bits) for every code at every nibble position:

- MXFP4: every E8M0 scale fast_ok accepts (0 .. 128) in fp16 and bf16, and the first one it
  refuses (129), where the formula does go wrong: the bound is where it has to be.
- NVFP4: every E4M3 byte's scale under many global scales (typical ones, random ones across
  float32's range, the smallest positive one fast_ok accepts and its negative, the largest
  float32, +-inf), fp16 and bf16; the largest g it refuses, where the formula does go wrong
  (bf16); NaN and 0 refused.
- NF4: the byte offset of each code's value (pair(): one shift and one mask; word(): a byte of
  one of two shifted, masked words) is the table index * 4.

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
# NVFP4: codes as fp16 value * 2^-14, converted to float32, times the table's s * 2^14
# ---------------------------------------------------------------------------------------------
E4M3_LARGEST = 0x7E   # 448
NVFP4_FAST_EXP = 14


def nvfp4_tables(g):
    """fill_table: s = e4m3 / g for every byte (float32 division), and s * 2^14."""
    with np.errstate(over="ignore", divide="ignore", invalid="ignore"):
        s = ref.e4m3_decode(np.arange(256, dtype=np.uint8)) / np.float32(g)
        return s, s * np.float32(2.0 ** NVFP4_FAST_EXP)


def nvfp4_fast_ok(g):
    return bool(np.abs(nvfp4_tables(g)[1][E4M3_LARGEST]) < np.inf)


def nvfp4_fast_words(q, scale14, dtype):
    """fast_word on words q with one block scale (s * 2^14, float32): [words, 4] pairs."""
    low = E2M1_LOW_BIT["fp16"]
    out = []
    for j in range(4):
        halves16 = (shift_bits(q, low - 4 * j) & np.uint64((0x7 << low) * 0x10001)) | (
            shift_bits(q, 12 - 4 * j) & np.uint64(PAIR_SIGNS))
        prods = []
        for h in (halves16 & np.uint64(0xFFFF), halves16 >> np.uint64(16)):
            v = h.astype(np.uint16).view(np.float16).astype(np.float32)   # cvt.f32.f16: exact
            with np.errstate(over="ignore", invalid="ignore"):
                prods.append(t_bits(ref.to_dtype(v * np.float32(scale14), dtype)))
        out.append((prods[1] << np.uint64(16)) | prods[0])
    return np.stack(out, axis=1)


def nvfp4_reference(codes, byte, g, dtype):
    return reference_bits(codes, lambda packed, cols: ref.dequantize_nvfp4(
        packed, np.full((1, -(-cols // 16)), byte, np.uint8), np.array([g], np.float32), cols,
        dtype))


def nvfp4_refused_g():
    """The largest positive g (float32) that fast_ok refuses (448 / g * 2^14 overflows float32,
    near 2^-105.2): a bisection over the bit patterns, which order positive floats."""
    lo = int(np.float32(2.0 ** -110).view(np.uint32))   # refused
    hi = int(np.float32(2.0 ** -100).view(np.uint32))   # accepted
    assert not nvfp4_fast_ok(np.uint32(lo).view(np.float32))
    assert nvfp4_fast_ok(np.uint32(hi).view(np.float32))
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if nvfp4_fast_ok(np.uint32(mid).view(np.float32)):
            hi = mid
        else:
            lo = mid
    return np.uint32(lo).view(np.float32)


def nvfp4_global_scales(rng):
    refused = nvfp4_refused_g()
    smallest_ok = np.nextafter(refused, np.float32(1))
    typical = np.float32(448 * 6) / rng.uniform(0.01, 100, size=6).astype(np.float32)
    wide = (2.0 ** rng.uniform(-100, 127, size=6)).astype(np.float32)
    special = np.array([smallest_ok, -smallest_ok, 1.0, -3.5, np.finfo(np.float32).max,
                        np.inf, -np.inf], np.float32)
    return np.concatenate([typical, wide, special])


@pytest.mark.parametrize("dtype", DTYPES)
def test_nvfp4_fast_word_is_the_reference_for_every_accepted_global_scale(dtype, seed):
    rng = np.random.default_rng(seed)
    q, codes = words_with_every_code_everywhere()
    for g in nvfp4_global_scales(rng):
        assert nvfp4_fast_ok(g), g
        _, fast = nvfp4_tables(g)
        for byte in range(256):
            got = pairs(nvfp4_fast_words(q, fast[byte], dtype))
            want = nvfp4_reference(codes, byte, g, dtype)
            assert np.array_equal(got, want), (
                f"{dtype}, g={g!r}, E4M3 {byte:#04x}, seed={seed}: fast "
                f"{got[got != want][:4]} vs reference {want[got != want][:4]}")


def test_nvfp4_fast_ok_refuses_nan_and_zero():
    assert not nvfp4_fast_ok(np.float32(np.nan))
    assert not nvfp4_fast_ok(np.float32(0.0))


def test_nvfp4_fast_word_needs_its_bound():
    """At the largest g that fast_ok refuses, s * 2^14 of the largest byte is +inf where s is
    finite: the formula gives +-inf or NaN where the reference does not, so the bound is
    needed. bf16 holds those products (fp16 rounds both to +-inf: no difference to see)."""
    dtype = "bf16"
    q, codes = words_with_every_code_everywhere()
    g = nvfp4_refused_g()
    s, fast = nvfp4_tables(g)
    assert np.isfinite(s[E4M3_LARGEST]) and np.isinf(fast[E4M3_LARGEST])
    got = pairs(nvfp4_fast_words(q, fast[E4M3_LARGEST], dtype))
    want = nvfp4_reference(codes, E4M3_LARGEST, g, dtype)
    assert not np.array_equal(got, want)


# ---------------------------------------------------------------------------------------------
# NF4: the byte offset of a code's value
# ---------------------------------------------------------------------------------------------
def byte_perm_zero_extend(x, byte):
    """__byte_perm(x, 0, 0x4440 | byte): byte `byte` of x, the other bytes zero."""
    return (x >> np.uint64(8 * byte)) & np.uint64(0xFF)


def test_nf4_word_table_offsets(seed):
    """pair()'s offsets (a shift and a mask per nibble) and word()'s (two shifted, masked words,
    then a byte each: nibble 2i in byte i of `even`, 2i + 1 in byte i of `odd`) are the table
    index * 4 for every nibble."""
    rng = np.random.default_rng(seed)
    q = rng.integers(0, 1 << 32, size=4096, dtype=np.uint64)
    q = np.concatenate([q, words_with_every_code_everywhere()[0]])
    even = shift_bits(q, 2) & np.uint64(0x3C3C3C3C)
    odd = shift_bits(q, -2) & np.uint64(0x3C3C3C3C)
    for e in range(8):
        want = ((q >> np.uint64(4 * e)) & np.uint64(0xF)) * np.uint64(4)
        assert np.array_equal(shift_bits(q, 2 - 4 * e) & np.uint64(0x3C), want), e
        assert np.array_equal(byte_perm_zero_extend(odd if e % 2 else even, e // 2), want), e
