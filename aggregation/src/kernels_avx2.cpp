// AVX2 + F16C path: 256-bit vectors, scalar reference for the tail.
//
// Every function carries TD_AVX2 (a target attribute) instead of the file being compiled with
// -mavx2, so inline functions shared with other translation units are never compiled for AVX2
// behind the linker's back, and clang and GCC both build this file.
#include <immintrin.h>

#include "scalar_ops.h"
#include "table.h"

#define TD_AVX2 __attribute__((target("avx2,f16c"))) inline

namespace treeduce::agg::detail {
namespace {

// ---- vectors: __m256 (8 binary32 lanes) for f32 and the narrow floats, __m256d (4 lanes) for
// f64, __m256i for the integer types in their own width (32, 16, 8 or 4 lanes). Selected by
// specialisation: std::conditional_t would drop the vector types' attributes.

enum class Kind { ps, pd, si };
constexpr Kind kind(DType d) noexcept {
  return is_integer(d) ? Kind::si : d == DType::f64 ? Kind::pd : Kind::ps;
}
template <Kind K>
struct V {
  using type = __m256;
};
template <>
struct V<Kind::pd> {
  using type = __m256d;
};
template <>
struct V<Kind::si> {
  using type = __m256i;
};
template <DType D>
using Vec = typename V<kind(D)>::type;

/// Elements per vector: 32 bytes over the accumulator element.
template <DType D>
constexpr std::size_t kLanes = 32 / acc_size(D);

// ---- widening loads: one vector of elements at index i into accumulator lanes ------------------

TD_AVX2 __m256 e4m3_to_ps(__m128i bytes8) {
  // E4M3 -> binary16 is a shift (exponent bias 7 vs 15 handled by scaling with 2^8 afterwards,
  // which is exact and turns E4M3 subnormals into correct binary32 values). Only S.1111.111 (NaN)
  // needs a fix: it lands on +-480, a value no E4M3 encoding has.
  const __m128i w = _mm_cvtepu8_epi16(bytes8);
  const __m128i h = _mm_or_si128(_mm_slli_epi16(_mm_and_si128(w, _mm_set1_epi16(0x7F)), 7),
                                 _mm_slli_epi16(_mm_and_si128(w, _mm_set1_epi16(0x80)), 8));
  const __m256 f = _mm256_mul_ps(_mm256_cvtph_ps(h), _mm256_set1_ps(256.0f));
  const __m256 abs = _mm256_andnot_ps(_mm256_set1_ps(-0.0f), f);
  const __m256 nan = _mm256_cmp_ps(abs, _mm256_set1_ps(480.0f), _CMP_EQ_OQ);
  // +-480 is 0x43F00000; OR 0x7FF00000 gives the widened NaN S.0x7FF00000 of convert.h.
  return _mm256_or_ps(f, _mm256_and_ps(nan, _mm256_castsi256_ps(_mm256_set1_epi32(0x7FF00000))));
}

template <DType D>
TD_AVX2 Vec<D> load_widen(const void* p, std::size_t i) {
  const auto* b = static_cast<const unsigned char*>(p) + i * dtype_size(D);
  if constexpr (D == DType::f32) {
    return _mm256_loadu_ps(reinterpret_cast<const float*>(b));
  } else if constexpr (is_integer(D)) {
    return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b));
  } else if constexpr (D == DType::f64) {
    return _mm256_loadu_pd(reinterpret_cast<const double*>(b));
  } else if constexpr (D == DType::f16) {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b)));
  } else if constexpr (D == DType::bf16) {
    const __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b)));
    return _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
  } else if constexpr (D == DType::e5m2) {
    // E5M2 is the top byte of a binary16.
    const __m128i w = _mm_cvtepu8_epi16(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(b)));
    return _mm256_cvtph_ps(_mm_slli_epi16(w, 8));
  } else {
    return e4m3_to_ps(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(b)));
  }
}

// ---- narrowing stores
// ----------------------------------------------------------------------------

TD_AVX2 __m256i nan_mask_epi32(__m256 v) {
  return _mm256_castps_si256(_mm256_cmp_ps(v, v, _CMP_UNORD_Q));
}

// 8 int32 lanes, each < 2^16, to 8 uint16 in order.
TD_AVX2 __m128i pack_u32_to_u16(__m256i v) {
  return _mm_packus_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
}

// FP8 narrowing on the binary32 bits: integer round-to-nearest-even of the significand for normal
// results, a float multiply + cvtps (round-to-nearest-even in the default MXCSR) for subnormal
// ones, a clamp for overflow (to infinity for E5M2, to 448 for E4M3), canonical NaN.
template <int kMan, int kBias, int kMaxBits, int kNanBits>
TD_AVX2 __m256i narrow_fp8_epi32(__m256 v) {
  constexpr int kShift = 23 - kMan;
  const __m256i x = _mm256_castps_si256(v);
  const __m256i a = _mm256_and_si256(x, _mm256_set1_epi32(0x7FFFFFFF));
  const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(a, kShift), _mm256_set1_epi32(1));
  __m256i n = _mm256_srli_epi32(
      _mm256_add_epi32(_mm256_add_epi32(a, _mm256_set1_epi32((1 << (kShift - 1)) - 1)), lsb),
      kShift);
  n = _mm256_sub_epi32(n, _mm256_set1_epi32((127 - kBias) << kMan));
  n = _mm256_min_epi32(n, _mm256_set1_epi32(kMaxBits));
  // Below the smallest normal 2^(1-bias): multiples of 2^(1-bias-man).
  const __m256i min_normal = _mm256_set1_epi32((127 + 1 - kBias) << 23);
  const __m256i is_sub = _mm256_cmpgt_epi32(min_normal, a);
  const float scale = static_cast<float>(1u << (kBias - 1 + kMan));
  const __m256i s =
      _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_castsi256_ps(a), _mm256_set1_ps(scale)));
  n = _mm256_blendv_epi8(n, s, is_sub);
  n = _mm256_or_si256(n, _mm256_and_si256(_mm256_srli_epi32(x, 24), _mm256_set1_epi32(0x80)));
  return _mm256_blendv_epi8(n, _mm256_set1_epi32(kNanBits), nan_mask_epi32(v));
}

template <DType D>
TD_AVX2 void store_narrow(void* p, std::size_t i, Vec<D> v) {
  auto* b = static_cast<unsigned char*>(p) + i * dtype_size(D);
  if constexpr (is_integer(D)) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(b), v);
  } else if constexpr (D == DType::f64) {
    const __m256d c = _mm256_blendv_pd(
        v, _mm256_castsi256_pd(_mm256_set1_epi64x(static_cast<long long>(kCanonicalNanF64))),
        _mm256_cmp_pd(v, v, _CMP_UNORD_Q));
    _mm256_storeu_pd(reinterpret_cast<double*>(b), c);
  } else if constexpr (D == DType::f32) {
    const __m256 c = _mm256_blendv_ps(v, _mm256_castsi256_ps(_mm256_set1_epi32(kCanonicalNanF32)),
                                      _mm256_cmp_ps(v, v, _CMP_UNORD_Q));
    _mm256_storeu_ps(reinterpret_cast<float*>(b), c);
  } else if constexpr (D == DType::f16) {
    const __m128i h = _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const __m128i nan = _mm_packs_epi32(_mm256_castsi256_si128(nan_mask_epi32(v)),
                                        _mm256_extracti128_si256(nan_mask_epi32(v), 1));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(b),
                     _mm_blendv_epi8(h, _mm_set1_epi16(static_cast<short>(kCanonicalNanF16)), nan));
  } else if constexpr (D == DType::bf16) {
    const __m256i x = _mm256_castps_si256(v);
    const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(x, 16), _mm256_set1_epi32(1));
    __m256i r = _mm256_srli_epi32(
        _mm256_add_epi32(_mm256_add_epi32(x, _mm256_set1_epi32(0x7FFF)), lsb), 16);
    r = _mm256_blendv_epi8(r, _mm256_set1_epi32(kCanonicalNanBF16), nan_mask_epi32(v));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(b), pack_u32_to_u16(r));
  } else {
    const __m256i n = D == DType::e4m3 ? narrow_fp8_epi32<3, 7, 0x7E, kCanonicalNanE4M3>(v)
                                       : narrow_fp8_epi32<2, 15, 0x7C, kCanonicalNanE5M2>(v);
    const __m128i w = pack_u32_to_u16(n);
    _mm_storel_epi64(reinterpret_cast<__m128i*>(b), _mm_packus_epi16(w, w));
  }
}

// ---- element-wise operations
// ---------------------------------------------------------------------

template <ReduceOp O>
TD_AVX2 __m256 combine_ps(__m256 a, __m256 b) {
  if constexpr (O == ReduceOp::sum) {
    return _mm256_add_ps(a, b);
  } else if constexpr (O == ReduceOp::prod) {
    return _mm256_mul_ps(a, b);
  } else {
    // minps/maxps return the second operand on NaN and on +-0 ties; fix both (see scalar_ops.h).
    __m256 m = O == ReduceOp::min ? _mm256_min_ps(a, b) : _mm256_max_ps(a, b);
    const __m256 tie = O == ReduceOp::min ? _mm256_or_ps(a, b) : _mm256_and_ps(a, b);
    m = _mm256_blendv_ps(m, tie, _mm256_cmp_ps(a, b, _CMP_EQ_OQ));
    return _mm256_blendv_ps(m, _mm256_castsi256_ps(_mm256_set1_epi32(kCanonicalNanF32)),
                            _mm256_cmp_ps(a, b, _CMP_UNORD_Q));
  }
}

// binary64: as binary32, in 4 lanes.
template <ReduceOp O>
TD_AVX2 __m256d combine_pd(__m256d a, __m256d b) {
  if constexpr (O == ReduceOp::sum) {
    return _mm256_add_pd(a, b);
  } else if constexpr (O == ReduceOp::prod) {
    return _mm256_mul_pd(a, b);
  } else {
    __m256d m = O == ReduceOp::min ? _mm256_min_pd(a, b) : _mm256_max_pd(a, b);
    const __m256d tie = O == ReduceOp::min ? _mm256_or_pd(a, b) : _mm256_and_pd(a, b);
    m = _mm256_blendv_pd(m, tie, _mm256_cmp_pd(a, b, _CMP_EQ_OQ));
    return _mm256_blendv_pd(
        m, _mm256_castsi256_pd(_mm256_set1_epi64x(static_cast<long long>(kCanonicalNanF64))),
        _mm256_cmp_pd(a, b, _CMP_UNORD_Q));
  }
}

// 8-bit product in 16-bit halves (there is no byte multiply): the low byte of a * b is the even
// lane's product; (a >> 8) * (b & 0xFF00) puts the odd lane's product in the high byte.
TD_AVX2 __m256i mullo_epi8(__m256i a, __m256i b) {
  const __m256i lo_bytes = _mm256_set1_epi16(0x00FF);
  const __m256i even = _mm256_mullo_epi16(a, b);
  const __m256i odd = _mm256_mullo_epi16(_mm256_srli_epi16(a, 8), _mm256_andnot_si256(lo_bytes, b));
  return _mm256_or_si256(_mm256_and_si256(even, lo_bytes), odd);
}

// 64-bit product from 32-bit multiplies: lo(a) * lo(b) in 64 bits, plus the two cross products
// lo(a) * hi(b) + hi(a) * lo(b) (their low 32 bits are all that survive) shifted up by 32.
TD_AVX2 __m256i mullo_epi64(__m256i a, __m256i b) {
  const __m256i lolo = _mm256_mul_epu32(a, b);
  const __m256i cross = _mm256_mullo_epi32(a, _mm256_shuffle_epi32(b, 0xB1));
  const __m256i cross_sum = _mm256_add_epi32(cross, _mm256_srli_epi64(cross, 32));
  return _mm256_add_epi64(lolo, _mm256_slli_epi64(cross_sum, 32));
}

// AVX2 has no 64-bit min/max: compare and blend; unsigned order is signed order with the sign bit
// flipped.
template <bool kSigned, bool kMin>
TD_AVX2 __m256i minmax_epi64(__m256i a, __m256i b) {
  __m256i gt;
  if constexpr (kSigned) {
    gt = _mm256_cmpgt_epi64(a, b);
  } else {
    const __m256i sign = _mm256_set1_epi64x(static_cast<long long>(0x8000000000000000ull));
    gt = _mm256_cmpgt_epi64(_mm256_xor_si256(a, sign), _mm256_xor_si256(b, sign));
  }
  return kMin ? _mm256_blendv_epi8(a, b, gt) : _mm256_blendv_epi8(b, a, gt);
}

/// All ones in the integer lanes that are zero.
template <DType D>
TD_AVX2 __m256i is_zero(__m256i v) {
  const __m256i z = _mm256_setzero_si256();
  if constexpr (dtype_size(D) == 1) {
    return _mm256_cmpeq_epi8(v, z);
  } else if constexpr (dtype_size(D) == 2) {
    return _mm256_cmpeq_epi16(v, z);
  } else if constexpr (dtype_size(D) == 4) {
    return _mm256_cmpeq_epi32(v, z);
  } else {
    return _mm256_cmpeq_epi64(v, z);
  }
}

/// 1 in every lane (of D's width).
template <DType D>
TD_AVX2 __m256i ones() {
  if constexpr (dtype_size(D) == 1) {
    return _mm256_set1_epi8(1);
  } else if constexpr (dtype_size(D) == 2) {
    return _mm256_set1_epi16(1);
  } else if constexpr (dtype_size(D) == 4) {
    return _mm256_set1_epi32(1);
  } else {
    return _mm256_set1_epi64x(1);
  }
}

/// A widened value as the accumulator keeps it for O (scalar::take): the logical operations keep
/// 0 or 1.
template <DType D, ReduceOp O>
TD_AVX2 Vec<D> take(Vec<D> v) {
  if constexpr (is_logical(O)) {
    return _mm256_andnot_si256(is_zero<D>(v), ones<D>());
  } else {
    return v;
  }
}

// Integers in their own width: sums and products wrap (the instructions do), min/max signed or
// unsigned, bitwise as is, logical on "not zero" of both sides (so an accumulator that is not 0/1
// still gives what scalar::combine gives).
template <DType D, ReduceOp O>
TD_AVX2 __m256i combine_int(__m256i a, __m256i b) {
  constexpr std::size_t kSize = dtype_size(D);
  constexpr bool kSigned = is_signed_integer(D);
  if constexpr (O == ReduceOp::sum) {
    if constexpr (kSize == 1) return _mm256_add_epi8(a, b);
    if constexpr (kSize == 2) return _mm256_add_epi16(a, b);
    if constexpr (kSize == 4) return _mm256_add_epi32(a, b);
    if constexpr (kSize == 8) return _mm256_add_epi64(a, b);
  } else if constexpr (O == ReduceOp::prod) {
    if constexpr (kSize == 1) return mullo_epi8(a, b);
    if constexpr (kSize == 2) return _mm256_mullo_epi16(a, b);
    if constexpr (kSize == 4) return _mm256_mullo_epi32(a, b);
    if constexpr (kSize == 8) return mullo_epi64(a, b);
  } else if constexpr (O == ReduceOp::min) {
    if constexpr (kSize == 1) return kSigned ? _mm256_min_epi8(a, b) : _mm256_min_epu8(a, b);
    if constexpr (kSize == 2) return kSigned ? _mm256_min_epi16(a, b) : _mm256_min_epu16(a, b);
    if constexpr (kSize == 4) return kSigned ? _mm256_min_epi32(a, b) : _mm256_min_epu32(a, b);
    if constexpr (kSize == 8) return minmax_epi64<kSigned, true>(a, b);
  } else if constexpr (O == ReduceOp::max) {
    if constexpr (kSize == 1) return kSigned ? _mm256_max_epi8(a, b) : _mm256_max_epu8(a, b);
    if constexpr (kSize == 2) return kSigned ? _mm256_max_epi16(a, b) : _mm256_max_epu16(a, b);
    if constexpr (kSize == 4) return kSigned ? _mm256_max_epi32(a, b) : _mm256_max_epu32(a, b);
    if constexpr (kSize == 8) return minmax_epi64<kSigned, false>(a, b);
  } else if constexpr (O == ReduceOp::band) {
    return _mm256_and_si256(a, b);
  } else if constexpr (O == ReduceOp::bor) {
    return _mm256_or_si256(a, b);
  } else if constexpr (O == ReduceOp::bxor) {
    return _mm256_xor_si256(a, b);
  } else {
    static_assert(is_logical(O));
    if constexpr (O == ReduceOp::lor) {
      return _mm256_andnot_si256(is_zero<D>(_mm256_or_si256(a, b)), ones<D>());
    }
    const __m256i za = is_zero<D>(a), zb = is_zero<D>(b);
    if constexpr (O == ReduceOp::land) {
      return _mm256_andnot_si256(_mm256_or_si256(za, zb), ones<D>());
    }
    return _mm256_and_si256(_mm256_xor_si256(za, zb), ones<D>());
  }
}

/// acc OP x on whole vectors (scalar::combine, lane by lane).
template <DType D, ReduceOp O>
TD_AVX2 Vec<D> combine(Vec<D> a, Vec<D> b) {
  if constexpr (is_integer(D)) {
    return combine_int<D, O>(a, b);
  } else if constexpr (D == DType::f64) {
    return combine_pd<O>(a, b);
  } else {
    return combine_ps<O>(a, b);
  }
}

// The accumulator: binary32 lanes for f32 and the narrow floats, the wire type for the others.
template <DType D>
TD_AVX2 Vec<D> load_acc(const void* acc, std::size_t i) {
  constexpr DType kLane = is_narrow_float(D) ? DType::f32 : D;
  return load_widen<kLane>(acc, i);
}
template <DType D>
TD_AVX2 void store_acc(void* acc, std::size_t i, Vec<D> v) {
  auto* b = static_cast<unsigned char*>(acc) + i * acc_size(D);
  if constexpr (is_integer(D)) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(b), v);
  } else if constexpr (D == DType::f64) {
    _mm256_storeu_pd(reinterpret_cast<double*>(b), v);
  } else {
    _mm256_storeu_ps(reinterpret_cast<float*>(b), v);
  }
}

#include "pairs_avx2.inl"

// The types and operations this path has vector code for; every other defined pair runs the
// scalar reference.
constexpr bool vector_type(DType d) noexcept { return !is_pair(d); }
constexpr bool vector_op(DType d, ReduceOp o) noexcept {
  return vector_type(d) && op_defined(d, o);
}

struct Avx2ImplVec {
  template <DType D, ReduceOp O>
  TD_AVX2 static void load(void* acc, const void* payload, std::size_t n) {
    constexpr std::size_t kW = kLanes<D>;
    std::size_t i = 0;
    for (; i + kW <= n; i += kW) store_acc<D>(acc, i, take<D, O>(load_widen<D>(payload, i)));
    scalar::load<D, O>(acc, payload, i, n);
  }
  // The payload goes into combine() as loaded: the logical operations test it for zero there.
  template <DType D, ReduceOp O>
  TD_AVX2 static void accumulate(void* acc, const void* payload, std::size_t n) {
    constexpr std::size_t kW = kLanes<D>;
    std::size_t i = 0;
    for (; i + kW <= n; i += kW) {
      store_acc<D>(acc, i, combine<D, O>(load_acc<D>(acc, i), load_widen<D>(payload, i)));
    }
    scalar::accumulate<D, O>(acc, payload, i, n);
  }
  template <DType D, ReduceOp O>
  TD_AVX2 static void reduce(void* acc, const void* const* payloads, std::size_t k, std::size_t n) {
    if (k == 0) return;
    constexpr std::size_t kW = kLanes<D>;
    std::size_t i = 0;
    for (; i + kW <= n; i += kW) {
      Vec<D> v = take<D, O>(load_widen<D>(payloads[0], i));
      for (std::size_t j = 1; j < k; ++j) v = combine<D, O>(v, load_widen<D>(payloads[j], i));
      store_acc<D>(acc, i, v);
    }
    scalar::reduce<D, O>(acc, payloads, k, i, n);
  }
  template <DType D>
  TD_AVX2 static void emit(void* payload, const void* acc, std::size_t n) {
    constexpr std::size_t kW = kLanes<D>;
    std::size_t i = 0;
    for (; i + kW <= n; i += kW) store_narrow<D>(payload, i, load_acc<D>(acc, i));
    scalar::emit<D>(payload, acc, i, n);
  }
};

#include "fp8_avx2.inl"

struct Avx2Impl {
  template <DType D, ReduceOp O>
  TD_AVX2 static void load(void* acc, const void* payload, std::size_t n) {
    if constexpr (is_pair(D)) {
      pairs256::Impl::load<D, O>(acc, payload, n);
    } else if constexpr (fp8avx2::kCovers<D, O>) {
      fp8avx2::load<D, O>(acc, payload, n);
    } else if constexpr (vector_op(D, O)) {
      Avx2ImplVec::load<D, O>(acc, payload, n);
    } else {
      scalar::load<D, O>(acc, payload, 0, n);
    }
  }
  template <DType D, ReduceOp O>
  TD_AVX2 static void accumulate(void* acc, const void* payload, std::size_t n) {
    if constexpr (is_pair(D)) {
      pairs256::Impl::accumulate<D, O>(acc, payload, n);
    } else if constexpr (fp8avx2::kCovers<D, O>) {
      fp8avx2::accumulate<D, O>(acc, payload, n);
    } else if constexpr (vector_op(D, O)) {
      Avx2ImplVec::accumulate<D, O>(acc, payload, n);
    } else {
      scalar::accumulate<D, O>(acc, payload, 0, n);
    }
  }
  template <DType D, ReduceOp O>
  TD_AVX2 static void reduce(void* acc, const void* const* payloads, std::size_t k, std::size_t n) {
    if constexpr (is_pair(D)) {
      pairs256::Impl::reduce<D, O>(acc, payloads, k, n);
    } else if constexpr (fp8avx2::kCovers<D, O>) {
      fp8avx2::reduce<D, O>(acc, payloads, k, n);
    } else if constexpr (vector_op(D, O)) {
      Avx2ImplVec::reduce<D, O>(acc, payloads, k, n);
    } else {
      scalar::reduce<D, O>(acc, payloads, k, 0, n);
    }
  }
  template <DType D>
  TD_AVX2 static void emit(void* payload, const void* acc, std::size_t n) {
    if constexpr (is_pair(D)) {
      pairs256::Impl::emit<D>(payload, acc, n);
    } else if constexpr (vector_type(D)) {
      Avx2ImplVec::emit<D>(payload, acc, n);
    } else {
      scalar::emit<D>(payload, acc, 0, n);
    }
  }
};

constexpr KernelTable kTable = make_table<Avx2Impl>(Isa::avx2);

}  // namespace

const KernelTable& avx2_table() noexcept { return kTable; }

}  // namespace treeduce::agg::detail
