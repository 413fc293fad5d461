// tiled_sm90_explicit.h -- device functions of the explicit Hopper path (T.ws, T.mbarrier_*,
// T.tma_copy, T.fence_proxy_async; tiled/compiler/backends/cuda_explicit.py).
//
// Thin wrappers over tiled_sm90.h's primitives, with the signatures the generated code calls:
// barriers and shared tiles arrive as untyped pointers into the dynamic pool (TVM spells
// their element types its own way) and tensor maps as the `const void*` that points at the
// kernel's `const __grid_constant__ TensorMap` parameter.  Compiled for sm_90a device passes
// only, like tiled_sm90.h.
#ifndef TILED_SM90_EXPLICIT_H_
#define TILED_SM90_EXPLICIT_H_

#include "tiled_sm90.h"

#if TILED_SM90A_ENABLED

namespace tiled {
namespace sm90 {

__device__ __forceinline__ void bar_init(void* bar, uint32_t count) {
  mbarrier_init(static_cast<uint64_t*>(bar), count);
}

__device__ __forceinline__ void bar_arrive(void* bar) {
  mbarrier_arrive(static_cast<uint64_t*>(bar));
}

__device__ __forceinline__ void bar_wait(void* bar, uint32_t parity) {
  mbarrier_wait_parity(static_cast<uint64_t*>(bar), parity);
}

// Raises the current phase's expected transaction bytes without arriving (the explicit
// path keeps arrivals and bytes apart: T.mbarrier_arrive counts threads, this counts bytes).
__device__ __forceinline__ void bar_expect_tx(void* bar, uint32_t tx_bytes) {
  asm volatile("mbarrier.expect_tx.relaxed.cta.shared::cta.b64 [%0], %1;" ::"r"(
                   smem_addr(bar)),
               "r"(tx_bytes)
               : "memory");
}

// TMA load of the box at (c0 = column, c1 = row) of the 2-D tensor `map` describes into the
// dense row-major shared tile `dst` (SWIZZLE_NONE, 128-byte aligned); its bytes complete on
// `bar`.
__device__ __forceinline__ void tma_load_tile(void* dst, const void* map, void* bar, int32_t c0,
                                              int32_t c1) {
  tma_load_2d(dst, static_cast<const TensorMap*>(map), static_cast<uint64_t*>(bar), c0, c1);
}

// A barrier among the 128 threads of one warpgroup (named barrier ID, 1..15); the other
// warpgroups never join it, so a warpgroup region can synchronize its own shared accesses.
template <int ID>
__device__ __forceinline__ void warpgroup_sync() {
  asm volatile("bar.sync %0, 128;" ::"n"(ID) : "memory");
}

}  // namespace sm90
}  // namespace tiled

#endif  // TILED_SM90A_ENABLED
#endif  // TILED_SM90_EXPLICIT_H_
