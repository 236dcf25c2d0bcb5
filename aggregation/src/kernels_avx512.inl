// AVX-512 path: 16 lanes per vector, masked loads and stores for the tail (no scalar tail).
// Included by kernels_avx512.cpp and kernels_avx512_bf16.cpp, which define TD_AVX512 (the target
// attribute), TD_USE_BF16_INSN (0 or 1) and TD_TABLE_NAME / TD_TABLE_ISA.
#if defined(__GNUC__) && !defined(__clang__) && __GNUC__ < 13
// GCC 12's avx512fintrin.h initialises its "undefined" vectors from themselves, which trips
// -Wmaybe-uninitialized at every inlined masked intrinsic (GCC PR 105593, fixed in GCC 12.3/13).
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <immintrin.h>

#include "fp8_vbmi.h"
#include "scalar_ops.h"
#include "table.h"

namespace treeduce::agg::detail {
namespace {

constexpr std::size_t kW = 16;

template <DType D>
struct V {
  using type = __m512;
};
template <>
struct V<DType::i32> {
  using type = __m512i;
};
template <DType D>
using Vec = typename V<D>::type;

TD_AVX512 __m512 e4m3_to_ps(__m128i bytes) {
  // See kernels_avx2.cpp: shift into binary16, scale by 2^8, patch NaN (which lands on +-480).
  // Measured: building the binary32 bits directly and scaling by 2^120 is 1.8x slower, because
  // E4M3 subnormals then become binary32 subnormal operands of the multiply.
  const __m256i w = _mm256_cvtepu8_epi16(bytes);
  const __m256i mag = _mm256_and_si256(w, _mm256_set1_epi16(0x7F));
  const __mmask16 nan = _mm256_cmpeq_epi16_mask(mag, _mm256_set1_epi16(0x7F));
  // (mag << 7) with the sign bit of (w << 8): ternary logic 0xD8 is "C ? B : A".
  const __m256i h = _mm256_ternarylogic_epi32(_mm256_slli_epi16(mag, 7), _mm256_slli_epi16(w, 8),
                                              _mm256_set1_epi16(static_cast<short>(0x8000)), 0xD8);
  const __m512 f = _mm512_mul_ps(_mm512_cvtph_ps(h), _mm512_set1_ps(256.0f));
  return _mm512_castsi512_ps(_mm512_mask_or_epi32(
      _mm512_castps_si512(f), nan, _mm512_castps_si512(f), _mm512_set1_epi32(0x7FF00000)));
}

/// 16 elements (or the lanes of m) of the wire type at index i, widened.
template <DType D>
TD_AVX512 Vec<D> load_widen(const void* p, std::size_t i, __mmask16 m) {
  const auto* b = static_cast<const unsigned char*>(p) + i * dtype_size(D);
  if constexpr (D == DType::f32) {
    return _mm512_maskz_loadu_ps(m, b);
  } else if constexpr (D == DType::i32) {
    return _mm512_maskz_loadu_epi32(m, b);
  } else if constexpr (D == DType::f16) {
    return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, b));
  } else if constexpr (D == DType::bf16) {
    return _mm512_castsi512_ps(
        _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, b)), 16));
  } else if constexpr (D == DType::e5m2) {
    return _mm512_cvtph_ps(_mm256_slli_epi16(_mm256_cvtepu8_epi16(_mm_maskz_loadu_epi8(m, b)), 8));
  } else {
    return e4m3_to_ps(_mm_maskz_loadu_epi8(m, b));
  }
}

/// 32 FP8 elements at index i, widened into two vectors: the byte-to-word work is done once on a
/// full 512-bit register instead of twice on 256-bit ones.
template <DType D>
TD_AVX512 void load_widen_fp8x32(const void* p, std::size_t i, __m512& lo, __m512& hi) {
  const __m512i w = _mm512_cvtepu8_epi16(_mm256_loadu_si256(
      reinterpret_cast<const __m256i*>(static_cast<const unsigned char*>(p) + i)));
  if constexpr (D == DType::e5m2) {
    const __m512i h = _mm512_slli_epi16(w, 8);
    lo = _mm512_cvtph_ps(_mm512_castsi512_si256(h));
    hi = _mm512_cvtph_ps(_mm512_extracti64x4_epi64(h, 1));
  } else {
    static_assert(D == DType::e4m3);
    const __m512i mag = _mm512_and_si512(w, _mm512_set1_epi16(0x7F));
    const __mmask32 nan = _mm512_cmpeq_epi16_mask(mag, _mm512_set1_epi16(0x7F));
    const __m512i h =
        _mm512_ternarylogic_epi32(_mm512_slli_epi16(mag, 7), _mm512_slli_epi16(w, 8),
                                  _mm512_set1_epi16(static_cast<short>(0x8000)), 0xD8);
    const __m512 scale = _mm512_set1_ps(256.0f);
    const __m512i nan_bits = _mm512_set1_epi32(0x7FF00000);
    const __m512i f0 =
        _mm512_castps_si512(_mm512_mul_ps(_mm512_cvtph_ps(_mm512_castsi512_si256(h)), scale));
    const __m512i f1 =
        _mm512_castps_si512(_mm512_mul_ps(_mm512_cvtph_ps(_mm512_extracti64x4_epi64(h, 1)), scale));
    lo = _mm512_castsi512_ps(_mm512_mask_or_epi32(f0, static_cast<__mmask16>(nan), f0, nan_bits));
    hi = _mm512_castsi512_ps(
        _mm512_mask_or_epi32(f1, static_cast<__mmask16>(nan >> 16), f1, nan_bits));
  }
}

/// 32 elements at index i as two vectors (the unrolled loops' input).
template <DType D>
TD_AVX512 void load_widen_x2(const void* p, std::size_t i, Vec<D>& lo, Vec<D>& hi) {
  if constexpr (D == DType::e4m3 || D == DType::e5m2) {
    load_widen_fp8x32<D>(p, i, lo, hi);
  } else {
    lo = load_widen<D>(p, i, 0xFFFF);
    hi = load_widen<D>(p, i + kW, 0xFFFF);
  }
}

template <int kMan, int kBias, int kMaxBits, int kNanBits>
TD_AVX512 __m128i narrow_fp8(__m512 v) {
  // See kernels_avx2.cpp for the method.
  constexpr int kShift = 23 - kMan;
  const __m512i x = _mm512_castps_si512(v);
  const __m512i a = _mm512_and_si512(x, _mm512_set1_epi32(0x7FFFFFFF));
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(a, kShift), _mm512_set1_epi32(1));
  __m512i n = _mm512_srli_epi32(
      _mm512_add_epi32(_mm512_add_epi32(a, _mm512_set1_epi32((1 << (kShift - 1)) - 1)), lsb),
      kShift);
  n = _mm512_sub_epi32(n, _mm512_set1_epi32((127 - kBias) << kMan));
  n = _mm512_min_epi32(n, _mm512_set1_epi32(kMaxBits));
  const __mmask16 is_sub = _mm512_cmplt_epi32_mask(a, _mm512_set1_epi32((127 + 1 - kBias) << 23));
  const float scale = static_cast<float>(1u << (kBias - 1 + kMan));
  n = _mm512_mask_mov_epi32(
      n, is_sub, _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_castsi512_ps(a), _mm512_set1_ps(scale))));
  n = _mm512_or_si512(n, _mm512_and_si512(_mm512_srli_epi32(x, 24), _mm512_set1_epi32(0x80)));
  n = _mm512_mask_mov_epi32(n, _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q), _mm512_set1_epi32(kNanBits));
  return _mm512_cvtepi32_epi8(n);
}

TD_AVX512 __m256i narrow_bf16_int(__m512 v) {
  const __m512i x = _mm512_castps_si512(v);
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(x, 16), _mm512_set1_epi32(1));
  const __m512i r =
      _mm512_srli_epi32(_mm512_add_epi32(_mm512_add_epi32(x, _mm512_set1_epi32(0x7FFF)), lsb), 16);
  return _mm512_cvtepi32_epi16(r);
}

TD_AVX512 __m256i narrow_bf16(__m512 v) {
  const __m512i abs = _mm512_and_si512(_mm512_castps_si512(v), _mm512_set1_epi32(0x7FFFFFFF));
#if TD_USE_BF16_INSN
  // vcvtneps2bf16 rounds to nearest even but treats subnormal inputs as zero; those lanes
  // (1 <= |bits| <= 0x7FFFFF: rare in gradients, common in tests) take the integer path.
  __m256i r = reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(v));
  const __mmask16 sub = _mm512_cmplt_epu32_mask(_mm512_sub_epi32(abs, _mm512_set1_epi32(1)),
                                                _mm512_set1_epi32(0x7FFFFF));
  if (sub != 0) r = _mm256_mask_mov_epi16(r, sub, narrow_bf16_int(v));
#else
  __m256i r = narrow_bf16_int(v);
#endif
  return _mm256_mask_mov_epi16(r, _mm512_cmpgt_epi32_mask(abs, _mm512_set1_epi32(0x7F800000)),
                               _mm256_set1_epi16(static_cast<short>(kCanonicalNanBF16)));
}

template <DType D>
TD_AVX512 void store_narrow(void* p, std::size_t i, Vec<D> v, __mmask16 m) {
  auto* b = static_cast<unsigned char*>(p) + i * dtype_size(D);
  if constexpr (D == DType::i32) {
    _mm512_mask_storeu_epi32(b, m, v);
  } else if constexpr (D == DType::f32) {
    const __m512 c = _mm512_mask_mov_ps(v, _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q),
                                        _mm512_castsi512_ps(_mm512_set1_epi32(kCanonicalNanF32)));
    _mm512_mask_storeu_ps(b, m, c);
  } else if constexpr (D == DType::f16) {
    const __m256i h =
        _mm256_mask_mov_epi16(_mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC),
                              _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q),
                              _mm256_set1_epi16(static_cast<short>(kCanonicalNanF16)));
    _mm256_mask_storeu_epi16(b, m, h);
  } else if constexpr (D == DType::bf16) {
    _mm256_mask_storeu_epi16(b, m, narrow_bf16(v));
  } else if constexpr (D == DType::e4m3) {
    _mm_mask_storeu_epi8(b, m, narrow_fp8<3, 7, 0x7E, kCanonicalNanE4M3>(v));
  } else {
    _mm_mask_storeu_epi8(b, m, narrow_fp8<2, 15, 0x7C, kCanonicalNanE5M2>(v));
  }
}

template <ReduceOp O>
TD_AVX512 __m512 combine(__m512 a, __m512 b) {
  if constexpr (O == ReduceOp::sum) {
    return _mm512_add_ps(a, b);
  } else {
    // See scalar_ops.h: -0 < +0, any NaN gives the canonical NaN. Ties (equal values, +-0
    // included) take a|b for min and a&b for max, in one masked op. (vrangeps does not order the
    // zeros that way, so it would save nothing.)
    const __mmask16 eq = _mm512_cmp_ps_mask(a, b, _CMP_EQ_OQ);
    const __m512 m = O == ReduceOp::min ? _mm512_mask_or_ps(_mm512_min_ps(a, b), eq, a, b)
                                        : _mm512_mask_and_ps(_mm512_max_ps(a, b), eq, a, b);
    return _mm512_mask_mov_ps(m, _mm512_cmp_ps_mask(a, b, _CMP_UNORD_Q),
                              _mm512_castsi512_ps(_mm512_set1_epi32(kCanonicalNanF32)));
  }
}

template <ReduceOp O>
TD_AVX512 __m512i combine(__m512i a, __m512i b) {
  if constexpr (O == ReduceOp::sum) {
    return _mm512_add_epi32(a, b);
  } else if constexpr (O == ReduceOp::min) {
    return _mm512_min_epi32(a, b);
  } else {
    return _mm512_max_epi32(a, b);
  }
}

template <DType D>
TD_AVX512 Vec<D> load_acc(const void* acc, std::size_t i, __mmask16 m) {
  constexpr DType kLane = D == DType::i32 ? DType::i32 : DType::f32;
  return load_widen<kLane>(acc, i, m);
}
template <DType D>
TD_AVX512 void store_acc(void* acc, std::size_t i, Vec<D> v, __mmask16 m) {
  if constexpr (D == DType::i32) {
    _mm512_mask_storeu_epi32(static_cast<std::int32_t*>(acc) + i, m, v);
  } else {
    _mm512_mask_storeu_ps(static_cast<float*>(acc) + i, m, v);
  }
}

TD_AVX512 __mmask16 tail_mask(std::size_t left) { return static_cast<__mmask16>((1u << left) - 1); }

#include "pairs_avx512.inl"

// The types and operations this path has vector code for; every other defined pair runs the
// scalar reference.
constexpr bool vector_type(DType d) noexcept {
  return d == DType::f32 || d == DType::f16 || d == DType::bf16 || d == DType::e4m3 ||
         d == DType::e5m2 || d == DType::i32;
}
constexpr bool vector_op(DType d, ReduceOp o) noexcept {
  return vector_type(d) && (o == ReduceOp::sum || o == ReduceOp::min || o == ReduceOp::max);
}

// The loops: full vectors with an all-ones mask (the compiler drops it), then one masked vector.
struct Avx512ImplVec {
  template <DType D>
  TD_AVX512 static void load(void* acc, const void* payload, std::size_t n) {
    std::size_t i = 0;
    for (; i + kW <= n; i += kW) store_acc<D>(acc, i, load_widen<D>(payload, i, 0xFFFF), 0xFFFF);
    if (i < n) {
      const __mmask16 m = tail_mask(n - i);
      store_acc<D>(acc, i, load_widen<D>(payload, i, m), m);
    }
  }
  template <DType D, ReduceOp O>
  TD_AVX512 static void accumulate(void* acc, const void* payload, std::size_t n) {
    std::size_t i = 0;
    // Two vectors per iteration halve the loop overhead; measured +10% on bf16 sum with the
    // accumulator in L2 (bench accumulate/bf16/sum/L2, vs_baseline 0.85-0.90 -> 0.97-1.00).
    for (; i + 2 * kW <= n; i += 2 * kW) {
      Vec<D> x0, x1;
      load_widen_x2<D>(payload, i, x0, x1);
      store_acc<D>(acc, i, combine<O>(load_acc<D>(acc, i, 0xFFFF), x0), 0xFFFF);
      store_acc<D>(acc, i + kW, combine<O>(load_acc<D>(acc, i + kW, 0xFFFF), x1), 0xFFFF);
    }
    for (; i + kW <= n; i += kW) {
      store_acc<D>(acc, i,
                   combine<O>(load_acc<D>(acc, i, 0xFFFF), load_widen<D>(payload, i, 0xFFFF)),
                   0xFFFF);
    }
    if (i < n) {
      const __mmask16 m = tail_mask(n - i);
      store_acc<D>(acc, i, combine<O>(load_acc<D>(acc, i, m), load_widen<D>(payload, i, m)), m);
    }
  }
  template <DType D, ReduceOp O>
  TD_AVX512 static void reduce(void* acc, const void* const* payloads, std::size_t k,
                               std::size_t n) {
    if (k == 0) return;
    std::size_t i = 0;
    for (; i + 2 * kW <= n; i += 2 * kW) {
      Vec<D> v0, v1;
      load_widen_x2<D>(payloads[0], i, v0, v1);
      for (std::size_t j = 1; j < k; ++j) {
        Vec<D> x0, x1;
        load_widen_x2<D>(payloads[j], i, x0, x1);
        v0 = combine<O>(v0, x0);
        v1 = combine<O>(v1, x1);
      }
      store_acc<D>(acc, i, v0, 0xFFFF);
      store_acc<D>(acc, i + kW, v1, 0xFFFF);
    }
    for (; i < n; i += kW) {
      const __mmask16 m = n - i >= kW ? __mmask16{0xFFFF} : tail_mask(n - i);
      Vec<D> v = load_widen<D>(payloads[0], i, m);
      for (std::size_t j = 1; j < k; ++j) v = combine<O>(v, load_widen<D>(payloads[j], i, m));
      store_acc<D>(acc, i, v, m);
    }
  }
  template <DType D>
  TD_AVX512 static void emit(void* payload, const void* acc, std::size_t n) {
    std::size_t i = 0;
    for (; i + kW <= n; i += kW) store_narrow<D>(payload, i, load_acc<D>(acc, i, 0xFFFF), 0xFFFF);
    if (i < n) {
      const __mmask16 m = tail_mask(n - i);
      store_narrow<D>(payload, i, load_acc<D>(acc, i, m), m);
    }
  }
};

#include "fp8_vbmi_avx512.inl"

struct Avx512Impl {
  template <DType D, ReduceOp O>
  TD_AVX512 static void load(void* acc, const void* payload, std::size_t n) {
    if constexpr (is_pair(D)) {
      pairs512::Impl::load<D, O>(acc, payload, n);
    } else if constexpr (vector_op(D, O)) {
      if constexpr (fp8vbmi::kCovers<D, O>) {
        if (fp8_vbmi()) return fp8vbmi::load<D, O>(acc, payload, n);
      }
      Avx512ImplVec::load<D>(acc, payload, n);
    } else {
      scalar::load<D, O>(acc, payload, 0, n);
    }
  }
  template <DType D, ReduceOp O>
  TD_AVX512 static void accumulate(void* acc, const void* payload, std::size_t n) {
    if constexpr (is_pair(D)) {
      pairs512::Impl::accumulate<D, O>(acc, payload, n);
    } else if constexpr (vector_op(D, O)) {
      if constexpr (fp8vbmi::kCovers<D, O>) {
        if (fp8_vbmi()) return fp8vbmi::accumulate<D, O>(acc, payload, n);
      }
      Avx512ImplVec::accumulate<D, O>(acc, payload, n);
    } else {
      scalar::accumulate<D, O>(acc, payload, 0, n);
    }
  }
  template <DType D, ReduceOp O>
  TD_AVX512 static void reduce(void* acc, const void* const* payloads, std::size_t k,
                               std::size_t n) {
    if constexpr (is_pair(D)) {
      pairs512::Impl::reduce<D, O>(acc, payloads, k, n);
    } else if constexpr (vector_op(D, O)) {
      if constexpr (fp8vbmi::kCovers<D, O>) {
        if (fp8_vbmi()) return fp8vbmi::reduce<D, O>(acc, payloads, k, n);
      }
      Avx512ImplVec::reduce<D, O>(acc, payloads, k, n);
    } else {
      scalar::reduce<D, O>(acc, payloads, k, 0, n);
    }
  }
  template <DType D>
  TD_AVX512 static void emit(void* payload, const void* acc, std::size_t n) {
    if constexpr (is_pair(D)) {
      pairs512::Impl::emit<D>(payload, acc, n);
    } else if constexpr (vector_type(D)) {
      Avx512ImplVec::emit<D>(payload, acc, n);
    } else {
      scalar::emit<D>(payload, acc, 0, n);
    }
  }
};

constexpr KernelTable kTable = make_table<Avx512Impl>(TD_TABLE_ISA);

}  // namespace

const KernelTable& TD_TABLE_NAME() noexcept { return kTable; }

}  // namespace treeduce::agg::detail
