//! Every DWARF walker on arbitrary section bytes (format: `hugify_core::fuzzing::dwarf`).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| hugify_core::fuzzing::dwarf(data));
