//! `transform` on mutated real ELF files (seeded from the test matrix). What it
//! accepts must pass its own self-check, parse again, and be left alone by a second
//! run (hugify never stacks a second shift on its own output).
#![no_main]

use hugify_core::{elf::Elf, transform_to_vec, Options};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let opts = Options { threshold: 0, ..Options::default() };
    if let Ok((_, out)) = transform_to_vec(data, &opts) {
        Elf::parse(&out).expect("the output of a successful transform parses");
        if let Ok((t, _)) = transform_to_vec(&out, &opts) {
            assert_eq!(t.summary().dv, 0, "a second run shifted hugify's own output again");
        }
    }
});
