"""The wrapper's plumbing on a GPU: each convenience path (NumPy in, CUDA arrays in, out=,
streams, 1-D, static scales, foreign and torch arrays) must give bitwise what the raw level gives,
and the error message of the calling thread is cleared by a successful call. The kernels' numbers
are checked against tests/reference.py in test_quantize_gpu.py; CUDA graph capture of the
wrapper's own buffers (frees deferred while a capture forbids them) is here too.

The tests skip without a CUDA device (conftest.py).
"""
import numpy as np
import pytest

import cuda_wrapper as ck
import reference as ref
from cuda_wrapper import DType
from gpu_support import (
    DTYPE_NAME, FLOAT_DTYPES, FakeCudaArray, assert_bitwise_equal, dtype_arg, random_normal,
    to_host,
)

pytestmark = pytest.mark.gpu


def test_successful_call_clears_the_message():
    with pytest.raises(ck.CKError):   # x is NULL: rejected before any CUDA call
        ck.raw.quantize_int8(0, DType.FP32, 4, 64, ck.PER_ROW, ck.DYNAMIC, 0x7F0000200000,
                             0x7F0000400000)
    assert ck.last_error_message()
    assert ck.raw.device_count() >= 1
    assert ck.last_error_message() == ""


# ------------------------------------------------------------------------------------------------
# Each path of the NumPy level against the raw level
# ------------------------------------------------------------------------------------------------
def make_input(rng, shape, ck_dtype):
    return random_normal(rng, shape, DTYPE_NAME[ck_dtype], 3.0)


def raw_quantize_int8(x, ck_dtype, granularity):
    rows, cols = x.shape
    xd = ck.DeviceArray.from_numpy(x)
    q = ck.DeviceArray.empty((rows, cols), np.int8).fill_byte(0x7F)
    s = ck.DeviceArray.empty((1 if granularity == ck.PER_TENSOR else rows,), np.float32)
    ck.raw.quantize_int8(xd.ptr, ck_dtype, rows, cols, granularity, ck.DYNAMIC, s.ptr, q.ptr)
    return q.to_numpy(), s.to_numpy()


def raw_quantize_int4(x, ck_dtype, group_size, mode):
    rows, cols = x.shape
    groups = ck.raw.int4_groups_per_row(cols, group_size)
    xd = ck.DeviceArray.from_numpy(x)
    p = ck.DeviceArray.empty((rows, (cols + 1) // 2), np.uint8)
    s = ck.DeviceArray.empty((rows, groups), x.dtype)
    z = ck.DeviceArray.empty((rows, groups), np.uint8) if mode == ck.INT4_ASYMMETRIC else None
    ck.raw.quantize_int4(xd.ptr, ck_dtype, rows, cols, group_size, mode, p.ptr, s.ptr,
                         z.ptr if z is not None else 0)
    return p.to_numpy(), s.to_numpy(), (z.to_numpy() if z is not None else None)


def assert_same(actual, expected, what):
    """A result of either kind (NumPy, DeviceArray) holds the bits of `expected`."""
    assert_bitwise_equal(to_host(actual), expected, what)


@pytest.mark.parametrize("granularity", ["tensor", "row"])
@pytest.mark.parametrize("ck_dtype", FLOAT_DTYPES, ids=lambda d: d.name)
def test_wrapper_int8_paths_agree(ck_dtype, granularity):
    rng = np.random.default_rng(1)
    x = make_input(rng, (7, 300), ck_dtype)
    gran = ck.PER_TENSOR if granularity == "tensor" else ck.PER_ROW
    want_q, want_s = raw_quantize_int8(x, ck_dtype, gran)
    dtype = dtype_arg(DTYPE_NAME[ck_dtype])

    q, s = ck.quantize_int8(x, granularity=granularity, dtype=dtype)          # NumPy
    assert_same(q, want_q, "numpy q")
    assert_same(s, want_s, "numpy scales")

    xd = ck.DeviceArray.from_numpy(x, ck_dtype=ck_dtype)                      # CUDA array
    qd, sd = ck.quantize_int8(xd, granularity=granularity)
    assert isinstance(qd, ck.DeviceArray) and isinstance(sd, ck.DeviceArray)
    assert_same(qd, want_q, "device q")
    assert_same(sd, want_s, "device scales")

    q_out, s_out = np.empty_like(want_q), np.empty_like(want_s)               # out=
    result = ck.quantize_int8(x, granularity=granularity, dtype=dtype, out=(q_out, s_out))
    assert result[0] is q_out and result[1] is s_out
    assert_same(q_out, want_q, "out= q")

    q_static, s_static = ck.quantize_int8(x, granularity=granularity, dtype=dtype, scales=want_s)
    assert_same(q_static, want_q, "static scales reproduce dynamic q")
    assert s_static is want_s

    for out_dtype, np_dtype in ref.NUMPY_DTYPE.items():
        host = ck.dequantize_int8(want_q, want_s, granularity=granularity, out_dtype=out_dtype)
        dev = ck.dequantize_int8(qd, sd, out_dtype=out_dtype)                 # inferred granularity
        assert host.dtype == np_dtype and host.shape == x.shape
        assert_same(dev, host, "dequantize %s" % out_dtype)
        if out_dtype == "bf16":
            assert dev.ck_dtype == DType.BF16


@pytest.mark.parametrize("symmetric", [True, False], ids=["sym", "asym"])
@pytest.mark.parametrize("group_size", [32, 128, ck.GROUP_ROW])
@pytest.mark.parametrize("ck_dtype", FLOAT_DTYPES, ids=lambda d: d.name)
def test_wrapper_int4_paths_agree(ck_dtype, group_size, symmetric):
    rng = np.random.default_rng(2)
    x = make_input(rng, (5, 259), ck_dtype)
    mode = ck.INT4_SYMMETRIC if symmetric else ck.INT4_ASYMMETRIC
    want_p, want_s, want_z = raw_quantize_int4(x, ck_dtype, group_size, mode)
    dtype = dtype_arg(DTYPE_NAME[ck_dtype])

    p, s, z = ck.quantize_int4(x, group_size=group_size, symmetric=symmetric, dtype=dtype)
    assert_same(p, want_p, "numpy packed")
    assert_same(s, want_s, "numpy scales")
    assert (z is None) == symmetric
    if not symmetric:
        assert_same(z, want_z, "numpy zeros")

    xd = ck.DeviceArray.from_numpy(x, ck_dtype=ck_dtype)
    pd, sd, zd = ck.quantize_int4(xd, group_size=group_size, symmetric=symmetric)
    assert_same(pd, want_p, "device packed")
    assert sd.ck_dtype == ck_dtype

    out_dtype = "bf16" if ck_dtype == DType.BF16 else None
    host = ck.dequantize_int4(want_p, want_s, want_z, cols=259, group_size=group_size,
                              out_dtype=out_dtype)
    dev = ck.dequantize_int4(pd, sd, zd, cols=259, group_size=group_size)
    assert host.shape == x.shape and host.dtype == x.dtype
    assert_same(dev, host, "dequantize_int4 device vs numpy")


def test_wrapper_one_dimensional_and_scalar_scale():
    x = np.linspace(-2, 2, 1001, dtype=np.float32)
    q, scale = ck.quantize_tensor(x)
    assert q.shape == (1001,) and isinstance(scale, float)
    back = ck.dequantize_tensor(q, scale)
    assert back.shape == (1001,) and back.dtype == np.float32
    assert np.max(np.abs(back - x)) <= scale * 0.5001
    qd, sd = ck.quantize_int8(ck.DeviceArray.from_numpy(x))
    assert qd.shape == (1001,) and sd.shape == (1,)
    # A Python float as the static scale of a device call is uploaded and kept alive.
    q2, s2 = ck.quantize_int8(ck.DeviceArray.from_numpy(x), scales=scale)
    assert isinstance(s2, ck.DeviceArray)
    assert_same(q2, q, "static scalar scale")


def test_wrapper_on_a_non_blocking_stream():
    stream = ck.cuda.stream_create(non_blocking=True)
    try:
        x = np.random.default_rng(3).standard_normal((64, 4096)).astype(np.float32)
        want_q, want_s = raw_quantize_int8(x, DType.FP32, ck.PER_ROW)
        q, s = ck.quantize_int8(x, granularity="row", stream=stream)       # NumPy on a stream
        assert_same(q, want_q, "numpy on a stream")
        xd = ck.DeviceArray.from_numpy(x)
        qd, sd = ck.quantize_int8(xd, granularity="row", stream=stream)
        assert qd.stream == stream and qd.__cuda_array_interface__["stream"] == stream
        assert_same(qd, want_q, "device on a stream")                     # to_numpy waits for it
    finally:
        ck.cuda.stream_synchronize(stream)
        ck.cuda.stream_destroy(stream)


def test_wrapper_uses_foreign_cuda_arrays_in_place():
    x = np.random.default_rng(4).standard_normal((4, 64)).astype(np.float16)
    xd = ck.DeviceArray.from_numpy(x)
    q_buffer = ck.DeviceArray.empty((4, 64), np.int8).fill_byte(0)
    foreign_x = FakeCudaArray((4, 64), "<f2", strides=(128, 2), ptr=xd.ptr)
    foreign_q = FakeCudaArray((4, 64), "|i1", ptr=q_buffer.ptr)
    q, s = ck.quantize_int8(foreign_x, granularity="row", out=(foreign_q, None))
    assert q is foreign_q and isinstance(s, ck.DeviceArray)
    want_q, _ = raw_quantize_int8(x, DType.FP16, ck.PER_ROW)
    assert_same(q_buffer, want_q, "written in place")


def test_wrapper_torch_interop():
    """torch tensors in, torch tensors out (tests/test_frameworks_gpu.py has the rest)."""
    torch = pytest.importorskip("torch")
    x = torch.randn(8, 256, device="cuda", dtype=torch.float16)
    q, s = ck.quantize_int8(x, granularity="row")
    assert isinstance(q, torch.Tensor) and q.dtype == torch.int8 and tuple(q.shape) == (8, 256)
    assert q.device == x.device and s.dtype == torch.float32
    want_q, _ = raw_quantize_int8(x.cpu().numpy(), DType.FP16, ck.PER_ROW)
    assert np.array_equal(q.cpu().numpy(), want_q)
    # bfloat16 tensors, directly or as their int16 bits with dtype="bf16".
    xb = x.to(torch.bfloat16)
    bits = xb.view(torch.int16).cpu().numpy().view(np.uint16)
    want_qb = raw_quantize_int8(bits, DType.BF16, ck.PER_ROW)[0]
    for tensor, dtype in ((xb, None), (xb.view(torch.int16), "bf16")):
        qb, _ = ck.quantize_int8(tensor, granularity="row", dtype=dtype)
        assert np.array_equal(qb.cpu().numpy(), want_qb)
    packed, scales, zeros = ck.quantize_int4(xb, group_size=64, symmetric=False)
    assert scales.dtype == torch.bfloat16 and packed.dtype == torch.uint8
    back = ck.dequantize_int4(packed, scales, zeros, cols=256, group_size=64)
    assert back.dtype == torch.bfloat16 and tuple(back.shape) == (8, 256)
    # Through the interface, torch reads a DeviceArray in place.
    qd, _ = ck.quantize_int8(ck.DeviceArray.from_numpy(x.cpu().numpy()), granularity="row")
    assert np.array_equal(torch.as_tensor(qd, device="cuda").cpu().numpy(), want_q)


def test_graph_capture_defers_frees_and_replays():
    stream = ck.cuda.stream_create()
    x = ck.DeviceArray.from_numpy(np.arange(-64, 64, dtype=np.float32).reshape(2, 64))
    q = ck.DeviceArray.empty((2, 64), np.int8)
    s = ck.DeviceArray.empty((2,), np.float32)
    scratch = ck.DeviceArray.empty((16,), np.float32)
    try:
        with ck.cuda.graph_capture(stream) as graph:
            ck.raw.quantize_int8(x.ptr, DType.FP32, 2, 64, ck.PER_ROW, ck.DYNAMIC, s.ptr, q.ptr,
                                 stream)
            scratch.free()     # cudaFree would invalidate the capture: it waits until the end
            del scratch
        q.fill_byte(0x80)              # -128: a code the kernel never writes
        ck.cuda.device_synchronize()
        assert (q.to_numpy() == -128).all(), "capture records, it does not run"
        graph.launch(stream)
        ck.cuda.stream_synchronize(stream)
        assert q.to_numpy()[0, 0] == -127 and q.to_numpy()[1, -1] == 127
        graph.close()
        graph.close()
        with pytest.raises(RuntimeError):
            graph.launch(stream)
    finally:
        ck.cuda.stream_destroy(stream)


@pytest.mark.cuda_api_error
def test_graph_capture_of_the_legacy_stream_raises():
    with pytest.raises(ck.CUDAError):          # the legacy stream cannot be captured
        with ck.cuda.graph_capture(0):
            pass
    # and the error is not left pending for the next library to report (torch raised it at
    # its next check)
    assert ck.cuda.get_last_error() == 0
