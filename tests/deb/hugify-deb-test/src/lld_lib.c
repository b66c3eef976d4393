/* hugify debhelper test: the library and the plugin of hugify-deb-test-lld, linked by lld. */
extern long LLD_PREFIX_DISPATCH(long);

long LLD_ENTRY(long x) {
    return LLD_PREFIX_DISPATCH(x) ^ 0x2b2b;
}
