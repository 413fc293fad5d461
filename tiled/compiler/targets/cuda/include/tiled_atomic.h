// tiled_atomic.h -- atomic read-modify-writes of one global or shared element that CUDA's
// atomics lack: max / min (T.atomic_max, T.atomic_min) of every type, and add of the
// integer types atomicAdd has no overload for (8-, 16- and 64-bit).  Included by
// tiled_cuda.h.
//
// 32- and 64-bit integers use the hardware's atomicMax / atomicMin / atomicAdd.  Every other
// case (float, double, half, bfloat16, 8- and 16-bit integers) takes a compare-and-swap loop
// on the aligned word that holds the element: 4 bytes for types up to 4 bytes wide (the
// element's neighbours in that word are written back as they were read, so a concurrent
// CAS on a neighbour makes this one retry, never lose a write), 8 bytes for double.  Max /
// min stop without writing once the element already wins (max: old >= v), so a losing
// value costs one load.  NaN: a NaN `v` never replaces a number (comparisons with NaN are
// false); a NaN already stored stays.  Integer adds wrap (two's complement).  All return
// the element's old value.
#pragma once

namespace tiled {

namespace detail {

template <int BYTES>
struct word_of;
template <>
struct word_of<1> {
  using type = uint8_t;
};
template <>
struct word_of<2> {
  using type = unsigned short;
};
template <>
struct word_of<4> {
  using type = uint32_t;
};
template <>
struct word_of<8> {
  using type = unsigned long long;
};

template <typename T>
__host__ __device__ __forceinline__ typename word_of<sizeof(T)>::type bits_of(T x) {
  typename word_of<sizeof(T)>::type r;
  __builtin_memcpy(&r, &x, sizeof(T));
  return r;
}

template <typename T>
__host__ __device__ __forceinline__ T from_bits(typename word_of<sizeof(T)>::type b) {
  T x;
  __builtin_memcpy(&x, &b, sizeof(T));
  return x;
}

// Values compared as the C++ numbers they are; 16-bit floats through float.
template <typename T>
__host__ __device__ __forceinline__ auto comparable(T x) {
  return x;
}
__host__ __device__ __forceinline__ float comparable(half x) { return __half2float(x); }
__host__ __device__ __forceinline__ float comparable(__nv_bfloat16 x) {
  return __bfloat162float(x);
}

enum { OP_ADD = 0, OP_MAX = 1, OP_MIN = 2 };

// Whether `v` replaces `old` in a max or min.
template <int OP, typename T>
__host__ __device__ __forceinline__ bool wins(T v, T old) {
  return OP == OP_MAX ? comparable(v) > comparable(old) : comparable(v) < comparable(old);
}

// The element after the operation: in `out`, and whether it differs from `old`'s value.
template <int OP, typename T>
__host__ __device__ __forceinline__ bool apply(T old, T v, T& out) {
  if constexpr (OP == OP_ADD) {
    out = static_cast<T>(old + v);  // integers only (their native adds cover the rest)
    return true;
  } else {
    out = v;
    return wins<OP>(v, old);
  }
}

// The 32-bit `word` with its element of type T at byte offset `shift / 8` replaced by the
// operation's result (`word` itself when the element keeps its value).
template <int OP, typename T>
__host__ __device__ __forceinline__ uint32_t word_update(uint32_t word, int shift, T v) {
  static_assert(sizeof(T) <= 4, "word_update: T wider than the word");
  constexpr uint32_t mask = sizeof(T) == 4 ? 0xffffffffu : ((1u << (8 * sizeof(T))) - 1u);
  const T old = from_bits<T>(static_cast<typename word_of<sizeof(T)>::type>((word >> shift) & mask));
  T next;
  if (!apply<OP>(old, v, next)) return word;
  return (word & ~(mask << shift)) | ((static_cast<uint32_t>(bits_of(next)) & mask) << shift);
}

template <int OP, typename T>
__device__ __forceinline__ T atomic_cas_loop(T* addr, T v) {
  if constexpr (sizeof(T) == 8) {
    auto* w = reinterpret_cast<unsigned long long*>(addr);
    unsigned long long old = *w, assumed;
    do {
      assumed = old;
      T next;
      if (!apply<OP>(from_bits<T>(assumed), v, next)) break;
      old = atomicCAS(w, assumed, bits_of(next));
    } while (old != assumed);
    return from_bits<T>(old);
  } else {
    const size_t p = reinterpret_cast<size_t>(addr);
    auto* w = reinterpret_cast<unsigned int*>(p & ~static_cast<size_t>(3));
    const int shift = static_cast<int>(p & 3) * 8;
    unsigned int old = *w, assumed;
    do {
      assumed = old;
      const unsigned int next = word_update<OP, T>(assumed, shift, v);
      if (next == assumed) break;
      old = atomicCAS(w, assumed, next);
    } while (old != assumed);
    constexpr uint32_t mask = sizeof(T) == 4 ? 0xffffffffu : ((1u << (8 * sizeof(T))) - 1u);
    return from_bits<T>(static_cast<typename word_of<sizeof(T)>::type>((old >> shift) & mask));
  }
}

}  // namespace detail

template <typename T>
__device__ __forceinline__ T atomic_max(T* addr, T v) {
  return detail::atomic_cas_loop<detail::OP_MAX>(addr, v);
}
template <typename T>
__device__ __forceinline__ T atomic_min(T* addr, T v) {
  return detail::atomic_cas_loop<detail::OP_MIN>(addr, v);
}
// Integer adds atomicAdd has no overload for (8- and 16-bit: a CAS loop on the word).
template <typename T>
__device__ __forceinline__ T atomic_add(T* addr, T v) {
  return detail::atomic_cas_loop<detail::OP_ADD>(addr, v);
}

__device__ __forceinline__ int atomic_max(int* addr, int v) { return atomicMax(addr, v); }
__device__ __forceinline__ int atomic_min(int* addr, int v) { return atomicMin(addr, v); }
__device__ __forceinline__ unsigned atomic_max(unsigned* addr, unsigned v) {
  return atomicMax(addr, v);
}
__device__ __forceinline__ unsigned atomic_min(unsigned* addr, unsigned v) {
  return atomicMin(addr, v);
}
__device__ __forceinline__ int64_t atomic_max(int64_t* addr, int64_t v) {
  return atomicMax(reinterpret_cast<long long*>(addr), static_cast<long long>(v));
}
__device__ __forceinline__ int64_t atomic_min(int64_t* addr, int64_t v) {
  return atomicMin(reinterpret_cast<long long*>(addr), static_cast<long long>(v));
}
__device__ __forceinline__ uint64_t atomic_max(uint64_t* addr, uint64_t v) {
  return atomicMax(reinterpret_cast<unsigned long long*>(addr),
                   static_cast<unsigned long long>(v));
}
__device__ __forceinline__ uint64_t atomic_min(uint64_t* addr, uint64_t v) {
  return atomicMin(reinterpret_cast<unsigned long long*>(addr),
                   static_cast<unsigned long long>(v));
}
// 64-bit adds: the unsigned add is the signed one in two's complement.
__device__ __forceinline__ int64_t atomic_add(int64_t* addr, int64_t v) {
  return static_cast<int64_t>(atomicAdd(reinterpret_cast<unsigned long long*>(addr),
                                        static_cast<unsigned long long>(v)));
}
__device__ __forceinline__ uint64_t atomic_add(uint64_t* addr, uint64_t v) {
  return atomicAdd(reinterpret_cast<unsigned long long*>(addr),
                   static_cast<unsigned long long>(v));
}

// Two adjacent float32 elements of global memory, addr[0] += a and addr[1] += b, each
// atomic on its own (no old values): on sm_90 one vector reduction when addr is 8-byte
// aligned (REDG.E.ADD.F32x2: half the requests), else two. A T.Parallel nest of relaxed
// atomic adds over a wgmma accumulator takes it for the pairs of adjacent columns each
// thread holds (targets/cuda/parallel.py).
__device__ __forceinline__ void atomic_add_f32x2(float* addr, float a, float b) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  if ((reinterpret_cast<unsigned long long>(addr) & 7) == 0) {  // NVRTC has no uintptr_t
    asm volatile("red.global.add.v2.f32 [%0], {%1, %2};" ::"l"(addr), "f"(a), "f"(b)
                 : "memory");
    return;
  }
#endif
  atomicAdd(addr, a);
  atomicAdd(addr + 1, b);
}

}  // namespace tiled
