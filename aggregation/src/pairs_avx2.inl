// MINLOC/MAXLOC on the pair types (f32_i32, f64_i32, i32_i32), AVX2. Included by
// kernels_avx2.cpp inside its unnamed namespace. The method is pairs_avx512.inl's (values split
// from indices, values turned into integer keys, the lower key wins, then the lower index), with
// vector masks and blends instead of mask registers, and the scalar reference for the tail.

namespace pairs256 {

struct Soa {
  __m256i key, v, i;
};

template <DType D>
constexpr bool kWide = D == DType::f64_i32;
/// Pairs per step: two vectors' worth.
template <DType D>
constexpr std::size_t kStep = kWide<D> ? 4 : 8;

template <DType D, ReduceOp O>
TD_AVX2 __m256i key_of(__m256i v) {
  constexpr bool kMax = O == ReduceOp::maxloc;
  const __m256i ones = _mm256_set1_epi32(-1);
  if constexpr (D == DType::i32_i32) {
    return kMax ? _mm256_xor_si256(v, ones) : v;
  } else if constexpr (D == DType::f32_i32) {
    __m256i k = _mm256_xor_si256(
        v, _mm256_and_si256(_mm256_srai_epi32(v, 31), _mm256_set1_epi32(0x7FFFFFFF)));
    if (kMax) k = _mm256_xor_si256(k, ones);
    const __m256 f = _mm256_castsi256_ps(v);
    return _mm256_castps_si256(_mm256_blendv_ps(_mm256_castsi256_ps(k),
                                                _mm256_castsi256_ps(_mm256_set1_epi32(INT32_MIN)),
                                                _mm256_cmp_ps(f, f, _CMP_UNORD_Q)));
  } else {
    const __m256i sign = _mm256_cmpgt_epi64(_mm256_setzero_si256(), v);
    __m256i k = _mm256_xor_si256(v, _mm256_srli_epi64(sign, 1));
    if (kMax) k = _mm256_xor_si256(k, ones);
    const __m256d f = _mm256_castsi256_pd(v);
    return _mm256_castpd_si256(_mm256_blendv_pd(_mm256_castsi256_pd(k),
                                                _mm256_castsi256_pd(_mm256_set1_epi64x(INT64_MIN)),
                                                _mm256_cmp_pd(f, f, _CMP_UNORD_Q)));
  }
}

// The lanes come out in an order of their own (in-lane shuffles), the same for every operand,
// and put() undoes it.
template <DType D, ReduceOp O>
TD_AVX2 Soa get(const void* src, std::size_t p) {
  const auto* b = static_cast<const unsigned char*>(src) + p * dtype_size(D);
  const __m256i a0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b));
  const __m256i a1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 32));
  Soa s;
  if constexpr (kWide<D>) {
    s.v = _mm256_unpacklo_epi64(a0, a1);
    // The index in both halves of its qword: a signed 64-bit order that is the index's, and the
    // padding is gone.
    s.i = _mm256_shuffle_epi32(_mm256_unpackhi_epi64(a0, a1), _MM_SHUFFLE(2, 2, 0, 0));
  } else {
    const __m256 f0 = _mm256_castsi256_ps(a0), f1 = _mm256_castsi256_ps(a1);
    s.v = _mm256_castps_si256(_mm256_shuffle_ps(f0, f1, _MM_SHUFFLE(2, 0, 2, 0)));
    s.i = _mm256_castps_si256(_mm256_shuffle_ps(f0, f1, _MM_SHUFFLE(3, 1, 3, 1)));
  }
  s.key = key_of<D, O>(s.v);
  return s;
}

template <DType D>
TD_AVX2 void put(void* dst, std::size_t p, const Soa& s, bool combined) {
  auto* b = static_cast<unsigned char*>(dst) + p * dtype_size(D);
  __m256i a0, a1;
  if constexpr (kWide<D>) {
    __m256i v = s.v;
    if (combined) {
      v = _mm256_blendv_epi8(v, _mm256_set1_epi64x(static_cast<long long>(kCanonicalNanF64)),
                             _mm256_cmpeq_epi64(s.key, _mm256_set1_epi64x(INT64_MIN)));
    }
    const __m256i i = _mm256_blend_epi32(s.i, _mm256_setzero_si256(), 0xAA);  // padding zero
    a0 = _mm256_unpacklo_epi64(v, i);
    a1 = _mm256_unpackhi_epi64(v, i);
  } else {
    __m256i v = s.v;
    if (D == DType::f32_i32 && combined) {
      v = _mm256_blendv_epi8(v, _mm256_set1_epi32(static_cast<int>(kCanonicalNanF32)),
                             _mm256_cmpeq_epi32(s.key, _mm256_set1_epi32(INT32_MIN)));
    }
    a0 = _mm256_unpacklo_epi32(v, s.i);
    a1 = _mm256_unpackhi_epi32(v, s.i);
  }
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(b), a0);
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(b + 32), a1);
}

/// b wins when its key is lower, or equal with a lower index; otherwise a.
template <DType D>
TD_AVX2 Soa combine(const Soa& a, const Soa& b) {
  __m256i w;
  if constexpr (kWide<D>) {
    w = _mm256_or_si256(
        _mm256_cmpgt_epi64(a.key, b.key),
        _mm256_and_si256(_mm256_cmpeq_epi64(a.key, b.key), _mm256_cmpgt_epi64(a.i, b.i)));
  } else {
    w = _mm256_or_si256(
        _mm256_cmpgt_epi32(a.key, b.key),
        _mm256_and_si256(_mm256_cmpeq_epi32(a.key, b.key), _mm256_cmpgt_epi32(a.i, b.i)));
  }
  return {_mm256_blendv_epi8(a.key, b.key, w), _mm256_blendv_epi8(a.v, b.v, w),
          _mm256_blendv_epi8(a.i, b.i, w)};
}

/// 32 bytes of pairs as emit() wants them (canonical NaN when `canonical`, padding zero).
template <DType D>
TD_AVX2 __m256i copy_vector(__m256i x, bool canonical) {
  if constexpr (kWide<D>) {
    if (canonical) {
      const __m256d f = _mm256_castsi256_pd(x);
      const __m256d nan = _mm256_and_pd(_mm256_cmp_pd(f, f, _CMP_UNORD_Q),
                                        _mm256_castsi256_pd(_mm256_setr_epi64x(-1, 0, -1, 0)));
      x = _mm256_castpd_si256(_mm256_blendv_pd(
          f, _mm256_castsi256_pd(_mm256_set1_epi64x(static_cast<long long>(kCanonicalNanF64))),
          nan));
    }
    return _mm256_and_si256(x, _mm256_setr_epi64x(-1, 0xFFFFFFFF, -1, 0xFFFFFFFF));
  } else {
    if (D == DType::f32_i32 && canonical) {
      const __m256 f = _mm256_castsi256_ps(x);
      const __m256 nan = _mm256_and_ps(_mm256_cmp_ps(f, f, _CMP_UNORD_Q),
                                       _mm256_castsi256_ps(_mm256_set1_epi64x(0xFFFFFFFF)));
      x = _mm256_castps_si256(_mm256_blendv_ps(
          f, _mm256_castsi256_ps(_mm256_set1_epi32(static_cast<int>(kCanonicalNanF32))), nan));
    }
    return x;
  }
}

struct Impl {
  template <DType D, ReduceOp O>
  TD_AVX2 static void load(void* acc, const void* payload, std::size_t n) {
    constexpr std::size_t kPer = 32 / dtype_size(D);
    std::size_t p = 0;
    for (; p + kPer <= n; p += kPer) {
      const auto* s = static_cast<const unsigned char*>(payload) + p * dtype_size(D);
      _mm256_storeu_si256(
          reinterpret_cast<__m256i*>(static_cast<unsigned char*>(acc) + p * dtype_size(D)),
          copy_vector<D>(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(s)), false));
    }
    scalar::load<D, O>(acc, payload, p, n);
  }
  template <DType D, ReduceOp O>
  TD_AVX2 static void accumulate(void* acc, const void* payload, std::size_t n) {
    std::size_t p = 0;
    for (; p + kStep<D> <= n; p += kStep<D>) {
      put<D>(acc, p, combine<D>(get<D, O>(acc, p), get<D, O>(payload, p)), true);
    }
    scalar::accumulate<D, O>(acc, payload, p, n);
  }
  template <DType D, ReduceOp O>
  TD_AVX2 static void reduce(void* acc, const void* const* payloads, std::size_t k, std::size_t n) {
    if (k == 0) return;
    std::size_t p = 0;
    for (; p + kStep<D> <= n; p += kStep<D>) {
      Soa s = get<D, O>(payloads[0], p);
      for (std::size_t j = 1; j < k; ++j) s = combine<D>(s, get<D, O>(payloads[j], p));
      put<D>(acc, p, s, k > 1);
    }
    scalar::reduce<D, O>(acc, payloads, k, p, n);
  }
  template <DType D>
  TD_AVX2 static void emit(void* payload, const void* acc, std::size_t n) {
    constexpr std::size_t kPer = 32 / dtype_size(D);
    std::size_t p = 0;
    for (; p + kPer <= n; p += kPer) {
      const auto* s = static_cast<const unsigned char*>(acc) + p * dtype_size(D);
      _mm256_storeu_si256(
          reinterpret_cast<__m256i*>(static_cast<unsigned char*>(payload) + p * dtype_size(D)),
          copy_vector<D>(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(s)), true));
    }
    scalar::emit<D>(payload, acc, p, n);
  }
};

}  // namespace pairs256
