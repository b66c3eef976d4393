/* The context every layer of the runtime works on; see hp_ctx.h. */
#include "hp_ctx.h"

#include "hp_sys.h"

void hp_ctx_init(struct hp_ctx *c, uint64_t hp)
{
    c->hp = hp;
    c->pagemap_fd = -1;
    c->maps_fd = -1;
    c->procmap = -1;
    c->scan = -1;
    c->cachestat = -1;
    c->aware = 0;
    c->measure = 0;
    c->smaps = 0;
    c->prepare = 0;
    c->prepared = 0;
    c->aware_recorded = 0;
    c->aware_checked = 0;
    c->rundir = 0;
    c->rundir_fd = -1;
    c->rundir_state = 0;
    c->may_record = -1;
    c->thorough = 0;
    c->kernel_version = 0;
    c->euid = -1;
    c->nfs = 0;
    c->budget = -1;
}

void hp_ctx_release(struct hp_ctx *c)
{
    if (c->pagemap_fd >= 0)
        hp_close(c->pagemap_fd);
    c->pagemap_fd = -1;
    if (c->maps_fd >= 0)
        hp_close(c->maps_fd);
    c->maps_fd = -1;
    if (c->rundir_state == 1 && c->rundir_fd >= 0)
        hp_close(c->rundir_fd);
    c->rundir_fd = -1;
    c->rundir_state = 0; /* looked at again when needed (the audit library, at a dlopen) */
    c->may_record = -1;
}
