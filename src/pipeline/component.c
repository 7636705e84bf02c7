/* component.c - opening one component folder of a pipeline (component.h). */
#include "pipeline/component.h"

#include "base/base.h"

#include <stdio.h>

kiln_status kp_open_component(const char *dir, const char *component, const kiln_load_opts *base, kiln_model **out) {
    double t0 = kp_component_start(base, component);
    kiln_status st;
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
    kp_component_done(base, component, t0, *out);
    return KILN_OK;
}

double kp_component_start(const kiln_load_opts *base, const char *component) {
    if (base && base->on_component) base->on_component(base->component_user, component, NULL, -1);
    return kb_now();
}

void kp_component_done(const kiln_load_opts *base, const char *component, double t0, const kiln_model *m) {
    double dt = kb_now() - t0;
    char what[64];
    snprintf(what, sizeof what, "load %s", component);
    kb_ledger_add(what, dt, kiln_model_origin(m));
    if (base && base->on_component) base->on_component(base->component_user, component, kiln_model_origin(m), dt);
}
