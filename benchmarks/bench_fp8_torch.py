#!/usr/bin/env python3
"""What a PyTorch user would call instead of ck_gemm_fp8_scaled: torch._scaled_mm with per-tensor
and with row-wise scales, beside the library's FP8 GEMM called from Python on the same torch
tensors (cuda_wrapper.gemm_fp8_scaled), on the shapes of ck_bench's fp8 family, timed on the same
GPU in the same run (run it beside ck_bench).

    python3 benchmarks/bench_fp8_torch.py [--out DIR] [--reps 50] [--quick]

Shapes as benchmarks/bench_fp8.cuh's: the layer shapes (K, N) = (4096, 4096), (4096, 14336),
(14336, 4096), (8192, 28672) at M = 1, 16, 64, 256, 1024, 4096; --quick: the first two shapes
at M = 16, 1024. a [M, K] and the weight b [N, K] (nn.Linear's layout) are float8_e4m3fn,
torch.randn rounded to E4M3 (the simple way: .to(torch.float8_e4m3fn)); the output is bf16, no
bias; the scales are float32 in [0.5, 1.5) on the device. Four columns per (shape, M):

  torch T  torch._scaled_mm(a, b.t(), scale_a=sa, scale_b=sb, out_dtype=torch.bfloat16) with
           sa, sb of shape () (per tensor): cuBLASLt's FP8 GEMM; b.t() is the column-major
           [K, N] operand _scaled_mm asks for, so no copy is made. use_fast_accum stays False
           (torch's default; sums promoted to float32, as the library does).
  ck T     ck.gemm_fp8_scaled(a_u8, b_u8, sa, sb, out_dtype="bf16", out=o) on uint8 views of
           the same float8 tensors (Tensor.view(torch.uint8): no copy), sa and sb 1 value each.
  torch R  the same _scaled_mm call with row-wise scales, sa [M, 1] and sb [1, N] float32 (what
           torch asks for them; it takes bf16 output only): CUTLASS's row-wise kernel, or
           cuBLASLt's where torch is built with cuBLAS 12.9+.
  ck R     the library with per-token x per-channel scales: the same values as 1-D views,
           sa [M] and sb [N].

The library call runs on torch's current stream (the capture stream inside torch.cuda.graph)
and, with out= preallocated, allocates and synchronizes nothing, so it is captured as torch's
calls are; its kernel is its own choice for the shape (CK_GEMM_FP8_KERNEL unset: "auto").
Before timing, each column's output on the first input copy is compared with a float32
product of the same E4M3 values times the same scales (TF32 off): a relative error (max
|difference| / max |reference|) above 1e-2 is noted. A call torch or the library refuses gets
the error in its note instead of a time. TFLOP/s counts 2 M N K; "speedup" is torch's time
over the library's with the same scales (above 1: the library faster).

Timing (bench_sdpa.time_calls): a CUDA graph of one call per input copy, replayed for about
--reps calls after a warm-up, CUDA events around the replays, the median of 5 loops (the host
time per call, torch's dispatch and the wrapper's argument checks, stays out, as ck_bench's
graph replays keep the library's out); where a call cannot be captured it is timed directly,
"eager" in its note. Every call of a row reads a, b, the scales and (the library) out from the
rotated copies, enough of them that each call reads its operands from DRAM (2 x 50 MB of L2
traffic between two uses, counting M K + N K + 2 M N bytes a call). The table goes to stdout
and, as markdown with the GPU's name, the date and the command, to
DIR/fp8-torch-<gpu>-<date>.md. torch is this script's dependency only: the library never
imports it. Exit status: 0; 1 without a loadable libcuda_kernels.so (run make); 2 without
torch (or without its FP8 GEMM) or a CUDA device.
"""
import argparse
import sys
from pathlib import Path

from bench_sdpa import copies_for, result_path, time_calls   # bench_sdpa's timing, output

REPO = Path(__file__).resolve().parent.parent   # cuda_wrapper.py lives there
EXIT_NO_LIBRARY = 1
EXIT_NO_DEVICE = 2
LAYER_SHAPES = [(4096, 4096), (4096, 14336), (14336, 4096), (8192, 28672)]  # K, N
LAYER_TOKENS = [1, 16, 64, 256, 1024, 4096]
QUICK_SHAPES = LAYER_SHAPES[:2]
QUICK_TOKENS = [16, 1024]
COLUMNS = ("torch T", "ck T", "torch R", "ck R")   # T: per-tensor scales, R: per-row scales
# bf16 rounds each output by at most 2^-9 of its float32 value, far below this; a wrong scale
# layout or operand order gives errors of order 1.
MISMATCH = 1e-2
REFUSALS = (RuntimeError, ValueError, TypeError, AssertionError)  # NotImplementedError, OOM too


def first_line(e, width=100):
    text = str(e).strip()
    return (text.splitlines()[0] if text else type(e).__name__)[:width]


def load_wrapper():
    """(cuda_wrapper module, None), or (None, why) where the library cannot be loaded."""
    sys.path.insert(0, str(REPO))
    import cuda_wrapper as ck
    try:
        ck.load_library()
    except ck.LibraryNotFoundError as e:
        return None, str(e)
    return ck, None


def scaled_mm(torch, a, b_t, scale_a, scale_b):
    """torch._scaled_mm to bf16; the output alone (torch before 2.4 also returns an amax)."""
    out = torch._scaled_mm(a, b_t, scale_a=scale_a, scale_b=scale_b, out_dtype=torch.bfloat16)
    return out[0] if isinstance(out, tuple) else out


def relative_error(out, reference):
    scale = reference.abs().max().item() or 1.0
    return (out.float() - reference).abs().max().item() / scale


def run_column(torch, call, reference, copies, reps):
    """One column of one row: (us, note); us None where the call is refused. The output of
    copy 0, made eagerly, is checked against `reference` before the timing."""
    try:
        out = call(0)
        torch.cuda.synchronize()
        err = relative_error(out, reference)
        del out
        us, note = time_calls(torch, call, copies, reps)
    except REFUSALS as e:
        return None, first_line(e)
    if not err <= MISMATCH:
        note = f"MISMATCH rel err {err:.2g}" + (", " + note if note else "")
    return us, note


def fp8(torch, *shape):
    return torch.randn(*shape, device="cuda").to(torch.float8_e4m3fn)


def scales(torch, shape):
    return torch.rand(shape, device="cuda") + 0.5


def row(torch, ck, k, n, m, weights, reps):
    """The four columns at one M: (shape, M, {column: us}, flops, note)."""
    shape = f"K={k} N={n}"
    flops = 2.0 * m * n * k
    copies = copies_for(m * k + n * k + 2 * m * n)
    ws = weights[:copies]
    try:
        xs = [fp8(torch, m, k) for _ in range(copies)]
        st_a = [scales(torch, ()) for _ in range(copies)]       # per tensor: shape ()
        st_b = [scales(torch, ()) for _ in range(copies)]
        sr_a = [scales(torch, (m, 1)) for _ in range(copies)]   # row-wise: [M, 1], [1, N]
        sr_b = [scales(torch, (1, n)) for _ in range(copies)]
        outs = [torch.empty(m, n, device="cuda", dtype=torch.bfloat16) for _ in range(copies)]
        xs_u8 = [x.view(torch.uint8) for x in xs]
        ws_u8 = [w.view(torch.uint8) for w in ws]
        ck_ta, ck_tb = [s.view(1) for s in st_a], [s.view(1) for s in st_b]
        ck_ra, ck_rb = [s.view(m) for s in sr_a], [s.view(n) for s in sr_b]
        product = xs[0].float() @ ws[0].float().t()
        reference_t = product * st_a[0] * st_b[0]
        reference_r = product * sr_a[0] * sr_b[0]
        del product
    except REFUSALS as e:  # out of memory
        return shape, m, {}, flops, first_line(e)
    calls = {
        "torch T": (lambda i: scaled_mm(torch, xs[i], ws[i].t(), st_a[i], st_b[i]), reference_t),
        "ck T": (lambda i: ck.gemm_fp8_scaled(xs_u8[i], ws_u8[i], ck_ta[i], ck_tb[i],
                                              out_dtype="bf16", out=outs[i]), reference_t),
        "torch R": (lambda i: scaled_mm(torch, xs[i], ws[i].t(), sr_a[i], sr_b[i]), reference_r),
        "ck R": (lambda i: ck.gemm_fp8_scaled(xs_u8[i], ws_u8[i], ck_ra[i], ck_rb[i],
                                              out_dtype="bf16", out=outs[i]), reference_r),
    }
    times, notes = {}, []
    for name in COLUMNS:
        call, reference = calls[name]
        times[name], note = run_column(torch, call, reference, copies, reps)
        if note:
            notes.append(f"{name}: {note}")
    return shape, m, times, flops, "; ".join(notes)


def shape_rows(torch, ck, k, n, tokens, reps):
    """The rows of one weight shape (K, N), one per M. The weight copies are made once, as
    many as the smallest M needs (the most); a row uses as many as its own traffic needs."""
    try:
        w = fp8(torch, n, k)
        weights = [w] + [w.clone() for _ in range(copies_for(n * k) - 1)]
    except REFUSALS as e:  # out of memory
        return [(f"K={k} N={n}", m, {}, 2.0 * m * n * k, first_line(e)) for m in tokens]
    rows = [row(torch, ck, k, n, m, weights, reps) for m in tokens]
    del weights, w
    torch.cuda.empty_cache()
    return rows


def render(rows):
    header = (f"{'shape':15} {'M':>5} {'torch T us':>10} {'ck T us':>9} {'T speedup':>9} "
              f"{'torch R us':>10} {'ck R us':>9} {'R speedup':>9} {'torch T TF/s':>12} "
              f"{'ck T TF/s':>9} {'torch R TF/s':>12} {'ck R TF/s':>9}  note")
    lines = [header, "-" * len(header)]
    for shape, m, times, flops, note in rows:
        def us_s(name, width):
            us = times.get(name)
            return f"{us:{width}.1f}" if us is not None else f"{'-':>{width}}"

        def tf_s(name, width):
            us = times.get(name)
            return f"{flops / us / 1e6:{width}.1f}" if us is not None else " " * width

        def speedup(torch_name, ck_name):
            t, c = times.get(torch_name), times.get(ck_name)
            return f"{t / c:9.2f}" if t is not None and c is not None else " " * 9

        lines.append(
            f"{shape:15} {m:5d} {us_s('torch T', 10)} {us_s('ck T', 9)} "
            f"{speedup('torch T', 'ck T')} {us_s('torch R', 10)} {us_s('ck R', 9)} "
            f"{speedup('torch R', 'ck R')} {tf_s('torch T', 12)} {tf_s('ck T', 9)} "
            f"{tf_s('torch R', 12)} {tf_s('ck R', 9)}  {note}".rstrip())
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=None, help="write fp8-torch-<gpu>-<date>.md there")
    parser.add_argument("--reps", type=int, default=50)
    parser.add_argument("--quick", action="store_true",
                        help="the first two shapes at M = 16, 1024")
    args = parser.parse_args()
    try:
        import torch
    except ImportError:
        print("bench_fp8_torch: torch is not installed", file=sys.stderr)
        return EXIT_NO_DEVICE
    if not hasattr(torch, "_scaled_mm") or not hasattr(torch, "float8_e4m3fn"):
        print(f"bench_fp8_torch: torch {torch.__version__} has no torch._scaled_mm or "
              "float8_e4m3fn", file=sys.stderr)
        return EXIT_NO_DEVICE
    if not torch.cuda.is_available():
        print("bench_fp8_torch: no CUDA device", file=sys.stderr)
        return EXIT_NO_DEVICE
    ck, why = load_wrapper()
    if ck is None:
        print(f"bench_fp8_torch: {why}", file=sys.stderr)
        return EXIT_NO_LIBRARY
    # The reference products are float32 sums of exact products: no TF32 rounding of the
    # operands (the FP8 calls do not read this flag).
    torch.backends.cuda.matmul.allow_tf32 = False
    gpu = torch.cuda.get_device_name()
    shapes, tokens = (QUICK_SHAPES, QUICK_TOKENS) if args.quick else (LAYER_SHAPES, LAYER_TOKENS)
    rows = []
    for k, n in shapes:
        rows += shape_rows(torch, ck, k, n, tokens, args.reps)

    table = render(rows)
    versions = (f"torch {torch.__version__}, CUDA {torch.version.cuda}, "
                f"libcuda_kernels {ck.version()}")
    legend = ("T: per-tensor scales; R: per-row scales (torch row-wise, the library's "
              "per-token x per-channel); speedup: torch us / ck us (above 1: the library faster)")
    print(f"{gpu}, {versions}")
    print(legend)
    print(table)
    if args.out:
        path, date = result_path(args.out, "fp8-torch", gpu)
        path.write_text(
            f"# torch._scaled_mm (per-tensor, row-wise) beside ck_gemm_fp8_scaled from Python on "
            f"the FP8 layer shapes, bf16 out, {gpu}, {date}\n\n"
            f"Command: `python3 benchmarks/bench_fp8_torch.py --out {args.out} "
            f"--reps {args.reps}{' --quick' if args.quick else ''}`; {versions}.\n\n"
            f"{legend}.\n\n"
            f"```\n{table}\n```\n")
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
