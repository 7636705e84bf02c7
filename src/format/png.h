/* png.h - a PNG preview of a latent (libpng). */
#ifndef KILN_PNG_H
#define KILN_PNG_H

#include "kiln.h"

/* latent [C,H,W]: the first three channels (fewer are repeated) are each
 * stretched to 0..255 by their own min and max; the image is scaled up by
 * whole pixels to be at least 256 wide. Written atomically. */
kiln_status kf_write_latent_png(const char *path, const float *latent, int C, int H, int W);

#endif
