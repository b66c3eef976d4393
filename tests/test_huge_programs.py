"""The biggest programs of Debian, which the byte probe held back from a shift for
bytes that only looked like a reference to the headers (issue 23): with the
instructions decoded they are shifted, all their code on huge pages, and still work.
And files with a true reference, or undecodable code, are refused by name."""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

from testkit import HP
from testkit.cli import hugify, transform
from testkit.elf import exec_load, hugified, sections
from testkit.recipes import debian_packages

LIB = "usr/lib/x86_64-linux-gnu"
SHF_EXECINSTR = 0x4


def _candidate(package: str) -> str:
    out = subprocess.run(["apt-cache", "policy", package], capture_output=True, text=True, check=True).stdout
    m = re.search(r"Candidate: (\S+)", out)
    assert m and m.group(1) != "(none)", out
    return m.group(1)


def _root() -> Path:
    """qemu with its modules and firmware; libnode with Debian's own node (of the
    same source version: another nodejs may be installed) and the libraries the
    system may lack."""
    node = f"nodejs={_candidate('libnode108')}"
    packages = ["qemu-system-x86", "qemu-system-common", "qemu-system-data", "seabios", "libnode108", node]
    return debian_packages("huge-programs", [*packages, "libc-ares2", "libuv1"])


def _all_code_on_huge_pages(path: Path) -> None:
    """readelf's and pyelftools' view, not the core's: one executable load on whole
    huge-page windows at a congruent offset, holding every executable section."""
    assert hugified(path)
    x = exec_load(path)
    for name, s in sections(path).items():
        if s["flags"] & SHF_EXECINSTR and s["size"]:
            assert x.vaddr <= s["addr"] and s["addr"] + s["size"] <= x.vaddr + x.memsz, name
    assert x.vaddr % HP == 0 and x.memsz % HP == 0


# A multiboot kernel (32-bit, loaded by qemu's -kernel): sums the primes below 20000
# by trial division, prints the sum in hex on COM1 and leaves through isa-debug-exit.
KERNEL = r"""
.text
.long 0x1BADB002, 0, -0x1BADB002
.globl _start
_start:
    xor %esi, %esi
    mov $2, %ecx
1:  mov $2, %ebx
2:  mov %ebx, %eax
    imul %ebx, %eax
    cmp %ecx, %eax
    ja 3f
    mov %ecx, %eax
    xor %edx, %edx
    div %ebx
    test %edx, %edx
    jz 4f
    inc %ebx
    jmp 2b
3:  add %ecx, %esi
4:  inc %ecx
    cmp $20000, %ecx
    jb 1b
    mov $8, %edi
5:  rol $4, %esi
    mov %esi, %eax
    and $15, %eax
    movb digits(%eax), %al
    mov $0x3f8, %dx
    out %al, %dx
    dec %edi
    jnz 5b
    mov $'\n', %al
    out %al, %dx
    mov $0xf4, %dx
    xor %eax, %eax
    out %eax, %dx
    hlt
digits: .ascii "0123456789abcdef"
"""


def test_qemu_system_x86_64_is_shifted_and_boots_a_kernel(tmp_path: Path) -> None:
    root = _root()
    qemu = tmp_path / "qemu-system-x86_64"
    report = transform(root / "usr/bin/qemu-system-x86_64", qemu)
    assert report["result"]["mode"] == "shift", report["plans"]["shift"]
    _all_code_on_huge_pages(qemu)
    (tmp_path / "k.S").write_text(KERNEL)
    subprocess.run(["as", "--32", "k.S", "-o", "k.o"], cwd=tmp_path, check=True)
    subprocess.run(["ld", "-m", "elf_i386", "-Ttext=0x100000", "k.o", "-o", "k.elf"], cwd=tmp_path, check=True)
    env = {**os.environ, "QEMU_MODULE_DIR": str(root / LIB / "qemu")}
    args = ["-L", root / "usr/share/seabios", "-L", root / "usr/share/qemu", "-M", "pc", "-accel", "tcg"]
    args += ["-display", "none", "-nodefaults", "-no-reboot", "-serial", "stdio"]
    args += ["-device", "isa-debug-exit,iobase=0xf4,iosize=4", "-kernel", tmp_path / "k.elf"]
    runs = [
        subprocess.run([binary, *map(str, args)], capture_output=True, text=True, env=env, timeout=300, check=False)
        for binary in (root / "usr/bin/qemu-system-x86_64", qemu)
    ]
    primes = [n for n in range(2, 20000) if all(n % d for d in range(2, int(n**0.5) + 1))]
    for r in runs:
        # isa-debug-exit: status (0 << 1) | 1.
        assert (r.returncode, r.stdout) == (1, f"{sum(primes):08x}\n"), r.stderr


def test_libnode_is_shifted_and_node_computes_the_same(tmp_path: Path) -> None:
    root = _root()
    libs = tmp_path / "libs"
    libs.mkdir()
    report = transform(root / LIB / "libnode.so.108", libs / "libnode.so.108")
    assert report["result"]["mode"] == "shift", report["plans"]["shift"]
    _all_code_on_huge_pages(libs / "libnode.so.108")
    script = (
        'let s = ""; for (let i = 0; i < 200000; i++) s += ((i * 7919) % 1000003).toString(36);'
        'console.log(s.length, require("crypto").createHash("sha256").update(s).digest("hex"))'
    )

    def base36(n: int) -> str:
        digits = "0123456789abcdefghijklmnopqrstuvwxyz"
        return digits[n] if n < 36 else base36(n // 36) + digits[n % 36]

    import hashlib

    s = "".join(base36(i * 7919 % 1000003) for i in range(200000))
    expected = f"{len(s)} {hashlib.sha256(s.encode()).hexdigest()}\n"
    for lib in (root / LIB, libs):
        env = {"LD_LIBRARY_PATH": f"{lib}:{root / LIB}", "PATH": "/usr/bin:/bin"}
        r = subprocess.run([root / "usr/bin/node", "-e", script], capture_output=True, text=True, env=env, check=True)
        assert r.stdout == expected, (lib, r.stderr)


def _shared_object(tmp_path: Path, source: str, suffix: str = ".c") -> Path:
    src = tmp_path / f"ref{suffix}"
    src.write_text(source)
    out = tmp_path / "libref.so"
    subprocess.run(["gcc", "-O2", "-fPIC", "-shared", "-Wl,-z,separate-code", src, "-o", out], check=True)
    subprocess.run(["strip", out], check=True)  # no symbol betrays it: only the code does
    return out


def _shift_refusal(path: Path) -> dict[str, str]:
    (r,) = json.loads(hugify("inspect", "--json", "--threshold", "0", path, check=False).stdout)
    return r["plans"]["shift"]


def _objdump(path: Path) -> str:
    return subprocess.run(
        ["objdump", "-d", "--no-show-raw-insn", path], capture_output=True, text=True, check=True
    ).stdout


def test_a_true_header_reference_is_refused_with_its_instruction(tmp_path: Path) -> None:
    lib = _shared_object(
        tmp_path,
        "extern const char __ehdr_start[];\n"
        "const void *headers(void) { return __ehdr_start; }\n"
        "int work(int n) { int s = 0; for (int i = 0; i < n; i++) s += i * i; return s; }\n",
    )
    # objdump's own disassembly is the oracle: the lea of address 0 and where it is.
    (lea,) = re.findall(r"^\s*([0-9a-f]+):\s+lea\s+-?0x[0-9a-f]+\(%rip\),%rax\s+# 0 ", _objdump(lib), re.M)
    plan = _shift_refusal(lib)
    assert plan["reason"] == "ehdr-reference"
    assert plan["detail"].startswith("`lea rax,["), plan
    assert f"at {int(lea, 16):#x} in .text refers pc-relatively to 0x0 (the ELF header)" in plan["detail"], plan
    text = hugify("inspect", "--threshold", "0", lib, check=False).stdout
    assert f"shift  not possible: {plan['detail']} (ehdr-reference)" in text
    # transform names it too (too small for alignment alone), and writes nothing.
    res = hugify("transform", "--json", "--threshold", "0", lib, "-o", tmp_path / "out.so", check=False)
    assert res.returncode == 4 and plan["detail"] in json.loads(res.stdout)["error"]["detail"]
    assert not (tmp_path / "out.so").exists()


def test_undecodable_code_inside_a_function_is_refused_by_address(tmp_path: Path) -> None:
    # A function whose FDE covers data: 0x06 (no instruction in 64-bit mode), then
    # bytes that could read as a RIP-relative displacement to the ELF header.
    lib = _shared_object(
        tmp_path,
        ".text\n.globl f\n.type f, @function\nf:\n.cfi_startproc\nnop\n"
        ".byte 0x06, 0x05\n.long __ehdr_start - . - 4\nret\n.cfi_endproc\n.size f, . - f\n",
        ".s",
    )
    (f,) = re.findall(r"^([0-9a-f]+) <f(?:@@Base)?>:", _objdump(lib), re.M)
    plan = _shift_refusal(lib)
    assert plan["reason"] == "undecodable-code", plan
    assert plan["detail"].startswith(f"the bytes at {int(f, 16) + 1:#x} in .text (06 05 "), plan
