/* log.c - leveled logging to stderr; the level is the one documented global
 * (set by kiln_set_log_level or $KILN_LOG=quiet|error|warn|info|debug). */
#include "base.h"

#include <stdlib.h>
#include <string.h>

static int g_level = -1;

void kiln_set_log_level(kiln_log_level l) { g_level = (int)l; }

kiln_log_level kb_log_level(void) {
    if (g_level < 0) {
        const char *e = getenv("KILN_LOG");
        g_level = KILN_LOG_WARN;
        if (e) {
            static const char *names[] = {"quiet", "error", "warn", "info", "debug"};
            for (int i = 0; i < 5; i++)
                if (!strcmp(e, names[i])) g_level = i;
        }
    }
    return (kiln_log_level)g_level;
}

void kb_log(kiln_log_level level, const char *fmt, ...) {
    if (level > kb_log_level() || level == KILN_LOG_QUIET) return;
    static const char *tag[] = {"", "error", "warning", "info", "debug"};
    char buf[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    fprintf(stderr, "kiln: %s: %s\n", tag[level], buf);
}
