// MINLOC/MAXLOC on the pair types (f32_i32, f64_i32, i32_i32), AVX-512. Included by
// kernels_avx512.inl inside its unnamed namespace, after TD_AVX512 is defined. docs/kernels.md
// ("Pairs: MINLOC and MAXLOC") explains the method; scalar_ops.h's combine() for pairs is the
// reference, bit for bit.
//
// A step takes two vectors of pairs from each operand (16 pairs of 8 bytes, or 8 pairs of 16
// bytes) and splits them into a vector of values and a vector of indices (one lane per pair:
// 32-bit lanes for f32_i32 and i32_i32, 64-bit lanes for f64_i32, whose index is sign-extended).
// Each value becomes an integer key whose signed order is the order of the operation, reversed
// for MAXLOC, so that "the lower key wins, the lower index on equal keys" is both operations:
//   - floats: the usual sortable-bits map (bits ^ (sign ? 0x7FF..F : 0)) orders -inf < ... < -0 <
//     +0 < ... < +inf; every NaN gets the lowest key (INT_MIN), which no number has, so NaNs win
//     and are all equal;
//   - MAXLOC takes the complement of the key (~x reverses the signed order) before NaNs are set.
// The winner's key, value and index are selected with one mask. A value whose key is INT_MIN is
// a NaN and is stored as the canonical NaN after any combination (a copy, as load() and a
// one-payload reduce() are, keeps the bits as they are). Tails use masked loads and stores.

namespace pairs512 {

struct Soa {
  __m512i key, v, i;
};

template <DType D>
constexpr bool kWide = D == DType::f64_i32;
/// Pairs per step: two vectors' worth.
template <DType D>
constexpr std::size_t kStep = kWide<D> ? 8 : 16;

/// Lane masks for the two vectors of one step (dword lanes, or qword lanes for f64_i32).
struct Masks {
  __mmask16 m0, m1;
};
template <DType D>
TD_AVX512 Masks step_masks(std::size_t pairs_left) {
  if (pairs_left >= kStep<D>) return kWide<D> ? Masks{0xFF, 0xFF} : Masks{0xFFFF, 0xFFFF};
  // Two lanes per pair in either layout; pairs_left < kStep, so the shift is below 32.
  const std::uint32_t m = (1u << (2 * pairs_left)) - 1;
  if constexpr (kWide<D>) {
    return {static_cast<__mmask16>(m & 0xFF), static_cast<__mmask16>(m >> 8)};
  } else {
    return {static_cast<__mmask16>(m & 0xFFFF), static_cast<__mmask16>(m >> 16)};
  }
}

template <DType D, ReduceOp O>
TD_AVX512 __m512i key_of(__m512i v) {
  constexpr bool kMax = O == ReduceOp::maxloc;
  // Ternary logic on (v, t, c): 0x78 is v ^ (t & c), 0x87 its complement.
  constexpr int kImm = kMax ? 0x87 : 0x78;
  if constexpr (D == DType::i32_i32) {
    return kMax ? _mm512_ternarylogic_epi32(v, v, v, 0x0F) : v;
  } else if constexpr (D == DType::f32_i32) {
    const __m512i k =
        _mm512_ternarylogic_epi32(v, _mm512_srai_epi32(v, 31), _mm512_set1_epi32(0x7FFFFFFF), kImm);
    const __m512 f = _mm512_castsi512_ps(v);
    return _mm512_mask_mov_epi32(k, _mm512_cmp_ps_mask(f, f, _CMP_UNORD_Q),
                                 _mm512_set1_epi32(INT32_MIN));
  } else {
    const __m512i k =
        _mm512_ternarylogic_epi64(v, _mm512_srai_epi64(v, 63), _mm512_set1_epi64(INT64_MAX), kImm);
    const __m512d f = _mm512_castsi512_pd(v);
    return _mm512_mask_mov_epi64(k, _mm512_cmp_pd_mask(f, f, _CMP_UNORD_Q),
                                 _mm512_set1_epi64(INT64_MIN));
  }
}

/// kStep pairs at pair index p (the lanes of m), split into values and indices, with keys.
template <DType D, ReduceOp O>
TD_AVX512 Soa get(const void* src, std::size_t p, Masks m) {
  const auto* b = static_cast<const unsigned char*>(src) + p * dtype_size(D);
  Soa s;
  if constexpr (kWide<D>) {
    const __m512i a0 = _mm512_maskz_loadu_epi64(static_cast<__mmask8>(m.m0), b);
    const __m512i a1 = _mm512_maskz_loadu_epi64(static_cast<__mmask8>(m.m1), b + 64);
    s.v = _mm512_permutex2var_epi64(a0, _mm512_setr_epi64(0, 2, 4, 6, 8, 10, 12, 14), a1);
    const __m512i x =
        _mm512_permutex2var_epi64(a0, _mm512_setr_epi64(1, 3, 5, 7, 9, 11, 13, 15), a1);
    s.i = _mm512_srai_epi64(_mm512_slli_epi64(x, 32), 32);  // the padding is ignored
  } else {
    const __m512i a0 = _mm512_maskz_loadu_epi32(m.m0, b);
    const __m512i a1 = _mm512_maskz_loadu_epi32(m.m1, b + 64);
    s.v = _mm512_permutex2var_epi32(
        a0, _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30), a1);
    s.i = _mm512_permutex2var_epi32(
        a0, _mm512_setr_epi32(1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31), a1);
  }
  s.key = key_of<D, O>(s.v);
  return s;
}

/// Stores s as pairs at pair index p; `combined`: s is the result of a combination, so a NaN
/// value is stored as the canonical NaN.
template <DType D>
TD_AVX512 void put(void* dst, std::size_t p, Masks m, const Soa& s, bool combined) {
  auto* b = static_cast<unsigned char*>(dst) + p * dtype_size(D);
  if constexpr (kWide<D>) {
    __m512i v = s.v;
    if (combined) {
      v = _mm512_mask_mov_epi64(v, _mm512_cmpeq_epi64_mask(s.key, _mm512_set1_epi64(INT64_MIN)),
                                _mm512_set1_epi64(static_cast<long long>(kCanonicalNanF64)));
    }
    const __m512i i = _mm512_and_si512(s.i, _mm512_set1_epi64(0xFFFFFFFF));  // padding zero
    _mm512_mask_storeu_epi64(
        b, static_cast<__mmask8>(m.m0),
        _mm512_permutex2var_epi64(v, _mm512_setr_epi64(0, 8, 1, 9, 2, 10, 3, 11), i));
    _mm512_mask_storeu_epi64(
        b + 64, static_cast<__mmask8>(m.m1),
        _mm512_permutex2var_epi64(v, _mm512_setr_epi64(4, 12, 5, 13, 6, 14, 7, 15), i));
  } else {
    __m512i v = s.v;
    if (D == DType::f32_i32 && combined) {
      v = _mm512_mask_mov_epi32(v, _mm512_cmpeq_epi32_mask(s.key, _mm512_set1_epi32(INT32_MIN)),
                                _mm512_set1_epi32(static_cast<int>(kCanonicalNanF32)));
    }
    _mm512_mask_storeu_epi32(
        b, m.m0,
        _mm512_permutex2var_epi32(
            v, _mm512_setr_epi32(0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23), s.i));
    _mm512_mask_storeu_epi32(
        b + 64, m.m1,
        _mm512_permutex2var_epi32(
            v, _mm512_setr_epi32(8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31),
            s.i));
  }
}

/// b wins when its key is lower, or equal with a lower index; otherwise a.
template <DType D>
TD_AVX512 Soa combine(const Soa& a, const Soa& b) {
  if constexpr (kWide<D>) {
    const __mmask8 w = _mm512_cmplt_epi64_mask(b.key, a.key) |
                       (_mm512_cmpeq_epi64_mask(b.key, a.key) & _mm512_cmplt_epi64_mask(b.i, a.i));
    return {_mm512_mask_mov_epi64(a.key, w, b.key), _mm512_mask_mov_epi64(a.v, w, b.v),
            _mm512_mask_mov_epi64(a.i, w, b.i)};
  } else {
    const __mmask16 w = _mm512_cmplt_epi32_mask(b.key, a.key) |
                        (_mm512_cmpeq_epi32_mask(b.key, a.key) & _mm512_cmplt_epi32_mask(b.i, a.i));
    return {_mm512_mask_mov_epi32(a.key, w, b.key), _mm512_mask_mov_epi32(a.v, w, b.v),
            _mm512_mask_mov_epi32(a.i, w, b.i)};
  }
}

/// One vector of pairs in place (64 bytes), as emit() wants it: a NaN value becomes the canonical
/// NaN (when `canonical`), f64_i32's padding becomes zero. Lanes outside m are not touched.
template <DType D>
TD_AVX512 void copy_vector(void* dst, const void* src, std::size_t byte, __mmask16 m,
                           bool canonical) {
  const auto* s = static_cast<const unsigned char*>(src) + byte;
  auto* d = static_cast<unsigned char*>(dst) + byte;
  if constexpr (kWide<D>) {
    __m512i x = _mm512_maskz_loadu_epi64(static_cast<__mmask8>(m), s);
    if (canonical) {
      const __m512d f = _mm512_castsi512_pd(x);
      x = _mm512_mask_mov_epi64(x, _mm512_mask_cmp_pd_mask(0x55, f, f, _CMP_UNORD_Q),
                                _mm512_set1_epi64(static_cast<long long>(kCanonicalNanF64)));
    }
    // Even qwords are values (kept), odd ones index and padding (padding cleared).
    x = _mm512_and_si512(
        x, _mm512_setr_epi64(-1, 0xFFFFFFFF, -1, 0xFFFFFFFF, -1, 0xFFFFFFFF, -1, 0xFFFFFFFF));
    _mm512_mask_storeu_epi64(d, static_cast<__mmask8>(m), x);
  } else {
    __m512i x = _mm512_maskz_loadu_epi32(m, s);
    if (D == DType::f32_i32 && canonical) {
      const __m512 f = _mm512_castsi512_ps(x);
      x = _mm512_mask_mov_epi32(x, _mm512_mask_cmp_ps_mask(0x5555, f, f, _CMP_UNORD_Q),
                                _mm512_set1_epi32(static_cast<int>(kCanonicalNanF32)));
    }
    _mm512_mask_storeu_epi32(d, m, x);
  }
}

template <DType D>
TD_AVX512 void copy_all(void* dst, const void* src, std::size_t n, bool canonical) {
  // Lanes of 4 bytes (8 for f64_i32) per vector of 64 bytes; every pair is whole lanes.
  constexpr std::size_t kLane = kWide<D> ? 8 : 4;
  const std::size_t lanes = n * dtype_size(D) / kLane;
  constexpr std::size_t kPer = 64 / kLane;
  std::size_t l = 0;
  for (; l + kPer <= lanes; l += kPer) copy_vector<D>(dst, src, l * kLane, 0xFFFF, canonical);
  if (l < lanes) {
    copy_vector<D>(dst, src, l * kLane, static_cast<__mmask16>((1u << (lanes - l)) - 1), canonical);
  }
}

struct Impl {
  template <DType D, ReduceOp O>
  TD_AVX512 static void load(void* acc, const void* payload, std::size_t n) {
    copy_all<D>(acc, payload, n, false);
  }
  template <DType D, ReduceOp O>
  TD_AVX512 static void accumulate(void* acc, const void* payload, std::size_t n) {
    for (std::size_t p = 0; p < n; p += kStep<D>) {
      const Masks m = step_masks<D>(n - p);
      put<D>(acc, p, m, combine<D>(get<D, O>(acc, p, m), get<D, O>(payload, p, m)), true);
    }
  }
  template <DType D, ReduceOp O>
  TD_AVX512 static void reduce(void* acc, const void* const* payloads, std::size_t k,
                               std::size_t n) {
    if (k == 0) return;
    for (std::size_t p = 0; p < n; p += kStep<D>) {
      const Masks m = step_masks<D>(n - p);
      Soa s = get<D, O>(payloads[0], p, m);
      for (std::size_t j = 1; j < k; ++j) s = combine<D>(s, get<D, O>(payloads[j], p, m));
      put<D>(acc, p, m, s, k > 1);
    }
  }
  template <DType D>
  TD_AVX512 static void emit(void* payload, const void* acc, std::size_t n) {
    copy_all<D>(payload, acc, n, true);
  }
};

}  // namespace pairs512
