# cuda_kernels-config.cmake - the CMake package of libcuda_kernels, which `make install` puts in
# <prefix>/lib/cmake/cuda_kernels/:
#
#   find_package(cuda_kernels 0.1 REQUIRED)   # -DCMAKE_PREFIX_PATH=<prefix> outside system prefixes
#   target_link_libraries(app PRIVATE cuda_kernels::cuda_kernels)
#
# cuda_kernels::cuda_kernels is the shared library with <prefix>/include on its include path.
# cuda_kernels.h needs no CUDA header, so a C or C++ consumer compiles without a CUDA toolkit; the
# library finds the CUDA runtime and cuBLAS it was built against through its own run path. A
# program that makes CUDA calls of its own links CUDA::cudart (find_package(CUDAToolkit)) itself.
#
# The prefix is taken from this file's place, three levels up, so an installed tree can be moved
# or staged with DESTDIR and still be found.
get_filename_component(_ck_prefix "${CMAKE_CURRENT_LIST_DIR}/../../.." ABSOLUTE)
set(_ck_library "${_ck_prefix}/lib/libcuda_kernels.so")
set(_ck_include "${_ck_prefix}/include")

if(NOT EXISTS "${_ck_library}" OR NOT EXISTS "${_ck_include}/cuda_kernels.h")
  set(cuda_kernels_FOUND FALSE)
  set(cuda_kernels_NOT_FOUND_MESSAGE
      "${_ck_prefix} has no lib/libcuda_kernels.so or include/cuda_kernels.h (an incomplete install?)")
  unset(_ck_prefix)
  unset(_ck_library)
  unset(_ck_include)
  return()
endif()

if(NOT TARGET cuda_kernels::cuda_kernels)
  add_library(cuda_kernels::cuda_kernels SHARED IMPORTED)
  # The library has no SONAME: linked by its path, a program would record that absolute path as
  # its dependency; IMPORTED_NO_SONAME links it as -lcuda_kernels instead.
  set_target_properties(cuda_kernels::cuda_kernels PROPERTIES
    IMPORTED_LOCATION "${_ck_library}"
    IMPORTED_NO_SONAME TRUE
    INTERFACE_INCLUDE_DIRECTORIES "${_ck_include}")
endif()

unset(_ck_prefix)
unset(_ck_library)
unset(_ck_include)
