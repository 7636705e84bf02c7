/* cpu.h - CPU feature detection for the kernels (cpu.c). */
#ifndef KILN_CPU_H
#define KILN_CPU_H

/* 1 when this CPU has AMX-BF16 and Linux granted this process the tile
 * state (ARCH_REQ_XCOMP_PERM); checked once. */
int kk_amx_ready(void);
/* 1 when this CPU has AVX512-FP16 (and AVX512-BF16, for the epilogue's
 * bf16 outputs) and KILN_F16 is not 0; checked once. */
int kk_f16_ready(void);
/* 1 when this CPU's class (kk_cpu_class, capped) has AVX512-BF16
 * (VDPBF16PS; with AVX512-BW/VL/DQ), the instructions of attn_bf16.c. */
int kk_bf16_ready(void);
/* 1 on CPU class 3 (docs/PERFORMANCE.md): AVX512-BF16 but neither AMX nor
 * AVX512-FP16 (in the hardware or under KILN_MAX_ISA=avx512_bf16; KILN_F16=0
 * on class 2 does not make one), the CPUs the fast backend runs attn_bf16.c on. */
int kk_bf16_only(void);
/* 1 when the class has AVX-512 core (F, BW, VL, DQ): attn_ex.c's instructions */
int kk_avx512_ready(void);

/* The best feature tag of kk_cpu_has (kernels.h) this CPU has: "avx512bf16", "amx", ... */
const char *kk_cpu_isa_tag(void);

#endif
