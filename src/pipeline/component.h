/* component.h - one component folder of a pipeline (text_encoder,
 * transformer, vae ...) opened the one way the pipeline code opens them. */
#ifndef KILN_PIPELINE_COMPONENT_H
#define KILN_PIPELINE_COMPONENT_H

#include "kiln.h"

/* dir as the model of component: through the weight cache with base's
 * options (source and component set here), or kiln_model_open without one
 * (base NULL); its load time goes into the ledger as "load COMPONENT". */
kiln_status kp_open_component(const char *dir, const char *component, const kiln_load_opts *base, kiln_model **out);

#endif
