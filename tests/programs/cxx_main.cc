// C++ test program: exceptions thrown in the (rewritten) library and caught here,
// across the two objects' .eh_frame and .gcc_except_table; virtual calls through
// the library's vtables; RTTI.
#include <cstdio>
#include <memory>
#include <stdexcept>
#include <typeinfo>

extern "C" long exe_dispatch(long);
long lib_throw(long);
long lib_compute(long);
long lib_static_value();
struct Shape {
    virtual ~Shape() = default;
    virtual long area() const = 0;
};
Shape *make_square(long);

int main(int argc, char **) {
    std::printf("generated code: %ld\n", exe_dispatch(argc));
    std::printf("library: %ld static %ld\n", lib_compute(3), lib_static_value());
    for (long i = 1; i <= 4; i++) {
        try {
            lib_throw(i);
        } catch (const std::out_of_range &e) {
            std::printf("caught out_of_range: %s\n", e.what());
        } catch (const std::runtime_error &e) {
            std::printf("caught runtime_error: %s (%s)\n", e.what(), typeid(e).name());
        }
    }
    std::unique_ptr<Shape> s(make_square(12));
    std::printf("virtual call: %ld\n", s->area());
    return 0;
}
