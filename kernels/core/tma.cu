// tma.cu - the host side of TMA: the tensor-map encoder lookup, the tensor map builders and the
// runnable check declared in tma.cuh.
#include "kernels/core/tma.cuh"

#include "kernels/core/common.cuh"  // compute_capability

namespace ck {

PFN_cuTensorMapEncodeTiled_v12000 tensor_map_encoder() {
    // A function-local static: initialized once, thread-safe, on first use.
    static const PFN_cuTensorMapEncodeTiled_v12000 fn = [] {
        void* p = nullptr;
        cudaDriverEntryPointQueryResult found{};
        if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000,
                                             cudaEnableDefault, &found) != cudaSuccess ||
            found != cudaDriverEntryPointSuccess)
            p = nullptr;
        return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(p);
    }();
    return fn;
}

bool tma_wgmma_runnable() {
    return compute_capability() == 90 && tensor_map_encoder() != nullptr;
}

cudaError_t make_tensor_map_2d(CUtensorMap* map, CUtensorMapDataType dtype, const void* base,
                               int64_t rows, int64_t row_length, int64_t row_stride_bytes,
                               int box_rows, int box_length, CUtensorMapSwizzle swizzle) {
    const auto encode = tensor_map_encoder();
    if (!encode) return cudaErrorNotSupported;
    // The driver counts dimensions innermost first: along the row, then across rows.
    const cuuint64_t dims[2] = {cuuint64_t(row_length), cuuint64_t(rows)};
    const cuuint64_t strides[1] = {cuuint64_t(row_stride_bytes)};  // of dimension 1, in bytes
    const cuuint32_t box[2] = {cuuint32_t(box_length), cuuint32_t(box_rows)};
    const cuuint32_t element_strides[2] = {1, 1};
    // OOB_FILL_NONE fills out-of-bounds elements with zeros (the other mode gives NaNs).
    const CUresult r =
        encode(map, dtype, 2, const_cast<void*>(base), dims, strides, box, element_strides,
               CU_TENSOR_MAP_INTERLEAVE_NONE, swizzle, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
               CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    return r == CUDA_SUCCESS ? cudaSuccess : cudaErrorInvalidValue;
}

cudaError_t make_tensor_map_3d(CUtensorMap* map, CUtensorMapDataType dtype, const void* base,
                               const int64_t (&dims)[3], const int64_t (&strides_bytes)[2],
                               const int (&box)[3], CUtensorMapSwizzle swizzle) {
    const auto encode = tensor_map_encoder();
    if (!encode) return cudaErrorNotSupported;
    const cuuint64_t sizes[3] = {cuuint64_t(dims[0]), cuuint64_t(dims[1]), cuuint64_t(dims[2])};
    const cuuint64_t strides[2] = {cuuint64_t(strides_bytes[0]), cuuint64_t(strides_bytes[1])};
    const cuuint32_t boxes[3] = {cuuint32_t(box[0]), cuuint32_t(box[1]), cuuint32_t(box[2])};
    const cuuint32_t element_strides[3] = {1, 1, 1};
    const CUresult r =
        encode(map, dtype, 3, const_cast<void*>(base), sizes, strides, boxes, element_strides,
               CU_TENSOR_MAP_INTERLEAVE_NONE, swizzle, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
               CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    return r == CUDA_SUCCESS ? cudaSuccess : cudaErrorInvalidValue;
}

}  // namespace ck
