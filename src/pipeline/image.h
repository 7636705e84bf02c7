/* image.h - the pixels at both ends of the VAE: diffusers'
 * VaeImageProcessor (postprocess: sample [B, 3, H, W] in [-1, 1] -> uint8
 * RGB [B, H, W, 3]; preprocess: uint8 RGB -> [1, 3, H, W] in [-1, 1]), PNG
 * files with the A1111 "parameters" text, and the PNG reader for encode
 * (libpng; untrusted input: tests/fuzz/fuzz_png.c). The public calls are
 * in include/kiln.h ("images: the VAE's pixels"). */
#ifndef KILN_IMAGE_H
#define KILN_IMAGE_H

#include "kiln.h"

/* The most pixels kiln_png_read accepts (a 32768 x 32768 image, the
 * VAE's largest side at f = 8); the fuzzer passes a smaller cap. */
#define KP_MAX_PIXELS ((size_t)1 << 30)
#define KP_MAX_SIDE 32768

/* Decode a PNG held in memory into rgb [*height, *width, 3] (malloc'd);
 * max_pixels caps height * width before the pixels are allocated. what
 * names the source in messages (a path). Conversions as kiln_png_read. */
kiln_status kp_png_decode(const void *data, size_t n, size_t max_pixels, const char *what, uint8_t **rgb,
                          int *height, int *width);

#endif
