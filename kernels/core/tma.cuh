// tma.cuh - the host side of TMA (the Hopper tensor memory accelerator): tensor maps, the
// descriptors that kernels take as __grid_constant__ parameters and hand to the copies of
// ptx_sm90.cuh (tma_load_2d). Plain host C++ in namespace ck, implemented in tma.cu; nothing here
// is exported.
#pragma once

#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace ck {

// The driver's cuTensorMapEncodeTiled, looked up once through the runtime (so the library needs
// no -lcuda); nullptr where the driver has none (before CUDA 12). Thread-safe.
PFN_cuTensorMapEncodeTiled_v12000 tensor_map_encoder();

// Whether this device can run the library's TMA + wgmma kernels: compute capability 9.0 (the
// sm_90a code they are built for) and a driver that encodes tensor maps. Their launchers also
// need a build with sm_90a (CK_BUILD_SM90A), which only their own files can see: they ask
// tma_wgmma_built_and_runnable().
bool tma_wgmma_runnable();
#ifdef CK_BUILD_SM90A
constexpr bool kTmaWgmmaBuilt = true;   // this file's sm_90 code is sm_90a
#else
constexpr bool kTmaWgmmaBuilt = false;  // empty fallbacks (or a file built without sm_90a)
#endif
// static: each file answers for its own build (kTmaWgmmaBuilt differs between files).
static inline bool tma_wgmma_built_and_runnable() { return kTmaWgmmaBuilt && tma_wgmma_runnable(); }

// A 2-D tensor map over a row-major matrix in global memory: `rows` rows of `row_length` elements
// of type `dtype`, starting at `base` and `row_stride_bytes` apart. One copy moves a box of
// box_rows x box_length elements (box_length along the row) into shared memory, laid out row by
// row and swizzled by `swizzle`; elements outside the matrix are filled with zeros, so partial
// tiles need no masking. The L2 is asked to fetch 256-byte lines.
// The driver's rules apply (it checks them; see cuTensorMapEncodeTiled in cuda.h): `map` 64-byte
// aligned, base 16-byte aligned, row_stride_bytes a multiple of 16, box sides 1 to 256 elements,
// a box row a multiple of 16 bytes and, swizzled, no longer than the swizzle span (128 bytes for
// CU_TENSOR_MAP_SWIZZLE_128B).
// Returns cudaErrorNotSupported without an encoder, cudaErrorInvalidValue where the driver
// refuses the map.
//
// Example, an int8 [rows, k] operand of a wgmma GEMM read in 128-byte K slices:
//   make_tensor_map_2d(&map, CU_TENSOR_MAP_DATA_TYPE_UINT8, a, rows, k, k, box_rows, 128,
//                      CU_TENSOR_MAP_SWIZZLE_128B);
cudaError_t make_tensor_map_2d(CUtensorMap* map, CUtensorMapDataType dtype, const void* base,
                               int64_t rows, int64_t row_length, int64_t row_stride_bytes,
                               int box_rows, int box_length, CUtensorMapSwizzle swizzle);

// A 3-D tensor map: dims[0] elements along the innermost dimension (contiguous), dims[1] and
// dims[2] along the outer ones, strides_bytes[0] and strides_bytes[1] apart (multiples of 16);
// one copy moves a box[0] x box[1] x box[2] box, laid out innermost first and swizzled as above.
// The same rules and errors as make_tensor_map_2d.
cudaError_t make_tensor_map_3d(CUtensorMap* map, CUtensorMapDataType dtype, const void* base,
                               const int64_t (&dims)[3], const int64_t (&strides_bytes)[2],
                               const int (&box)[3], CUtensorMapSwizzle swizzle);

}  // namespace ck
