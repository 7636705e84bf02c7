/* component.c - opening one component folder of a pipeline (component.h). */
#include "pipeline/component.h"

#include "base/base.h"

#include <stdio.h>

kiln_status kp_open_component(const char *dir, const char *component, const kiln_load_opts *base, kiln_model **out) {
    double t0 = kb_now();
    kiln_status st;
    if (base && base->on_component) base->on_component(base->component_user, component, NULL, -1);
    if (!base) {
        st = kiln_model_open(dir, NULL, out);
    } else {
        kiln_load_opts o = *base;
        o.source = dir;
        o.source_fn = NULL;
        o.config_path = NULL;
        o.component = component;
        st = kiln_load_model(&o, out);
    }
    if (st) return st;
    char what[64];
    snprintf(what, sizeof what, "load %s", component);
    kb_ledger_add(what, kb_now() - t0, kiln_model_origin(*out));
    if (base && base->on_component) base->on_component(base->component_user, component, kiln_model_origin(*out), kb_now() - t0);
    return KILN_OK;
}
