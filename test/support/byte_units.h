// Byte-size literals for kiln's tests: 4_KiB, 16_MiB, 1_GiB (uint64_t bytes).
#ifndef KILN_TEST_BYTE_UNITS_H_
#define KILN_TEST_BYTE_UNITS_H_

#include <cstdint>

namespace kiln::test::units {

inline constexpr uint64_t operator""_KiB(unsigned long long n) { return n << 10; }
inline constexpr uint64_t operator""_MiB(unsigned long long n) { return n << 20; }
inline constexpr uint64_t operator""_GiB(unsigned long long n) { return n << 30; }

}  // namespace kiln::test::units

namespace kiln::test {
using namespace kiln::test::units;  // kiln::test's helpers and their users see the literals
}  // namespace kiln::test

#endif  // KILN_TEST_BYTE_UNITS_H_
