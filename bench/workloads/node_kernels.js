// The node workload of bench/speedup.py: CPU-bound kernels that keep V8's JIT tiers,
// its runtime and its garbage collector busy (all in libnode's code), with no I/O but
// the checksum line each kernel prints, so that the original and the hugified libnode
// can be checked to agree. Nothing depends on time or on Math.random: the same SCALE
// gives the same output.
//
// usage: node node_kernels.js [SCALE]   (SCALE: a number, default 1: about 3 s of CPU
// time on a 2-core VM)
"use strict";

const SCALE = Number(process.argv[2] || "1");
const WORDS = ["huge", "page", "folio", "cache", "window", "segment", "loader", "kernel", "TLB", "code"];

// A 32-bit linear congruential generator: the same numbers on every run.
function rng(seed) {
  let s = seed >>> 0;
  return () => {
    s = (Math.imul(s, 1664525) + 1013904223) >>> 0;
    return s;
  };
}

// Tasks and queues in the style of the Richards benchmark: objects with shapes, method
// calls through a polymorphic dispatch, many small allocations.
function scheduler(scale) {
  class Task {
    constructor(id, prio) {
      this.id = id;
      this.prio = prio;
      this.count = 0;
    }
    run(q) {
      this.count++;
      return q.length % 3;
    }
  }
  class Worker extends Task {
    run(q) {
      this.count += 2;
      q.push({ from: this.id, v: this.count & 255 });
      return 1;
    }
  }
  class Handler extends Task {
    run(q) {
      const p = q.pop();
      this.count += p ? p.v : 1;
      return 2;
    }
  }
  class Idler extends Task {
    run() {
      this.count = (this.count * 31 + 7) % 1000003;
      return 0;
    }
  }
  const kinds = [Task, Worker, Handler, Idler];
  const tasks = [];
  for (let i = 0; i < 64; i++) tasks.push(new kinds[i % 4](i, (i * 7) % 11));
  const q = [];
  let sum = 0;
  const steps = Math.floor(8_000_000 * scale);
  for (let i = 0; i < steps; i++) {
    const t = tasks[(i * 13 + sum) & 63];
    sum = (sum + t.run(q) + t.prio) & 0xffff;
    if (q.length > 512) q.length = 0;
  }
  return tasks.reduce((a, t) => (a + t.count) % 1000000007, sum);
}

// JSON: a generated tree stringified and parsed again (the runtime's JSON code).
function json(scale) {
  const next = rng(7);
  const doc = [];
  for (let i = 0; i < 2000; i++) {
    doc.push({
      path: `/usr/lib/lib${i}.so`,
      windows: Array.from({ length: i % 9 }, (_, w) => ({ offset: w * 2097152, state: WORDS[next() % 10] })),
      size: next() % 65536,
    });
  }
  let total = 0;
  for (let k = 0; k < Math.floor(90 * scale); k++) {
    const back = JSON.parse(JSON.stringify(doc));
    for (const f of back) total = (total + f.size + f.windows.length) % 1000000007;
  }
  return total;
}

// Regular expressions (irregexp, compiled to native code) over generated log lines.
function regex(scale) {
  const lines = [];
  for (let n = 0; n < 6000; n++) {
    lines.push(`${String(n).padStart(5, "0")} ${WORDS[n % 10]}-${WORDS[(n * 7) % 10]} size=${(n * 37) % 4096}`);
  }
  const text = lines.join("\n");
  const re = /(\d+) ([a-zA-Z]+)-(page|cache|code|\w+) size=(\d+)/g;
  let total = 0;
  for (let k = 0; k < Math.floor(200 * scale); k++) {
    for (const m of text.matchAll(re)) total += Number(m[4]) + m[3].length;
    total += (text.match(/\b(?:huge|TLB)\w*/g) || []).length;
    total %= 1000000007;
  }
  return total;
}

// Maps, Sets and strings: hashing, rehashing, string building and splitting.
function collections(scale) {
  const next = rng(11);
  let total = 0;
  for (let k = 0; k < Math.floor(24 * scale); k++) {
    const m = new Map();
    const s = new Set();
    for (let i = 0; i < 40000; i++) {
      const key = `k${next() % 20000}`;
      m.set(key, (m.get(key) || 0) + i);
      s.add(key.slice(1));
    }
    const words = [...s].join(",").split(",");
    words.sort();
    total = (total + m.size + words.length + words[words.length >> 1].length) % 1000000007;
  }
  return total;
}

// Numbers: a typed-array matrix product and BigInt arithmetic (a runtime call per operation).
function numbers(scale) {
  const n = 96;
  const a = new Float64Array(n * n);
  const b = new Float64Array(n * n);
  const c = new Float64Array(n * n);
  for (let i = 0; i < n * n; i++) {
    a[i] = (i % 17) / 17;
    b[i] = (i % 13) / 13;
  }
  for (let k = 0; k < Math.floor(30 * scale); k++) {
    for (let i = 0; i < n; i++) {
      for (let j = 0; j < n; j++) {
        let x = 0;
        for (let l = 0; l < n; l++) x += a[i * n + l] * b[l * n + j];
        c[i * n + j] = x;
      }
    }
  }
  let f = 1n;
  for (let i = 1n; i <= BigInt(Math.floor(40000 * scale)); i++) f = (f * i) % 1000000000000000003n;
  return `${Math.round(c.reduce((x, y) => x + y, 0))}:${f}`;
}

// Code compiled at run time (the parser and every compiler tier), exceptions thrown and caught.
function compile(scale) {
  let total = 0;
  for (let k = 0; k < Math.floor(30000 * scale); k++) {
    const f = new Function("x", `let s = ${k}; for (let i = 0; i < 50; i++) s = (s * 31 + x + i) % 65521; return s;`);
    total = (total + f(k)) % 1000000007;
    try {
      if (k % 3 === 0) throw new RangeError(`bad ${k}`);
    } catch (e) {
      total += e.message.length;
    }
  }
  return total;
}

for (const [name, kernel] of Object.entries({ scheduler, json, regex, collections, numbers, compile })) {
  console.log(`${name} ${kernel(SCALE)}`);
}
