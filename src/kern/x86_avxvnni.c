/* x86_avxvnni: the Q4/Q8 block matmul of x86_avx2_common.h with AVX-VNNI (VEX vpdpbusd, Intel
 * Alder Lake and later client CPUs without AVX-512; built with its own -m flags, called only when
 * dispatch.c has checked the CPU). Unsigned weights (Q4 q + 8, Q8 q + 128) by signed activations,
 * the offset removed through the activation group sum. The other entries are the avx2 table's
 * (dispatch.c fills them in). */
#include "x86_avx2_common.h"

/* vpdpbusd accumulates in int32 without saturation: any chunk length is exact. */
AI __m256i q4_dot4(__m256i part, __m256i w, __m256i x) {
    return _mm256_dpbusd_avx_epi32(part, w, x);
}

AI __m256i q4_flush(__m256i isum, __m256i part) { return _mm256_add_epi32(isum, part); }

/* q xor 0x80 = q + 128 as an unsigned byte. */
AI __m256i q8_prep(__m256i w) { return _mm256_xor_si256(w, _mm256_set1_epi8((char)0x80)); }

AI __m256i q8_dot4(__m256i part, __m256i w, __m256i x) {
    return _mm256_dpbusd_avx_epi32(part, w, x);
}

AI int32_t q8_offset(void) { return 128; }

const csd_kern_ops csd_kern_ops_avxvnni = {
    .name = "avxvnni",
    .matmul_q4_q8 = q_matmul_q4,
    .matmul_q8_q8 = q_matmul_q8,
    .matvec_q4 = streams_q4,
    .matvec_q8 = streams_q8,
    /* 2 KB, the distance every table used until stop 40 (chosen on the AMD EPYC Zen 4 hosts): no
     * AVX-VNNI CPU without AVX-512 was at hand to measure the avx2 table's 1 KB against. */
    .mv_pf_ahead = 2048,
};
