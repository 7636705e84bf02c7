/* cpu.c - what this CPU can run: the feature tags of the weight cache's
 * layouts and packages' manifests (kk_cpu_has, from oneDNN's view of the
 * ISA), and whether kiln's own AMX, fp16 and AVX512-BF16 kernels may run here. Every
 * kernel file asks here; none asks another kernel file. */
#define _GNU_SOURCE
#include "kernels/cpu/cpu.h"
#include "kernels/kernels.h"

#include <oneapi/dnnl/dnnl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

static const struct {
    const char *tag;
    dnnl_cpu_isa_t isa;
} k_isa_tags[] = {{"sse41", dnnl_cpu_isa_sse41},
                  {"avx2", dnnl_cpu_isa_avx2},
                  {"avx512", dnnl_cpu_isa_avx512_core},
                  {"avx512vnni", dnnl_cpu_isa_avx512_core_vnni},
                  {"avx512bf16", dnnl_cpu_isa_avx512_core_bf16},
                  {"amx", dnnl_cpu_isa_avx512_core_amx}};

int kk_cpu_has(const char *feature) {
    dnnl_cpu_isa_t isa = dnnl_get_effective_cpu_isa();
    for (size_t i = 0; i < sizeof k_isa_tags / sizeof *k_isa_tags; i++)
        if (!strcmp(feature, k_isa_tags[i].tag)) return isa >= k_isa_tags[i].isa;
    return 0; /* a feature this build does not know is a feature it cannot promise */
}

int kk_amx_ready(void) {
    static int ready = -1;
    int r = __atomic_load_n(&ready, __ATOMIC_RELAXED);
    if (r < 0) {
        /* Linux hands out AMX state only on request (ARCH_REQ_XCOMP_PERM for XTILEDATA) */
        r = kk_cpu_has("amx") && syscall(SYS_arch_prctl, 0x1023, 18) == 0;
        __atomic_store_n(&ready, r, __ATOMIC_RELAXED);
    }
    return r;
}

int kk_f16_ready(void) {
    static int ready = -1;
    int r = __atomic_load_n(&ready, __ATOMIC_RELAXED);
    if (r < 0) {
        const char *e = getenv("KILN_F16");
        __builtin_cpu_init();
        r = !(e && !strcmp(e, "0")) && __builtin_cpu_supports("avx512fp16") && __builtin_cpu_supports("avx512bf16");
        __atomic_store_n(&ready, r, __ATOMIC_RELAXED);
    }
    return r;
}

int kk_bf16_ready(void) {
    static int ready = -1;
    int r = __atomic_load_n(&ready, __ATOMIC_RELAXED);
    if (r < 0) {
        __builtin_cpu_init();
        r = __builtin_cpu_supports("avx512bf16") && __builtin_cpu_supports("avx512bw") &&
            __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
        __atomic_store_n(&ready, r, __ATOMIC_RELAXED);
    }
    return r;
}

int kk_bf16_only(void) {
    static int only = -1;
    int r = __atomic_load_n(&only, __ATOMIC_RELAXED);
    if (r < 0) {
        __builtin_cpu_init();
        r = kk_bf16_ready() && !kk_cpu_has("amx") && !__builtin_cpu_supports("avx512fp16");
        __atomic_store_n(&only, r, __ATOMIC_RELAXED);
    }
    return r;
}

const char *kk_cpu_isa_tag(void) {
    dnnl_cpu_isa_t isa = dnnl_get_effective_cpu_isa();
    const char *tag = "sse41";
    for (size_t i = 0; i < sizeof k_isa_tags / sizeof *k_isa_tags; i++)
        if (isa >= k_isa_tags[i].isa) tag = k_isa_tags[i].tag;
    return tag;
}
