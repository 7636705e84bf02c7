/* cpu.c - what this CPU can run: its class (docs/PERFORMANCE.md's five,
 * from cpuid), capped by KILN_MAX_ISA so that a machine runs exactly the
 * kernels of a lower class; the feature tags of the weight cache's layouts
 * and packages' manifests (kk_cpu_has, from oneDNN's view of the ISA, which
 * the cap reaches through dnnl_set_max_cpu_isa); and whether kiln's own AMX,
 * fp16, AVX512-BF16 and AVX-512 kernels may run here. Every kernel file asks
 * here; none asks another kernel file or cpuid. */
#define _GNU_SOURCE
#include "kernels/cpu/cpu.h"
#include "base/base.h"
#include "kernels/kernels.h"

#include <cpuid.h>
#include <oneapi/dnnl/dnnl.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

/* each class, the name KILN_MAX_ISA takes and the oneDNN ISA it caps oneDNN
 * at (oneDNN 2.6 has no AVX512-FP16 level: its kernels there are the bf16 ones) */
static const struct {
    const char *name;
    dnnl_cpu_isa_t dnnl;
} k_classes[KK_CLASS_COUNT] = {
    [KK_CLASS_BASE] = {"sse41", dnnl_cpu_isa_sse41},
    [KK_CLASS_AVX2] = {"avx2", dnnl_cpu_isa_avx2},
    [KK_CLASS_AVX512] = {"avx512", dnnl_cpu_isa_avx512_core},
    [KK_CLASS_AVX512_BF16] = {"avx512_bf16", dnnl_cpu_isa_avx512_core_bf16},
    [KK_CLASS_AVX512_FP16] = {"avx512_fp16", dnnl_cpu_isa_avx512_core_bf16},
    [KK_CLASS_AMX] = {"amx", dnnl_cpu_isa_avx512_core_amx},
};

static const struct {
    const char *tag;
    dnnl_cpu_isa_t isa;
} k_isa_tags[] = {{"sse41", dnnl_cpu_isa_sse41},
                  {"avx2", dnnl_cpu_isa_avx2},
                  {"avx512", dnnl_cpu_isa_avx512_core},
                  {"avx512vnni", dnnl_cpu_isa_avx512_core_vnni},
                  {"avx512bf16", dnnl_cpu_isa_avx512_core_bf16},
                  {"amx", dnnl_cpu_isa_avx512_core_amx}};

/* oneDNN's ISA values are feature masks: an ISA has a level when it has all its bits */
static int isa_has(dnnl_cpu_isa_t isa, dnnl_cpu_isa_t level) { return ((unsigned)isa & (unsigned)level) == (unsigned)level; }

/* The hardware's class from cpuid, with the OS's consent to the register
 * state (XCR0: AVX's ymm, AVX-512's zmm and masks, AMX's tiles). */
static kk_class hw_class(void) {
    unsigned a, b, c, d;
    if (!__get_cpuid(1, &a, &b, &c, &d)) return KK_CLASS_BASE;
    int fma = (c >> 12) & 1, osxsave = (c >> 27) & 1, f16c = (c >> 29) & 1;
    if (!osxsave || __get_cpuid_max(0, NULL) < 7) return KK_CLASS_BASE;
    unsigned lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    uint64_t xcr0 = ((uint64_t)hi << 32) | lo;
    unsigned b7, c7, d7, a71 = 0, b71, c71, d71;
    __cpuid_count(7, 0, a, b7, c7, d7);
    unsigned max7 = a;
    if (max7 >= 1) __cpuid_count(7, 1, a71, b71, c71, d71);
    int avx2 = (b7 >> 5) & 1;
    if (!avx2 || !fma || !f16c || (xcr0 & 0x6) != 0x6) return KK_CLASS_BASE;
    /* avx512f, dq, bw, vl: AVX-512 "core" (Skylake-SP and every AVX-512 CPU since) */
    int avx512 = ((b7 >> 16) & 1) && ((b7 >> 17) & 1) && ((b7 >> 30) & 1) && ((b7 >> 31) & 1) && (xcr0 & 0xe0) == 0xe0;
    if (!avx512) return KK_CLASS_AVX2;
    int vnni = (c7 >> 11) & 1, bf16 = (a71 >> 5) & 1;
    if (!bf16 || !vnni) return KK_CLASS_AVX512;
    int fp16 = (d7 >> 23) & 1;
    int amx = ((d7 >> 22) & 1) && ((d7 >> 24) & 1) && ((d7 >> 25) & 1) && (xcr0 & 0x60000) == 0x60000;
    return amx ? KK_CLASS_AMX : fp16 ? KK_CLASS_AVX512_FP16 : KK_CLASS_AVX512_BF16;
}

static kk_class g_hw, g_class;
static int g_cap_bad;
static pthread_once_t g_once = PTHREAD_ONCE_INIT;

/* KILN_MAX_ISA's class, KK_CLASS_COUNT when unset, -1 when not a class name */
static int cap_of_env(void) {
    const char *e = getenv("KILN_MAX_ISA");
    if (!e || !*e) return KK_CLASS_COUNT;
    for (int i = KK_CLASS_AVX2; i < KK_CLASS_COUNT; i++)
        if (!strcmp(e, k_classes[i].name)) return i;
    return -1;
}

/* Once, before any other oneDNN call of this process: the class, and oneDNN
 * capped to it. ONEDNN_MAX_CPU_ISA set by the user lowers the class too, so
 * that kiln's own kernels never run above what oneDNN was allowed. */
static void init_class(void) {
    g_hw = hw_class();
    int cap = cap_of_env();
    g_cap_bad = cap < 0;
    kk_class c = cap >= 0 && cap < (int)g_hw ? (kk_class)cap : g_hw;
    if (c < g_hw) dnnl_set_max_cpu_isa(k_classes[c].dnnl);
    dnnl_cpu_isa_t isa = dnnl_get_effective_cpu_isa();
    while (c > KK_CLASS_BASE && !isa_has(isa, k_classes[c].dnnl)) c--;
    g_class = c;
}

kk_class kk_cpu_class(void) {
    pthread_once(&g_once, init_class);
    return g_class;
}

kk_class kk_cpu_hw_class(void) {
    pthread_once(&g_once, init_class);
    return g_hw;
}

const char *kiln_cpu_class(int hardware) { return kk_class_name(hardware ? kk_cpu_hw_class() : kk_cpu_class()); }

const char *kk_class_name(kk_class c) { return c >= 0 && c < KK_CLASS_COUNT ? k_classes[c].name : "?"; }

int kk_class_parse(const char *name) {
    for (int i = KK_CLASS_AVX2; i < KK_CLASS_COUNT; i++)
        if (name && !strcmp(name, k_classes[i].name)) return i;
    return -1;
}

const char *kk_cpu_cap_error(void) {
    pthread_once(&g_once, init_class);
    return g_cap_bad ? "is not a CPU class (expected one of avx2, avx512, avx512_bf16, avx512_fp16, amx)" : NULL;
}

int kk_cpu_has(const char *feature) {
    kk_cpu_class();
    dnnl_cpu_isa_t isa = dnnl_get_effective_cpu_isa();
    for (size_t i = 0; i < sizeof k_isa_tags / sizeof *k_isa_tags; i++)
        if (!strcmp(feature, k_isa_tags[i].tag)) return isa_has(isa, k_isa_tags[i].isa);
    return 0; /* a feature this build does not know is a feature it cannot promise */
}

int kk_amx_ready(void) {
    static int ready = -1;
    int r = __atomic_load_n(&ready, __ATOMIC_RELAXED);
    if (r < 0) {
        /* Linux hands out AMX state only on request (ARCH_REQ_XCOMP_PERM for XTILEDATA) */
        r = kk_cpu_class() >= KK_CLASS_AMX && kk_cpu_has("amx") && syscall(SYS_arch_prctl, 0x1023, 18) == 0;
        __atomic_store_n(&ready, r, __ATOMIC_RELAXED);
    }
    return r;
}

int kk_f16_ready(void) {
    static int ready = -1;
    int r = __atomic_load_n(&ready, __ATOMIC_RELAXED);
    if (r < 0) {
        const char *e = getenv("KILN_F16");
        r = !(e && !strcmp(e, "0")) && kk_cpu_class() >= KK_CLASS_AVX512_FP16;
        __atomic_store_n(&ready, r, __ATOMIC_RELAXED);
    }
    return r;
}

int kk_bf16_ready(void) { return kk_cpu_class() >= KK_CLASS_AVX512_BF16; }

int kk_bf16_only(void) { return kk_cpu_class() == KK_CLASS_AVX512_BF16; }

int kk_avx512_ready(void) { return kk_cpu_class() >= KK_CLASS_AVX512; }

const char *kk_cpu_isa_tag(void) {
    kk_cpu_class();
    dnnl_cpu_isa_t isa = dnnl_get_effective_cpu_isa();
    const char *tag = "sse41";
    for (size_t i = 0; i < sizeof k_isa_tags / sizeof *k_isa_tags; i++)
        if (isa_has(isa, k_isa_tags[i].isa)) tag = k_isa_tags[i].tag;
    return tag;
}
