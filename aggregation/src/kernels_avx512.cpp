// AVX-512 F/BW/VL/DQ + F16C. Left out of builds configured with -Davx512=disabled (valgrind).
#define TD_AVX512 __attribute__((target("avx2,f16c,avx512f,avx512bw,avx512vl,avx512dq"))) inline
#define TD_USE_BF16_INSN 0
#define TD_TABLE_NAME avx512_table
#define TD_TABLE_ISA Isa::avx512
#include "kernels_avx512.inl"
