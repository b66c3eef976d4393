//! `inspect` (parsing, layout classification, both plans) on arbitrary bytes: any
//! input gets a report or an error, never a panic.
#![no_main]

use hugify_core::{inspect, Options};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = inspect(data, &Options { threshold: 0, ..Options::default() });
});
