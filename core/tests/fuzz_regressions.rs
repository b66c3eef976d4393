//! Inputs the fuzz targets (fuzz/, bench/fuzz.py) once crashed on, kept under
//! fuzz/regressions/TARGET/: each must now give a result or an error, never a panic.

use std::fs;
use std::path::Path;

use hugify_core::{inspect, probe::probe, transform_to_vec, Options, DEFAULT_HUGE_PAGE};

fn inputs(target: &str) -> Vec<(String, Vec<u8>)> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz/regressions").join(target);
    let Ok(entries) = fs::read_dir(&dir) else { return Vec::new() }; // none found yet
    let mut out: Vec<_> =
        entries.map(|e| e.unwrap().path()).map(|p| (p.display().to_string(), fs::read(&p).unwrap())).collect();
    out.sort();
    out
}

fn opts() -> Options {
    Options { threshold: 0, ..Options::default() }
}

#[test]
fn inspect_and_transform_inputs_give_errors_not_panics() {
    let files: Vec<_> = inputs("inspect").into_iter().chain(inputs("transform")).collect();
    assert!(!files.is_empty());
    for (name, data) in files {
        eprintln!("{name}");
        let _ = inspect(&data, &opts());
        let _ = probe(&data).map(|p| p.windows(DEFAULT_HUGE_PAGE));
        let _ = transform_to_vec(&data, &opts());
    }
}

#[test]
fn dwarf_inputs_give_errors_not_panics() {
    for (name, data) in inputs("dwarf") {
        eprintln!("{name}");
        hugify_core::fuzzing::dwarf(&data);
    }
}
