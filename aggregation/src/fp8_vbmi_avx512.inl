// FP8 (e4m3, e5m2) widening by table on the AVX-512 paths, for CPUs with AVX512-VBMI. Included by
// kernels_avx512.inl inside its unnamed namespace, after combine() and Avx512ImplVec; the wrappers
// there call these loops when fp8_vbmi() (fp8_vbmi.h) says so. docs/kernels.md, "FP8 widening by
// table", says why and what it measured.
//
// Every E4M3 and E5M2 value is exactly a bfloat16 (at most 4 significant bits, exponents well
// inside binary32's), so its binary32 bits are two bytes above two zero bytes. For 64 elements at
// once: one vpermb puts the input bytes in the order the unpacks below need, two vpermi2b look up
// the two bytes in 128-entry tables indexed by the magnitude (the permute ignores bit 7 of each
// index byte, which is the sign), one ternary-logic op puts the sign back, and unpacks with zero
// make the binary32 lanes. No conversion, multiply or NaN fix-up: the tables hold the exact
// widened bits of every encoding, NaN payloads included (convert.h).

#if TD_USE_BF16_INSN
#define TD_VBMI   \
  __attribute__(( \
      target("avx2,f16c,avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,avx512vbmi"))) inline
#else
#define TD_VBMI \
  __attribute__((target("avx2,f16c,avx512f,avx512bw,avx512vl,avx512dq,avx512vbmi"))) inline
#endif

namespace fp8vbmi {

/// The operations whose loops are here (those with a binary32 combine() in kernels_avx512.inl);
/// the wrappers call them when fp8_vbmi().
template <DType D, ReduceOp O>
constexpr bool kCovers = (D == DType::e4m3 || D == DType::e5m2) &&
                         (O == ReduceOp::sum || O == ReduceOp::min || O == ReduceOp::max ||
                          O == ReduceOp::prod);

/// Bytes 2 and 3 of the binary32 widening of each magnitude 0..127 (bytes 0 and 1 are zero).
struct Table {
  alignas(64) std::uint8_t b2[128];
  alignas(64) std::uint8_t b3[128];
};

template <DType D>
const Table& table() {
  static const Table t = [] {
    Table r{};
    for (unsigned m = 0; m < 128; ++m) {
      const auto x = static_cast<std::uint8_t>(m);
      const auto bits =
          std::bit_cast<std::uint32_t>(D == DType::e4m3 ? e4m3_to_f32(x) : e5m2_to_f32(x));
      r.b2[m] = static_cast<std::uint8_t>(bits >> 16);
      r.b3[m] = static_cast<std::uint8_t>(bits >> 24);
    }
    return r;
  }();
  return t;
}

/// vpermb indices that order 64 input bytes for the in-lane unpacks of widen64(): output vector
/// q takes bytes 4q..4q+3 of each 128-bit lane L, which must be elements 16q + 4L + 0..3.
struct Order {
  alignas(64) std::uint8_t idx[64];
};
constexpr Order kOrder = [] {
  Order o{};
  for (unsigned lane = 0; lane < 4; ++lane) {
    for (unsigned q = 0; q < 4; ++q) {
      for (unsigned r = 0; r < 4; ++r) {
        o.idx[16 * lane + 4 * q + r] = static_cast<std::uint8_t>(16 * q + 4 * lane + r);
      }
    }
  }
  return o;
}();

struct Lut {
  __m512i b2_lo, b2_hi, b3_lo, b3_hi, order;
};

template <DType D>
TD_VBMI Lut lut() {
  const Table& t = table<D>();
  return {_mm512_load_si512(t.b2), _mm512_load_si512(t.b2 + 64), _mm512_load_si512(t.b3),
          _mm512_load_si512(t.b3 + 64), _mm512_load_si512(kOrder.idx)};
}

/// 64 FP8 bytes widened into four vectors of 16 binary32: 3 cross-lane byte permutes, a ternary
/// logic op and 6 in-lane unpacks. Measured against 4 zero-masking vpermt2b for the placement
/// (2 + 1 + 4 cross-lane ops): the unpacks were faster at L1 (vs_f32_elements 1.02-1.18 vs
/// 0.92-1.08 for e4m3 sum, 1.01-1.09 vs 0.85-0.89 for e5m2 sum, interleaved runs).
TD_VBMI void widen64(const Lut& l, __m512i in, __m512 out[4]) {
  const __m512i x = _mm512_permutexvar_epi8(l.order, in);
  const __m512i b2 = _mm512_permutex2var_epi8(l.b2_lo, x, l.b2_hi);
  // b3 | (x & 0x80): ternary logic 0xF8 is A | (B & C).
  const __m512i b3 = _mm512_ternarylogic_epi32(_mm512_permutex2var_epi8(l.b3_lo, x, l.b3_hi), x,
                                               _mm512_set1_epi8(static_cast<char>(0x80)), 0xF8);
  // Bytes (b2, b3) into words, then words into the top halves of dwords.
  const __m512i lo = _mm512_unpacklo_epi8(b2, b3), hi = _mm512_unpackhi_epi8(b2, b3);
  const __m512i z = _mm512_setzero_si512();
  out[0] = _mm512_castsi512_ps(_mm512_unpacklo_epi16(z, lo));
  out[1] = _mm512_castsi512_ps(_mm512_unpackhi_epi16(z, lo));
  out[2] = _mm512_castsi512_ps(_mm512_unpacklo_epi16(z, hi));
  out[3] = _mm512_castsi512_ps(_mm512_unpackhi_epi16(z, hi));
}

TD_VBMI __mmask16 lanes(std::size_t left) {
  return left >= 16 ? __mmask16{0xFFFF} : static_cast<__mmask16>((1u << left) - 1);
}

template <DType D, ReduceOp O>
TD_VBMI void load(void* acc, const void* payload, std::size_t n) {
  const Lut l = lut<D>();
  auto* a = static_cast<float*>(acc);
  const auto* p = static_cast<const unsigned char*>(payload);
  std::size_t i = 0;
  __m512 w[4];
  for (; i + 64 <= n; i += 64) {
    widen64(l, _mm512_loadu_si512(p + i), w);
    for (int q = 0; q < 4; ++q) _mm512_storeu_ps(a + i + 16 * q, w[q]);
  }
  if (i < n) {
    const std::size_t left = n - i;
    widen64(l, _mm512_maskz_loadu_epi8((__mmask64{1} << left) - 1, p + i), w);
    for (std::size_t q = 0; 16 * q < left; ++q) {
      _mm512_mask_storeu_ps(a + i + 16 * q, lanes(left - 16 * q), w[q]);
    }
  }
}

template <DType D, ReduceOp O>
TD_VBMI void accumulate(void* acc, const void* payload, std::size_t n) {
  const Lut l = lut<D>();
  auto* a = static_cast<float*>(acc);
  const auto* p = static_cast<const unsigned char*>(payload);
  std::size_t i = 0;
  __m512 w[4];
  for (; i + 64 <= n; i += 64) {
    widen64(l, _mm512_loadu_si512(p + i), w);
    for (int q = 0; q < 4; ++q) {
      _mm512_storeu_ps(a + i + 16 * q, combine_ps<O>(_mm512_loadu_ps(a + i + 16 * q), w[q]));
    }
  }
  if (i < n) {
    const std::size_t left = n - i;
    widen64(l, _mm512_maskz_loadu_epi8((__mmask64{1} << left) - 1, p + i), w);
    for (std::size_t q = 0; 16 * q < left; ++q) {
      const __mmask16 m = lanes(left - 16 * q);
      _mm512_mask_storeu_ps(a + i + 16 * q, m,
                            combine_ps<O>(_mm512_maskz_loadu_ps(m, a + i + 16 * q), w[q]));
    }
  }
}

template <DType D, ReduceOp O>
TD_VBMI void reduce(void* acc, const void* const* payloads, std::size_t k, std::size_t n) {
  if (k == 0) return;
  const Lut l = lut<D>();
  auto* a = static_cast<float*>(acc);
  for (std::size_t i = 0; i < n; i += 64) {
    const std::size_t left = n - i;
    const __mmask64 mb = left >= 64 ? ~__mmask64{0} : (__mmask64{1} << left) - 1;
    __m512 v[4], w[4];
    widen64(l, _mm512_maskz_loadu_epi8(mb, static_cast<const unsigned char*>(payloads[0]) + i), v);
    for (std::size_t j = 1; j < k; ++j) {
      widen64(l, _mm512_maskz_loadu_epi8(mb, static_cast<const unsigned char*>(payloads[j]) + i),
              w);
      for (int q = 0; q < 4; ++q) v[q] = combine_ps<O>(v[q], w[q]);
    }
    for (std::size_t q = 0; q < 4 && 16 * q < left; ++q) {
      _mm512_mask_storeu_ps(a + i + 16 * q, lanes(left - 16 * q), v[q]);
    }
  }
}

}  // namespace fp8vbmi

#undef TD_VBMI
