"""The wrapper with PyTorch and CuPy on a GPU: results in the caller's kind, the caller's stream,
no cudaMalloc, cudaFree or synchronization on a device call's path, CUDA graph capture and
torch.compile.

- torch in -> torch out: every family of functions, and QuantizedLinear, on torch CUDA tensors
  returns torch tensors on the input's device, with the dtype and shape of the NumPy path's
  result and its bits (bf16 as torch.bfloat16, in and out).
- Streams: a call runs on torch's current stream (ordered after the work already there), or on
  stream= (made current for the call's allocations).
- Memory: after a warm-up, calls on torch tensors allocate only through torch's caching
  allocator (its segment count, the cudaMallocs, stays put) and never touch the DeviceArray
  pool; calls on DeviceArrays reuse the pool's blocks. A call leaves a long kernel that is still
  running unfinished (it waited for nothing).
- CuPy in -> CuPy out, on CuPy's current stream.
- torch.cuda.graph captures QuantizedLinear; torch.compile traces it (and moe_forward) into the
  custom operators; the Inductor + CUDA graphs run is marked slow.

Skipped without a GPU (conftest.py), without torch / CuPy (each test says which), and under
compute-sanitizer (make sanitize: the frameworks' own kernels are not the library's to check).
"""
import numpy as np
import pytest

import checkpoint_formats as cf
import cuda_wrapper as ck
from gpu_support import SANITIZE, assert_bitwise_equal, dtype_arg, random_normal

pytestmark = pytest.mark.gpu

if SANITIZE:
    pytest.skip("the frameworks' kernels are not the library's to sanitize",
                allow_module_level=True)

# A GPU spin long enough to outlast a burst of host calls (~0.5 s at 2 GHz): a call that
# waited for the device would find it finished.
SPIN_CYCLES = 1_000_000_000


@pytest.fixture(scope="module")
def torch():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch sees no CUDA device (a CPU-only build of torch?)")
    return torch


@pytest.fixture(scope="module")
def cupy():
    cupy = pytest.importorskip("cupy")
    try:
        cupy.cuda.runtime.getDeviceCount()
    except Exception as e:  # noqa: BLE001 - CuPy built for another CUDA, no driver, ...
        pytest.skip(f"CuPy cannot use the GPU: {e}")
    return cupy


def to_torch(torch, a, dtype=None):
    """A CUDA tensor of the NumPy array a; dtype "bf16": uint16 bits as torch.bfloat16."""
    if dtype == "bf16":
        return torch.from_numpy(np.ascontiguousarray(a).view(np.int16)).cuda().view(
            torch.bfloat16)
    return torch.from_numpy(np.ascontiguousarray(a)).cuda()


def from_torch(torch, t):
    """The NumPy copy of a tensor (bfloat16 as uint16 bits)."""
    t = t.detach().cpu()
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view(np.uint16)
    return t.numpy()


def assert_torch_result(torch, got, want, what, bf16=False):
    """got: a CUDA tensor on the current device with want's shape, dtype and bits."""
    assert isinstance(got, torch.Tensor), f"{what}: {type(got).__name__}, not a tensor"
    assert got.is_cuda and got.device.index == torch.cuda.current_device(), what
    want = np.asarray(want)
    if bf16:
        assert got.dtype == torch.bfloat16, f"{what}: {got.dtype}"
    assert tuple(got.shape) == want.shape, f"{what}: shape {tuple(got.shape)} != {want.shape}"
    assert_bitwise_equal(from_torch(torch, got), want, what)


def pool_allocations():
    """The DeviceArray pool's allocation counters (frees of arrays collected meanwhile may move
    the others)."""
    stats = ck.cuda.memory_stats()
    return stats["mallocs"], stats["reuses"]


def spy_streams(monkeypatch, name):
    """The stream argument of every launch of ck_<name> from here on (the raw level's, through
    ck._entries, and the fast paths', through ck._fast_entries)."""
    seen = []
    for entries in (ck._entries, ck._fast_entries):
        def launch(*args, _original=getattr(entries, "ck_" + name)):
            seen.append(args[-1])
            return _original(*args)

        monkeypatch.setattr(entries, "ck_" + name, launch)
    return seen


# ------------------------------------------------------------------------------------------------
# torch in -> torch out, bit for bit the NumPy path
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", ["fp32", "fp16", "bf16"])
def test_torch_quantizers(torch, dtype):
    rng = np.random.default_rng(11)
    x = random_normal(rng, (8, 256), dtype, 3.0)
    bf16 = dtype == "bf16"
    xt = to_torch(torch, x, dtype)
    q, s = ck.quantize_int8(x, granularity="row", dtype=dtype_arg(dtype))
    qt, st = ck.quantize_int8(xt, granularity="row")
    assert_torch_result(torch, qt, q, "q")
    assert_torch_result(torch, st, s, "scales")
    back = ck.dequantize_int8(q, s, out_dtype=dtype)
    assert_torch_result(torch, ck.dequantize_int8(qt, st, out_dtype=dtype), back, "dequantize",
                        bf16)
    p, s4, z = ck.quantize_int4(x, group_size=64, symmetric=False, dtype=dtype_arg(dtype))
    pt, s4t, zt = ck.quantize_int4(xt, group_size=64, symmetric=False)
    for got, want, what in ((pt, p, "packed"), (s4t, s4, "int4 scales"), (zt, z, "zeros")):
        assert_torch_result(torch, got, want, what, bf16 and what == "int4 scales")
    w = ck.dequantize_int4(p, s4, z, cols=256, group_size=64,
                           out_dtype="bf16" if bf16 else None)
    assert_torch_result(torch, ck.dequantize_int4(pt, s4t, zt, cols=256, group_size=64), w,
                        "dequantize_int4", bf16)
    # A Python float as the static scale is written on the device, and returned as a tensor.
    q2, s2 = ck.quantize_int8(xt, scales=0.125)
    assert_torch_result(torch, s2, np.array([0.125], np.float32), "static scale")
    assert_torch_result(torch, q2, ck.quantize_int8(x, scales=0.125, dtype=dtype_arg(dtype))[0],
                        "static q")


def test_torch_gemms(torch):
    rng = np.random.default_rng(12)
    a = rng.integers(-127, 128, (8, 256), dtype=np.int8)
    b = rng.integers(-127, 128, (64, 256), dtype=np.int8)
    scale_a = rng.uniform(0.001, 0.01, 8).astype(np.float32)
    bias = random_normal(rng, (64,), "bf16")
    at, bt, sat, biast = (to_torch(torch, a), to_torch(torch, b), to_torch(torch, scale_a),
                          to_torch(torch, bias, "bf16"))
    assert_torch_result(torch, ck.gemm_int8(at, bt), ck.gemm_int8(a, b), "gemm_int8")
    want = ck.gemm_int8_scaled(a, b, scale_a, 0.02, bias=bias, activation="relu",
                               out_dtype="bf16")
    got = ck.gemm_int8_scaled(at, bt, sat, 0.02, bias=biast, activation="relu",
                              out_dtype="bf16")
    assert_torch_result(torch, got, want, "gemm_int8_scaled", bf16=True)
    assert_torch_result(torch, ck.int8_matmul(at, bt.T.contiguous(), 0.01, 0.02, scale_c=0.5),
                        ck.int8_matmul(a, np.ascontiguousarray(b.T), 0.01, 0.02, scale_c=0.5),
                        "int8_matmul requantized")
    x = random_normal(rng, (8, 256), "fp16")
    w = random_normal(rng, (64, 256), "fp16", 0.1)
    assert_torch_result(torch, ck.linear(to_torch(torch, x), to_torch(torch, w)),
                        ck.linear(x, w), "linear")
    perm = rng.permutation(256).astype(np.int32)
    assert_torch_result(torch, ck.permute_columns(to_torch(torch, x), to_torch(torch, perm)),
                        ck.permute_columns(x, perm), "permute_columns")


@pytest.mark.parametrize("dtype", ["fp32", "fp16", "bf16"])
def test_torch_common_calls_take_the_fast_path(torch, dtype, monkeypatch):
    """quantize_int8 and gemm_int8_scaled on torch tensors alone (no Python scalar, out= or
    stream=) run without a _Call and give the NumPy path's bits."""
    rng = np.random.default_rng(19)
    bf16 = dtype == "bf16"
    x = random_normal(rng, (4, 256), dtype, 3.0)
    a = rng.integers(-127, 128, (4, 256), dtype=np.int8)
    b = rng.integers(-127, 128, (64, 256), dtype=np.int8)
    scale_a = rng.uniform(0.001, 0.01, 4).astype(np.float32)
    scale_b = rng.uniform(0.001, 0.01, 64).astype(np.float32)
    bias = random_normal(rng, (64,), dtype)
    want_q = ck.quantize_int8(x, granularity="row", dtype=dtype_arg(dtype))
    want_t = ck.quantize_int8(x, dtype=dtype_arg(dtype))
    want_y = ck.gemm_int8_scaled(a, b, scale_a, scale_b, bias=bias, activation="relu",
                                 out_dtype=dtype)
    want_1d = ck.gemm_int8_scaled(a[0], b, scale_a[:1], scale_b, out_dtype=dtype)
    want_static = ck.quantize_int8(x, scales=scale_a[:1], dtype=dtype_arg(dtype))[0]
    xt, at, bt = to_torch(torch, x, dtype), to_torch(torch, a), to_torch(torch, b)
    sat, sbt, biast = (to_torch(torch, scale_a), to_torch(torch, scale_b),
                       to_torch(torch, bias, dtype))

    class NoCall:
        def __init__(self, *args):
            raise AssertionError("the common call must not build a _Call")

    monkeypatch.setattr(ck, "_Call", NoCall)
    for got, want, what in zip(ck.quantize_int8(xt, granularity="row"), want_q,
                               ("q per row", "scales per row")):
        assert_torch_result(torch, got, want, what)
    for got, want, what in zip(ck.quantize_int8(xt), want_t, ("q", "scale")):
        assert_torch_result(torch, got, want, what)
    # One scale is torch.empty_like of a kept tensor: every call still gets a tensor of its own.
    scales = [ck.quantize_int8(xt)[1] for _ in range(3)]
    assert len({s.data_ptr() for s in scales}) == 3
    for s in scales:
        assert_torch_result(torch, s, want_t[1], "scale of a repeated call")
    q_static, s_static = ck.quantize_int8(xt, scales=sat[:1])
    assert s_static.data_ptr() == sat.data_ptr()
    assert_torch_result(torch, q_static, want_static, "static q")
    got = ck.gemm_int8_scaled(at, bt, sat, sbt, bias=biast, activation="relu", out_dtype=dtype)
    assert_torch_result(torch, got, want_y, "gemm_int8_scaled", bf16)
    got = ck.gemm_int8_scaled(at[0], bt, sat[:1], sbt, out_dtype=dtype)
    assert_torch_result(torch, got, want_1d, "gemm_int8_scaled, 1-D a", bf16)


@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
def test_torch_w4a16(torch, dtype):
    rng = np.random.default_rng(13)
    bf16 = dtype == "bf16"
    x = random_normal(rng, (5, 256), dtype)
    w = random_normal(rng, (96, 256), dtype, 0.1)
    packed, scales, zeros = ck.quantize_int4(w, group_size=128, symmetric=False,
                                             dtype=dtype_arg(dtype))
    xt, pt, st, zt = (to_torch(torch, x, dtype), to_torch(torch, packed),
                      to_torch(torch, scales, dtype), to_torch(torch, zeros))
    want = ck.gemm_w4a16(x, packed, scales, zeros, group_size=128, dtype=dtype_arg(dtype))
    assert_torch_result(torch, ck.gemm_w4a16(xt, pt, st, zt, group_size=128), want, "w4a16",
                        bf16)
    prepacked = ck.w4a16_prepack(packed, scales, zeros, group_size=128, dtype=dtype_arg(dtype))
    prepacked_t = ck.w4a16_prepack(pt, st, zt, group_size=128)
    for got, want_part, what in zip(prepacked_t, prepacked, ("w", "scales", "zeros")):
        assert_torch_result(torch, got, want_part, "prepacked " + what, bf16 and what == "scales")
    assert_torch_result(torch, ck.gemm_w4a16_prepacked(xt, *prepacked_t, n=96, group_size=128),
                        want, "w4a16 prepacked", bf16)


def test_torch_moe(torch):
    rng = np.random.default_rng(14)
    experts, hidden, inter, tokens, group = 4, 64, 32, 5, 32
    prepacked, prepacked_t = [], []
    for shape, gate_up in (((experts, 2 * inter, hidden), True),
                           ((experts, hidden, inter), False)):
        w = random_normal(rng, (shape[0] * shape[1], shape[2]), "fp16", 0.1)
        p, s, _ = ck.quantize_int4(w, group_size=group)
        p, s = p.reshape(shape[0], shape[1], -1), s.reshape(shape[0], shape[1], -1)
        prepacked.append(ck.moe_prepack(p, s, None, group_size=group, gate_up=gate_up))
        prepacked_t.append(ck.moe_prepack(to_torch(torch, p), to_torch(torch, s), None,
                                          group_size=group, gate_up=gate_up))
        for got, want, what in zip(prepacked_t[-1][:2], prepacked[-1][:2], ("w", "scales")):
            assert_torch_result(torch, got, want, "moe_prepack " + what)
    x = random_normal(rng, (tokens, hidden), "fp16")
    logits = rng.standard_normal((tokens, experts)).astype(np.float32)
    xt, lt = to_torch(torch, x), to_torch(torch, logits)
    ids, weights = ck.moe_route(logits, 2)
    ids_t, weights_t = ck.moe_route(lt, 2)
    assert_torch_result(torch, ids_t, ids, "moe_route ids")
    assert_torch_result(torch, weights_t, weights, "moe_route weights")
    want = ck.moe_forward(x, *prepacked, experts, inter, group_size=group, router_logits=logits,
                          top_k=2)
    got = ck.moe_forward(xt, *prepacked_t, experts, inter, group_size=group, router_logits=lt,
                         top_k=2)
    assert_torch_result(torch, got, want, "moe_forward")


@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
def test_torch_quantized_linear(torch, dtype, monkeypatch):
    """A layer built from torch tensors holds torch tensors and gives the NumPy layer's bits,
    for 2-D and 1-D inputs, through the fast path (no _Call at all), and so does a layer built
    from NumPy when called on torch tensors."""
    rng = np.random.default_rng(15)
    bf16 = dtype == "bf16"
    w = random_normal(rng, (128, 256), dtype, 0.1)
    bias = random_normal(rng, (128,), dtype)
    x = random_normal(rng, (3, 256), dtype)
    layer = ck.QuantizedLinear.from_float(w, bias=bias, group_size=128, symmetric=False,
                                          dtype=dtype_arg(dtype), activation="relu")
    layer_t = ck.QuantizedLinear.from_float(to_torch(torch, w, dtype),
                                            bias=to_torch(torch, bias, dtype), group_size=128,
                                            symmetric=False, activation="relu")
    assert all(isinstance(a, torch.Tensor) for a in layer_t.prepacked[:2] + (layer_t.bias,))
    want = layer(x)
    xt = to_torch(torch, x, dtype)

    class NoCall:
        def __init__(self, *args):
            raise AssertionError("the common call must not build a _Call")

    with monkeypatch.context() as m:
        m.setattr(ck, "_Call", NoCall)
        assert_torch_result(torch, layer_t(xt), want, "torch layer", bf16)
        assert_torch_result(torch, layer_t(xt[1]), want[1], "torch layer, 1-D", bf16)
        assert_torch_result(torch, layer(xt), want, "NumPy-built layer on torch", bf16)
    out = torch.empty(3, 128, dtype=xt.dtype, device="cuda")
    assert layer_t(xt, out=out) is out
    assert_torch_result(torch, out, want, "out=", bf16)
    cpu = layer_t(xt.cpu())      # a CPU tensor: the host path, a CPU tensor back
    assert cpu.device.type == "cpu" and cpu.dtype == xt.dtype
    assert_bitwise_equal(from_torch(torch, cpu), want, "CPU tensor in, CPU tensor out")
    with pytest.raises(TypeError):
        layer_t(xt.float())
    with pytest.raises(ValueError):
        layer_t(torch.zeros(3, 512, dtype=xt.dtype, device="cuda").T)


def test_torch_quantized_linear_follows_replaced_attributes(torch):
    """The fast path reads the layer's launch arguments once, and again when an attribute they
    come from is replaced: a new activation or bias is the next call's."""
    rng = np.random.default_rng(24)
    w = to_torch(torch, random_normal(rng, (128, 256), "fp16", 0.1))
    bias = to_torch(torch, random_normal(rng, (128,), "fp16"))
    x = to_torch(torch, random_normal(rng, (3, 256), "fp16"))
    layer = ck.QuantizedLinear.from_float(w, group_size=128)
    plain = from_torch(torch, layer(x))
    layer.activation = ck.ACTIVATION_RELU
    want = ck.QuantizedLinear.from_float(w, group_size=128, activation="relu")(x)
    assert_torch_result(torch, layer(x), from_torch(torch, want), "activation replaced")
    layer.bias = bias
    want = ck.QuantizedLinear.from_float(w, bias=bias, group_size=128, activation="relu")(x)
    assert_torch_result(torch, layer(x), from_torch(torch, want), "bias replaced")
    layer.activation, layer.bias = ck.ACTIVATION_NONE, None
    assert_torch_result(torch, layer(x), plain, "both back")


def test_torch_quantized_linear_act_order(torch):
    """A GPTQ act-order layer from torch tensors gathers x's columns in the fast path."""
    rng = np.random.default_rng(16)
    qweight, qzeros, scales, g_idx = cf.random_gptq_checkpoint(rng, 256, 64, 64, "fp16",
                                                               g_idx="act_order")
    layer = ck.QuantizedLinear.from_gptq(qweight, qzeros, scales, g_idx=g_idx, group_size=64)
    layer_t = ck.QuantizedLinear.from_gptq(*(to_torch(torch, a) for a in (qweight, qzeros,
                                                                          scales, g_idx)),
                                           group_size=64)
    assert isinstance(layer_t.perm, torch.Tensor)
    x = random_normal(rng, (4, 256), "fp16")
    assert_torch_result(torch, layer_t(to_torch(torch, x)), layer(x), "act-order layer")


# ------------------------------------------------------------------------------------------------
# Streams
# ------------------------------------------------------------------------------------------------
def test_torch_call_is_ordered_on_the_current_stream(torch, monkeypatch):
    """x is written on a side stream behind a long spin; a call made with that stream current
    must read what was written (it runs after it on that stream)."""
    rng = np.random.default_rng(17)
    x = random_normal(rng, (4, 4096), "fp32", 3.0)
    want_q, want_s = ck.quantize_int8(x, granularity="row")
    source = to_torch(torch, x)
    side = torch.cuda.Stream()
    streams = spy_streams(monkeypatch, "quantize_int8")
    with torch.cuda.stream(side):
        target = torch.zeros_like(source)
        torch.cuda._sleep(SPIN_CYCLES // 4)
        target.copy_(source)
        q, s = ck.quantize_int8(target, granularity="row")
    assert streams == [side.cuda_stream]
    side.synchronize()
    assert_torch_result(torch, q, want_q, "q on the side stream")
    assert_torch_result(torch, s, want_s, "scales on the side stream")


def test_torch_stream_argument(torch, monkeypatch):
    rng = np.random.default_rng(18)
    x = random_normal(rng, (4, 512), "fp16", 3.0)
    want = ck.quantize_int8(x, granularity="row")[0]
    xt = to_torch(torch, x)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())   # xt is written
    streams = spy_streams(monkeypatch, "quantize_int8")
    q, _ = ck.quantize_int8(xt, granularity="row", stream=side.cuda_stream)
    assert streams == [side.cuda_stream]
    assert torch.cuda.current_stream().cuda_stream != side.cuda_stream, "current again after"
    side.synchronize()
    assert_torch_result(torch, q, want, "q on stream=")


def allocation_stream(torch, t):
    """The stream torch's caching allocator gave t's memory for: its segment's (a segment's
    blocks serve allocations for its stream only)."""
    ptr = t.data_ptr()
    for segment in torch.cuda.memory_snapshot():
        if segment["address"] <= ptr < segment["address"] + segment["total_size"]:
            return segment["stream"]
    raise AssertionError("no segment of torch's allocator holds %#x" % ptr)


def test_torch_fast_paths_follow_the_current_stream(torch, monkeypatch):
    """Every fast-path call asks torch for its current stream: a stream made current between
    calls is the next call's, for the launch and for the results' memory, and the default
    stream is again after it; the results are the same bits on either."""
    rng = np.random.default_rng(23)
    layer = ck.QuantizedLinear.from_float(
        to_torch(torch, random_normal(rng, (128, 256), "fp16", 0.1)), group_size=128)
    x = to_torch(torch, random_normal(rng, (2, 256), "fp16"))
    a = to_torch(torch, rng.integers(-127, 128, (2, 256), dtype=np.int8))
    b = to_torch(torch, rng.integers(-127, 128, (64, 256), dtype=np.int8))
    scale_a = to_torch(torch, np.full(2, 0.01, np.float32))
    scale_b = to_torch(torch, np.full(64, 0.02, np.float32))
    calls = {   # entry point -> the call, returning its (first) result
        "quantize_int8": lambda: ck.quantize_int8(x, granularity="row")[0],
        "gemm_int8_scaled": lambda: ck.gemm_int8_scaled(a, b, scale_a, scale_b,
                                                        out_dtype="fp16"),
        "gemm_w4a16_prepacked": lambda: layer(x),
    }
    default = torch.cuda.current_stream()
    side = torch.cuda.Stream()
    side.wait_stream(default)   # the inputs are written
    for name, call in calls.items():
        streams = spy_streams(monkeypatch, name)
        before = call()
        with torch.cuda.stream(side):
            on_side = call()
        after = call()
        assert streams == [default.cuda_stream, side.cuda_stream, default.cuda_stream], name
        assert [allocation_stream(torch, t) for t in (before, on_side, after)] == \
            [default.cuda_stream, side.cuda_stream, default.cuda_stream], name
        side.synchronize()
        assert_torch_result(torch, on_side, from_torch(torch, before), name + " on a side stream")
        assert_torch_result(torch, after, from_torch(torch, before), name + " after it")


# ------------------------------------------------------------------------------------------------
# No cudaMalloc, cudaFree or synchronization on the path of a device call
# ------------------------------------------------------------------------------------------------
def test_torch_calls_allocate_through_torch_only(torch):
    rng = np.random.default_rng(19)
    w = to_torch(torch, random_normal(rng, (512, 1024), "fp16", 0.1))
    layer = ck.QuantizedLinear.from_float(w, group_size=128)
    x = to_torch(torch, random_normal(rng, (1, 1024), "fp16"))
    a = torch.randint(-127, 128, (16, 1024), dtype=torch.int8, device="cuda")
    b = torch.randint(-127, 128, (256, 1024), dtype=torch.int8, device="cuda")
    scale_b = torch.full((256,), 0.01, device="cuda")

    def calls():
        layer(x)
        ck.quantize_int8(x, granularity="row")
        ck.gemm_int8_scaled(a, b, 0.5, scale_b, out_dtype="fp16")

    for _ in range(3):   # warm torch's cache
        calls()
    torch.cuda.synchronize()
    pool_before = pool_allocations()
    torch_before = torch.cuda.memory_stats()
    torch.cuda._sleep(SPIN_CYCLES)
    for _ in range(20):
        calls()
    assert not torch.cuda.current_stream().query(), "a call waited for the device"
    torch_after = torch.cuda.memory_stats()
    torch.cuda.synchronize()
    assert torch_after["segment.all.allocated"] == torch_before["segment.all.allocated"], \
        "cudaMalloc'd a new segment"
    assert torch_after["allocation.all.allocated"] > torch_before["allocation.all.allocated"]
    assert pool_allocations() == pool_before, "the DeviceArray pool is not for torch calls"


def test_device_array_calls_reuse_the_pool(torch):
    """DeviceArrays in, DeviceArrays out: after a warm-up every block comes from the pool, and
    a burst of calls behind a long kernel leaves it running (the torch spin orders the legacy
    stream the calls run on)."""
    rng = np.random.default_rng(20)
    x = ck.DeviceArray.from_numpy(random_normal(rng, (16, 1024), "fp16"))
    a = ck.DeviceArray.from_numpy(rng.integers(-127, 128, (16, 1024), dtype=np.int8))
    b = ck.DeviceArray.from_numpy(rng.integers(-127, 128, (256, 1024), dtype=np.int8))
    sa = ck.DeviceArray.from_numpy(np.full(16, 0.01, np.float32))
    sb = ck.DeviceArray.from_numpy(np.full(256, 0.02, np.float32))

    def calls():   # each round's results live until the next round's are made
        return ck.quantize_int8(x, granularity="row"), ck.gemm_int8_scaled(a, b, sa, sb,
                                                                           out_dtype="fp16")

    held = calls()
    for _ in range(2):
        held = calls()
    before = ck.cuda.memory_stats()
    torch.cuda._sleep(SPIN_CYCLES)       # on the legacy default stream, torch's default
    for _ in range(20):
        held = calls()
    assert not torch.cuda.current_stream().query(), "a call waited for the device"
    del held
    after = ck.cuda.memory_stats()
    ck.cuda.device_synchronize()
    assert after["mallocs"] == before["mallocs"] and after["frees"] == before["frees"]
    assert after["reuses"] >= before["reuses"] + 40


# ------------------------------------------------------------------------------------------------
# CuPy
# ------------------------------------------------------------------------------------------------
def test_cupy_in_cupy_out(cupy, monkeypatch):
    rng = np.random.default_rng(21)
    x = random_normal(rng, (8, 256), "bf16", 3.0)
    xc = cupy.asarray(x)                               # uint16: bf16 is said with dtype=
    q, s = ck.quantize_int8(x, granularity="row", dtype="bf16")
    qc, sc = ck.quantize_int8(xc, granularity="row", dtype="bf16")
    assert isinstance(qc, cupy.ndarray) and isinstance(sc, cupy.ndarray)
    assert_bitwise_equal(cupy.asnumpy(qc), q, "cupy q")
    assert_bitwise_equal(cupy.asnumpy(sc), s, "cupy scales")
    a = rng.integers(-127, 128, (8, 256), dtype=np.int8)
    b = rng.integers(-127, 128, (64, 256), dtype=np.int8)
    want = ck.gemm_int8_scaled(a, b, 0.01, 0.02, out_dtype="bf16")
    got = ck.gemm_int8_scaled(cupy.asarray(a), cupy.asarray(b), 0.01, 0.02, out_dtype="bf16")
    assert isinstance(got, cupy.ndarray) and got.dtype == np.uint16
    assert_bitwise_equal(cupy.asnumpy(got), want, "cupy gemm_int8_scaled")
    w = random_normal(rng, (64, 256), "fp16", 0.1)
    layer = ck.QuantizedLinear.from_float(cupy.asarray(w), group_size=128)
    assert isinstance(layer.prepacked[0], cupy.ndarray)
    xh = random_normal(rng, (2, 256), "fp16")
    y = layer(cupy.asarray(xh))
    assert isinstance(y, cupy.ndarray)
    assert_bitwise_equal(cupy.asnumpy(y), ck.QuantizedLinear.from_float(w, group_size=128)(xh),
                         "cupy layer")
    stream = cupy.cuda.Stream(non_blocking=True)
    streams = spy_streams(monkeypatch, "quantize_int8")
    pool_before = pool_allocations()
    with stream:
        qs, _ = ck.quantize_int8(xc, granularity="row", dtype="bf16")
    assert streams == [stream.ptr] and pool_allocations() == pool_before
    stream.synchronize()
    assert_bitwise_equal(cupy.asnumpy(qs), q, "cupy q on a stream")


@pytest.mark.parametrize("dtype", ["fp32", "fp16"])
def test_cupy_common_calls_take_the_fast_path(cupy, dtype, monkeypatch):
    """quantize_int8 on a CuPy array alone runs without a _Call and gives the NumPy path's
    bits; a view that is not C-contiguous is left to the general path, which refuses it."""
    rng = np.random.default_rng(24)
    x = random_normal(rng, (4, 256), dtype, 3.0)
    want_q = ck.quantize_int8(x, granularity="row")
    want_t = ck.quantize_int8(x)
    xc = cupy.asarray(x)

    class NoCall:
        def __init__(self, *args):
            raise AssertionError("the common call must not build a _Call")

    with monkeypatch.context() as m:
        m.setattr(ck, "_Call", NoCall)
        for got, want in ((ck.quantize_int8(xc, granularity="row"), want_q),
                          (ck.quantize_int8(xc), want_t)):
            for g, w, what in zip(got, want, ("q", "scales")):
                assert isinstance(g, cupy.ndarray), what
                assert_bitwise_equal(cupy.asnumpy(g), w, what)
    for view in (xc[:, ::2], xc.T):
        with pytest.raises(ValueError, match="C-contiguous"):
            ck.quantize_int8(view, granularity="row")


# ------------------------------------------------------------------------------------------------
# CUDA graphs and torch.compile
# ------------------------------------------------------------------------------------------------
def quantized_layer(torch, rng, n=256, k=512):
    w = to_torch(torch, random_normal(rng, (n, k), "fp16", 0.1))
    bias = to_torch(torch, random_normal(rng, (n,), "fp16"))
    return ck.QuantizedLinear.from_float(w, bias=bias, group_size=128, symmetric=False)


def test_torch_cuda_graph_captures_a_layer(torch):
    rng = np.random.default_rng(22)
    layer = quantized_layer(torch, rng)
    x = to_torch(torch, random_normal(rng, (2, 512), "fp16"))
    side = torch.cuda.Stream()                       # warm-up off the capture, as torch asks
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            layer(x)
            ck.gemm_int8_scaled(torch.ones(2, 64, dtype=torch.int8, device="cuda"),
                                torch.ones(32, 64, dtype=torch.int8, device="cuda"), 0.5, 0.25)
    torch.cuda.current_stream().wait_stream(side)
    a = torch.ones(2, 64, dtype=torch.int8, device="cuda")
    b = torch.ones(32, 64, dtype=torch.int8, device="cuda")
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y = layer(x)
        c = ck.gemm_int8_scaled(a, b, 0.5, 0.25)     # Python scales: filled, captured
    for _ in range(2):
        x.copy_(to_torch(torch, random_normal(rng, (2, 512), "fp16")))
        a.fill_(2)
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(y, layer(x)), "the replay computes the new input"
        assert torch.equal(c, torch.full((2, 32), 64 * 2 * 0.125, device="cuda"))


def test_torch_operators_check(torch):
    if not hasattr(torch.library, "opcheck"):
        pytest.skip("torch.library.opcheck needs torch 2.4+")
    rng = np.random.default_rng(23)
    layer = quantized_layer(torch, rng)
    x = to_torch(torch, random_normal(rng, (3, 512), "fp16"))
    op, *tensors = layer._torch_tensors
    args = (x, *tensors, layer.out_features, layer.group_size, layer.activation)
    torch.library.opcheck(op.default, args, test_utils=("test_schema", "test_faketensor"))
    assert torch.equal(op(*args), layer(x))


def test_torch_compile_traces_the_operators(torch):
    """fullgraph=True: the layer and moe_forward are custom-operator nodes, no graph break."""
    rng = np.random.default_rng(24)
    layer = quantized_layer(torch, rng, n=64, k=128)
    experts, inter, group = 4, 32, 32
    weights = []
    for shape, gate_up in (((experts, 2 * inter, 64), True), ((experts, 64, inter), False)):
        w = to_torch(torch, random_normal(rng, (shape[0] * shape[1], shape[2]), "fp16", 0.1))
        p, s, _ = ck.quantize_int4(w, group_size=group)
        weights.append(ck.moe_prepack(p.view(*shape[:2], -1), s.view(*shape[:2], -1), None,
                                      group_size=group, gate_up=gate_up))

    class Block(torch.nn.Module):
        def forward(self, x, logits):
            h = torch.relu(layer(x))
            return ck.moe_forward(h, *weights, experts, inter, group_size=group,
                                  router_logits=logits, top_k=2) + 1

    x = to_torch(torch, random_normal(rng, (5, 128), "fp16"))
    logits = torch.randn(5, experts, device="cuda")
    block = Block()
    eager = block(x, logits)
    compiled = torch.compile(block, fullgraph=True, backend="aot_eager")
    assert torch.equal(compiled(x, logits), eager)


@pytest.mark.slow
def test_torch_compile_inductor_with_cuda_graphs(torch):
    rng = np.random.default_rng(25)
    layer = quantized_layer(torch, rng)

    class Block(torch.nn.Module):
        def forward(self, x):
            return torch.relu(layer(x)) + 1

    block = Block()
    compiled = torch.compile(block, mode="reduce-overhead", fullgraph=True)
    for step in range(4):   # recorded, then replayed from the CUDA graph
        x = to_torch(torch, random_normal(rng, (1, 512), "fp16"))
        assert torch.equal(compiled(x), block(x)), f"step {step}"
