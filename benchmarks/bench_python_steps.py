#!/usr/bin/env python3
"""The pieces of a convenience call's host time, one by one (what bench_python_overhead.py
measures whole): ctypes calls by argument count and argument type, one launch through the raw
level, the library's function (errcheck), the status-returning one and the fast paths' (integers
as words), the wrapper's argument parsing, the framework calls a fast path makes (torch's and
CuPy's allocations, data pointers, current stream and device, the kinds' fast_view,
fast_float_input, fast_empty and fast_scales), and the DeviceArray path's pool steps (cudaGetDevice, cudaEventRecord, capture
checks).

    python3 benchmarks/bench_python_steps.py [--calls 20000] [--profile]

Each row: the best of 5 loops of --calls calls, in us per call. --profile adds a cProfile of
quantize_int8 on a DeviceArray (the slowest path) sorted by own time. torch or CuPy missing:
their rows are skipped. Exit status: 0, or 2 without a CUDA device. Nothing is written.
"""
import argparse
import ctypes
import sys
import timeit
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # cuda_wrapper.py lives there
import cuda_wrapper as ck  # noqa: E402

M, N, K = 1, 4096, 4096
EXIT_NO_DEVICE = 2


def timer(calls):
    def row(label, fn, n=calls):
        fn()
        us = min(timeit.repeat(fn, number=n, repeat=5)) / n * 1e6
        print("%-62s %8.3f" % (label, us), flush=True)
    return row


def library_rows(row, calls):
    lib = ck.load_library()
    row("ctypes: ck_version (no argument)", lib.ck_version)
    row("ctypes: ck_w4a16_prepacked_groups (3 int64)",
        lambda: lib.ck_w4a16_prepacked_groups(N, K, 128))
    row("ctypes: ck_block4_prepacked_scales_bytes (enum + 3 int64)",
        lambda: lib.ck_block4_prepacked_scales_bytes(0, N, K, 64))
    row("raw.w4a16_prepacked_groups (the raw level's pass-through)",
        lambda: ck.raw.w4a16_prepacked_groups(N, K, 128))
    # One launch (M=1, K=4096, fp16, per row) three ways: the raw level, the library's function
    # (argtypes and errcheck), the status-returning function the fast paths call.
    x = ck.DeviceArray.from_numpy(np.zeros((M, K), np.float16))
    q = ck.DeviceArray.empty((M, K), np.int8)
    s = ck.DeviceArray.empty((M,), np.float32)
    args = (x.ptr, ck.DType.FP16, M, K, ck.PER_ROW, ck.DYNAMIC, s.ptr, q.ptr, 0)
    launches = min(calls, 2000)
    row("raw.quantize_int8, launches", lambda: ck.raw.quantize_int8(*args), launches)
    ck.cuda.device_synchronize()
    row("lib.ck_quantize_int8 (errcheck), launches", lambda: lib.ck_quantize_int8(*args),
        launches)
    ck.cuda.device_synchronize()
    row("_entries.ck_quantize_int8 (the status), launches",
        lambda: ck._entries.ck_quantize_int8(*args), launches)
    ck.cuda.device_synchronize()
    row("_fast_entries.ck_quantize_int8 (integers as c_void_p), launches",
        lambda: ck._fast_entries.ck_quantize_int8(*args), launches)
    ck.cuda.device_synchronize()
    # The same export, 3 int64, declared as c_int64 and as c_void_p: the conversions' cost.
    words = lib["ck_w4a16_prepacked_groups"]
    words.argtypes, words.restype = [ctypes.c_void_p] * 3, ctypes.c_int64
    row("ctypes: ck_w4a16_prepacked_groups (3 c_void_p)", lambda: words(N, K, 128))
    row("_layout('nk')", lambda: ck._layout("nk"))
    row("_as_dtype_enum('fp16')", lambda: ck._as_dtype_enum("fp16"))
    row("_granularity('row')", lambda: ck._granularity("row"))


def torch_rows(row, calls):
    try:
        import torch
    except ImportError:
        print("skipped: torch is not installed")
        return
    x = torch.zeros(M, K, dtype=torch.float16, device="cuda")
    a = torch.zeros(M, K, dtype=torch.int8, device="cuda")
    b = torch.zeros(N, K, dtype=torch.int8, device="cuda")
    sa = torch.ones(M, dtype=torch.float32, device="cuda")
    sb = torch.ones(N, dtype=torch.float32, device="cuda")
    kind = ck._kind(x)
    device = x.device
    row("torch: x.new_empty((1, 4096), dtype=int8)", lambda: x.new_empty((M, K), dtype=torch.int8))
    row("torch: torch.empty((1, 4096), dtype=int8, device=x.device)",
        lambda: torch.empty((M, K), dtype=torch.int8, device=x.device))
    row("torch: torch.empty((1, 4096), dtype=int8, device=<a torch.device>)",
        lambda: torch.empty((M, K), dtype=torch.int8, device=device))
    row("torch: torch.empty(1, 4096, dtype=int8, device=<a torch.device>)",
        lambda: torch.empty(M, K, dtype=torch.int8, device=device))
    row("torch: torch.empty_strided((1, 4096), (4096, 1), dtype=int8, device=...)",
        lambda: torch.empty_strided((M, K), (K, 1), dtype=torch.int8, device=device))
    row("torch: torch.empty_like(x, dtype=int8)", lambda: torch.empty_like(x, dtype=torch.int8))
    row("torch: x.data_ptr()", x.data_ptr)
    row("torch: x.is_contiguous()", x.is_contiguous)
    row("torch: tuple(x.shape)", lambda: tuple(x.shape))
    row("torch: x.get_device()", x.get_device)
    row("torch: _cuda_getCurrentRawStream(0)", lambda: torch._C._cuda_getCurrentRawStream(0))
    row("torch: _cuda_getDevice()", torch._C._cuda_getDevice)
    row("wrapper: _torch_compiling()", ck._torch_compiling)
    row("wrapper: kind.view(x) (dtype, contiguity, pointer, shape)", lambda: kind.view(x, "x"))
    row("wrapper: kind.fast_view(a) (kind, device, dtype, contiguity, pointer, shape)",
        lambda: kind.fast_view(a, 0, ck._INT8))
    row("wrapper: kind.empty (new_empty, data_ptr)",
        lambda: kind.empty((M, K), ck._INT8, ck.DType.INT8, x))
    row("wrapper: kind.fast_empty (torch.empty, data_ptr)",
        lambda: kind.fast_empty((M, K), ck.DType.INT8, 0))
    row("wrapper: kind.fast_empty_like (torch.empty_like, data_ptr)",
        lambda: kind.fast_empty_like(x, ck.DType.INT8))
    row("wrapper: kind.fast_scales(1) (empty_like of a kept tensor, data_ptr)",
        lambda: kind.fast_scales(1, 0))
    row("wrapper: kind.fast_scales(2) (torch.empty, data_ptr)", lambda: kind.fast_scales(2, 0))
    row("wrapper: kind.fast_float_input(x) (device, dtype, contiguity, pointer, shape)",
        lambda: kind.fast_float_input(x))
    row("wrapper: _foreign_capture() (torch's capture query)", ck._foreign_capture)
    row("quantize_int8(x, granularity='row'), launches", lambda: ck.quantize_int8(x, "row"),
        min(calls, 2000))
    torch.cuda.synchronize()
    row("gemm_int8_scaled(a, b, sa, sb, out_dtype='fp16'), launches",
        lambda: ck.gemm_int8_scaled(a, b, sa, sb, out_dtype="fp16"), min(calls, 2000))
    torch.cuda.synchronize()
    torch_op_rows(row, torch, x, calls)


def torch_op_rows(row, torch, x, calls):
    """The custom operators' dispatch: an operator whose body only allocates its result,
    registered both ways torch offers, beside the library's w4a16_linear and the layer."""
    from torch.library import Library, custom_op

    @custom_op("ck_steps::empty_custom_op", mutates_args=())
    def _(x: torch.Tensor) -> torch.Tensor:
        return torch.empty_like(x)

    lib = Library("ck_steps", "FRAGMENT")   # its registrations last while this runs
    lib.define("empty_library(Tensor x) -> Tensor")
    lib.impl("empty_library", lambda t: torch.empty_like(t), "CUDA")
    ops = torch.ops.ck_steps
    row("torch op: @custom_op, body torch.empty_like", lambda: ops.empty_custom_op(x))
    row("torch op: Library.impl(CUDA), body torch.empty_like",
        lambda: ops.empty_library(x))
    weight = torch.randn(N, K, dtype=torch.float16, device="cuda")
    layer = ck.QuantizedLinear.from_float(weight, group_size=128)
    if not layer._torch_tensors:
        print("skipped: the layer has no torch operator")
        return
    op, w, s, z, bias, perm = layer._torch_tensors
    args = (x, w, s, z, bias, perm, N, 128, layer.activation)
    launches = min(calls, 2000)
    row("QuantizedLinear(x), launches", lambda: layer(x), launches)
    torch.cuda.synchronize()
    row("gemm_w4a16_prepacked(x, w, s, z, n), launches",
        lambda: ck.gemm_w4a16_prepacked(x, w, s, z, n=N, group_size=128), launches)
    torch.cuda.synchronize()
    row("torch.ops.cuda_kernels.w4a16_linear, launches", lambda: op(*args), launches)
    torch.cuda.synchronize()


def cupy_rows(row):
    try:
        import cupy
        cupy.cuda.runtime.getDeviceCount()
    except Exception as e:  # noqa: BLE001 - not installed, or built for another CUDA
        print("skipped: CuPy is not usable (%s)" % e)
        return
    x = cupy.zeros((M, K), cupy.float16)
    kind = ck._kind(x)
    row("cupy: cupy.empty((1, 4096), int8)", lambda: cupy.empty((M, K), np.int8))
    row("cupy: x.data.ptr", lambda: x.data.ptr)
    row("cupy: x.flags.c_contiguous", lambda: x.flags.c_contiguous)
    row("cupy: get_current_stream().ptr", lambda: cupy.cuda.get_current_stream().ptr)
    row("cupy: runtime.getDevice()", cupy.cuda.runtime.getDevice)
    row("wrapper: kind.fast_view(x)", lambda: kind.fast_view(x, 0, np.dtype(np.float16)))
    row("wrapper: kind.fast_float_input(x)", lambda: kind.fast_float_input(x))
    row("wrapper: kind.fast_scales(1)", lambda: kind.fast_scales(1, 0))
    row("quantize_int8(x, granularity='row'), launches", lambda: ck.quantize_int8(x, "row"),
        2000)
    cupy.cuda.Device().synchronize()


def device_array_rows(row, profile):
    x = ck.DeviceArray.from_numpy(np.zeros((M, K), np.float16))
    row("DeviceArray.empty((1, 4096), int8) and free()",
        lambda: ck.DeviceArray.empty((M, K), np.int8).free())
    row("cuda.current_device() (cudaGetDevice through ctypes)", ck.cuda.current_device)
    block = x._block
    row("pool.record(block, 0) (cudaEventRecord through ctypes)", lambda: ck._pool.record(block, 0))
    row("_any_capture()", ck._any_capture)
    ck.cuda.device_synchronize()
    if profile:
        import cProfile
        import pstats
        def calls():
            for _ in range(3000):
                ck.quantize_int8(x, granularity="row")   # the results go back to the pool

        profiler = cProfile.Profile()
        profiler.runcall(calls)
        ck.cuda.device_synchronize()
        pstats.Stats(profiler).sort_stats("tottime").print_stats(20)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=20000, help="calls per timed loop")
    parser.add_argument("--profile", action="store_true",
                        help="also cProfile quantize_int8 on a DeviceArray")
    args = parser.parse_args()
    if ck.device_count() < 1:
        print("no CUDA device visible: nothing to measure")
        return EXIT_NO_DEVICE
    row = timer(args.calls)
    print("%-62s %8s" % ("step", "us/call"))
    library_rows(row, args.calls)
    torch_rows(row, args.calls)
    cupy_rows(row)
    device_array_rows(row, args.profile)
    return 0


if __name__ == "__main__":
    sys.exit(main())
