#!/usr/bin/env python3
"""What a PyTorch user would call for a 2:4 sparse fp16 layer instead of ck's sparse GEMM:
torch.sparse.to_sparse_semi_structured (cuSPARSELt or CUTLASS, whichever torch picks) through
F.linear, beside dense fp16 F.linear (cuBLAS), on the shapes of ck_bench's sparse family, timed
on the same GPU (run it beside ck_bench).

    python3 benchmarks/bench_sparse_torch.py [--out DIR] [--reps 50] [--only layer|seed]
                                             [--quick] [--force-cutlass]

Shapes as benchmarks/bench_sparse.cuh's: the layer shapes (K, N) = (4096, 4096),
(4096, 14336), (14336, 4096), (8192, 28672) at M = 1, 16, 64, 256, 1024, 4096, and the seed
shapes (1024, 1024), (5120, 5120), (16384, 16384), (20480, 5120), (5120, 20480) at M = 1, 16,
256; --quick: (4096, 4096) at M = 1, 16, 256 alone. fp16, x [M, K], the weight w [N, K]
(nn.Linear's layout), out = x @ w.T, no bias; x and w uniform in [-1, 1], w pruned to 2:4
along K by magnitude (the 2 largest |w| of every 4 kept), and the dense row multiplies the same
pruned w. The sparse weight is to_sparse_semi_structured(w); the backend column is its class,
SparseSemiStructuredTensorCUSPARSELT or SparseSemiStructuredTensorCUTLASS (--force-cutlass
sets SparseSemiStructuredTensor._FORCE_CUTLASS first; torch's default is cuSPARSELt). It is
called as F.linear(x, w_sparse), or where that fails as (w_sparse @ x.T).T; the note says which
form ran; where M is not a multiple of torch's minimum (8), torch pads x and copies the result
back out, and those kernels are in the sparse time. A shape torch refuses (the sparse
operand's dimensions must be multiples of a tile) gets the error in its note instead of a
time. The sparse output is checked against the dense one: a relative error (max |difference| /
max |dense|) above 1e-2 is noted.
TFLOP/s counts 2 M N K for both rows (the products the sparse call stands for, twice those its
tensor cores do); dense/2:4 is the dense time over the sparse one (above 1: sparse faster).

Timing: a CUDA graph of one call per input copy, replayed for about --reps calls after a
warm-up, CUDA events around the replays, the median of 5 loops (torch's host time per call,
the sparse tensor subclass's dispatch included, stays out, as ck_bench's graph replays keep the
library's out); the weights and inputs are rotated over enough copies that each call reads
them from DRAM (2 x 50 MB of L2 traffic between two uses). The table goes to stdout
and, as markdown with the GPU's name, the date and the command, to
DIR/sparse-torch-<gpu>-<date>.md. torch is this script's dependency only: the library never
imports it. Exit status: 0, 2 without torch (or without to_sparse_semi_structured) or a CUDA
device.
"""
import argparse
import datetime
import re
import sys
import warnings
from pathlib import Path

from bench_sdpa import copies_for, time_calls   # the same timing: CUDA graphs past the L2

EXIT_NO_DEVICE = 2
LAYER_SHAPES = [(4096, 4096), (4096, 14336), (14336, 4096), (8192, 28672)]  # K, N
LAYER_TOKENS = [1, 16, 64, 256, 1024, 4096]
SEED_SHAPES = [(1024, 1024), (5120, 5120), (16384, 16384), (20480, 5120), (5120, 20480)]
SEED_TOKENS = [1, 16, 256]
QUICK = [((4096, 4096), [1, 16, 256])]
SPARSE_BYTES_PER_WEIGHT = 9 / 8  # fp16 2:4: half the values + their metadata (cuSPARSELt's)
MISMATCH = 1e-2
REFUSALS = (RuntimeError, ValueError, TypeError, AssertionError)  # NotImplementedError, OOM too
FORMS = (  # the ways to call the sparse weight, in the order tried
    ("F.linear", lambda F, x, w: F.linear(x, w)),
    ("(w @ x.T).T", lambda F, x, w: (w @ x.t()).t()),
)


def first_line(e, width=120):
    text = str(e).strip()
    return (text.splitlines()[0] if text else type(e).__name__)[:width]


def run_case(torch, call, copies, reps):
    """One call on one shape: (us, note); us None where torch refuses it."""
    try:
        return time_calls(torch, call, copies, reps)
    except REFUSALS as e:
        return None, first_line(e)


def prune_2_4(torch, w):
    """w [N, K] with the 2 largest |w| of every 4 along K kept, the other 2 zeroed."""
    n, k = w.shape
    groups = w.view(n, k // 4, 4)
    keep = groups.abs().topk(2, dim=-1).indices
    mask = torch.zeros(groups.shape, dtype=torch.bool, device=w.device).scatter_(-1, keep, True)
    return (groups * mask).view(n, k)


def uniform(torch, *shape):
    return torch.rand(*shape, device="cuda", dtype=torch.float16) * 2 - 1


def sparse_class_name(torch):
    """The class to_sparse_semi_structured makes now (as torch picks it)."""
    semi = torch.sparse.SparseSemiStructuredTensor
    return ("SparseSemiStructuredTensorCUTLASS" if semi._FORCE_CUTLASS
            else "SparseSemiStructuredTensorCUSPARSELT")


def pick_form(F, xs, ws, reference):
    """The first form that runs on copy 0: (name, function, note) or (None, None, errors)."""
    errors = []
    for name, form in FORMS:
        try:
            out = form(F, xs[0], ws[0])
        except REFUSALS as e:
            errors.append(f"{name}: {first_line(e)}")
            continue
        note = name
        scale = reference.abs().max().item() or 1.0
        err = (out.float() - reference.float()).abs().max().item() / scale
        if not err <= MISMATCH:
            note += f", MISMATCH rel err {err:.2g}"
        return name, form, note
    return None, None, "; ".join(errors)


def shape_rows(torch, k, n, tokens, reps):
    """The rows of one weight shape (K, N), one per M: (shape, M, backend, dense us, sparse us,
    flops, note)."""
    import torch.nn.functional as F
    shape = f"K={k} N={n}"
    backend = sparse_class_name(torch)
    rows = []
    try:
        w = prune_2_4(torch, uniform(torch, n, k))
    except REFUSALS as e:  # out of memory
        return [(shape, m, backend, None, None, 2.0 * m * n * k, first_line(e)) for m in tokens]
    # Enough copies that the weight alone (the sparse one, the smaller) rotates past L2; the
    # activations only add to each call's traffic.
    copies = copies_for(SPARSE_BYTES_PER_WEIGHT * n * k)
    dense_ws = [w] + [w.clone() for _ in range(copies - 1)]
    sparse_ws, sparse_error = None, ""
    try:
        sparse_ws = [torch.sparse.to_sparse_semi_structured(w) for _ in range(copies)]
        backend = type(sparse_ws[0]).__name__
    except REFUSALS as e:  # the shape, the dtype or the GPU
        sparse_error = "to_sparse_semi_structured: " + first_line(e)
    torch.cuda.synchronize()
    for m in tokens:
        flops = 2.0 * m * n * k
        try:
            x = uniform(torch, m, k)
            xs = [x] + [x.clone() for _ in range(copies - 1)]
        except REFUSALS as e:
            rows.append((shape, m, backend, None, None, flops, first_line(e)))
            continue
        dense_us, dense_note = run_case(
            torch, lambda i: F.linear(xs[i], dense_ws[i]), copies, reps)
        notes = ["dense " + dense_note] if dense_note else []
        sparse_us = None
        if sparse_ws is None:
            notes.append(sparse_error)
        else:
            try:
                name, form, note = pick_form(F, xs, sparse_ws, F.linear(xs[0], dense_ws[0]))
            except REFUSALS as e:
                name, form, note = None, None, first_line(e)
            notes.append(note)
            if form is not None:
                sparse_us, sparse_note = run_case(
                    torch, lambda i: form(F, xs[i], sparse_ws[i]), copies, reps)
                if sparse_note:
                    notes.append(("" if sparse_us is None else "2:4 ") + sparse_note)
        rows.append((shape, m, backend, dense_us, sparse_us, flops, "; ".join(notes)))
        del xs, x
        torch.cuda.empty_cache()
    del dense_ws, sparse_ws, w
    torch.cuda.empty_cache()
    return rows


def cusparselt_version(torch):
    try:
        from torch.backends import cusparselt
        return str(cusparselt.version()) if cusparselt.is_available() else "not available"
    except (ImportError, AttributeError, RuntimeError):
        return "unknown"


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=None, help="write sparse-torch-<gpu>-<date>.md there")
    parser.add_argument("--reps", type=int, default=50)
    which = parser.add_mutually_exclusive_group()
    which.add_argument("--only", choices=("layer", "seed"), default=None,
                       help="run that set of shapes alone")
    which.add_argument("--quick", action="store_true",
                       help="one shape, (K, N) = (4096, 4096), at M = 1, 16, 256")
    parser.add_argument("--force-cutlass", action="store_true",
                        help="set SparseSemiStructuredTensor._FORCE_CUTLASS (torch's default: "
                             "cuSPARSELt)")
    args = parser.parse_args()
    try:
        import torch
    except ImportError:
        print("bench_sparse_torch: torch is not installed", file=sys.stderr)
        return EXIT_NO_DEVICE
    if not hasattr(torch.sparse, "to_sparse_semi_structured"):
        print(f"bench_sparse_torch: torch {torch.__version__} has no "
              "torch.sparse.to_sparse_semi_structured", file=sys.stderr)
        return EXIT_NO_DEVICE
    if not torch.cuda.is_available():
        print("bench_sparse_torch: no CUDA device", file=sys.stderr)
        return EXIT_NO_DEVICE
    warnings.filterwarnings("ignore", message="The PyTorch API of SparseSemiStructuredTensor")
    if args.force_cutlass:
        torch.sparse.SparseSemiStructuredTensor._FORCE_CUTLASS = True
    gpu = torch.cuda.get_device_name()
    if args.quick:
        problems = QUICK
    else:
        problems = ([(s, LAYER_TOKENS) for s in LAYER_SHAPES] if args.only != "seed" else [])
        problems += ([(s, SEED_TOKENS) for s in SEED_SHAPES] if args.only != "layer" else [])
    rows = []
    for (k, n), tokens in problems:
        rows += shape_rows(torch, k, n, tokens, args.reps)

    header = (f"{'shape':13} {'M':>5} {'backend':36} {'dense us':>9} {'2:4 us':>9} "
              f"{'dense/2:4':>9} {'dense TF/s':>10} {'2:4 TF/s':>9}  note")
    lines = [header, "-" * len(header)]
    for shape, m, backend, dense_us, sparse_us, flops, note in rows:
        def us_s(us):
            return f"{us:9.1f}" if us is not None else f"{'-':>9}"

        def tf_s(us, width):
            return f"{flops / us / 1e6:{width}.1f}" if us is not None else " " * width

        ratio = (f"{dense_us / sparse_us:9.2f}" if dense_us is not None and sparse_us is not None
                 else " " * 9)
        lines.append(f"{shape:13} {m:5d} {backend:36} {us_s(dense_us)} {us_s(sparse_us)} "
                     f"{ratio} {tf_s(dense_us, 10)} {tf_s(sparse_us, 9)}  {note}")
    table = "\n".join(lines)
    versions = (f"torch {torch.__version__}, CUDA {torch.version.cuda}, "
                f"cuSPARSELt {cusparselt_version(torch)}")
    print(f"{gpu}, {versions}")
    print(table)
    if args.out:
        date = datetime.date.today().isoformat()
        slug = re.sub(r"[^a-z0-9]+", "-", gpu.lower()).strip("-")
        path = Path(args.out) / f"sparse-torch-{slug}-{date}.md"
        path.parent.mkdir(parents=True, exist_ok=True)
        options = (" --quick" if args.quick else "") + \
            (f" --only {args.only}" if args.only else "") + \
            (" --force-cutlass" if args.force_cutlass else "")
        path.write_text(
            f"# PyTorch 2:4 semi-structured sparse fp16 (to_sparse_semi_structured) beside dense "
            f"fp16 F.linear on the sparse shapes, {gpu}, {date}\n\n"
            f"Command: `python3 benchmarks/bench_sparse_torch.py --out {args.out} "
            f"--reps {args.reps}{options}`; {versions}.\n\n"
            f"```\n{table}\n```\n")
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
