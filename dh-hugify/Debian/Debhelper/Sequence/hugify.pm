#!/usr/bin/perl
# The dh(1) add-on "hugify": runs dh_hugify after the files are installed and
# before the debug information is split off, so that dwz and dh_strip (and its
# -dbgsym package) see the rewritten files and their build-ids; dh_hugify_check
# after dh_strip, the last tool that rewrites ELF files, so that a tool that
# undid the layout fails the build; and dh_hugify_sign after the check, so that
# its statement and signature cover the bytes that ship, checked.
#
# Enabled by Build-Depends: dh-sequence-hugify (recorded in the .buildinfo with
# the distribution's policy package), dh $@ --with hugify, or, locally and
# unrecorded, DH_EXTRA_ADDONS=hugify in the build environment; disabled by
# dh $@ --without hugify. See dh_hugify(1), dh_hugify_check(1), dh_hugify_sign(1).

use strict;
use warnings;

# dh_dwz runs first of the ELF tools from compat 12 on (elf-tools add-on);
# before that (or wherever it was removed) dh_strip is the first.
insert_before('dh_dwz', 'dh_hugify') or insert_before('dh_strip', 'dh_hugify');
insert_after('dh_strip', 'dh_hugify_check');
insert_after('dh_hugify_check', 'dh_hugify_sign');

1;
