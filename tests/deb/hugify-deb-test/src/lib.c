/* hugify debhelper test library: over 1 MiB of generated code behind one entry point. */
extern long lib_dispatch(long);

long lib_entry(long x) {
    long r = lib_dispatch(x); /* lib-breakpoint */
    return r ^ 0x5a5a;
}
