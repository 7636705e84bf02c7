/* fuzz_png.c - libFuzzer harness for the PNG reader of `kiln encode-image`
 * (kp_png_decode, src/pipeline/image.c: libpng from memory, every colour
 * type and depth converted to 8-bit RGB).
 *
 * The input is a whole file. Properties checked beyond "no crash, no
 * sanitizer report": a failure leaves a message and no pixels; a decoded
 * image has positive sides within the cap, every pixel byte is readable, it
 * writes back as a PNG (kiln_png_write) that decodes to the same pixels,
 * and the encode preprocess maps it into [-1, 1] or refuses its size. */
#include "fuzz_common.h"

#include "base/base.h"
#include "pipeline/image.h"

#include <math.h>

#define KFZ_MAX_PIXELS ((size_t)1 << 20) /* 1 Mpixel: a decode within libFuzzer's memory limit */

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    kb_clear_error();
    uint8_t *rgb = (uint8_t *)1;
    int h = -1, w = -1;
    kiln_status st = kp_png_decode(data, size, KFZ_MAX_PIXELS, "fuzz.png", &rgb, &h, &w);
    if (st != KILN_OK) {
        KFZ_ASSERT(kiln_last_error()[0]);
        KFZ_ASSERT(rgb == NULL && h == 0 && w == 0);
        return 0;
    }
    KFZ_ASSERT(rgb && h > 0 && w > 0 && (size_t)h * (size_t)w <= KFZ_MAX_PIXELS);
    size_t n = (size_t)h * (size_t)w * 3;
    uint8_t x = 0;
    for (size_t i = 0; i < n; i++) x ^= rgb[i];
    (void)x;
    /* the 8-bit RGB image survives kiln's writer and this reader */
    char path[400];
    snprintf(path, sizeof path, "%s/back.png", kfz_scratch());
    if ((size_t)h * (size_t)w <= 65536) {
        KFZ_ASSERT(kiln_png_write(path, rgb, h, w, NULL, 0) == KILN_OK);
        char *again = NULL;
        size_t an = 0;
        KFZ_ASSERT(kb_read_file(path, &again, &an) == KILN_OK);
        uint8_t *back = NULL;
        int bh = 0, bw = 0;
        KFZ_ASSERT(kp_png_decode(again, an, KFZ_MAX_PIXELS, path, &back, &bh, &bw) == KILN_OK);
        KFZ_ASSERT(bh == h && bw == w && !memcmp(back, rgb, n));
        free(back);
        free(again);
    }
    /* the encode preprocess: values in [-1, 1], or the size refused */
    float *img = malloc(n * sizeof(float));
    KFZ_ASSERT(img);
    st = kiln_image_preprocess(rgb, h, w, 8, img);
    KFZ_ASSERT(st == KILN_OK || (st == KILN_ERR_SHAPE && (h % 8 || w % 8)));
    if (st == KILN_OK)
        for (size_t i = 0; i < n; i++) KFZ_ASSERT(img[i] >= -1.0f && img[i] <= 1.0f);
    free(img);
    free(rgb);
    return 0;
}
