/* flux_pipeline.h - the parts of a diffusers FluxPipeline folder that are
 * Flux's own (flux_pipeline.c): its text side (CLIP-L's pooled output and
 * T5's hidden states) and its sampling (the dynamic shift from the image's
 * sequence length, the distilled guidance as an input, no CFG batch), as
 * FluxPipeline.__call__ does them: the row kp_flux_kind of the pipeline
 * class table (pipeline_kind.h), which the pipeline object (pipeline.c)
 * hands a FluxPipeline's requests. */
#ifndef KILN_FLUX_PIPELINE_H
#define KILN_FLUX_PIPELINE_H

#include "kiln.h"
#include "pipeline/component.h"
#include "pipeline/pipeline_files.h"
#include "pipeline/pipeline_kind.h"

typedef struct kp_flux kp_flux;

/* the text encoders of src (tokenizer/ + text_encoder/: CLIPTextModel;
 * tokenizer_2/ + text_encoder_2/: T5), checked against the transformer's
 * pooled_projection_dim and joint_attention_dim */
kiln_status kp_flux_open(const kp_source *src, const char *where, const kiln_load_opts *base, kiln_model *transformer,
                         const kp_schedule *sched, kp_flux **out);
void kp_flux_free(kp_flux *f);
/* the text encoders (i 0: CLIP-L, 1: T5), NULL past them */
kiln_model *kp_flux_text_model(kp_flux *f, int i);
/* 1 for a guidance-distilled transformer (Flux.1-dev: a guidance input) */
int kp_flux_guided(const kp_flux *f);
/* the latent's channels (the transformer's in_channels / 4) */
int kp_flux_channels(const kp_flux *f);

/* FluxPipeline's schedule for steps steps over N packed image tokens: mu on
 * the scheduler's line, s = linspace(1, 1/steps, steps) in f32, sigma =
 * e^mu / (e^mu + (1/s - 1)) in numpy's f32 arithmetic, timesteps = 1000
 * sigma, a 0 appended to sigmas (steps + 1 values) */
kiln_status kp_flux_schedule(const kp_schedule *s, int steps, int64_t N, double *mu, float *timesteps, float *sigmas);

#endif
