"""Generated inputs of bench/speedup.py: the template-heavy C++ translation unit the
compilers build, and the iTLB-bound C program (the upper bound of the gain)."""

from __future__ import annotations

import random

CXX_HEAD = """\
#include <algorithm>
#include <functional>
#include <map>
#include <memory>
#include <numeric>
#include <set>
#include <sstream>
#include <string>
#include <tuple>
#include <unordered_map>
#include <variant>
#include <vector>
"""

CXX_UNIT = """
struct T{i} {{
    int a; double b; std::string s;
    bool operator<(const T{i} &o) const {{ return std::tie(a, b, s) < std::tie(o.a, o.b, o.s); }}
    bool operator==(const T{i} &o) const {{ return std::tie(a, b, s) == std::tie(o.a, o.b, o.s); }}
}};
struct H{i} {{ size_t operator()(const T{i} &t) const {{ return std::hash<std::string>()(t.s) ^ size_t(t.a); }} }};
template <typename K, typename V> struct Index{i} {{
    std::map<K, std::vector<V>> by_key;
    std::unordered_map<K, std::set<V>, H{i}> sets;
    void add(const K &k, const V &v) {{ by_key[k].push_back(v); sets[k].insert(v); }}
}};
std::string work{i}(int n) {{
    std::vector<T{i}> v;
    for (int k = 0; k < n; k++) v.push_back({{k * {i} % 17, k * 0.5, std::to_string(k)}});
    std::sort(v.begin(), v.end());
    std::stable_sort(v.begin(), v.end(), [](const T{i} &x, const T{i} &y) {{ return x.s < y.s; }});
    Index{i}<T{i}, int> idx;
    for (auto &t : v) idx.add(t, t.a);
    std::variant<T{i}, int, std::string> var = v.empty() ? std::variant<T{i}, int, std::string>(n) : v[0];
    std::ostringstream os;
    os << std::visit([](auto &&x) -> std::string {{
        using X = std::decay_t<decltype(x)>;
        if constexpr (std::is_same_v<X, T{i}>) return x.s;
        else if constexpr (std::is_same_v<X, int>) return std::to_string(x);
        else return x; }}, var);
    auto sum = std::accumulate(v.begin(), v.end(), 0.0, [](double s, const T{i} &t) {{ return s + t.b; }});
    std::function<int(int)> f = [&](int x) {{ return x + int(idx.by_key.size()); }};
    auto p = std::make_shared<std::tuple<T{i}, std::string, double>>(v.empty() ? T{i}{{}} : v.back(), os.str(), sum);
    return std::get<1>(*p) + std::to_string(f(std::get<2>(*p) > 0));
}}
"""


def cxx_unit(units: int) -> str:
    """A translation unit of `units` copies of a block that instantiates the standard
    containers and algorithms for a type of its own: compile time grows linearly."""
    body = "".join(CXX_UNIT.format(i=i) for i in range(units))
    calls = " + ".join(f"work{i}(n)" for i in range(units))
    return f"{CXX_HEAD}{body}\nstd::string work_all(int n) {{ return {calls}; }}\n"


#: How the iTLB program is built: position-independent, one function per 4 KiB page.
ITLB_CFLAGS = ("-O1", "-fPIE", "-pie", "-falign-functions=4096")


def itlb_program(functions: int, seed: int = 1) -> str:
    """A program of `functions` small functions, to be built with
    -falign-functions=4096 (ITLB_CFLAGS) so that they are 4 KiB apart, called in a
    shuffled order ARGV[1] times over: each call lands on another 4 KiB page, so with
    small pages nearly every call misses the iTLB. The calls are direct (predicted
    branches): beyond the calls themselves, the run costs fetching code from a new page
    each time."""
    order = list(range(functions))
    random.Random(seed).shuffle(order)
    out = ["#include <stdio.h>", "#include <stdlib.h>"]
    out += [
        f"__attribute__((noinline)) long f{i}(long x) {{ return x * {2 * i + 3} + {i}; }}" for i in range(functions)
    ]
    out.append("__attribute__((noinline)) long chain(long x) {")
    out += [f"    x = f{i}(x) & 0xffffff;" for i in order]
    out.append("    return x;\n}")
    out.append(
        "int main(int argc, char **argv) {\n"
        "    long rounds = argc > 1 ? atol(argv[1]) : 1, x = 1;\n"
        "    for (long r = 0; r < rounds; r++) x = chain(x);\n"
        '    printf("%ld\\n", x);\n    return 0;\n}'
    )
    return "\n".join(out) + "\n"
