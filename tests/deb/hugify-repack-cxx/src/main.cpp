// hugify repack test program: a template, a virtual call and an exception.
#include <iostream>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

struct Shape {
    virtual ~Shape() = default;
    virtual double area() const = 0;
};

struct Square : Shape {
    double side;
    explicit Square(double s) : side(s) {}
    double area() const override { return side * side; }
};

template <typename T> T total(const std::vector<T> &values) {
    T sum{};
    for (const T &x : values)
        sum += x; // total-line
    return sum;
}

int checked(int x) {
    if (x < 0)
        throw std::invalid_argument("negative");
    return x * 2;
}

int main(int argc, char **) {
    std::map<std::string, int> counts{{"a", 1}, {"b", 2}};
    std::vector<long> values{1, 2, 3, argc};
    Square square(3);
    const Shape &shape = square;
    int r = 0;
    try {
        r = checked(-argc);
    } catch (const std::exception &e) {
        std::cout << "caught " << e.what() << '\n';
    }
    long sum = total(values); // main-calls-total
    std::cout << "total " << sum << " area " << shape.area() << " counts " << counts.size() << " r " << r << '\n';
    return 0;
}
