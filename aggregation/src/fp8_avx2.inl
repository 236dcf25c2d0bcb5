// E4M3 widening by nibble lookups on the AVX2 path, 32 elements at a time. Included by
// kernels_avx2.cpp inside its unnamed namespace, after combine() and Avx2ImplVec; the wrappers
// call these loops for e4m3 x {sum, min, max}. docs/kernels.md, "FP8 widening by table".
//
// An E4M3 magnitude m = EEEE.MMM widens to the binary32 bits b3.b2.0.0, and for normal values
// (E >= 1) b3 = 0x3C + (m >> 4) and b2 = (m & 0xF) << 4: one vpshufb each, on the high and the
// low nibble. The subnormals (m < 8) take two other vpshufb on the low nibble and a blend, NaN
// (m = 0x7F) one OR, the sign another; unpacks with zero then make the binary32 lanes (a vpermd
// first puts the input in the order the in-lane unpacks need). About 6 operations per 8
// elements against 13 for the shift, vcvtph2ps, multiply and NaN fix of e4m3_to_ps().

namespace fp8avx2 {

template <DType D, ReduceOp O>
constexpr bool kCovers = D == DType::e4m3 && (O == ReduceOp::sum || O == ReduceOp::min ||
                                              O == ReduceOp::max || O == ReduceOp::prod);

TD_AVX2 __m256i lanes16(std::uint8_t v0, std::uint8_t v1, std::uint8_t v2, std::uint8_t v3,
                        std::uint8_t v4, std::uint8_t v5, std::uint8_t v6, std::uint8_t v7,
                        std::uint8_t v8, std::uint8_t v9, std::uint8_t v10, std::uint8_t v11,
                        std::uint8_t v12, std::uint8_t v13, std::uint8_t v14, std::uint8_t v15) {
  const __m128i t = _mm_setr_epi8(
      static_cast<char>(v0), static_cast<char>(v1), static_cast<char>(v2), static_cast<char>(v3),
      static_cast<char>(v4), static_cast<char>(v5), static_cast<char>(v6), static_cast<char>(v7),
      static_cast<char>(v8), static_cast<char>(v9), static_cast<char>(v10), static_cast<char>(v11),
      static_cast<char>(v12), static_cast<char>(v13), static_cast<char>(v14),
      static_cast<char>(v15));
  return _mm256_broadcastsi128_si256(t);
}

/// 32 E4M3 bytes widened into four vectors of 8 binary32.
TD_AVX2 void widen32(__m256i in, __m256 out[4]) {
  const __m256i x = _mm256_permutevar8x32_epi32(in, _mm256_setr_epi32(0, 2, 4, 6, 1, 3, 5, 7));
  const __m256i m = _mm256_and_si256(x, _mm256_set1_epi8(0x7F));
  const __m256i hn = _mm256_and_si256(_mm256_srli_epi16(m, 4), _mm256_set1_epi8(0x0F));
  const __m256i ln = _mm256_and_si256(x, _mm256_set1_epi8(0x0F));
  const __m256i sub = _mm256_cmpgt_epi8(_mm256_set1_epi8(8), m);
  // Normal values by nibble; subnormals M * 2^-9 by M (the low nibble, E = 0).
  const __m256i b2n = lanes16(0x00, 0x10, 0x20, 0x30, 0x40, 0x50, 0x60, 0x70, 0x80, 0x90, 0xA0,
                              0xB0, 0xC0, 0xD0, 0xE0, 0xF0);
  const __m256i b2s =
      lanes16(0x00, 0x00, 0x80, 0xC0, 0x00, 0x20, 0x40, 0x60, 0, 0, 0, 0, 0, 0, 0, 0);
  const __m256i b3n =
      lanes16(0x3C, 0x3D, 0x3E, 0x3F, 0x40, 0x41, 0x42, 0x43, 0, 0, 0, 0, 0, 0, 0, 0);
  const __m256i b3s =
      lanes16(0x00, 0x3B, 0x3B, 0x3B, 0x3C, 0x3C, 0x3C, 0x3C, 0, 0, 0, 0, 0, 0, 0, 0);
  const __m256i b2 =
      _mm256_blendv_epi8(_mm256_shuffle_epi8(b2n, ln), _mm256_shuffle_epi8(b2s, ln), sub);
  __m256i b3 = _mm256_blendv_epi8(_mm256_shuffle_epi8(b3n, hn), _mm256_shuffle_epi8(b3s, ln), sub);
  // NaN: 0x43 | 0x7F = 0x7F (and b2 is 0xF0): 0x7FF00000, convert.h's widened E4M3 NaN.
  b3 = _mm256_or_si256(
      b3, _mm256_and_si256(_mm256_cmpeq_epi8(m, _mm256_set1_epi8(0x7F)), _mm256_set1_epi8(0x7F)));
  b3 = _mm256_or_si256(b3, _mm256_and_si256(x, _mm256_set1_epi8(static_cast<char>(0x80))));
  const __m256i lo = _mm256_unpacklo_epi8(b2, b3), hi = _mm256_unpackhi_epi8(b2, b3);
  const __m256i z = _mm256_setzero_si256();
  out[0] = _mm256_castsi256_ps(_mm256_unpacklo_epi16(z, lo));
  out[1] = _mm256_castsi256_ps(_mm256_unpackhi_epi16(z, lo));
  out[2] = _mm256_castsi256_ps(_mm256_unpacklo_epi16(z, hi));
  out[3] = _mm256_castsi256_ps(_mm256_unpackhi_epi16(z, hi));
}

TD_AVX2 __m256i bytes32(const void* p, std::size_t i) {
  return _mm256_loadu_si256(
      reinterpret_cast<const __m256i*>(static_cast<const std::uint8_t*>(p) + i));
}

template <DType D, ReduceOp O>
TD_AVX2 void load(void* acc, const void* payload, std::size_t n) {
  auto* a = static_cast<float*>(acc);
  std::size_t i = 0;
  __m256 w[4];
  for (; i + 32 <= n; i += 32) {
    widen32(bytes32(payload, i), w);
    for (int q = 0; q < 4; ++q) _mm256_storeu_ps(a + i + 8 * q, w[q]);
  }
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(a + i, load_widen<D>(payload, i));
  scalar::load<D, O>(acc, payload, i, n);
}

template <DType D, ReduceOp O>
TD_AVX2 void accumulate(void* acc, const void* payload, std::size_t n) {
  auto* a = static_cast<float*>(acc);
  std::size_t i = 0;
  __m256 w[4];
  for (; i + 32 <= n; i += 32) {
    widen32(bytes32(payload, i), w);
    for (int q = 0; q < 4; ++q) {
      _mm256_storeu_ps(a + i + 8 * q, combine_ps<O>(_mm256_loadu_ps(a + i + 8 * q), w[q]));
    }
  }
  for (; i + 8 <= n; i += 8) {
    _mm256_storeu_ps(a + i, combine_ps<O>(_mm256_loadu_ps(a + i), load_widen<D>(payload, i)));
  }
  scalar::accumulate<D, O>(acc, payload, i, n);
}

template <DType D, ReduceOp O>
TD_AVX2 void reduce(void* acc, const void* const* payloads, std::size_t k, std::size_t n) {
  if (k == 0) return;
  auto* a = static_cast<float*>(acc);
  std::size_t i = 0;
  for (; i + 32 <= n; i += 32) {
    __m256 v[4], w[4];
    widen32(bytes32(payloads[0], i), v);
    for (std::size_t j = 1; j < k; ++j) {
      widen32(bytes32(payloads[j], i), w);
      for (int q = 0; q < 4; ++q) v[q] = combine_ps<O>(v[q], w[q]);
    }
    for (int q = 0; q < 4; ++q) _mm256_storeu_ps(a + i + 8 * q, v[q]);
  }
  for (; i + 8 <= n; i += 8) {  // 8-element steps with e4m3_to_ps() before the scalar tail
    __m256 v = load_widen<D>(payloads[0], i);
    for (std::size_t j = 1; j < k; ++j) v = combine_ps<O>(v, load_widen<D>(payloads[j], i));
    _mm256_storeu_ps(a + i, v);
  }
  scalar::reduce<D, O>(acc, payloads, k, i, n);
}

}  // namespace fp8avx2
