#!/usr/bin/env python3
"""The Python layer's cost per call, beside the kernel's own time and torch's F.linear.

    python3 benchmarks/bench_python_overhead.py [--out benchmarks/results] [--calls 2000]
                                                [--loops 7]

For each operation, one M=1 decode step on a 4096 x 4096 weight (QuantizedLinear, fp16
activations, INT4 group 128; gemm_int8_scaled, per-row scales, fp16 out; quantize_int8 of an
fp16 row), and each way of calling it:

  raw          ck.raw.<function> with int pointers and preallocated outputs (the ctypes floor)
  DeviceArray  the convenience function on DeviceArrays (results from the pool)
  torch        the convenience function (or the layer) on torch CUDA tensors
  torch op     torch.ops.cuda_kernels.w4a16_linear, what torch.compile calls (eager here)
  cupy         the convenience function (or the layer) on CuPy arrays
  F.linear     torch.nn.functional.linear, fp16, the same shape: torch's own per-call cost

a loop of --calls calls is timed twice: after the last call is issued ("host us/call", the
Python and launch cost) and after one synchronize ("wall us/call"), the median of --loops loops;
the rows take turns, loop by loop (a slow spell of a shared host falls on all of them).
"kernel us" is the device time of one call: CUDA events around a CUDA graph of GRAPH_CALLS
launches, so no host time is in it. Where wall time exceeds the kernel's, the loop is host
bound; "over kernel" is wall minus kernel, what a call costs beyond its kernel (the
convenience level's goal: at most 10 us). torch or CuPy missing: their rows are skipped, saying
so. The host's CPU sets every host number: compare rows of one run (F.linear is in each).

The table is printed and written, as markdown with the GPU's name, the date and the command, to
--out/python-overhead-<gpu>-<date>.md. Exit status: 0, or 2 without a CUDA device. Nothing
imports this file.
"""
import argparse
import ctypes
import datetime
import platform
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))  # cuda_wrapper.py lives there
import cuda_wrapper as ck  # noqa: E402

M, N, K, GROUP = 1, 4096, 4096, 128
GRAPH_CALLS = 50      # launches per CUDA graph of the kernel timing
GRAPH_REPLAYS = 20
EXIT_NO_DEVICE = 2


# ------------------------------------------------------------------------------------------------
# Frameworks, when installed
# ------------------------------------------------------------------------------------------------
def load_torch():
    try:
        import torch
    except ImportError:
        return None, "torch is not installed"
    if not torch.cuda.is_available():
        return None, "torch sees no CUDA device"
    return torch, None


def load_cupy():
    try:
        import cupy
        cupy.cuda.runtime.getDeviceCount()
    except Exception as e:  # noqa: BLE001 - not installed, or built for another CUDA
        return None, "CuPy is not usable (%s)" % e
    return cupy, None


def gpu_name(torch, cupy):
    if torch is not None:
        return torch.cuda.get_device_name()
    if cupy is not None:
        name = cupy.cuda.runtime.getDeviceProperties(0)["name"]
        return name.decode() if isinstance(name, bytes) else name
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=30)
        return out.stdout.splitlines()[0].strip()
    except (OSError, IndexError, subprocess.SubprocessError):
        return "unknown GPU"


# ------------------------------------------------------------------------------------------------
# Timing
# ------------------------------------------------------------------------------------------------
class DeviceTimer:
    """CUDA events (with timing) on a stream, through the libcudart the wrapper loaded."""

    def __init__(self):
        rt = ck.cuda._load()
        voidp = ctypes.c_void_p
        for name, argtypes in (("cudaEventCreate", [ctypes.POINTER(voidp)]),
                               ("cudaEventRecord", [voidp, voidp]),
                               ("cudaEventSynchronize", [voidp]),
                               ("cudaEventElapsedTime", [ctypes.POINTER(ctypes.c_float), voidp,
                                                         voidp])):
            getattr(rt, name).argtypes = argtypes
            getattr(rt, name).restype = ctypes.c_int
        self.rt = rt
        self.start, self.end = voidp(), voidp()
        for event in (self.start, self.end):
            self.check(rt.cudaEventCreate(ctypes.byref(event)), "cudaEventCreate")

    @staticmethod
    def check(err, call):
        if err != 0:
            raise ck.CUDAError(err, call, ck.cuda.error_string(err))

    def milliseconds(self, run, stream):
        """Device time of what run() enqueues on `stream`."""
        self.check(self.rt.cudaEventRecord(self.start, stream), "cudaEventRecord")
        run()
        self.check(self.rt.cudaEventRecord(self.end, stream), "cudaEventRecord")
        self.check(self.rt.cudaEventSynchronize(self.end), "cudaEventSynchronize")
        ms = ctypes.c_float()
        self.check(self.rt.cudaEventElapsedTime(ctypes.byref(ms), self.start, self.end),
                   "cudaEventElapsedTime")
        return ms.value


def kernel_us(timer, launch):
    """Device time of one launch(stream): a CUDA graph of GRAPH_CALLS launches, replayed."""
    stream = ck.cuda.stream_create(non_blocking=True)
    try:
        with ck.cuda.graph_capture(stream) as graph:
            for _ in range(GRAPH_CALLS):
                launch(stream)
        with graph:
            graph.launch(stream)   # warm
            ms = timer.milliseconds(lambda: [graph.launch(stream) for _ in range(GRAPH_REPLAYS)],
                                    stream)
        return 1000.0 * ms / (GRAPH_CALLS * GRAPH_REPLAYS)
    finally:
        ck.cuda.stream_synchronize(stream)
        ck.cuda.stream_destroy(stream)


def time_loop(call, synchronize, calls):
    """(host us/call, wall us/call) of one loop of `calls` calls."""
    t0 = time.perf_counter()
    for _ in range(calls):
        call()
    t1 = time.perf_counter()
    synchronize()
    t2 = time.perf_counter()
    return (t1 - t0) / calls * 1e6, (t2 - t0) / calls * 1e6


def time_rows(cases, calls, loops):
    """[(host us/call, wall us/call)] of each (call, synchronize) case: medians over `loops`
    loops of `calls` calls. The cases take turns, loop by loop: a slow spell of a shared host
    falls on every row alike rather than on the few timed in it."""
    for call, synchronize in cases:
        for _ in range(10):
            call()
        synchronize()
    times = [[] for _ in cases]
    for _ in range(loops):
        for (call, synchronize), samples in zip(cases, times):
            samples.append(time_loop(call, synchronize, calls))
    return [(statistics.median(h for h, _ in samples), statistics.median(w for _, w in samples))
            for samples in times]


# ------------------------------------------------------------------------------------------------
# The operations
# ------------------------------------------------------------------------------------------------
def host_data(seed=0):
    rng = np.random.default_rng(seed)
    return dict(
        x=rng.standard_normal((M, K), dtype=np.float32).astype(np.float16),
        w=(rng.standard_normal((N, K), dtype=np.float32) * 0.02).astype(np.float16),
        a=rng.integers(-127, 128, (M, K), dtype=np.int8),
        b=rng.integers(-127, 128, (N, K), dtype=np.int8),
        scale_a=np.full(M, 0.01, np.float32),
        scale_b=np.full(N, 0.02, np.float32),
    )


def raw_launches(data):
    """{op: launch(stream)} at the raw level, on DeviceArrays made once."""
    dev = {name: ck.DeviceArray.from_numpy(a) for name, a in data.items()}
    layer = ck.QuantizedLinear.from_float(data["w"], group_size=GROUP)
    w, s, _ = layer.prepacked
    y16 = ck.DeviceArray.empty((M, N), np.float16)
    q = ck.DeviceArray.empty((M, K), np.int8)
    qs = ck.DeviceArray.empty((M,), np.float32)
    return {   # the closures keep the arrays alive
        "QuantizedLinear": lambda stream: ck.raw.gemm_w4a16_prepacked(
            dev["x"].ptr, ck.DType.FP16, w.ptr, s.ptr, 0, GROUP, ck.INT4_SYMMETRIC, 0,
            ck.ACTIVATION_NONE, M, N, K, y16.ptr, stream),
        "gemm_int8_scaled": lambda stream: ck.raw.gemm_int8_scaled(
            dev["a"].ptr, dev["b"].ptr, ck.LAYOUT_NK, M, N, K, dev["scale_a"].ptr, ck.PER_ROW,
            dev["scale_b"].ptr, ck.PER_ROW, 0, ck.ACTIVATION_NONE, y16.ptr, ck.DType.FP16,
            stream),
        "quantize_int8": lambda stream: ck.raw.quantize_int8(
            dev["x"].ptr, ck.DType.FP16, M, K, ck.PER_ROW, ck.DYNAMIC, qs.ptr, q.ptr, stream),
    }


def convenience_calls(data, to_device):
    """({op: call()} of the convenience level on arrays made by to_device(ndarray), the layer,
    the arrays)."""
    d = {name: to_device(a) for name, a in data.items()}
    layer = ck.QuantizedLinear.from_float(d["w"], group_size=GROUP)
    return {
        "QuantizedLinear": lambda: layer(d["x"]),
        "gemm_int8_scaled": lambda: ck.gemm_int8_scaled(d["a"], d["b"], d["scale_a"],
                                                        d["scale_b"], out_dtype="fp16"),
        "quantize_int8": lambda: ck.quantize_int8(d["x"], granularity="row"),
    }, layer, d


def run(args):
    torch, torch_why = load_torch()
    cupy, cupy_why = load_cupy()
    data = host_data()
    timer = DeviceTimer()
    raw = raw_launches(data)
    ops = list(raw)
    kernel = {op: kernel_us(timer, raw[op]) for op in ops}
    device_sync = ck.cuda.device_synchronize
    paths = [("raw", {op: (lambda launch=raw[op]: launch(0)) for op in ops}, device_sync),
             ("DeviceArray", convenience_calls(data, ck.DeviceArray.from_numpy)[0], device_sync)]
    skipped = []
    extra = []   # (op, path, call, synchronize, kernel us)
    if torch is not None:
        calls, layer, d = convenience_calls(data, lambda a: torch.from_numpy(a).cuda())
        paths.append(("torch", calls, torch.cuda.synchronize))
        op, *tensors = layer._torch_tensors or (None,)
        if op is not None:
            args_op = (d["x"], *tensors, layer.out_features, layer.group_size, layer.activation)
            # Default arguments bind now: the loops below rebind the name op.
            extra.append(("QuantizedLinear", "torch op", lambda op=op, a=args_op: op(*a),
                          torch.cuda.synchronize, kernel["QuantizedLinear"]))
        w16 = d["w"]
        extra.append(("QuantizedLinear", "F.linear fp16",
                      lambda: torch.nn.functional.linear(d["x"], w16),
                      torch.cuda.synchronize, torch_kernel_us(torch, d["x"], w16)))
    else:
        skipped.append("torch rows: " + torch_why)
    if cupy is not None:
        paths.append(("cupy", convenience_calls(data, cupy.asarray)[0],
                      lambda: cupy.cuda.Device().synchronize()))
    else:
        skipped.append("cupy rows: " + cupy_why)
    cases = []   # (op, path, call, synchronize, kernel us), in the table's order
    for op in ops:
        cases += [(op, path, calls[op], synchronize, kernel[op])
                  for path, calls, synchronize in paths]
        cases += [case for case in extra if case[0] == op]
    times = time_rows([(call, synchronize) for _, _, call, synchronize, _ in cases],
                      args.calls, args.loops)
    rows = [(op, path, host, wall, k_us)
            for (op, path, _, _, k_us), (host, wall) in zip(cases, times)]
    return rows, skipped, gpu_name(torch, cupy), versions(torch, cupy)


def torch_kernel_us(torch, x, w):
    """Device time of one F.linear: torch's CUDA graph of GRAPH_CALLS calls, replayed."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            torch.nn.functional.linear(x, w)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(GRAPH_CALLS):
            torch.nn.functional.linear(x, w)
    graph.replay()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(GRAPH_REPLAYS):
        graph.replay()
    end.record()
    end.synchronize()
    return 1000.0 * start.elapsed_time(end) / (GRAPH_CALLS * GRAPH_REPLAYS)


def versions(torch, cupy):
    parts = ["libcuda_kernels %s" % ck.version(), "CUDA runtime %d" % ck.cuda.runtime_version(),
             "Python %s" % platform.python_version(), "NumPy %s" % np.__version__]
    if torch is not None:
        parts.append("torch %s" % torch.__version__)
    if cupy is not None:
        parts.append("CuPy %s" % cupy.__version__)
    return ", ".join(parts)


# ------------------------------------------------------------------------------------------------
# Output
# ------------------------------------------------------------------------------------------------
def table(rows):
    header = "%-18s %-14s %13s %13s %11s %12s %15s" % (
        "op", "path", "host us/call", "wall us/call", "kernel us", "wall/kernel",
        "over kernel us")
    lines = [header, "-" * len(header)]
    for op, path, host, wall, k_us in rows:
        lines.append("%-18s %-14s %13.2f %13.2f %11.2f %11.2fx %15.2f" % (
            op, path, host, wall, k_us, wall / k_us, wall - k_us))
    return "\n".join(lines)


def markdown(text, skipped, gpu, version_line, command, date):
    notes = "".join("\nSkipped: %s." % why for why in skipped)
    return ("# Python per-call overhead, %s, %s\n\nCommand: `%s`\n\n%s.\n\n"
            "M=%d, N=%d, K=%d; QuantizedLinear fp16, INT4 group %d. host: the loop's time until "
            "the last call is issued, per call; wall: until one synchronize after it; kernel: "
            "CUDA events around a CUDA graph of %d launches (no host time); over kernel: wall - "
            "kernel.%s\n\n```\n%s\n```\n"
            % (gpu, date, command, version_line, M, N, K, GROUP, GRAPH_CALLS, notes, text))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=str(REPO / "benchmarks" / "results"),
                        help="directory of the markdown file (default: benchmarks/results)")
    parser.add_argument("--calls", type=int, default=2000, help="calls per timed loop")
    parser.add_argument("--loops", type=int, default=7, help="timed loops (the median is kept)")
    args = parser.parse_args()
    if ck.device_count() < 1:
        print("no CUDA device visible: nothing to measure")
        return EXIT_NO_DEVICE
    rows, skipped, gpu, version_line = run(args)
    text = table(rows)
    for why in skipped:
        print("skipped: %s" % why)
    print(text)
    date = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d")
    command = " ".join(["python3"] + [sys.argv[0]] + sys.argv[1:])
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    slug = re.sub(r"[^a-z0-9]+", "-", gpu.lower()).strip("-")
    path = out / ("python-overhead-%s-%s.md" % (slug, date))
    path.write_text(markdown(text, skipped, gpu, version_line, command, date))
    print("wrote %s" % path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
