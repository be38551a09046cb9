"""GPU tests of the fused Q/K/V projection (ck_qkv_prepack, ck_qkv_projection) against
tests/reference.py.

- Weights: the reference quantizers' output (ref.quantize_int4, ref.quantize_block4) of random
  float weights W [(Hq + 2 Hkv) D, H] ~ N(0, 1/H), in each of the four formats (INT4 symmetric
  and asymmetric, several groups; NF4, MXFP4, NVFP4).
- The prepack runs on the device into poisoned, guarded buffers; its outputs must be bitwise
  the format's reference prepack (ref.w4a16_prepack, ref.block4_prepack) of W's rows in the
  order ref.qkv_prepack_rows gives (the rotate-half pairs side by side; the identity otherwise).
- q, k, v are compared with the float64 reference ref.qkv_projection_f64 on the dequantized
  weight (x W'^T + bias, split by head, rotated with the float32 table taken as exact) under
  the tolerance gpu_support.qkv_tolerances derives: float32 accumulation (tensor cores that may
  truncate: twice float32's unit roundoff), the rotation's two products and difference, and
  the rounding to dtype. ||err|| / ||ref|| is printed.
- Shapes: tokens on both sides of 16 (the weight-streaming kernel; above it the Hopper kernel
  in every format, in 64-row blocks up to 64 and 128-row blocks past it), MHA, GQA and MQA
  heads, head dims 32 ... 128, a rotary dim below the head dim; RoPE none, rotate-half and
  interleaved; fp16 and bf16; with and without bias.
- Positions outside the table read its nearest row (clamped); the outputs' guards stay intact
  and nothing is written past q, k, v; the call captures into a CUDA graph and replays.
- The Python layer (cuda_wrapper.QkvProjection.from_float) in every format: NumPy in, NumPy out,
  against the reference quantizer's weight (the library's quantizers give the same codes), and
  the same bits from DeviceArrays in (DeviceArrays out).

The tests skip without a CUDA device. CK_SANITIZE=1 keeps the smaller shapes. Each test draws a
seed, prints it and names it in its messages; CK_TEST_SEED=<seed> replays it.
"""

import math

import numpy as np
import pytest

import cuda_wrapper as ck
import reference as ref
from gpu_support import (
    CK_DTYPE, GROUP_IDS, GuardedBuffer, KernelCall, POISON, SANITIZE, U32, assert_bitwise_equal,
    assert_graph_replays, assert_within, qkv_tolerances, random_normal, synchronize,
)

pytestmark = pytest.mark.gpu

TENSOR_CORE_ROUNDOFF = 2 * U32
ROPE = {None: ck.ROPE_NONE, "neox": ck.ROPE_NEOX, "interleaved": ck.ROPE_INTERLEAVED}
WEIGHT4 = {"int4": ck.WEIGHT4_INT4, "nf4": ck.WEIGHT4_NF4, "mxfp4": ck.WEIGHT4_MXFP4,
           "nvfp4": ck.WEIGHT4_NVFP4}
# (format, mode or None, group / block size)
FORMATS = [("int4", "sym", 128), ("int4", "asym", 64), ("int4", "sym", ref.GROUP_ROW),
           ("nf4", None, 64), ("mxfp4", None, 32), ("nvfp4", None, 16)]
# (tokens, hidden, Hq, Hkv, D, rotary_dim)
SHAPES = [(1, 256, 4, 2, 64, 64), (5, 512, 8, 2, 128, 128), (16, 128, 4, 1, 32, 16),
          (17, 256, 4, 4, 64, 48), (80, 256, 8, 2, 64, 64), (130, 128, 2, 1, 128, 128)]
if SANITIZE:
    SHAPES = [s for s in SHAPES if s[0] * s[1] <= 16 * 512]
MAX_POSITION = 2048


def fmt_id(case):
    fmt, mode, group = case
    return f"{fmt}-{mode}-{GROUP_IDS[group]}" if mode else f"{fmt}-b{group}"


class QkvCall(KernelCall):
    """One layer: its native weight quantized by the reference, prepacked on the device by
    ck_qkv_prepack into poisoned guarded buffers, and one ck_qkv_projection call's buffers."""

    def __init__(self, rng, shape, case, style, dtype, bias=True, positions=None):
        tokens, hidden, hq, hkv, d, rotary = shape
        self.fmt, self.mode, self.group = case
        self.shape, self.style, self.dtype = shape, style, dtype
        n = ref.qkv_output_columns(hq, hkv, d)
        w = ref.random_input(rng, (n, hidden), dtype, scale=1.0 / math.sqrt(hidden))
        if self.fmt == "int4":
            packed, scales, zeros = ref.quantize_int4(w, dtype, self.group, self.mode)
            self.native, self.global_scale = (packed, scales, zeros), None
        else:
            packed, scales, g = ref.quantize_block4(self.fmt, w, dtype, self.group)
            self.native, self.global_scale = (packed, scales, None), g
        self.x = random_normal(rng, (tokens, hidden), dtype)
        self.bias = random_normal(rng, n, dtype) if bias else None
        if positions is None:
            positions = rng.integers(0, MAX_POSITION, size=tokens)
        self.positions = np.asarray(positions, np.int32)
        self.cos_sin = ref.rope_cos_sin_cache(MAX_POSITION, rotary, base=500000.0)
        self.params = ck.QkvParams(
            tokens=tokens, hidden=hidden, num_heads_q=hq, num_heads_kv=hkv, head_dim=d,
            dtype=CK_DTYPE[dtype], format=WEIGHT4[self.fmt], group_size=self.group,
            mode=ck.INT4_ASYMMETRIC if self.mode == "asym" else ck.INT4_SYMMETRIC,
            rope_style=ROPE[style], rotary_dim=rotary if style else 0,
            max_position=MAX_POSITION if style else 0)
        self.buffers = {}
        self.device_inputs()
        self.prepack()
        np_dtype = ref.NUMPY_DTYPE[dtype]
        self.outputs = {"q": GuardedBuffer.output((tokens, hq, d), np_dtype, POISON),
                        "k": GuardedBuffer.output((tokens, hkv, d), np_dtype, POISON),
                        "v": GuardedBuffer.output((tokens, hkv, d), np_dtype, POISON)}
        p = self.params
        p.x = self.buffers["x"].ptr
        p.bias = self.ptr("bias")
        p.global_scale = self.ptr("global_scale")
        if style:
            p.positions, p.cos_sin = self.ptr("positions"), self.ptr("cos_sin")
        p.q, p.k, p.v = (self.outputs[name].ptr for name in "qkv")

    def ptr(self, name):
        buffer = self.buffers.get(name)
        return 0 if buffer is None else buffer.ptr

    def device_inputs(self):
        packed, scales, zeros = self.native
        hosts = {"packed": packed, "scales": scales, "zeros": zeros, "x": self.x,
                 "bias": self.bias, "global_scale": self.global_scale,
                 "positions": self.positions, "cos_sin": self.cos_sin}
        for name, host in hosts.items():
            if host is not None:
                self.buffers[name] = GuardedBuffer.input(host)

    def reference_prepack(self):
        """The format's reference prepack of W's rows in ck_qkv_prepack's order."""
        tokens, hidden, hq, hkv, d, rotary = self.shape
        rows = ref.qkv_prepack_rows(hq, hkv, d, rotary, self.style)
        packed, scales, zeros = self.native
        n = packed.shape[0]
        if self.fmt == "int4":
            w, s, z = ref.w4a16_prepack(packed[rows], scales[rows],
                                        None if zeros is None else zeros[rows], n, hidden,
                                        self.group)
            return w, s.view(np.uint8), z
        w, s = ref.block4_prepack(self.fmt, packed[rows], scales[rows], n, hidden, self.group)
        return w, s, None

    def prepack(self):
        want = self.reference_prepack()
        self.want_prepack = want
        self.prepacked = [None if a is None else GuardedBuffer.output(a.shape, a.dtype, POISON)
                          for a in want]
        w_pre, s_pre, z_pre = self.prepacked
        ck.raw.qkv_prepack(self.params, self.buffers["packed"].ptr, self.buffers["scales"].ptr,
                           self.ptr("zeros"), w_pre.ptr, s_pre.ptr,
                           0 if z_pre is None else z_pre.ptr, 0)
        self.params.w_prepacked, self.params.scales_prepacked = w_pre.ptr, s_pre.ptr
        self.params.zeros_prepacked = 0 if z_pre is None else z_pre.ptr

    def check_prepack(self, ctx):
        synchronize()
        for name, got, want in zip(("w_prepacked", "scales_prepacked", "zeros_prepacked"),
                                   self.prepacked, self.want_prepack):
            if want is not None:
                assert_bitwise_equal(got.read(f"{name}, {ctx}"), want, f"{name}, {ctx}")

    def launch(self, stream=0):
        ck.raw.qkv_projection(self.params, stream)

    def refill(self, rng):
        """Fresh x, bias and positions in the same device buffers (the weight stays)."""
        tokens = self.shape[0]
        self.x = random_normal(rng, self.x.shape, self.dtype)
        self.buffers["x"].write(self.x)
        if self.bias is not None:
            self.bias = random_normal(rng, self.bias.shape, self.dtype)
            self.buffers["bias"].write(self.bias)
        self.positions = rng.integers(0, MAX_POSITION, size=tokens).astype(np.int32)
        self.buffers["positions"].write(self.positions)

    def weight(self):
        """W' [N, H], the dequantized weight in dtype's representation (checkpoint row order)."""
        packed, scales, zeros = self.native
        hidden = self.shape[1]
        if self.fmt == "int4":
            return ref.dequantized_int4_weight(packed, scales, zeros, self.group, hidden,
                                               self.dtype)
        return ref.dequantized_block4_weight(self.fmt, packed, scales, self.global_scale,
                                             hidden, self.group, self.dtype)

    def check(self, ctx, positions=None):
        """q, k, v against the float64 reference (positions: the ones the reference rotates
        by; default the call's own)."""
        synchronize()
        _, _, hq, hkv, _, _ = self.shape
        pos = self.positions if positions is None else positions
        exact, tols = qkv_tolerances(self.x, self.weight(), self.bias, hq, hkv,
                                     pos if self.style else None,
                                     self.cos_sin if self.style else None, self.style or "neox",
                                     self.dtype, TENSOR_CORE_ROUNDOFF)
        for name, want, tol in zip("qkv", exact, tols):
            got = ref.to_f32(self.outputs[name].read(f"{name}, {ctx}"), self.dtype).astype(np.float64)
            assert_within(got, want, tol, f"{name}, {ctx}")
            norm = np.linalg.norm(want)
            print(f"{name}: ||err|| / ||ref|| = {np.linalg.norm(got - want) / max(norm, 1e-300):.3g}")


@pytest.mark.parametrize("style", [None, "neox", "interleaved"], ids=["no-rope", "neox", "gptj"])
@pytest.mark.parametrize("dtype", ref.W4A16_DTYPES)
@pytest.mark.parametrize("case", FORMATS, ids=fmt_id)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "T%d-H%d-%dx%dx%d-R%d" % s)
def test_projection_meets_the_reference(shape, case, dtype, style, seed):
    rng = np.random.default_rng(seed)
    call = QkvCall(rng, shape, case, style, dtype, bias=bool(seed % 2))
    ctx = f"{shape} {fmt_id(case)} {dtype} rope={style}, seed={seed}"
    call.check_prepack(ctx)
    call.launch()
    call.check(ctx)


@pytest.mark.parametrize("case", [FORMATS[0], FORMATS[3]], ids=fmt_id)
@pytest.mark.parametrize("tokens", [3, 40])
def test_positions_outside_the_table_read_its_nearest_row(tokens, case, seed):
    rng = np.random.default_rng(seed)
    positions = rng.integers(-5000, 5000, size=tokens).astype(np.int32)
    positions[0], positions[-1] = -1, MAX_POSITION   # one just past each end
    call = QkvCall(rng, (tokens, 256, 4, 2, 64, 64), case, "neox", "fp16", positions=positions)
    call.launch()
    call.check(f"clamped positions, seed={seed}", np.clip(positions, 0, MAX_POSITION - 1))


def test_graph_capture_replays_the_projection(seed):
    rng = np.random.default_rng(seed)
    call = QkvCall(rng, (4, 256, 4, 2, 64, 64), FORMATS[0], "neox", "bf16")
    assert_graph_replays(call, rng, seed)


@pytest.mark.parametrize("style", [None, "neox"], ids=["no-rope", "neox"])
@pytest.mark.parametrize("fmt", ["int4", "nf4", "mxfp4", "nvfp4"])
def test_python_layer_from_float(fmt, style, seed):
    rng = np.random.default_rng(seed)
    tokens, hidden, hq, hkv, d = 6, 256, 4, 2, 64
    n = ref.qkv_output_columns(hq, hkv, d)
    w = ref.random_input(rng, (n, hidden), "fp16", scale=1.0 / math.sqrt(hidden))
    x = random_normal(rng, (tokens, hidden), "fp16")
    bias = random_normal(rng, n, "fp16")
    positions = rng.integers(0, MAX_POSITION, size=tokens).astype(np.int32)
    cos_sin = ref.rope_cos_sin_cache(MAX_POSITION, d, base=10000.0)
    layer = ck.QkvProjection.from_float(w, hq, hkv, format=fmt, bias=bias, rope=style,
                                        cos_sin=cos_sin if style else None)
    got = layer(x, positions if style else None)
    assert all(isinstance(a, np.ndarray) for a in got), [type(a) for a in got]
    group = {"int4": 128, "nf4": 64, "mxfp4": 32, "nvfp4": 16}[fmt]
    if fmt == "int4":
        packed, scales, zeros = ref.quantize_int4(w, "fp16", group, "sym")
        w_deq = ref.dequantized_int4_weight(packed, scales, zeros, group, hidden, "fp16")
    else:
        packed, scales, g = ref.quantize_block4(fmt, w, "fp16", group)
        w_deq = ref.dequantized_block4_weight(fmt, packed, scales, g, hidden, group, "fp16")
    exact, tols = qkv_tolerances(x, w_deq, bias, hq, hkv, positions if style else None,
                                 cos_sin if style else None, style or "neox", "fp16",
                                 TENSOR_CORE_ROUNDOFF)
    ctx = f"QkvProjection {fmt} rope={style}, seed={seed}"
    for name, a, want, tol in zip("qkv", got, exact, tols):
        assert a.shape == want.shape, (name, a.shape, want.shape)
        assert_within(ref.to_f32(a, "fp16").astype(np.float64), want, tol, f"{name}, {ctx}")
    # Device arrays in: device arrays out, the same bits.
    dev = layer(ck.DeviceArray.from_numpy(x),
                ck.DeviceArray.from_numpy(positions) if style else None)
    for name, a, b in zip("qkv", dev, got):
        assert isinstance(a, ck.DeviceArray), (name, type(a))
        assert_bitwise_equal(a.to_numpy(), b, f"{name} from DeviceArrays, {ctx}")
