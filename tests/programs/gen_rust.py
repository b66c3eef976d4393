#!/usr/bin/env python3
"""Generates a Rust test program of a chosen size: many functions with matches
(jump tables), a table of function pointers, trait objects, a thread-local, and a
panic caught across frames.

usage: gen_rust.py COUNT OUTFILE
"""

import sys
from pathlib import Path


def main() -> None:
    count, out = int(sys.argv[1]), Path(sys.argv[2])
    parts = [
        "use std::cell::Cell;",
        "thread_local! { static COUNTER: Cell<u64> = const { Cell::new(7) }; }",
        "trait Shape { fn area(&self) -> u64; }",
        "struct Sq(u64); impl Shape for Sq { fn area(&self) -> u64 { self.0 * self.0 } }",
        "struct Tri(u64); impl Shape for Tri { fn area(&self) -> u64 { self.0 * self.0 / 2 } }",
    ]
    for i in range(count):
        arms = []
        for c in range(32):
            k = (i * 13 + c * 7) % 89 + 1
            if c % 4 == 0:
                arms.append(f"{c} => x.wrapping_mul({k}).wrapping_add({i})")
            elif c % 4 == 1:
                arms.append(f'{c} => x ^ ("rust-string-{i % 32}".len() as u64 * {k})')
            elif c % 4 == 2:
                arms.append(f"{c} => (x >> {c % 5 + 1}).wrapping_add({k * 31})")
            else:
                arms.append(f"{c} => x.rotate_left({c}) ^ {k}")
        arms.append("_ => x")
        parts.append(f"#[inline(never)] fn f{i}(x: u64) -> u64 {{ match (x ^ {i}) % 32 {{ " + ", ".join(arms) + " } }")
    table = ", ".join(f"f{i}" for i in range(count))
    parts.append(f"static TABLE: [fn(u64) -> u64; {count}] = [{table}];")
    parts.append(
        """
fn main() {
    let mut acc: u64 = std::env::args().count() as u64;
    for (i, f) in TABLE.iter().enumerate() { acc = acc.wrapping_mul(31).wrapping_add(f(acc + i as u64)); }
    println!("generated code: {acc}");
    let shapes: Vec<Box<dyn Shape>> = vec![Box::new(Sq(12)), Box::new(Tri(9))];
    println!("trait objects: {:?}", shapes.iter().map(|s| s.area()).collect::<Vec<_>>());
    let t = std::thread::spawn(|| COUNTER.with(|c| { c.set(c.get() + 5); c.get() })).join().unwrap();
    println!("thread local: main {} thread {t}", COUNTER.with(|c| c.get()));
    std::panic::set_hook(Box::new(|_| {}));
    let r = std::panic::catch_unwind(|| { if acc != 0 { panic!("unwound") } 1 });
    println!("panic caught: {}", r.is_err());
}
"""
    )
    out.write_text("\n".join(parts) + "\n")


if __name__ == "__main__":
    main()
