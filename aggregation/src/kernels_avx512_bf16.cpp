// AVX-512 plus AVX512-BF16: the same kernels, with vcvtneps2bf16 for bf16 narrowing.
#define TD_AVX512 \
  __attribute__((target("avx2,f16c,avx512f,avx512bw,avx512vl,avx512dq,avx512bf16"))) inline
#define TD_USE_BF16_INSN 1
#define TD_TABLE_NAME avx512_bf16_table
#define TD_TABLE_ISA Isa::avx512_bf16
#include "kernels_avx512.inl"
