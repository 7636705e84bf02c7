/* rng.c - kiln_noise: seeded standard normal noise, the same for a seed
 * whatever the thread count or chunking. In base, below every layer that
 * needs it (the model's seeded weights and example inputs, the sampler). */
#include "base.h"

#include <math.h>

static uint64_t splitmix64(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* Element pair k comes from hashing (seed, k) only: the same seed gives the
 * same noise for any thread count or chunking. Box-Muller on 53-bit uniforms. */
void kiln_noise(uint64_t seed, float *out, size_t n) {
    for (size_t k = 0; 2 * k < n; k++) {
        uint64_t a = splitmix64(seed + (2 * k + 1) * 0x9e3779b97f4a7c15ull);
        uint64_t b = splitmix64(seed + (2 * k + 2) * 0x9e3779b97f4a7c15ull);
        double u1 = ((double)(a >> 11) + 1.0) * 0x1.0p-53; /* (0, 1] */
        double u2 = (double)(b >> 11) * 0x1.0p-53;         /* [0, 1) */
        double r = sqrt(-2.0 * log(u1)), th = 2.0 * M_PI * u2;
        out[2 * k] = (float)(r * cos(th));
        if (2 * k + 1 < n) out[2 * k + 1] = (float)(r * sin(th));
    }
}

