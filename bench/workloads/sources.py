"""Generated inputs of bench/speedup.py: the template-heavy C++ translation unit the
compilers build. (The iTLB-bound C program, the upper bound of the gain, is
testkit/recipes.py's `itlb_program`: the tests of `hugify try` build it too.)"""

from __future__ import annotations

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
