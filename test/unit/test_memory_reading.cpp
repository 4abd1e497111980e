// MemoryReadingCache (rhi/memory_reading.h): the one device-reading cache that the cpu device and
// DeviceMemory's failure pictures share: a reading is reused while younger than the age asked
// for, whole, with its tag.
#include <catch2/catch.hpp>

#include "kiln/rhi/memory_reading.h"

using kiln::MemoryReadingCache;

TEST_CASE("a reading is reused only while younger than the age asked for", "[memory_reading]") {
  MemoryReadingCache cache;
  MemoryReadingCache::Reading r;
  CHECK_FALSE(cache.get(1'000, 1'000'000, &r));  // never read

  cache.put({/*free*/ 100, /*total*/ 400, /*tag*/ 7, /*time_ns*/ 5'000});
  REQUIRE(cache.get(5'000, 1'000, &r));
  CHECK((r.free_bytes == 100 && r.total_bytes == 400 && r.tag == 7 && r.time_ns == 5'000));
  CHECK(cache.get(5'999, 1'000, &r));
  CHECK_FALSE(cache.get(6'000, 1'000, &r));  // exactly max_age old: read again

  cache.put({200, 400, 8, 7'000});  // a newer reading replaces it
  REQUIRE(cache.get(7'500, 1'000, &r));
  CHECK((r.free_bytes == 200 && r.tag == 8));
  cache.put({300, 400, 9, 6'500});  // an older one never does (a writer that read the device first)
  REQUIRE(cache.get(7'500, 1'000, &r));
  CHECK((r.free_bytes == 200 && r.tag == 8 && r.time_ns == 7'000));
}
