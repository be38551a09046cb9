"""`make install` as a C or C++ project meets it (CPU only, no GPU needed).

One install into a scratch prefix, of the library that `make` already built (never rebuilt), then:
- the tree holds the header, the library, cuda_kernels.pc and the CMake package;
- pkg-config reports the header's version and flags that build and run a C program;
- a CMake project (C only: the header needs no CUDA) finds the package with find_package, links
  cuda_kernels::cuda_kernels and runs, calling ck_version() and ck_status_string();
- the package's version file accepts what it should (this version, a lower patch, a range) and
  refuses the rest (a later minor, another major).
The CMake tests skip where cmake is not installed.
"""
import os
import re
import shutil
import subprocess

import pytest

from test_build import header_version, make_env, need_tool, run

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HEADER = os.path.join(REPO_ROOT, "cuda_kernels.h")
LIBRARY = os.path.join(REPO_ROOT, "libcuda_kernels.so")
CUDA_HOME = os.environ.get("CUDA_HOME") or "/usr/local/cuda"

# What `make install` reads; copied to a scratch directory so that nothing in the repository is
# rebuilt or rewritten (install regenerates cuda_kernels.pc for its PREFIX).
INSTALL_INPUTS = ["Makefile", "cuda_kernels.h", "cuda_kernels.map", "cuda_kernels.pc.in",
                  "libcuda_kernels.so", "cmake"]
INSTALLED = ["include/cuda_kernels.h", "lib/libcuda_kernels.so", "lib/pkgconfig/cuda_kernels.pc",
             "lib/cmake/cuda_kernels/cuda_kernels-config.cmake",
             "lib/cmake/cuda_kernels/cuda_kernels-config-version.cmake"]


MAJOR, MINOR, PATCH = header_version()
VERSION = "%d.%d.%d" % (MAJOR, MINOR, PATCH)
ENCODED = MAJOR * 10000 + MINOR * 100 + PATCH


@pytest.fixture(scope="module")
def prefix(tmp_path_factory):
    """`make install PREFIX=<scratch>` from a copy of the build files; the installed prefix."""
    if not os.path.isfile(LIBRARY):
        pytest.fail("%s is missing: run `make` first" % LIBRARY)
    root = tmp_path_factory.mktemp("install")
    work = root / "src"
    work.mkdir()
    for name in INSTALL_INPUTS:
        source = os.path.join(REPO_ROOT, name)
        if os.path.isdir(source):
            shutil.copytree(source, work / name)
        else:
            shutil.copy2(source, work / name)
    installed = root / "prefix"
    # -o: the library is taken as it is, never rebuilt (the copy has no sources anyway).
    run([need_tool("make"), "-C", str(work), "-o", "libcuda_kernels.so", "install",
         "PREFIX=%s" % installed, "CUDA_HOME=%s" % CUDA_HOME], env=make_env())
    return installed


def test_install_puts_everything_in_place(prefix):
    for rel in INSTALLED:
        assert (prefix / rel).is_file(), "not installed: %s" % rel
    assert (prefix / "include/cuda_kernels.h").read_text() == open(HEADER).read()
    assert os.access(prefix / "lib/libcuda_kernels.so", os.X_OK)
    version_file = (prefix / "lib/cmake/cuda_kernels/cuda_kernels-config-version.cmake")
    assert 'set(PACKAGE_VERSION "%s")' % VERSION in version_file.read_text()


# A C99 program that uses the C ABI through the installed header alone.
MAIN_C = r"""
#include <stdio.h>
#include <cuda_kernels.h>

int main(void) {
    printf("ck_version %d header %d\n", ck_version(), CK_VERSION);
    printf("%s %s\n", ck_status_string(CK_STATUS_SUCCESS), ck_status_string(CK_STATUS_MISALIGNED));
    return ck_version() == CK_VERSION ? 0 : 1;
}
"""


def check_program_output(out):
    lines = out.splitlines()
    assert lines[0] == "ck_version %d header %d" % (ENCODED, ENCODED), out
    assert lines[1] == "CK_STATUS_SUCCESS CK_STATUS_MISALIGNED", out


def test_pkg_config_builds_and_runs_a_program(prefix, tmp_path):
    pkg_config = need_tool("pkg-config")
    pc_dir = str(prefix / "lib" / "pkgconfig")
    env = dict(os.environ, PKG_CONFIG_PATH=pc_dir, PKG_CONFIG_LIBDIR=pc_dir)
    assert run([pkg_config, "--modversion", "cuda_kernels"], env=env).strip() == VERSION
    assert run([pkg_config, "--variable=prefix", "cuda_kernels"], env=env).strip() == str(prefix)
    flags = run([pkg_config, "--cflags", "--libs", "cuda_kernels"], env=env).split()
    assert "-I%s/include" % prefix in flags, flags
    assert "-L%s/lib" % prefix in flags and "-lcuda_kernels" in flags, flags
    source, exe = tmp_path / "main.c", tmp_path / "main"
    source.write_text(MAIN_C)
    run([need_tool("gcc"), "-std=c99", "-Wall", "-Wextra", "-Werror", "-pedantic", str(source)]
        + flags + ["-o", str(exe)])
    # The run path from the .pc file finds the library: no LD_LIBRARY_PATH.
    check_program_output(run([str(exe)]))


# ------------------------------------------------------------------------------------------------
# find_package(cuda_kernels)
# ------------------------------------------------------------------------------------------------
CONSUMER_CMAKE = """
cmake_minimum_required(VERSION 3.16)
project(ck_consumer LANGUAGES C)
find_package(cuda_kernels %s REQUIRED)
message(STATUS "cuda_kernels_VERSION=${cuda_kernels_VERSION}")
add_executable(consumer main.c)
set_target_properties(consumer PROPERTIES C_STANDARD 99 C_STANDARD_REQUIRED ON C_EXTENSIONS OFF)
target_compile_options(consumer PRIVATE -Wall -Wextra -Werror -pedantic)
target_link_libraries(consumer PRIVATE cuda_kernels::cuda_kernels)
"""


def cmake_configure(source_dir, build_dir, prefix, check=True):
    cmd = [need_tool("cmake"), "-S", str(source_dir), "-B", str(build_dir),
           "-DCMAKE_PREFIX_PATH=%s" % prefix, "-DCMAKE_BUILD_TYPE=Release"]
    if check:
        return run(cmd)
    return subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def test_cmake_consumer_builds_and_runs(prefix, tmp_path):
    cmake = need_tool("cmake")
    source_dir, build_dir = tmp_path / "consumer", tmp_path / "build"
    source_dir.mkdir()
    (source_dir / "CMakeLists.txt").write_text(CONSUMER_CMAKE % ("%d.%d" % (MAJOR, MINOR)))
    (source_dir / "main.c").write_text(MAIN_C)
    configured = cmake_configure(source_dir, build_dir, prefix)
    assert "cuda_kernels_VERSION=%s" % VERSION in configured, configured
    run([cmake, "--build", str(build_dir)])
    exe = str(build_dir / "consumer")
    check_program_output(run([exe]))

    # The program names the library, not the path it was linked from (the library has no
    # SONAME), and finds it through the build tree's run path.
    dynamic = run([need_tool("readelf"), "-d", exe])
    needed = re.findall(r"\(NEEDED\)\s+Shared library: \[([^\]]+)\]", dynamic)
    assert "libcuda_kernels.so" in needed, needed
    assert str(prefix / "lib") in dynamic, dynamic


def test_cmake_package_survives_a_move(prefix, tmp_path):
    """The package finds its files from its own place: a copied prefix is found where it lands."""
    moved = tmp_path / "moved"
    shutil.copytree(prefix, moved, symlinks=True)
    source_dir = tmp_path / "probe"
    source_dir.mkdir()
    (source_dir / "CMakeLists.txt").write_text(
        "cmake_minimum_required(VERSION 3.16)\nproject(probe NONE)\n"
        "find_package(cuda_kernels REQUIRED)\n"
        "get_target_property(location cuda_kernels::cuda_kernels IMPORTED_LOCATION)\n"
        "get_target_property(include cuda_kernels::cuda_kernels INTERFACE_INCLUDE_DIRECTORIES)\n"
        'message(STATUS "location=${location}")\nmessage(STATUS "include=${include}")\n')
    out = cmake_configure(source_dir, tmp_path / "build", moved)
    assert "location=%s/lib/libcuda_kernels.so" % moved in out, out
    assert "include=%s/include" % moved in out, out


# (requested version, accepted): the rule of cuda_kernels-config-version.cmake.in.
def version_cases():
    later_minor = "%d.%d" % (MAJOR, MINOR + 1)
    cases = [(VERSION, True), ("%d.%d" % (MAJOR, MINOR), True), (later_minor, False),
             ("%d.0" % (MAJOR + 1), False), ("%d.%d...%d.0" % (MAJOR, MINOR, MAJOR + 1), True),
             ("%s...<%s" % (later_minor, "%d.0" % (MAJOR + 2)), False)]
    if PATCH > 0:
        cases.append(("%d.%d.%d" % (MAJOR, MINOR, PATCH - 1), True))
    if MAJOR == 0 and MINOR > 0:
        cases.append(("0.%d" % (MINOR - 1), False))   # before 1.0 the minor version must match
    if MAJOR > 0:
        cases.append(("%d.0" % MAJOR, True))
    return cases


def cmake_version():
    out = run([need_tool("cmake"), "--version"])
    return tuple(int(x) for x in re.search(r"version (\d+)\.(\d+)", out).groups())


def test_cmake_version_file(prefix, tmp_path):
    if cmake_version() < (3, 19):
        pytest.skip("cmake %d.%d: version ranges in find_package need 3.19" % cmake_version())
    cases = version_cases()
    lines = ["cmake_minimum_required(VERSION 3.19)", "project(versions NONE)"]
    for i, (requested, _) in enumerate(cases):
        # Each find_package in its own function scope, so that one result does not leak into the
        # next (find_package caches cuda_kernels_DIR, which is what every case should reuse).
        lines += ["function(case_%d)" % i,
                  "  find_package(cuda_kernels %s QUIET)" % requested,
                  '  message(STATUS "case %d ${cuda_kernels_FOUND}")' % i,
                  "endfunction()", "case_%d()" % i]
    source_dir = tmp_path / "versions"
    source_dir.mkdir()
    (source_dir / "CMakeLists.txt").write_text("\n".join(lines) + "\n")
    out = cmake_configure(source_dir, tmp_path / "build", prefix)
    for i, (requested, accepted) in enumerate(cases):
        found = re.search(r"case %d (\S+)" % i, out)
        assert found, out
        assert (found.group(1) == "1") == accepted, \
            "find_package(cuda_kernels %s): found=%s, expected %s" % (
                requested, found.group(1), accepted)


def test_cmake_reports_an_incomplete_install(prefix, tmp_path):
    broken = tmp_path / "broken"
    shutil.copytree(prefix, broken, symlinks=True)
    os.remove(broken / "lib" / "libcuda_kernels.so")
    source_dir = tmp_path / "probe"
    source_dir.mkdir()
    (source_dir / "CMakeLists.txt").write_text(
        "cmake_minimum_required(VERSION 3.16)\nproject(probe NONE)\n"
        "find_package(cuda_kernels REQUIRED)\n")
    proc = cmake_configure(source_dir, tmp_path / "build", broken, check=False)
    assert proc.returncode != 0, proc.stdout
    # CMake wraps the package's message at its own width.
    assert "has no lib/libcuda_kernels.so" in " ".join(proc.stdout.split()), proc.stdout
