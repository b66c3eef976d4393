// C++ shared library: throws exceptions that the program catches, exports a class
// hierarchy (vtables and typeinfo are relocated data), and instantiates templates.
#include <stdexcept>
#include <string>
#include <vector>

extern "C" long lib_dispatch(long);

struct LibError : std::runtime_error {
    long code;
    LibError(const std::string &what, long c) : std::runtime_error(what), code(c) {}
};

struct Shape {
    virtual ~Shape() = default;
    virtual long area() const = 0;
};
struct Square : Shape {
    long side;
    explicit Square(long s) : side(s) {}
    long area() const override { return side * side; }
};

template <int N> long unrolled(long x) { return unrolled<N - 1>(x * 3 + N) ^ (x >> 2); }
template <> long unrolled<0>(long x) { return x; }

long lib_throw(long x) {
    if (x % 2) throw LibError("odd input " + std::to_string(x), x * 7);
    throw std::out_of_range("even input");
}

Shape *make_square(long s) { return new Square(s); }

long lib_compute(long x) {
    std::vector<long> v;
    for (long i = 0; i < 16; i++) v.push_back(unrolled<24>(x + i));
    long acc = lib_dispatch(x);
    for (long e : v) acc ^= e;
    return acc;
}

static struct Init {
    long value = 0;
    Init() { value = unrolled<8>(5); }
} lib_static_init;

long lib_static_value() { return lib_static_init.value; }
