"""The build and the C ABI as a C or C++ user meets them (CPU only, no GPU needed).

- cuda_kernels.h compiles as strict C99 and C++11, alone and beside <cuda_runtime_api.h>, where
  ck_stream_t and cudaStream_t are the same type;
- C++ sees the functions with C linkage;
- libcuda_kernels.so exports exactly the header's functions, all prefixed ck_;
- tests/c/smoke.c (strict C99, the header alone) builds and runs;
- `make install` puts the header, the library and a working pkg-config file in place.
"""
import os
import re
import shutil
import subprocess

import pytest

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HEADER = os.path.join(REPO_ROOT, "cuda_kernels.h")
LIBRARY = os.path.join(REPO_ROOT, "libcuda_kernels.so")
SMOKE_C = os.path.join(REPO_ROOT, "tests", "c", "smoke.c")
CUDA_HOME = os.environ.get("CUDA_HOME") or "/usr/local/cuda"
CUDA_INCLUDE = os.path.join(CUDA_HOME, "include")
CUDA_LIB = os.path.join(CUDA_HOME, "lib64")

C_STRICT = ["-std=c99", "-Wall", "-Wextra", "-Werror", "-pedantic"]
CXX_STRICT = ["-std=c++11", "-Wall", "-Wextra", "-Werror", "-pedantic"]


def header_functions():
    """Names of the functions the header declares with CK_API."""
    text = open(HEADER).read()
    text = re.sub(r"/\*.*?\*/", " ", text, flags=re.S)
    text = re.sub(r"//[^\n]*", " ", text)
    return sorted(re.findall(r"\bCK_API\b[^;(]*?\b(ck_\w+)\s*\(", text))


def header_version():
    """(major, minor, patch) from the CK_VERSION_* macros."""
    text = open(HEADER).read()
    return tuple(int(re.search(r"#define CK_VERSION_%s (\d+)" % part, text).group(1))
                 for part in ("MAJOR", "MINOR", "PATCH"))


VERSION = "%d.%d.%d" % header_version()


def need_tool(name):
    path = shutil.which(name)
    if path is None:
        pytest.skip("%s is not installed" % name)
    return path


def run(cmd, **kwargs):
    """Runs cmd; fails the test with its output if it exits non-zero."""
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          **kwargs)
    if proc.returncode != 0:
        pytest.fail("`%s` exited %d:\n%s" % (" ".join(cmd), proc.returncode, proc.stdout))
    return proc.stdout


@pytest.fixture(scope="module")
def library():
    if not os.path.isfile(LIBRARY):
        pytest.fail("%s is missing: run `make` first" % LIBRARY)
    return LIBRARY


def test_header_declares_functions():
    names = header_functions()
    assert "ck_version" in names and "ck_quantize_int8" in names, names
    assert len(names) == len(set(names)), "a function is declared twice"


# ------------------------------------------------------------------------------------------------
# The header as a compiler sees it
# ------------------------------------------------------------------------------------------------
# Every public type, enum and macro, used once, in the plainest C.
USES_EVERYTHING = r"""
#include "cuda_kernels.h"
#include "cuda_kernels.h" /* the include guard holds */

int uses_everything(void);
int uses_everything(void) {
    ck_status_t s = CK_STATUS_SUCCESS;
    ck_dtype_t d = CK_DTYPE_BF16;
    ck_granularity_t g = CK_PER_ROW;
    ck_scale_mode_t m = CK_SCALE_DYNAMIC;
    ck_int4_mode_t i4 = CK_INT4_ASYMMETRIC;
    ck_stream_t stream = 0;
    int64_t groups = ck_int4_groups_per_row(4096, CK_GROUP_ROW);
    (void)stream;
    return (int)s + (int)d + (int)g + (int)m + (int)i4 + (int)groups + CK_VERSION +
           CK_VERSION_MAJOR + CK_VERSION_MINOR + CK_VERSION_PATCH + CK_STATUS_INTERNAL_ERROR +
           CK_DTYPE_UINT8 + CK_PER_TENSOR + CK_SCALE_STATIC + CK_INT4_SYMMETRIC;
}
"""


def compile_source(tmp_path, compiler, flags, source, suffix, extra=()):
    path = tmp_path / ("tu" + suffix)
    path.write_text(source)
    return run([need_tool(compiler)] + flags + ["-I", REPO_ROOT] + list(extra) + [str(path)])


def test_header_compiles_as_strict_c99(tmp_path):
    compile_source(tmp_path, "gcc", C_STRICT + ["-fsyntax-only"], USES_EVERYTHING, ".c")


def test_header_compiles_as_strict_cxx11(tmp_path):
    compile_source(tmp_path, "g++", CXX_STRICT + ["-fsyntax-only"], USES_EVERYTHING, ".cpp")


def test_header_compiles_first_and_alone(tmp_path):
    """The header includes what it needs (stdint.h, stddef.h) itself."""
    compile_source(tmp_path, "gcc", C_STRICT + ["-fsyntax-only"],
                   '#include "cuda_kernels.h"\nint main(void) { return CK_VERSION > 0 ? 0 : 1; }\n',
                   ".c")


def test_cxx_sees_c_linkage(tmp_path):
    """Compiled as C++, every function still refers to its unmangled C symbol."""
    names = header_functions()
    source = '#include "cuda_kernels.h"\nvoid* const table[] = {\n%s\n};\n' % ",\n".join(
        "    reinterpret_cast<void*>(&%s)" % name for name in names)
    obj = tmp_path / "linkage.o"
    compile_source(tmp_path, "g++", CXX_STRICT + ["-c", "-o", str(obj)], source, ".cpp")
    undefined = set(run([need_tool("nm"), "-u", str(obj)]).split()) - {"U"}
    missing = [name for name in names if name not in undefined]
    assert not missing, "C++ refers to these with mangled names (no extern \"C\"?): %s" % missing


# ck_stream_t and cudaStream_t must be one type: passing either where the other is expected, with
# no cast, compiles warning-free in C and is an exact type match in C++.
WITH_CUDA_RUNTIME = r"""
#include <cuda_runtime_api.h>
#include "cuda_kernels.h"

ck_status_t launch_on(cudaStream_t stream);
ck_status_t launch_on(cudaStream_t stream) {
    ck_stream_t mine = stream;
    cudaStream_t theirs = mine;
    return ck_quantize_int8(0, CK_DTYPE_FP32, 1, 1, CK_PER_TENSOR, CK_SCALE_DYNAMIC, 0, 0, theirs);
}
#ifdef __cplusplus
#include <type_traits>
static_assert(std::is_same<ck_stream_t, cudaStream_t>::value, "ck_stream_t is cudaStream_t");
#endif
"""


@pytest.fixture(scope="module")
def cuda_include():
    if not os.path.isfile(os.path.join(CUDA_INCLUDE, "cuda_runtime_api.h")):
        pytest.skip("no CUDA toolkit headers under %s (set CUDA_HOME)" % CUDA_INCLUDE)
    return CUDA_INCLUDE


def test_header_beside_cuda_runtime_c(tmp_path, cuda_include):
    # No -pedantic: CUDA's own headers are not ISO C99 (anonymous unions).
    compile_source(tmp_path, "gcc", ["-std=c99", "-Wall", "-Wextra", "-Werror", "-fsyntax-only"],
                   WITH_CUDA_RUNTIME, ".c", extra=["-I", cuda_include])


def test_header_beside_cuda_runtime_c_pedantic_with_isystem(tmp_path, cuda_include):
    # As the Makefile builds tests/c/smoke.c: -pedantic for our code, CUDA's as a system header.
    compile_source(tmp_path, "gcc", C_STRICT + ["-fsyntax-only"], WITH_CUDA_RUNTIME, ".c",
                   extra=["-isystem", cuda_include])


def test_header_beside_cuda_runtime_cxx(tmp_path, cuda_include):
    compile_source(tmp_path, "g++", ["-std=c++11", "-Wall", "-Wextra", "-Werror", "-fsyntax-only"],
                   WITH_CUDA_RUNTIME, ".cpp", extra=["-I", cuda_include])


# ------------------------------------------------------------------------------------------------
# The shared library
# ------------------------------------------------------------------------------------------------
def exported_symbols(path):
    out = run([need_tool("nm"), "-D", "--defined-only", path])
    symbols = set()
    for line in out.splitlines():
        fields = line.split()
        if len(fields) >= 3:
            symbols.add(fields[2].split("@")[0])
    return symbols


def test_exports_only_ck_symbols(library):
    foreign = sorted(s for s in exported_symbols(library) if not s.startswith("ck_"))
    assert not foreign, "exported without the ck_ prefix: %s" % foreign


def test_exports_match_header(library):
    exported, declared = exported_symbols(library), set(header_functions())
    assert sorted(exported - declared) == [], "exported but not in cuda_kernels.h"
    assert sorted(declared - exported) == [], "declared in cuda_kernels.h but not exported"


def test_library_links_cudart_shared(library):
    """The wrapper (and every other user of cudart in the process) shares the library's
    cudart: it is a shared dependency, not linked in statically."""
    dynamic = run([need_tool("readelf"), "-d", library])
    needed = re.findall(r"\(NEEDED\)\s+Shared library: \[([^\]]+)\]", dynamic)
    assert any(n.startswith("libcudart.so") for n in needed), needed


# ------------------------------------------------------------------------------------------------
# tests/c/smoke.c: a C99 user of the header and the library
# ------------------------------------------------------------------------------------------------
def check_smoke_output(proc):
    assert proc.returncode == 0, "smoke exited %d:\n%s" % (proc.returncode, proc.stdout)
    assert "libcuda_kernels %s (header %s)" % (VERSION, VERSION) in proc.stdout, proc.stdout
    assert ("no CUDA device: skipping GPU part" in proc.stdout
            or "GPU round trip" in proc.stdout), proc.stdout
    assert proc.stdout.rstrip().endswith("OK"), proc.stdout


def test_c_smoke_builds_strict_and_runs(tmp_path, library, cuda_include):
    """Built the way the Makefile's $(BUILD)/c_smoke rule does, into a scratch directory."""
    exe = tmp_path / "c_smoke"
    run([need_tool("gcc")] + C_STRICT + ["-I", REPO_ROOT, "-isystem", cuda_include, SMOKE_C,
         "-L", REPO_ROOT, "-lcuda_kernels", "-L", CUDA_LIB, "-lcudart",
         "-Wl,-rpath," + REPO_ROOT, "-Wl,-rpath," + CUDA_LIB, "-o", str(exe)])
    proc = subprocess.run([str(exe)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True, timeout=120)
    check_smoke_output(proc)


def test_built_c_smoke_runs(library):
    exe = os.path.join(REPO_ROOT, "build", "c_smoke")
    if not os.path.isfile(exe):
        pytest.skip("build/c_smoke is not built (`make build/c_smoke`)")
    proc = subprocess.run([exe], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          timeout=120)
    check_smoke_output(proc)


# ------------------------------------------------------------------------------------------------
# make install
# ------------------------------------------------------------------------------------------------
def make_env():
    env = dict(os.environ)
    env.pop("MAKEFLAGS", None)
    env.pop("MFLAGS", None)
    return env


def test_make_install_dry_run_names_everything():
    out = run([need_tool("make"), "-n", "-C", REPO_ROOT, "install", "PREFIX=/tmp/x"],
              env=make_env())
    for what in ("cuda_kernels.h", "libcuda_kernels.so", "cuda_kernels.pc", "/tmp/x/include",
                 "/tmp/x/lib"):
        assert what in out, "`make -n install` does not mention %s:\n%s" % (what, out)


def test_make_install_into_destdir(tmp_path, library):
    """A real install into DESTDIR from a scratch copy of the build files (so that nothing in
    the repository is rebuilt or rewritten), then pkg-config and a C program against it."""
    work = tmp_path / "src"
    work.mkdir()
    for name in ("Makefile", "cuda_kernels.h", "cuda_kernels.map", "cuda_kernels.pc.in",
                 "libcuda_kernels.so"):
        shutil.copy2(os.path.join(REPO_ROOT, name), work / name)
    shutil.copytree(os.path.join(REPO_ROOT, "cmake"), work / "cmake")
    destdir, prefix = tmp_path / "root", "/opt/ck"
    # -o: the library is taken as it is, never rebuilt.
    run([need_tool("make"), "-C", str(work), "-o", "libcuda_kernels.so", "install",
         "DESTDIR=%s" % destdir, "PREFIX=%s" % prefix, "CUDA_HOME=%s" % CUDA_HOME],
        env=make_env())
    root = str(destdir) + prefix
    for rel in ("include/cuda_kernels.h", "lib/libcuda_kernels.so",
                "lib/pkgconfig/cuda_kernels.pc"):
        assert os.path.isfile(os.path.join(root, rel)), "not installed: %s" % rel
    assert open(os.path.join(root, "include/cuda_kernels.h")).read() == open(HEADER).read()

    pkg_config = need_tool("pkg-config")
    env = dict(os.environ, PKG_CONFIG_PATH=os.path.join(root, "lib", "pkgconfig"),
               PKG_CONFIG_LIBDIR=os.path.join(root, "lib", "pkgconfig"))
    assert run([pkg_config, "--modversion", "cuda_kernels"], env=env).strip() == VERSION
    flags = run([pkg_config, "--cflags", "--libs", "cuda_kernels"], env=env).split()
    assert "-I%s/include" % prefix in flags, flags
    assert "-L%s/lib" % prefix in flags and "-lcuda_kernels" in flags, flags

    # Compile and run a program with the installed tree (the sysroot maps /opt/ck into DESTDIR).
    env["PKG_CONFIG_SYSROOT_DIR"] = str(destdir)
    sys_flags = run([pkg_config, "--cflags", "--libs", "cuda_kernels"], env=env).split()
    program = tmp_path / "user.c"
    program.write_text('#include <cuda_kernels.h>\n#include <stdio.h>\n'
                       'int main(void) { printf("%d\\n", ck_version());\n'
                       '  return ck_version() == CK_VERSION ? 0 : 1; }\n')
    exe = tmp_path / "user"
    run([need_tool("gcc")] + C_STRICT + [str(program)] + sys_flags + ["-o", str(exe)])
    out = run([str(exe)], env=dict(os.environ, LD_LIBRARY_PATH=os.path.join(root, "lib")))
    major, minor, patch = header_version()
    assert out.strip() == str(major * 10000 + minor * 100 + patch)
