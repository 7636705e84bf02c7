/* sd3_text.c - the text side of an SD3 / SD3.5 pipeline folder, exactly as
 * diffusers' StableDiffusion3Pipeline.encode_prompt: each prompt through
 * CLIP-L (tokenizer/, text_encoder/), CLIP-G (tokenizer_2/, text_encoder_2/)
 * and T5 (tokenizer_3/, text_encoder_3/; zeros when the pipeline has none);
 *
 *   prompt_embeds = cat(pad(cat(clipL.h[-2], clipG.h[-2], -1), T5 width), T5, dim 1)
 *                   [B, 77 + max_sequence_length, T5 width]
 *   pooled        = cat(clipL.text_embeds, clipG.text_embeds)   [B, P_L + P_G]
 *
 * with every prompt's rows repeated images_per_prompt times in a row. Each
 * encoder is a model of the spine (its family's table), so it goes through
 * the weight cache and the compiled packages like the transformer. */
#include "base/base.h"
#include "kiln.h"
#include "pipeline/component.h"

#include <cjson/cJSON.h>
#include <stdlib.h>
#include <string.h>

#define CLIP_LEN 77
#define SD3_JOINT_DEFAULT 4096 /* SD3Transformer2DModel's joint_attention_dim without a config */

static const char *const k_tok[3] = {"tokenizer", "tokenizer_2", "tokenizer_3"};
static const char *const k_enc[3] = {"text_encoder", "text_encoder_2", "text_encoder_3"};

struct kiln_sd3_text {
    kiln_tokenizer *tok[3];
    kiln_model *enc[3]; /* CLIP-L, CLIP-G, T5 (NULL: none, zeros) */
    int joint;          /* the T5 width, or the transformer's joint_attention_dim without T5 */
};

void kiln_sd3_text_free(kiln_sd3_text *t) {
    if (!t) return;
    for (int i = 0; i < 3; i++) {
        kiln_tokenizer_free(t->tok[i]);
        kiln_model_free(t->enc[i]);
    }
    free(t);
}

/* transformer/config.json's joint_attention_dim (SD3's default without one;
 * an all-in-one file: its tokenizers folder's, or the transformer's inferred) */
static int joint_dim(const kp_source *src) {
    char *text = NULL;
    int d = SD3_JOINT_DEFAULT;
    if (kp_component_config(src, "transformer", &text)) text = NULL;
    if (text) {
        cJSON *j = cJSON_Parse(text);
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, "joint_attention_dim");
        if (cJSON_IsNumber(v) && v->valuedouble >= 1 && v->valuedouble <= 1 << 20) d = v->valueint;
        cJSON_Delete(j);
    }
    kb_clear_error();
    free(text);
    return d;
}

/* an encoder's output by name, and its shape */
static int has_output(const kiln_model *m, const char *name) {
    for (int i = 0; i < kiln_model_n_outputs(m); i++)
        if (!strcmp(kiln_model_output_name(m, i), name)) return 1;
    return 0;
}

kiln_status kiln_sd3_text_open(const char *pipeline, const kiln_load_opts *base, kiln_sd3_text **out) {
    if (!pipeline || !out) return kb_fail(KILN_ERR_INVALID_ARG, "kiln_sd3_text_open: pipeline folder and out are required");
    *out = NULL;
    /* an all-in-one file goes on, to say that it needs its tokenizers */
    if (!kb_is_dir(pipeline) && !kp_is_single_file(pipeline))
        return kb_fail(KILN_ERR_IO, "%s is not a pipeline folder", pipeline);
    return kiln_sd3_text_open_file(pipeline, NULL, base, out);
}

kiln_status kiln_sd3_text_open_file(const char *path, const char *tokenizers_dir, const kiln_load_opts *base,
                                    kiln_sd3_text **out) {
    if (!path || !out) return kb_fail(KILN_ERR_INVALID_ARG, "kiln_sd3_text_open_file: path and out are required");
    *out = NULL;
    kp_source src;
    kiln_status st = kp_source_init(path, tokenizers_dir, &src);
    if (!st) st = kp_check_tokenizers(&src); /* before any encoder loads */
    if (!st) st = kp_check_folder(&src, kp_sd3_parts + 1); /* the text parts (and whatever the index lists) */
    if (st) return st;
    kiln_sd3_text *t = kb_calloc(1, sizeof *t);
    if (!t) return KILN_ERR_NOMEM;
    for (int i = 0; i < 3 && !st; i++) {
        char *td = kp_aux_path(&src, k_tok[i]);
        int has_enc = kp_has_component(&src, k_enc[i]);
        if (src.aux && !td) st = KILN_ERR_NOMEM;
        else if (i == 2 && !has_enc) { /* no T5: zeros in its place, as diffusers */
        } else if (src.dir && (!td || !kb_is_dir(td) || !has_enc)) {
            st = kb_fail(KILN_ERR_MISSING, "%s: an SD3 pipeline needs %s/ and %s/%s", path, k_tok[i], k_enc[i],
                         i == 2 ? " (or neither)" : "");
        } else if (!has_enc) {
            st = kb_fail(KILN_ERR_MISSING, "%s: an all-in-one SD3 file needs %s* (%s)", path,
                         kp_component_prefix(src.file, k_enc[i]), k_enc[i]);
        } else if (!td || !kb_is_dir(td)) {
            st = kp_missing_tokenizer(&src, k_tok[i]);
        } else if (!(st = kiln_tokenizer_open(td, &t->tok[i]))) {
            st = kp_open_part(&src, k_enc[i], base, &t->enc[i]);
            if (st) st = kb_wrap(st, "%s", k_enc[i]);
        }
        free(td);
    }
    for (int i = 0; i < 2 && !st; i++)
        if (!has_output(t->enc[i], "hidden_states_penultimate") || !has_output(t->enc[i], "text_embeds"))
            st = kb_fail(KILN_ERR_UNSUPPORTED, "%s/%s is a %s model without hidden_states_penultimate and text_embeds "
                         "(SD3 needs CLIPTextModelWithProjection)", path, k_enc[i], kiln_model_family(t->enc[i]));
    if (!st && t->enc[2] && !has_output(t->enc[2], "last_hidden_state"))
        st = kb_fail(KILN_ERR_UNSUPPORTED, "%s/text_encoder_3 is a %s model without last_hidden_state (SD3 needs a T5 "
                     "encoder)", path, kiln_model_family(t->enc[2]));
    if (!st && !t->enc[2]) t->joint = joint_dim(&src);
    if (st) {
        kiln_sd3_text_free(t);
        return st;
    }
    *out = t;
    return KILN_OK;
}

kiln_model *kiln_sd3_text_model(kiln_sd3_text *t, int i) { return t && i >= 0 && i < 3 ? t->enc[i] : NULL; }

kiln_status kiln_sd3_text_widths(kiln_sd3_text *t, int64_t *t5_width, int64_t *pooled_width) {
    if (!t) return kb_fail(KILN_ERR_INVALID_ARG, "kiln_sd3_text_widths: encoders required");
    int64_t pl = 0, pg = 0, w = t->joint;
    kiln_status st = kp_output_width(t->enc[0], CLIP_LEN, "text_embeds", &pl);
    if (!st) st = kp_output_width(t->enc[1], CLIP_LEN, "text_embeds", &pg);
    if (!st && t->enc[2]) st = kp_output_width(t->enc[2], 1, "last_hidden_state", &w);
    if (st) return st;
    if (t5_width) *t5_width = w;
    if (pooled_width) *pooled_width = pl + pg;
    return KILN_OK;
}

kiln_status kiln_sd3_encode(kiln_sd3_text *t, const char *const *prompts, int n, int images_per_prompt,
                            int max_sequence_length, float **embeds, int64_t embeds_shape[3], float **pooled,
                            int64_t pooled_shape[2]) {
    if (!t || !prompts || !embeds || !pooled || !embeds_shape || !pooled_shape)
        return kb_fail(KILN_ERR_INVALID_ARG, "kiln_sd3_encode: encoders, prompts and outputs are required");
    *embeds = *pooled = NULL;
    if (n < 1 || n > 1024) return kb_fail(KILN_ERR_INVALID_ARG, "kiln_sd3_encode: %d prompts (1 to 1024)", n);
    if (images_per_prompt < 1 || images_per_prompt > 1024 || n * images_per_prompt > 1024)
        return kb_fail(KILN_ERR_INVALID_ARG, "kiln_sd3_encode: %d images per prompt for %d prompts (a batch of at "
                       "most 1024)", images_per_prompt, n);
    if (max_sequence_length <= 0) max_sequence_length = 256;
    if (max_sequence_length > 512)
        return kb_fail(KILN_ERR_INVALID_ARG, "max_sequence_length %d: at most 512 (T5's)", max_sequence_length);
    for (int p = 0; p < n; p++)
        if (!prompts[p]) return kb_fail(KILN_ERR_INVALID_ARG, "kiln_sd3_encode: prompt %d is NULL", p);
    static const char *const clip_out[2] = {"hidden_states_penultimate", "text_embeds"}, *t5_out[1] = {"last_hidden_state"};
    float *b[3][2] = {{0}};
    int64_t sh[3][2][3];
    kiln_status st = KILN_OK;
    for (int i = 0; i < 2 && !st; i++) {
        /* CLIP-G reads the tokens CLIP-L does: one warning for both */
        st = kp_encode_ids(t->enc[i], t->tok[i], prompts, n, CLIP_LEN, i ? NULL : "CLIP", 2, clip_out, b[i], sh[i]);
        if (st) st = kb_wrap(st, "%s", k_enc[i]);
    }
    if (!st && t->enc[2]) {
        st = kp_encode_ids(t->enc[2], t->tok[2], prompts, n, max_sequence_length, "T5 (max_sequence_length)", 1, t5_out,
                        b[2], sh[2]);
        if (st) st = kb_wrap(st, "text_encoder_3");
    }
    int64_t Dl = st ? 0 : sh[0][0][2], Dg = st ? 0 : sh[1][0][2], W = t->enc[2] && !st ? sh[2][0][2] : t->joint;
    int64_t L = max_sequence_length, S = CLIP_LEN + L, B = (int64_t)n * images_per_prompt;
    int64_t Pl = st ? 0 : sh[0][1][1], Pg = st ? 0 : sh[1][1][1];
    if (!st && Dl + Dg > W)
        st = kb_fail(KILN_ERR_SHAPE, "the CLIP widths %lld + %lld do not fit in the T5 width %lld", (long long)Dl,
                     (long long)Dg, (long long)W);
    float *e = st ? NULL : kb_calloc((size_t)(B * S * W), sizeof(float));
    float *po = st ? NULL : malloc(sizeof(float) * (size_t)(B * (Pl + Pg)));
    if (!st && (!e || !po)) st = kb_fail(KILN_ERR_NOMEM, "out of memory for the prompt embeddings");
    for (int64_t r = 0; !st && r < B; r++) {
        int64_t p = r / images_per_prompt; /* diffusers repeats each prompt's rows in a row */
        float *row = e + r * S * W;
        for (int64_t k = 0; k < CLIP_LEN; k++) {
            memcpy(row + k * W, b[0][0] + (p * CLIP_LEN + k) * Dl, sizeof(float) * (size_t)Dl);
            memcpy(row + k * W + Dl, b[1][0] + (p * CLIP_LEN + k) * Dg, sizeof(float) * (size_t)Dg);
        }
        if (t->enc[2]) memcpy(row + CLIP_LEN * W, b[2][0] + p * L * W, sizeof(float) * (size_t)(L * W));
        memcpy(po + r * (Pl + Pg), b[0][1] + p * Pl, sizeof(float) * (size_t)Pl);
        memcpy(po + r * (Pl + Pg) + Pl, b[1][1] + p * Pg, sizeof(float) * (size_t)Pg);
    }
    for (int i = 0; i < 3; i++) {
        free(b[i][0]);
        free(b[i][1]);
    }
    if (st) {
        free(e);
        free(po);
        return st;
    }
    *embeds = e;
    *pooled = po;
    embeds_shape[0] = B, embeds_shape[1] = S, embeds_shape[2] = W;
    pooled_shape[0] = B, pooled_shape[1] = Pl + Pg;
    return KILN_OK;
}
