//! `inspect` (parsing, layout classification, both plans) and the probe on arbitrary
//! bytes: any input gets a report or an error, never a panic.
#![no_main]

use hugify_core::{inspect, probe::probe, Options, DEFAULT_HUGE_PAGE};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = inspect(data, &Options { threshold: 0, ..Options::default() });
    let _ = probe(data).map(|p| p.windows(DEFAULT_HUGE_PAGE));
});
