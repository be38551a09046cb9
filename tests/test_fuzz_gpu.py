"""GPU shape fuzz of every kernel family against tests/reference.py, aliasing, and tensors past
2^31 elements.

- Shapes: for each family, CK_FUZZ_SHAPES cases (default 40; 8 under CK_SANITIZE=1; `make fuzz`
  runs 500) drawn from a generator seeded by the family's name and the case's index, so every
  run sees the same cases (the data is fresh each run: the `seed` fixture). M, N, K and rows/cols
  are odd, prime, 1, and just below, at and above tile multiples (15/16/17, 63/64/65,
  127/128/129, 255/256/257, ...), K on each family's multiple, M * N * K bounded so that the
  NumPy references stay fast. Each case also draws the dtype, group size, mode, epilogue (scale
  granularities, bias, ReLU, output dtype), weight layout, kernel variant (forced through the
  CK_GEMM_*_KERNEL overrides, the automatic choice where this GPU has no such kernel) and
  pointer offsets (the least alignment the header allows). Families: INT8 and INT4
  (de)quantization, INT8 GEMM (int32 and scaled), INT4 x INT4 GEMM (int32 and scaled),
  ck_linear, W4A16 on the interchange and the prepacked layout (and the prepack itself), the
  GPTQ and AWQ importers, ck_permute_columns, the block 4-bit formats (NF4 at every blocksize,
  MXFP4, NVFP4 with its global scale computed or given; inputs with NaN, inf, zeros and
  subnormals; quantize bit for bit, dequantize value for value), and the Mixture-of-experts
  layer: ck_moe_route
  (E up to 1024, k up to 32, logits spread or full of ties), ck_moe_prepack (E up to 257, odd
  N for w2) and ck_moe_forward (T from 1 to a few hundred, aimed at 1, 15/16/17, 63/64/65 and
  127/128/129 rows per expert, where the layer moves from the streaming to the tensor-core
  kernel and from its 64-row to its 128-row blocks; E <= 64, k <= 8, H and I <= 512; routed by
  fp32/fp16/bf16 logits, with or without renormalization, or by the caller's ids: distinct,
  repeated, all on one expert or partly outside [0, E); the kernel forced through CK_MOE_KERNEL;
  run twice, on a workspace of random bytes the second time: the same bits).
- Each case runs through the call classes of the family's own test file and is checked the same
  way: bit for bit where the header promises it, within the same derived tolerances otherwise.
  Every output is poisoned before the call and sits between 256-byte guard regions filled with a
  pattern; the guards must be intact afterwards (gpu_support.GuardedBuffer), inputs too.
- Aliasing: inputs that are only read may share memory (a == b, scale_a == scale_b, x == w):
  exact results. An output sharing memory with an input (in place): the header forbids it for
  some entry points and says nothing for others (test_fuzz_abi.py names them); such a call must
  be rejected, or stay inside its buffers (the values are unspecified).
- CK_FUZZ_LARGE=1 (`make fuzz`): tensors past 2^31 elements (32-bit index arithmetic would wrap):
  INT8 quantization and INT4 dequantization of > 2^31 elements, an INT8 GEMM with > 2^31 outputs.
- test_fuzz_abi.py again in a child process that sees no device (it skips where one is visible).

The tests skip without a CUDA device. Each test draws a data seed from os.urandom, prints it and
names it in its messages; CK_TEST_SEED=<seed> replays a failure.
"""
import math
import os
import re
import subprocess
import sys
import zlib

import numpy as np
import pytest

import checkpoint_formats as cf
import cuda_wrapper as ck
import reference as ref
from gpu_support import (
    CK_DTYPE, GROUP_IDS, POISON, POISON_CODES, POISON_QUANTIZED, SANITIZE,
    UINT_OF_SIZE, GuardedBuffer, assert_bitwise_equal, compute_capability, synchronize,
)
# The call classes and data of each family's own tests (helpers only: no test_* names).
from test_gemm_gpu import GemmInt8Call, LinearCall, make_scaled_call as make_int8_scaled_call
from test_gemm_gpu import GemmInt8ScaledCall, random_int8, random_linear_inputs, weight_shape
from test_gemm_gpu import random_int8_scales as random_gemm_scales
from test_gemm_int4_gpu import GemmInt4Call, GemmInt4ScaledCall, make_int4_call, pack
from test_gemm_int4_gpu import make_scaled_call as make_int4_scaled_call
from test_gemm_int4_gpu import random_codes, random_int4_scales
from test_import_gpu import ImportCall, PermuteCall
from test_moe_gpu import (
    BAD_IDS, ExpertWeight, MoECall, RouteCall, grid_logits, moe_id, random_experts, random_ids,
    sm80,   # a fixture: ck_moe_forward needs compute capability 8.0+
)
from test_quantize_gpu import (
    DequantizeInt4Call, DequantizeInt8Call, QuantizeInt4Call, QuantizeInt8Call, random_int4_inputs,
    random_int8_codes, random_int8_scales,
)
from test_w4a16_gpu import make_call as make_w4a16_call
from test_block4_gpu import BLOCK as BLOCK4_BLOCK, FORMATS as BLOCK4_FORMATS, with_specials
from test_block4_gpu import QuantizeCall as Block4QuantizeCall
from test_block4_gpu import random_dequantize_call as random_block4_dequantize_call

pytestmark = pytest.mark.gpu

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

FUZZ_SHAPES = int(os.environ.get("CK_FUZZ_SHAPES") or (8 if SANITIZE else 40))
FUZZ_LARGE = os.environ.get("CK_FUZZ_LARGE") == "1"
# Bounds that keep a case's NumPy reference in the milliseconds (and its sanitized kernels short).
MAX_MACS = 2**20 if SANITIZE else 2**24
MAX_ELEMENTS = 2**18 if SANITIZE else 2**21

# ---------------------------------------------------------------------------------------------
# Drawing shapes
# ---------------------------------------------------------------------------------------------
# Sizes around the kernels' tiles (16 to 256 rows or columns, 64 to 128 k per step) and group
# sizes, odd and prime sizes, 1.
EDGES = (1, 2, 3, 5, 7, 8, 9, 13, 15, 16, 17, 31, 32, 33, 63, 64, 65, 97, 127, 128, 129, 131,
         251, 255, 256, 257, 509, 511, 512, 513, 1021, 1023, 1024, 1025, 4095, 4096, 4097)
WIDE = (8191, 8193, 16383, 16385, 65537)
TILES = (32, 64, 128, 256, 512, 1024, 2048, 4096)


def pick(rng, values):
    return values[int(rng.integers(len(values)))]


def draw_size(rng, top, multiple=1):
    """A size <= top (at least `multiple`), a multiple of `multiple`: mostly an edge (a tile size
    and one step either side of it), otherwise uniform."""
    top = max(top, multiple)
    if multiple == 1:
        edges = [v for v in EDGES + WIDE if v <= top]
    else:
        edges = sorted({v for t in TILES for v in (t - multiple, t, t + multiple)
                        if multiple <= v <= top} | {multiple})
    if rng.random() < 0.75:
        return pick(rng, edges)
    return multiple * int(rng.integers(1, top // multiple + 1))


def draw_mnk(rng, k_multiple, n_multiple=1, m_top=1100, n_top=4200, k_top=4200):
    """(M, N, K) with M * N * K <= MAX_MACS (up to rounding to the multiples), drawn in a random
    order so that each dimension is sometimes the large one."""
    multiple = {"m": 1, "n": n_multiple, "k": k_multiple}
    tops = {"m": m_top, "n": n_top, "k": k_top}
    dims = {}
    for d in rng.permutation(["m", "n", "k"]):
        rest = math.prod(dims.values()) * math.prod(
            multiple[o] for o in "mnk" if o not in dims and o != d)
        dims[d] = draw_size(rng, min(tops[d], MAX_MACS // rest), multiple[d])
    return dims["m"], dims["n"], dims["k"]


def draw_matrix(rng, cols_multiple=1):
    """(rows, cols) with rows * cols <= MAX_ELEMENTS."""
    cols = draw_size(rng, 70000, cols_multiple)
    return draw_size(rng, max(1, MAX_ELEMENTS // cols)), cols


def shape_id(shape):
    return "x".join(map(str, shape))


def fuzz_cases(family, make):
    """FUZZ_SHAPES pytest params of a family: make(rng) -> (arguments, id) for case i, with rng
    seeded by the family's name and i (the same cases on every run)."""
    family_seed = zlib.crc32(family.encode())
    params = []
    for i in range(FUZZ_SHAPES):
        args, case_id = make(np.random.default_rng([family_seed, i]))
        params.append(pytest.param(*args, id=f"{i}-{case_id}"))
    return params


# ---------------------------------------------------------------------------------------------
# Kernel variants
# ---------------------------------------------------------------------------------------------
SMALL_M_MAX = 16


def force_variant(monkeypatch, env, variant):
    """Forces `variant` through `env`; where this GPU has no such kernel (mma, small_m and tc need
    compute capability 8.0+, wgmma 9.0), the automatic choice instead. Returns what was set."""
    cc = compute_capability()
    if (variant in ("mma", "small_m", "tc") and cc < (8, 0)) or (variant == "wgmma" and cc != (9, 0)):
        variant = "auto"
    monkeypatch.setenv(env, variant)
    return variant


def int8_variant(rng, m, layout):
    served = ["auto", "reference", "mma"]
    if layout == "nk":
        served.append("wgmma")
        if m <= SMALL_M_MAX:
            served.append("small_m")
    return pick(rng, served)


def int4_variant(rng, m):
    return pick(rng, ["auto", "reference", "mma"] + (["small_m"] if m <= SMALL_M_MAX else []))


def w4a16_variant(rng, m, prepacked):
    """tc and wgmma (any m) serve a prepacked weight."""
    served = ["auto", "reference"] + (["small_m"] if m <= SMALL_M_MAX else [])
    if prepacked:
        served += ["tc", "wgmma"]
    return pick(rng, served)


# ---------------------------------------------------------------------------------------------
# Quantization
# ---------------------------------------------------------------------------------------------
def quantize_int8_case(rng):
    shape = draw_matrix(rng)
    dtype, granularity = pick(rng, ref.DTYPES), pick(rng, ref.GRANULARITIES)
    scale_mode, misalign = pick(rng, ("dynamic", "static")), pick(rng, (0, 1))
    return ((shape, dtype, granularity, scale_mode, misalign),
            f"{shape_id(shape)}-{dtype}-{granularity}-{scale_mode}-m{misalign}")


@pytest.mark.parametrize("shape, dtype, granularity, scale_mode, misalign",
                         fuzz_cases("quantize_int8", quantize_int8_case))
def test_fuzz_quantize_int8(shape, dtype, granularity, scale_mode, misalign, seed):
    rng = np.random.default_rng(seed)
    x = ref.random_input(rng, shape, dtype)
    static_scales = None
    if scale_mode == "static":   # around the dynamic scales: half of them saturate
        _, dynamic_scales = ref.quantize_int8(x, dtype, granularity)
        static_scales = dynamic_scales * rng.uniform(0.5, 2.0, dynamic_scales.size).astype(
            np.float32)
    call = QuantizeInt8Call(x, dtype, granularity, static_scales, misalign)
    call.launch()
    call.check(f"seed={seed}")


def dequantize_int8_case(rng):
    shape = draw_matrix(rng)
    out_dtype, granularity, misalign = pick(rng, ref.DTYPES), pick(rng, ref.GRANULARITIES), \
        pick(rng, (0, 1))
    return ((shape, out_dtype, granularity, misalign),
            f"{shape_id(shape)}-{out_dtype}-{granularity}-m{misalign}")


@pytest.mark.parametrize("shape, out_dtype, granularity, misalign",
                         fuzz_cases("dequantize_int8", dequantize_int8_case))
def test_fuzz_dequantize_int8(shape, out_dtype, granularity, misalign, seed):
    rng = np.random.default_rng(seed)
    scales = random_int8_scales(rng, 1 if granularity == "tensor" else shape[0])
    call = DequantizeInt8Call(random_int8_codes(rng, shape), scales, granularity, out_dtype,
                              misalign)
    call.launch()
    call.check(f"seed={seed}")


def int4_format_case(rng):
    shape = draw_matrix(rng)
    dtype, group, mode = pick(rng, ref.DTYPES), pick(rng, ref.INT4_GROUP_SIZES), \
        pick(rng, ref.INT4_MODES)
    misalign = pick(rng, (0, 1))
    return ((shape, dtype, group, mode, misalign),
            f"{shape_id(shape)}-{dtype}-{GROUP_IDS[group]}-{mode}-m{misalign}")


@pytest.mark.parametrize("shape, dtype, group_size, mode, misalign",
                         fuzz_cases("quantize_int4", int4_format_case))
def test_fuzz_quantize_int4(shape, dtype, group_size, mode, misalign, seed):
    rng = np.random.default_rng(seed)
    call = QuantizeInt4Call(ref.random_input(rng, shape, dtype), dtype, group_size, mode, misalign)
    call.launch()
    call.check(f"seed={seed}")


@pytest.mark.parametrize("shape, out_dtype, group_size, mode, misalign",
                         fuzz_cases("dequantize_int4", int4_format_case))
def test_fuzz_dequantize_int4(shape, out_dtype, group_size, mode, misalign, seed):
    rng = np.random.default_rng(seed)
    rows, cols = shape
    packed, scales, zeros = random_int4_inputs(rng, rows, cols, group_size, mode, out_dtype)
    call = DequantizeInt4Call(packed, scales, zeros, cols, group_size, mode, out_dtype, misalign)
    call.launch()
    call.check(f"seed={seed}")


# ---------------------------------------------------------------------------------------------
# INT8 and INT4 x INT4 GEMMs, ck_linear
# ---------------------------------------------------------------------------------------------
def epilogue_draw(rng):
    """(out_dtype, granularities, bias, activation) of a scaled GEMM."""
    return (pick(rng, ref.DTYPES), (pick(rng, ref.GRANULARITIES), pick(rng, ref.GRANULARITIES)),
            bool(rng.integers(2)), pick(rng, ref.ACTIVATIONS))


def epilogue_id(out_dtype, granularities, bias, activation):
    return f"{out_dtype}-a_{granularities[0]}-b_{granularities[1]}-" \
           f"{'bias' if bias else 'nobias'}-{activation}"


def out_offsets(rng, out_dtype):
    """Bytes before out and bias: whole elements of out_dtype (the least the header allows)."""
    size = np.dtype(ref.NUMPY_DTYPE[out_dtype]).itemsize
    return pick(rng, (0, 1, 3)) * size, pick(rng, (0, 1)) * size


def gemm_int8_case(rng, scaled):
    layout = pick(rng, ref.LAYOUTS)
    shape = draw_mnk(rng, 16, 16 if layout == "kn" else 1)
    variant = int8_variant(rng, shape[0], layout)
    a_off, b_off = pick(rng, (0, 16, 48)), pick(rng, (0, 16, 32))
    if not scaled:
        misalign = (a_off, b_off, pick(rng, (0, 4, 12)))
        return ((layout, variant, shape, misalign),
                f"{layout}-{variant}-{shape_id(shape)}-{'-'.join(map(str, misalign))}")
    epilogue = epilogue_draw(rng)
    misalign = (a_off, b_off, *out_offsets(rng, epilogue[0]))
    return ((layout, variant, shape, epilogue, misalign),
            f"{layout}-{variant}-{shape_id(shape)}-{epilogue_id(*epilogue)}-"
            f"{'-'.join(map(str, misalign))}")


@pytest.mark.parametrize("layout, variant, shape, misalign",
                         fuzz_cases("gemm_int8", lambda rng: gemm_int8_case(rng, False)))
def test_fuzz_gemm_int8(layout, variant, shape, misalign, monkeypatch, seed):
    variant = force_variant(monkeypatch, "CK_GEMM_INT8_KERNEL", variant)
    rng = np.random.default_rng(seed)
    m, n, k = shape
    call = GemmInt8Call(random_int8(rng, (m, k)), random_int8(rng, weight_shape(layout, n, k)),
                        layout, misalign)
    call.launch()
    call.check(f"{variant}, seed={seed}")


@pytest.mark.parametrize("layout, variant, shape, epilogue, misalign",
                         fuzz_cases("gemm_int8_scaled", lambda rng: gemm_int8_case(rng, True)))
def test_fuzz_gemm_int8_scaled(layout, variant, shape, epilogue, misalign, monkeypatch, seed):
    variant = force_variant(monkeypatch, "CK_GEMM_INT8_KERNEL", variant)
    out_dtype, granularities, bias, activation = epilogue
    call = make_int8_scaled_call(np.random.default_rng(seed), layout, shape, out_dtype,
                                 granularities, bias, activation, misalign)
    call.launch()
    call.check(f"{variant}, seed={seed}")


def gemm_int4_case(rng, scaled):
    shape = draw_mnk(rng, 32)
    variant = int4_variant(rng, shape[0])
    a_off, b_off = pick(rng, (0, 16, 48)), pick(rng, (0, 16, 32))
    if not scaled:
        misalign = (a_off, b_off, pick(rng, (0, 4, 12)))
        return ((variant, shape, misalign),
                f"{variant}-{shape_id(shape)}-{'-'.join(map(str, misalign))}")
    epilogue = epilogue_draw(rng)
    misalign = (a_off, b_off, *out_offsets(rng, epilogue[0]))
    return ((variant, shape, epilogue, misalign),
            f"{variant}-{shape_id(shape)}-{epilogue_id(*epilogue)}-{'-'.join(map(str, misalign))}")


@pytest.mark.parametrize("variant, shape, misalign",
                         fuzz_cases("gemm_int4", lambda rng: gemm_int4_case(rng, False)))
def test_fuzz_gemm_int4(variant, shape, misalign, monkeypatch, seed):
    variant = force_variant(monkeypatch, "CK_GEMM_INT4_KERNEL", variant)
    call = make_int4_call(np.random.default_rng(seed), shape, misalign)
    call.launch()
    call.check(f"{variant}, seed={seed}")


@pytest.mark.parametrize("variant, shape, epilogue, misalign",
                         fuzz_cases("gemm_int4_scaled", lambda rng: gemm_int4_case(rng, True)))
def test_fuzz_gemm_int4_scaled(variant, shape, epilogue, misalign, monkeypatch, seed):
    """Bit for bit ck_gemm_int8_scaled (automatic variant) on the unpacked codes."""
    variant = force_variant(monkeypatch, "CK_GEMM_INT4_KERNEL", variant)
    out_dtype, granularities, bias, activation = epilogue
    call = make_int4_scaled_call(np.random.default_rng(seed), shape, out_dtype, granularities,
                                 bias, activation, misalign)
    call.launch()
    call.check(f"{variant}, seed={seed}")


def linear_case(rng):
    dtype = pick(rng, ref.DTYPES)
    per_vector = 16 // np.dtype(ref.NUMPY_DTYPE[dtype]).itemsize   # K and N multiples of it
    shape = draw_mnk(rng, per_vector, per_vector)
    bias, activation = bool(rng.integers(2)), pick(rng, ref.ACTIVATIONS)
    misalign = tuple(pick(rng, (0, 16, 48)) for _ in range(4))
    return ((dtype, shape, bias, activation, misalign),
            f"{dtype}-{shape_id(shape)}-{'bias' if bias else 'nobias'}-{activation}-"
            f"{'-'.join(map(str, misalign))}")


@pytest.mark.cublas
@pytest.mark.parametrize("dtype, shape, bias, activation, misalign",
                         fuzz_cases("linear", linear_case))
def test_fuzz_linear(dtype, shape, bias, activation, misalign, seed):
    rng = np.random.default_rng(seed)
    x, w, bias_values = random_linear_inputs(rng, *shape, dtype, bias)
    call = LinearCall(x, w, bias_values, activation, dtype, misalign)
    call.launch()
    call.check(f"seed={seed}")


# ---------------------------------------------------------------------------------------------
# W4A16: the interchange layout, the prepack and the prepacked layout
# ---------------------------------------------------------------------------------------------
def w4a16_case(rng, prepacked):
    shape = draw_mnk(rng, 32)
    variant = w4a16_variant(rng, shape[0], prepacked)
    dtype, mode = pick(rng, ref.W4A16_DTYPES), pick(rng, ref.INT4_MODES)
    group, source = pick(rng, ref.INT4_GROUP_SIZES), pick(rng, ("quantized", "codes"))
    bias, activation = bool(rng.integers(2)), pick(rng, ref.ACTIVATIONS)
    # x and w_packed 16-byte aligned; scales, bias and out at whole fp16/bf16 elements.
    misalign = (pick(rng, (0, 16)), pick(rng, (0, 16, 48)), pick(rng, (0, 2, 6)),
                pick(rng, (0, 2)), pick(rng, (0, 2, 6)))
    return ((variant, shape, dtype, mode, group, source, bias, activation, misalign),
            f"{variant}-{shape_id(shape)}-{dtype}-{mode}-{GROUP_IDS[group]}-{source}-"
            f"{'bias' if bias else 'nobias'}-{activation}-{'-'.join(map(str, misalign))}")


W4A16_ARGS = "variant, shape, dtype, mode, group_size, source, bias, activation, misalign"


@pytest.mark.parametrize(W4A16_ARGS, fuzz_cases("gemm_w4a16", lambda rng: w4a16_case(rng, False)))
def test_fuzz_gemm_w4a16(variant, shape, dtype, mode, group_size, source, bias, activation,
                         misalign, monkeypatch, seed):
    variant = force_variant(monkeypatch, "CK_GEMM_W4A16_KERNEL", variant)
    call = make_w4a16_call(np.random.default_rng(seed), shape, dtype, mode, group_size, source,
                           bias, activation, misalign)
    call.launch()
    call.check(f"{variant}, seed={seed}")


@pytest.mark.parametrize(W4A16_ARGS, fuzz_cases("gemm_w4a16_prepacked",
                                                lambda rng: w4a16_case(rng, True)))
def test_fuzz_gemm_w4a16_prepacked(variant, shape, dtype, mode, group_size, source, bias,
                                   activation, misalign, monkeypatch, seed):
    """ck_w4a16_prepack writes the header's layout bit for bit (and nothing around it), and
    ck_gemm_w4a16_prepacked on it meets the reference."""
    variant = force_variant(monkeypatch, "CK_GEMM_W4A16_KERNEL", variant)
    call = make_w4a16_call(np.random.default_rng(seed), shape, dtype, mode, group_size, source,
                           bias, activation, misalign, prepacked=True)
    call.launch()
    ctx = f"{variant}, seed={seed}"
    call.check(ctx)
    _, w_packed, scales, zeros, _ = call.inputs
    want_w, want_s, want_z = ref.w4a16_prepack(w_packed, scales, zeros, shape[1], shape[2],
                                               group_size)
    assert_bitwise_equal(call.w_pre.read(f"w_prepacked, {ctx}"), want_w, f"w_prepacked, {ctx}")
    assert_bitwise_equal(call.scales_pre.read(f"scales_prepacked, {ctx}"), want_s,
                         f"scales_prepacked, {ctx}")
    if want_z is not None:
        assert_bitwise_equal(call.zeros_pre.read(f"zeros_prepacked, {ctx}"), want_z,
                             f"zeros_prepacked, {ctx}")


# ---------------------------------------------------------------------------------------------
# Checkpoint importers and ck_permute_columns
# ---------------------------------------------------------------------------------------------
# Bytes before each buffer: whole elements (int32 4, fp16/bf16 2, uint8 1), as the header allows.
IMPORT_OFFSETS = {"qweight": (0, 4), "qzeros": (0, 4, 12), "scales": (0, 2), "g_idx": (0, 4),
                  "w_packed": (0, 1, 3), "scales_out": (0, 2, 6), "zeros_out": (0, 1, 3),
                  "perm": (0, 4)}


def import_case(rng):
    fmt = pick(rng, ("gptq", "awq"))
    g_idx_kind = pick(rng, ("none", "trivial", "act_order")) if fmt == "gptq" else "none"
    k = draw_size(rng, 4096, 32)
    n = draw_size(rng, min(2048, max(8, MAX_MACS // (4 * k))), 8)
    dtype, group = pick(rng, ref.W4A16_DTYPES), pick(rng, ref.INT4_GROUP_SIZES)
    misalign = {name: pick(rng, offsets) for name, offsets in IMPORT_OFFSETS.items()}
    offsets = "-".join(str(misalign[name]) for name in IMPORT_OFFSETS)
    return ((fmt, g_idx_kind, k, n, dtype, group, misalign),
            f"{fmt}-{g_idx_kind}-k{k}-n{n}-{dtype}-{GROUP_IDS[group]}-{offsets}")


@pytest.mark.parametrize("fmt, g_idx_kind, k, n, dtype, group_size, misalign",
                         fuzz_cases("import", import_case))
def test_fuzz_import(fmt, g_idx_kind, k, n, dtype, group_size, misalign, seed):
    call = ImportCall(np.random.default_rng(seed), fmt, k, n, group_size, dtype, g_idx_kind,
                      misalign)
    call.launch()
    call.check(f"seed={seed}")


def permute_case(rng):
    shape = draw_matrix(rng)
    dtype, kind = pick(rng, ref.DTYPES), pick(rng, ("permutation", "gather"))
    size = np.dtype(ref.NUMPY_DTYPE[dtype]).itemsize
    misalign = (pick(rng, (0, 1, 3)) * size, pick(rng, (0, 4)), pick(rng, (0, 1)) * size)
    return ((shape, dtype, kind, misalign),
            f"{shape_id(shape)}-{dtype}-{kind}-{'-'.join(map(str, misalign))}")


@pytest.mark.parametrize("shape, dtype, kind, misalign", fuzz_cases("permute", permute_case))
def test_fuzz_permute_columns(shape, dtype, kind, misalign, seed):
    call = PermuteCall(np.random.default_rng(seed), *shape, dtype, kind, misalign)
    call.launch()
    call.check(f"seed={seed}")


# ---------------------------------------------------------------------------------------------
# Block 4-bit formats: NF4 (every blocksize), MXFP4, NVFP4 (global scale computed or given)
# ---------------------------------------------------------------------------------------------
def block4_case(rng):
    shape = draw_matrix(rng)
    fmt, dtype = pick(rng, BLOCK4_FORMATS), pick(rng, ref.DTYPES)
    blocksize = pick(rng, ref.NF4_BLOCK_SIZES) if fmt == "nf4" else BLOCK4_BLOCK[fmt]
    given = fmt == "nvfp4" and bool(rng.integers(2))   # a given global scale, else computed
    misalign = pick(rng, (0, 1))
    return ((fmt, shape, dtype, blocksize, given, misalign),
            f"{fmt}-{shape_id(shape)}-{dtype}-b{blocksize}{'-given' if given else ''}-m{misalign}")


@pytest.mark.parametrize("fmt, shape, dtype, blocksize, given, misalign",
                         fuzz_cases("quantize_block4", block4_case))
def test_fuzz_quantize_block4(fmt, shape, dtype, blocksize, given, misalign, seed):
    rng = np.random.default_rng(seed)
    x = with_specials(rng, ref.random_input(rng, shape, dtype), dtype)
    g = np.array([10.0 ** rng.uniform(-3, 3)], np.float32) if given else None
    Block4QuantizeCall(fmt, x, dtype, blocksize, g, misalign).check_launch(f"seed={seed}")


@pytest.mark.parametrize("fmt, shape, dtype, blocksize, given, misalign",
                         fuzz_cases("dequantize_block4", block4_case))
def test_fuzz_dequantize_block4(fmt, shape, dtype, blocksize, given, misalign, seed):
    call = random_block4_dequantize_call(np.random.default_rng(seed), fmt, shape, blocksize,
                                         dtype, misalign)
    call.check_launch(f"seed={seed}")


# ---------------------------------------------------------------------------------------------
# Mixture of experts: ck_moe_route, ck_moe_prepack, ck_moe_forward
# ---------------------------------------------------------------------------------------------
# Bounds of the layer's cases: the header allows E up to 1024 and k up to 32; the layer's cases
# stay at the models' sizes (E <= 64, k <= 8, H and I <= 512), which keep its float64 reference
# in the milliseconds. The route takes the header's whole range of E and k; the prepack E up to
# 257 (its reference prepacks one expert at a time, ~0.1 ms each).
MOE_EXPERTS_TOP = 64
MOE_PREPACK_EXPERTS_TOP = 257
MOE_ROUTE_TOKENS_TOP = 1100   # grid_logits draws each token's logits on its own
MOE_TOP_K = (1, 2, 3, 4, 6, 8)
MOE_ROUTE_TOP_K = (1, 2, 3, 4, 6, 8, 16, 31, 32)
MOE_FEATURES_TOP = 512
MOE_TOKENS_TOP = 520
# The expert GEMMs run the streaming kernel in blocks of 16 rows while the experts that have
# rows get at most 16 on average (ceil(T k / min(E, T k))), the tensor-core kernel beyond, in
# blocks of 64 rows up to 64 per expert and of 128 above, and on Hopper the wgmma kernel in
# blocks of 128 above 64 and of 256 above 128: the averages around those sizes.
MOE_STREAM_ROWS = 16
MOE_WGMMA_ROWS = 64
MOE_ROWS_PER_EXPERT = (1, 2, 15, 16, 17, 63, 64, 65, 127, 128, 129, 255, 256, 257)
# The caller's ids: distinct per token (a router's), drawn with repetition (a token's pairs may
# name one expert twice), every pair on one expert, or some outside [0, E) (the header: such a
# pair contributes nothing).
MOE_IDS = ("distinct", "repeated", "one_expert", "out_of_range")
MOE_ROUTINGS = tuple(f"ids_{kind}" for kind in MOE_IDS) + ref.MOE_ROUTER_DTYPES
# Host work of a layer case: its 3 T k H I multiply-adds (the float64 reference does each once,
# its error bound about twice more) within MAX_MACS; its E * 3 H I expert weights (drawn,
# quantized and dequantized on the host, every expert whether used or not) within MOE_WEIGHTS.
# A route case: T E logits within MOE_ROUTE_ELEMENTS.
MOE_WEIGHTS = MAX_ELEMENTS // 4
MOE_ROUTE_ELEMENTS = MAX_ELEMENTS // 8


def moe_rows_per_expert(tokens, experts, top_k):
    """The rows each expert that has any gets on average, rounded up: what picks the layer's
    expert kernel (from the sizes alone, whatever the ids)."""
    pairs = tokens * top_k
    return -(-pairs // min(experts, pairs))


def draw_top_k(rng, top, edges):
    """k in [1, top]: mostly one of `edges`, otherwise uniform."""
    if rng.random() < 0.75:
        return pick(rng, [v for v in edges if v <= top])
    return int(rng.integers(1, top + 1))


def moe_route_case(rng):
    experts = draw_size(rng, ref.MOE_MAX_EXPERTS)
    tokens = draw_size(rng, min(MOE_ROUTE_TOKENS_TOP, max(1, MOE_ROUTE_ELEMENTS // experts)))
    top_k = draw_top_k(rng, min(experts, ref.MOE_MAX_TOP_K), MOE_ROUTE_TOP_K)
    dtype, renormalize, ties = pick(rng, ref.MOE_ROUTER_DTYPES), bool(rng.integers(2)), \
        bool(rng.integers(2))
    # logits aligned to its element, ids and weights to 4 bytes: the least the header allows.
    size = np.dtype(ref.NUMPY_DTYPE[dtype]).itemsize
    misalign = (pick(rng, (0, 1, 3)) * size, pick(rng, (0, 4, 12)), pick(rng, (0, 4, 12)))
    return ((tokens, experts, top_k, dtype, renormalize, ties, misalign),
            f"T{tokens}-E{experts}-k{top_k}-{dtype}-{'renorm' if renormalize else 'raw'}-"
            f"{'ties' if ties else 'spread'}-{'-'.join(map(str, misalign))}")


def assert_inputs_intact(inputs, ctx):
    """inputs: (name, GuardedBuffer, host values): each still holds its values, guards intact."""
    for name, buffer, host in inputs:
        assert_bitwise_equal(buffer.read(f"{name}, {ctx}"), np.asarray(host),
                             f"the input {name} was written, {ctx}")


@pytest.mark.parametrize("tokens, experts, top_k, dtype, renormalize, ties, misalign",
                         fuzz_cases("moe_route", moe_route_case))
def test_fuzz_moe_route(tokens, experts, top_k, dtype, renormalize, ties, misalign, seed):
    """ids bit for bit the reference's, weights within test_moe_gpu.py's bound (logits spread
    over a grid, or full of exact ties); the same bits again on outputs poisoned anew."""
    rng = np.random.default_rng(seed)
    call = RouteCall(grid_logits(rng, tokens, experts, dtype, ties), top_k, renormalize, dtype,
                     misalign)
    call.launch()
    ctx = f"seed={seed}"
    ids, weights = call.check(ctx)
    assert_inputs_intact([("logits", call.logits, call.logits_host)], ctx)
    call.poison_outputs()
    call.launch()
    synchronize()
    for name, buffer, first in (("ids", call.ids, ids), ("weights", call.weights, weights)):
        assert_bitwise_equal(buffer.read(f"{name}, second run, {ctx}"), first,
                             f"{name}, second run, {ctx}")


def moe_prepack_case(rng):
    gate_up = bool(rng.integers(2))
    k = draw_size(rng, 4096, 32)
    experts = draw_size(rng, min(MOE_PREPACK_EXPERTS_TOP, max(1, MAX_ELEMENTS // (16 * k))))
    n = draw_size(rng, min(4096, max(16, MAX_ELEMENTS // (experts * k))), 16 if gate_up else 1)
    dtype, mode, group = pick(rng, ref.MOE_DTYPES), pick(rng, ref.INT4_MODES), \
        pick(rng, ref.INT4_GROUP_SIZES)
    misalign = pick(rng, (0, 16, 48))
    return ((experts, n, k, gate_up, dtype, mode, group, misalign),
            f"E{experts}-n{n}-k{k}-{'w13' if gate_up else 'w2'}-{dtype}-{mode}-"
            f"{GROUP_IDS[group]}-m{misalign}")


@pytest.mark.parametrize("experts, n, k, gate_up, dtype, mode, group_size, misalign",
                         fuzz_cases("moe_prepack", moe_prepack_case))
def test_fuzz_moe_prepack(experts, n, k, gate_up, dtype, mode, group_size, misalign, seed):
    """Bit for bit ref.moe_prepack on random bytes (every code), random zero points and scales
    (the outputs 16-byte aligned, not 256); nothing written around the outputs or into the
    inputs."""
    rng = np.random.default_rng(seed)
    weight = ExpertWeight(random_experts(rng, experts, n, k, dtype, mode, group_size, "codes"),
                          k, group_size, dtype, gate_up, misalign)
    ctx = f"seed={seed}"
    weight.check_prepacked(ctx)
    assert_inputs_intact([(name, buffer, host) for name, buffer, host in
                          zip(("w_packed", "scales", "zeros"), weight.inputs, weight.host)
                          if buffer is not None], ctx)


def draw_tokens(rng, top, experts, top_k):
    """T <= top (at least 1): 1, or T giving the experts one of MOE_ROWS_PER_EXPERT rows on
    average (T = floor(r E / k) makes ceil(T k / min(E, T k)) exactly r), or a size of
    draw_size."""
    reachable = [r for r in MOE_ROWS_PER_EXPERT if r * experts // top_k <= top]
    draw = rng.random()
    if draw < 0.1:
        return 1
    if draw < 0.55 and reachable:
        return max(1, pick(rng, reachable) * experts // top_k)
    return draw_size(rng, top)


def moe_forward_case(rng):
    experts = (pick(rng, [v for v in EDGES if v <= MOE_EXPERTS_TOP]) if rng.random() < 0.75
               else int(rng.integers(1, MOE_EXPERTS_TOP + 1)))
    top_k = draw_top_k(rng, min(experts, MOE_TOP_K[-1]), MOE_TOP_K)
    # T, H and I in a random order (so that each is sometimes the large one), each within what
    # MAX_MACS and MOE_WEIGHTS leave with the others not yet drawn at their least (1, 32, 32).
    dims = {"tokens": 1, "hidden": 32, "inter": 32}
    for d in rng.permutation(list(dims)):
        rest = math.prod(v for o, v in dims.items() if o != d)
        if d == "tokens":
            dims[d] = draw_tokens(rng, min(MOE_TOKENS_TOP, MAX_MACS // (3 * top_k * rest)),
                                  experts, top_k)
        else:
            other = dims["inter" if d == "hidden" else "hidden"]
            dims[d] = draw_size(rng, min(MOE_FEATURES_TOP, MAX_MACS // (3 * top_k * rest),
                                         MOE_WEIGHTS // (3 * experts * other)), 32)
    tokens, hidden, inter = dims["tokens"], dims["hidden"], dims["inter"]
    shape = (tokens, hidden, inter, experts, top_k)
    served = ["auto", "stream"]
    rows = moe_rows_per_expert(tokens, experts, top_k)
    if rows > MOE_STREAM_ROWS:
        served.append("tc")
    if rows > MOE_WGMMA_ROWS:
        served.append("wgmma")
    variant = pick(rng, served)
    dtype, mode, group = pick(rng, ref.MOE_DTYPES), pick(rng, ref.INT4_MODES), \
        pick(rng, ref.INT4_GROUP_SIZES)
    routing = pick(rng, MOE_ROUTINGS)
    renormalize = routing in ref.MOE_ROUTER_DTYPES and bool(rng.integers(2))
    source, misalign = pick(rng, ("normal", "codes")), bool(rng.integers(2))
    return ((variant, shape, dtype, mode, group, routing, renormalize, source, misalign),
            f"{variant}-{moe_id(shape)}-{dtype}-{mode}-{GROUP_IDS[group]}-route_{routing}"
            f"{'-renorm' if renormalize else ''}-{source}-{'m16' if misalign else 'm0'}")


def moe_caller_ids(rng, kind, tokens, experts, top_k):
    """The caller's ids [T, k] of MOE_IDS kind `kind`."""
    if kind == "distinct":
        return random_ids(rng, tokens, experts, top_k)[0]
    if kind == "repeated":
        return rng.integers(0, experts, size=(tokens, top_k), dtype=np.int32)
    if kind == "one_expert":
        return np.full((tokens, top_k), rng.integers(experts), np.int32)
    assert kind == "out_of_range", kind
    ids, _ = random_ids(rng, tokens, experts, top_k)
    bad = rng.random(ids.shape) < rng.uniform(0.1, 0.6)
    bad_values = np.array(BAD_IDS + (experts, experts + 3), np.int64)
    return np.where(bad, rng.choice(bad_values, size=ids.shape), ids).astype(np.int32)


def moe_call_inputs(call, ctx):
    """(name, GuardedBuffer, values) of every input of a MoECall: x, the routing, the
    interchange weights the prepacks read and, as they are now on the device, the prepacked ones
    the layer reads (test_fuzz_moe_prepack checks them bit for bit)."""
    inputs = [("x", call.x, call.x_host)]
    if call.logits is not None:
        inputs.append(("router_logits", call.logits, call.route_host))
    else:
        inputs += [("topk_ids", call.ids, call.route_host[0]),
                   ("topk_weights", call.weights, call.route_host[1])]
    for weight, which in ((call.w13, "w13"), (call.w2, "w2")):
        inputs += [(f"{which} {name}", buffer, host) for name, buffer, host in
                   zip(("w_packed", "scales", "zeros"), weight.inputs, weight.host)
                   if buffer is not None]
        inputs += [(f"{which} {name}", buffer, buffer.read(f"{which} {name}, {ctx}"))
                   for name, buffer in zip(("w_prepacked", "scales_prepacked", "zeros_prepacked"),
                                           (weight.w, weight.scales, weight.zeros))
                   if buffer is not None]
    return inputs


MOE_FORWARD_ARGS = "variant, shape, dtype, mode, group_size, routing, renormalize, source, misalign"


@pytest.mark.parametrize(MOE_FORWARD_ARGS, fuzz_cases("moe_forward", moe_forward_case))
def test_fuzz_moe_forward(variant, shape, dtype, mode, group_size, routing, renormalize, source,
                          misalign, monkeypatch, sm80, seed):
    """The layer within test_moe_gpu.py's bounds of the float64 reference (routed by its logits,
    or by the caller's ids and weights); out and the workspace poisoned, nothing written around
    them or into any input (the prepacked weights included); the same bits again on outputs
    poisoned anew and a workspace of random bytes."""
    variant = force_variant(monkeypatch, "CK_MOE_KERNEL", variant)
    rng = np.random.default_rng(seed)
    tokens, _, _, experts, top_k = shape
    if routing in ref.MOE_ROUTER_DTYPES:
        call = MoECall(rng, shape, dtype, mode, group_size, routing, renormalize, source,
                       misalign=misalign)
    else:
        ids = moe_caller_ids(rng, routing[len("ids_"):], tokens, experts, top_k)
        call = MoECall(rng, shape, dtype, mode, group_size, "ids", source=source, ids=ids,
                       misalign=misalign)
    ctx = f"{variant}, seed={seed}"
    inputs = moe_call_inputs(call, ctx)
    call.launch()
    first = call.check(ctx)
    assert_inputs_intact(inputs, ctx)
    call.poison_outputs()
    call.scramble_workspace(rng)
    call.launch()
    synchronize()
    assert_bitwise_equal(call.out.read(f"out, second run, {ctx}"), first,
                         f"out, second run, {ctx}")
    call.workspace.read(f"workspace, second run, {ctx}")


# ---------------------------------------------------------------------------------------------
# Aliasing: inputs read through the same memory
# ---------------------------------------------------------------------------------------------
# cuda_kernels.h forbids only outputs overlapping inputs; two inputs that are only read may be
# the same memory: a product of a matrix with itself (M = N, a == b), one scale vector for both
# operands (scale_a == scale_b), x == w in ck_linear. Exact results (the reference of the same
# values), on every kernel variant.
SELF_PRODUCT_K = 160   # a multiple of 32 (INT4) and of 16 (INT8), two K steps and a partial one


def self_product_params(variants):
    return [pytest.param(variant, m, id=f"{variant}-m{m}") for variant in variants
            for m in (5, 16, 100) if variant != "small_m" or m <= SMALL_M_MAX]


@pytest.mark.parametrize("variant, m", self_product_params(
    ("auto", "reference", "mma", "small_m", "wgmma")))
def test_gemm_int8_operands_in_the_same_memory(variant, m, monkeypatch, seed):
    variant = force_variant(monkeypatch, "CK_GEMM_INT8_KERNEL", variant)
    rng = np.random.default_rng(seed)
    k = SELF_PRODUCT_K
    a = random_int8(rng, (m, k))
    call = GemmInt8Call(a, a.copy(), "nk")
    ck.raw.gemm_int8(call.a.ptr, call.a.ptr, ck.LAYOUT_NK, m, m, k, call.out.ptr, 0)
    call.check(f"a == b, {variant}, seed={seed}")
    scale = random_gemm_scales(rng, m, k)
    scaled = GemmInt8ScaledCall(a, a.copy(), "nk", scale, scale.copy(), None, "none", "fp32",
                                ("row", "row"))
    ck.raw.gemm_int8_scaled(scaled.a.ptr, scaled.a.ptr, ck.LAYOUT_NK, m, m, k, scaled.scale_a.ptr,
                            ck.PER_ROW, scaled.scale_a.ptr, ck.PER_ROW, 0, ck.ACTIVATION_NONE,
                            scaled.out.ptr, ck.DType.FP32, 0)
    scaled.check(f"a == b, scale_a == scale_b, {variant}, seed={seed}")


@pytest.mark.parametrize("variant, m", self_product_params(("auto", "reference", "mma", "small_m")))
def test_gemm_int4_operands_in_the_same_memory(variant, m, monkeypatch, seed):
    variant = force_variant(monkeypatch, "CK_GEMM_INT4_KERNEL", variant)
    rng = np.random.default_rng(seed)
    k = SELF_PRODUCT_K
    a = random_codes(rng, (m, k))
    call = GemmInt4Call(a, a.copy())
    ck.raw.gemm_int4(call.a.ptr, call.a.ptr, m, m, k, call.out.ptr, 0)
    call.check(f"a == b, {variant}, seed={seed}")
    scale = random_int4_scales(rng, m, k)
    scaled = GemmInt4ScaledCall(a, a.copy(), scale, scale.copy(), None, "relu", "fp16",
                                ("row", "row"))
    ck.raw.gemm_int4_scaled(scaled.a.ptr, scaled.a.ptr, m, m, k, scaled.scale_a.ptr, ck.PER_ROW,
                            scaled.scale_a.ptr, ck.PER_ROW, 0, ck.ACTIVATION_RELU, scaled.out.ptr,
                            ck.DType.FP16, 0)
    scaled.check(f"a == b, scale_a == scale_b, {variant}, seed={seed}")


@pytest.mark.cublas
@pytest.mark.parametrize("dtype", ref.DTYPES)
def test_linear_x_and_w_in_the_same_memory(dtype, seed):
    rng = np.random.default_rng(seed)
    m, k = 72, 160
    x, _, bias = random_linear_inputs(rng, m, m, k, dtype, True)
    call = LinearCall(x, x.copy(), bias, "none", dtype)
    ck.raw.linear(call.x.ptr, call.x.ptr, call.bias.ptr, CK_DTYPE[dtype], m, m, k,
                  ck.ACTIVATION_NONE, call.out.ptr, 0)
    call.check(f"x == w, seed={seed}")


# ---------------------------------------------------------------------------------------------
# Aliasing: an output in the memory of an input (in place)
# ---------------------------------------------------------------------------------------------
class SharedRegion:
    """One device region that an input and an output of a call both start at: it holds the
    input's bytes, padded with POISON to the larger of the two, between guards."""

    def __init__(self, host_input, out_nbytes):
        data = np.ascontiguousarray(host_input).reshape(-1).view(np.uint8)
        self.host = np.full(max(data.size, out_nbytes), POISON, np.uint8)
        self.host[:data.size] = data
        self.buffer = GuardedBuffer.input(self.host)
        self.ptr = self.buffer.ptr


def in_place_case(name, rng, m):
    """(launch, region, other buffers {name: (buffer, host or None for an output)}, the two
    arguments that share the region) of an in-place call of `name`, m rows."""
    u8, f16, f32 = np.uint8, np.float16, np.float32
    cols, n, k, group = 1000, 72, 96, 32
    raw = ck.raw
    if name == "ck_quantize_int8":
        x = ref.random_input(rng, (m, cols), "fp16")
        region = SharedRegion(x, m * cols)
        scales = GuardedBuffer.output((m,), f32, POISON_QUANTIZED)
        return (lambda: raw.quantize_int8(region.ptr, ck.DType.FP16, m, cols, ck.PER_ROW,
                                          ck.DYNAMIC, scales.ptr, region.ptr),
                region, {"scales": (scales, None)}, ("x", "q"))
    if name == "ck_dequantize_int8":
        q, s = random_int8_codes(rng, (m, cols)), random_int8_scales(rng, m)
        region, scales = SharedRegion(q, m * cols * 4), GuardedBuffer.input(s)
        return (lambda: raw.dequantize_int8(region.ptr, scales.ptr, m, cols, ck.PER_ROW,
                                            region.ptr, ck.DType.FP32),
                region, {"scales": (scales, s)}, ("q", "out"))
    if name == "ck_quantize_int4":
        x = ref.random_input(rng, (m, cols), "fp16")
        region = SharedRegion(x, m * cols // 2)
        scales = GuardedBuffer.output((m, ref.int4_groups_per_row(cols, group)), f16,
                                      POISON_QUANTIZED)
        return (lambda: raw.quantize_int4(region.ptr, ck.DType.FP16, m, cols, group,
                                          ck.INT4_SYMMETRIC, region.ptr, scales.ptr, 0),
                region, {"scales": (scales, None)}, ("x", "q_packed"))
    if name == "ck_dequantize_int4":
        packed, s, _ = random_int4_inputs(rng, m, cols, group, "sym", "fp16")
        region, scales = SharedRegion(packed, m * cols * 2), GuardedBuffer.input(s)
        return (lambda: raw.dequantize_int4(region.ptr, scales.ptr, 0, m, cols, group,
                                            ck.INT4_SYMMETRIC, region.ptr, ck.DType.FP16),
                region, {"scales": (scales, s)}, ("q_packed", "out"))
    if name == "ck_permute_columns":
        x, p = ref.random_input(rng, (m, cols), "fp16"), rng.permutation(cols).astype(np.int32)
        region, perm = SharedRegion(x, m * cols * 2), GuardedBuffer.input(p)
        return (lambda: raw.permute_columns(region.ptr, ck.DType.FP16, m, cols, perm.ptr,
                                            region.ptr),
                region, {"perm": (perm, p)}, ("x", "out"))
    if name == "ck_gemm_int8":
        a, b_host = random_int8(rng, (m, k)), random_int8(rng, (n, k))
        region, b = SharedRegion(a, m * n * 4), GuardedBuffer.input(b_host)
        return (lambda: raw.gemm_int8(region.ptr, b.ptr, ck.LAYOUT_NK, m, n, k, region.ptr),
                region, {"b": (b, b_host)}, ("a", "c"))
    if name == "ck_gemm_int4":
        a, b_host = pack(random_codes(rng, (m, k))), pack(random_codes(rng, (n, k)))
        region, b = SharedRegion(a, m * n * 4), GuardedBuffer.input(b_host)
        return (lambda: raw.gemm_int4(region.ptr, b.ptr, m, n, k, region.ptr),
                region, {"b": (b, b_host)}, ("a", "c"))
    if name == "ck_linear":
        x, w_host, _ = random_linear_inputs(rng, m, n, k, "fp16", False)
        region, w = SharedRegion(x, m * n * 2), GuardedBuffer.input(w_host)
        return (lambda: raw.linear(region.ptr, w.ptr, 0, ck.DType.FP16, m, n, k,
                                   ck.ACTIVATION_NONE, region.ptr),
                region, {"w": (w, w_host)}, ("x", "out"))
    groups = k // group
    w_host = rng.integers(0, 256, size=(n, k // 2), dtype=u8)
    s_host = ref.to_dtype(rng.uniform(0.01, 0.1, (n, groups)).astype(np.float32), "fp16")
    if name in ("ck_gemm_w4a16", "ck_gemm_w4a16_prepacked"):
        x = ref.random_input(rng, (m, k), "fp16")
        region = SharedRegion(x, m * n * 2)
        w, scales = GuardedBuffer.input(w_host), GuardedBuffer.input(s_host)
        others = {"w_packed": (w, w_host), "scales": (scales, s_host)}
        if name == "ck_gemm_w4a16":
            return (lambda: raw.gemm_w4a16(region.ptr, ck.DType.FP16, w.ptr, scales.ptr, 0, group,
                                           ck.INT4_SYMMETRIC, 0, ck.ACTIVATION_NONE, m, n, k,
                                           region.ptr),
                    region, others, ("x", "out"))
        nbytes, nvalues = ref.w4a16_prepacked_sizes(n, k, group)
        w_pre = GuardedBuffer.output((nbytes,), u8, POISON)
        s_pre = GuardedBuffer.output((nvalues,), f16, POISON)
        raw.w4a16_prepack(w.ptr, scales.ptr, 0, ck.DType.FP16, n, k, group, ck.INT4_SYMMETRIC,
                          w_pre.ptr, s_pre.ptr, 0)
        return (lambda: raw.gemm_w4a16_prepacked(region.ptr, ck.DType.FP16, w_pre.ptr, s_pre.ptr,
                                                 0, group, ck.INT4_SYMMETRIC, 0,
                                                 ck.ACTIVATION_NONE, m, n, k, region.ptr),
                region, dict(others, w_prepacked=(w_pre, None), scales_prepacked=(s_pre, None)),
                ("x", "out"))
    if name == "ck_w4a16_prepack":
        nbytes, nvalues = ref.w4a16_prepacked_sizes(n, k, group)
        region, scales = SharedRegion(w_host, nbytes), GuardedBuffer.input(s_host)
        s_pre = GuardedBuffer.output((nvalues,), f16, POISON)
        return (lambda: raw.w4a16_prepack(region.ptr, scales.ptr, 0, ck.DType.FP16, n, k, group,
                                          ck.INT4_SYMMETRIC, region.ptr, s_pre.ptr, 0),
                region, {"scales": (scales, s_host), "scales_prepacked": (s_pre, None)},
                ("w_packed", "w_prepacked"))
    assert name == "ck_import_awq", name
    qweight, qzeros_host, s_ckpt = cf.random_awq_checkpoint(rng, k, n, group, "fp16")
    region = SharedRegion(qweight, n * k // 2)   # qweight [K, N / 8] int32: as many bytes
    qzeros, scales = GuardedBuffer.input(qzeros_host), GuardedBuffer.input(s_ckpt)
    s_out = GuardedBuffer.output((n, groups), f16, POISON)
    z_out = GuardedBuffer.output((n, groups), u8, POISON)
    return (lambda: raw.import_awq(region.ptr, qzeros.ptr, scales.ptr, ck.DType.FP16, n, k, group,
                                   region.ptr, s_out.ptr, z_out.ptr),
            region, {"qzeros": (qzeros, qzeros_host), "scales": (scales, s_ckpt),
                     "scales_out": (s_out, None), "zeros_out": (z_out, None)},
            ("qweight", "w_packed"))


IN_PLACE = ("ck_quantize_int8", "ck_dequantize_int8", "ck_quantize_int4", "ck_dequantize_int4",
            "ck_permute_columns", "ck_gemm_int8", "ck_gemm_int4", "ck_linear", "ck_gemm_w4a16",
            "ck_gemm_w4a16_prepacked", "ck_w4a16_prepack", "ck_import_awq")


@pytest.mark.parametrize("m", [5, 40])
@pytest.mark.parametrize("name", [pytest.param(name, marks=[pytest.mark.cublas] if
                                               name == "ck_linear" else [], id=name)
                                  for name in IN_PLACE])
def test_output_in_the_memory_of_an_input(name, m, seed):
    """The header forbids this overlap or says nothing about it: the call is rejected
    (CK_STATUS_INVALID_VALUE, naming both arguments, writing nothing), or it runs and writes
    nothing outside its buffers and nothing into its other inputs (its values are unspecified).
    Prints which."""
    rng = np.random.default_rng(seed)
    launch, region, others, shared = in_place_case(name, rng, m)
    synchronize()
    ctx = f"{name} with {shared[1]} == {shared[0]}, m={m}, seed={seed}"
    try:
        launch()
    except ck.CKError as e:
        assert e.status == ck.Status.INVALID_VALUE, f"{ctx}: {e}"
        assert all(re.search(r"\b%s\b" % arg, e.message) for arg in shared), f"{ctx}: {e.message}"
        synchronize()
        assert_bitwise_equal(region.buffer.read(ctx), region.host, f"{ctx}: a rejected call wrote")
        print(f"{ctx}: rejected: {e.message}")
        return
    synchronize()
    region.buffer.read(f"{ctx}: the shared region")   # its guards
    for what, (buffer, host) in others.items():
        got = buffer.read(f"{ctx}: {what}")
        if host is not None:
            assert_bitwise_equal(got, np.asarray(host), f"{ctx}: the input {what} was written")
    print(f"{ctx}: accepted (unspecified values, nothing written outside its buffers)")


# ---------------------------------------------------------------------------------------------
# Past 2^31 elements (CK_FUZZ_LARGE=1): 32-bit index arithmetic would wrap
# ---------------------------------------------------------------------------------------------
# The inputs repeat a few random rows (a period coprime to the tile sizes), so that the reference
# of those rows gives every output: out[r, c] = base[r % P, c % Q].
large = pytest.mark.skipif(not FUZZ_LARGE or SANITIZE,
                           reason="CK_FUZZ_LARGE=1 (make fuzz) runs the tensors past 2^31 "
                                  "elements; never under compute-sanitizer")
PAST_2_31 = 2**31 + 2**20


def allocated_or_skip(make):
    """make() (device buffers of many GB); skips where the GPU has not the memory."""
    try:
        return make()
    except ck.CUDAError as e:
        pytest.skip(f"not enough device memory: {e}")


def assert_periodic(got, base, what):
    """got [R, C] equals base [P, Q] repeated: got[r, c] == base[r % P, c % Q] (R, C multiples
    of P, Q), bit for bit."""
    (rows, cols), (p, q) = got.shape, base.shape
    bits = UINT_OF_SIZE[got.dtype.itemsize]
    view = got.view(bits).reshape(rows // p, p, cols // q, q)
    equal = view == base.view(bits)[None, :, None, :]
    if equal.all():
        return
    i, pi, j, qj = (int(v) for v in np.argwhere(~equal)[0])
    r, c = i * p + pi, j * q + qj
    raise AssertionError(f"{what}: {int((~equal).sum())} elements differ; first at "
                         f"[{r}, {c}] (element {r * cols + c}): got {got[r, c]!r}, "
                         f"expected {base[pi, qj]!r}")


@large
def test_quantize_int8_past_2_31_elements(seed):
    rng = np.random.default_rng(seed)
    period, cols = 7, 65539                      # odd rows: no row starts 16-byte aligned
    rows = period * -(-PAST_2_31 // (period * cols))
    base = ref.random_input(rng, (period, cols), "fp16")
    want_q, want_scales = ref.quantize_int8(base, "fp16", "row")
    x, q, scales = allocated_or_skip(lambda: (
        GuardedBuffer.input(np.tile(base, (rows // period, 1))),
        GuardedBuffer.output((rows, cols), np.int8, POISON_CODES),
        GuardedBuffer.output((rows,), np.float32, POISON_QUANTIZED)))
    ck.raw.quantize_int8(x.ptr, ck.DType.FP16, rows, cols, ck.PER_ROW, ck.DYNAMIC, scales.ptr,
                         q.ptr, 0)
    synchronize()
    ctx = f"{rows} x {cols} = {rows * cols} elements, seed={seed}"
    assert_periodic(q.read(f"q, {ctx}"), want_q, f"q, {ctx}")
    assert_periodic(scales.read(f"scales, {ctx}")[:, None], want_scales[:, None],
                    f"scales, {ctx}")


@large
def test_dequantize_int4_past_2_31_elements(seed):
    rng = np.random.default_rng(seed)
    period, cols, group = 5, 65537, 128          # odd cols: a half-used last byte per row
    rows = period * -(-PAST_2_31 // (period * cols))
    packed, scales_host, zeros_host = random_int4_inputs(rng, period, cols, group, "asym", "fp16")
    want = ref.dequantize_int4(packed, scales_host, zeros_host, cols, group, "asym", "fp16")
    tile = (rows // period, 1)
    q, s, z, out = allocated_or_skip(lambda: (
        GuardedBuffer.input(np.tile(packed, tile)), GuardedBuffer.input(np.tile(scales_host, tile)),
        GuardedBuffer.input(np.tile(zeros_host, tile)),
        GuardedBuffer.output((rows, cols), np.float16, POISON)))
    ck.raw.dequantize_int4(q.ptr, s.ptr, z.ptr, rows, cols, group, ck.INT4_ASYMMETRIC, out.ptr,
                           ck.DType.FP16, 0)
    synchronize()
    ctx = f"{rows} x {cols} = {rows * cols} elements, seed={seed}"
    assert_periodic(out.read(f"out, {ctx}"), want, f"out, {ctx}")


@large
@pytest.mark.parametrize("variant", ["auto", "reference"])
def test_gemm_int8_past_2_31_outputs(variant, monkeypatch, seed):
    force_variant(monkeypatch, "CK_GEMM_INT8_KERNEL", variant)
    rng = np.random.default_rng(seed)
    a_period, b_period, k = 5, 3, 32
    m, n = 65550, 32784                          # multiples of 5 and of 48; M N > 2^31
    base_a, base_b = random_int8(rng, (a_period, k)), random_int8(rng, (b_period, k))
    want = ref.gemm_int8(base_a, base_b, "nk")
    a, b, c = allocated_or_skip(lambda: (
        GuardedBuffer.input(np.tile(base_a, (m // a_period, 1))),
        GuardedBuffer.input(np.tile(base_b, (n // b_period, 1))),
        GuardedBuffer.output((m, n), np.int32, POISON)))
    ck.raw.gemm_int8(a.ptr, b.ptr, ck.LAYOUT_NK, m, n, k, c.ptr, 0)
    synchronize()
    ctx = f"{variant}, {m} x {n} = {m * n} outputs, seed={seed}"
    assert_periodic(c.read(f"c, {ctx}"), want, f"c, {ctx}")


# ---------------------------------------------------------------------------------------------
# The ABI fuzzer where no device is visible
# ---------------------------------------------------------------------------------------------
@pytest.mark.cuda_api_error
def test_abi_fuzz_where_no_device_is_visible():
    """test_fuzz_abi.py makes valid calls on fake addresses, which would launch here: it skips in
    this process and runs in a child that sees no device (CUDA_VISIBLE_DEVICES=""), with this
    process's CK_FUZZ_PROFILE, whole (without this process's CK_TEST_SHARD)."""
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="")
    env.pop("CK_TEST_SHARD", None)   # this process's shard holds this test: the child runs all
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", os.path.join(REPO_ROOT, "tests", "test_fuzz_abi.py"),
         "-q", "-rs", "-p", "no:cacheprovider"],
        cwd=REPO_ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        timeout=3600)
    summary = proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else ""
    if "needs Hypothesis" in proc.stdout and proc.returncode == 0:
        pytest.skip("the ABI fuzzer needs Hypothesis (requirements.txt)")
    assert proc.returncode == 0, proc.stdout[-8000:]
    passed = re.search(r"(\d+) passed", summary)
    assert passed and int(passed.group(1)) >= 100 and "skipped" not in summary, \
        f"the child ran too little: {summary!r}"
    print(summary)
