// The CPU device's view of memory: a container's limit (rhi/cpu/cgroup_memory.cpp) and the
// host's /proc/meminfo (rhi/cpu/meminfo.cpp).
#include <catch2/catch.hpp>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include "cgroup_memory.h"
#include "meminfo.h"

namespace fs = std::filesystem;
using kiln::cgroup::read_memory_limit;

namespace {
struct TempRoot {
  fs::path root;
  TempRoot() {
    char pattern[] = "/tmp/kiln-cgroup-XXXXXX";
    root = mkdtemp(pattern);
  }
  ~TempRoot() { fs::remove_all(root); }
  void write(const std::string &relative, const std::string &text) const {
    fs::create_directories((root / relative).parent_path());
    std::ofstream(root / relative) << text << "\n";
  }
};
}  // namespace

TEST_CASE("cgroup v2: memory.max and memory.current of the process's cgroup", "[cgroup]") {
  TempRoot t;
  t.write("kiln.slice/job/memory.max", "2147483648");
  t.write("kiln.slice/job/memory.current", "536870912");
  auto limit = read_memory_limit("0::/kiln.slice/job\n", t.root.string());
  REQUIRE(limit);
  CHECK(limit->limit_bytes == 2147483648u);
  CHECK(limit->usage_bytes == 536870912u);
}

TEST_CASE("cgroup v2 'max' is no limit", "[cgroup]") {
  TempRoot t;
  t.write("job/memory.max", "max");
  t.write("job/memory.current", "123");
  CHECK_FALSE(read_memory_limit("0::/job\n", t.root.string()));
}

TEST_CASE("cgroup v1: the memory controller's limit_in_bytes, unlimited ignored", "[cgroup]") {
  TempRoot t;
  t.write("memory/docker/abc/memory.limit_in_bytes", "1073741824");
  t.write("memory/docker/abc/memory.usage_in_bytes", "1000");
  const std::string cgroup = "12:pids:/docker/abc\n4:memory:/docker/abc\n0::/\n";
  auto limit = read_memory_limit(cgroup, t.root.string());
  REQUIRE(limit);
  CHECK(limit->limit_bytes == 1073741824u);
  CHECK(limit->usage_bytes == 1000u);
  t.write("memory/docker/abc/memory.limit_in_bytes", "9223372036854771712");
  CHECK_FALSE(read_memory_limit(cgroup, t.root.string()));
}

TEST_CASE("no readable cgroup files means no limit", "[cgroup]") {
  TempRoot t;
  CHECK_FALSE(read_memory_limit("0::/nowhere\n", t.root.string()));
  CHECK_FALSE(read_memory_limit("garbage", t.root.string()));
}

TEST_CASE("a cgroup limit caps the host's total and free memory; no limit changes nothing",
          "[cgroup]") {
  using kiln::cgroup::cap_by_limit;
  using kiln::cgroup::MemoryLimit;
  uint64_t total = 64ull << 30, free_bytes = 48ull << 30;  // the host: 64 GiB, 48 free
  cap_by_limit(MemoryLimit{2ull << 30, 512ull << 20}, &total, &free_bytes);
  CHECK(total == 2ull << 30);                          // the container's 2 GiB
  CHECK(free_bytes == (2ull << 30) - (512ull << 20));  // what it leaves above its usage
  total = 64ull << 30, free_bytes = 1ull << 30;        // the host is the tighter one
  cap_by_limit(MemoryLimit{2ull << 30, 0}, &total, &free_bytes);
  CHECK(total == 2ull << 30);
  CHECK(free_bytes == 1ull << 30);
  cap_by_limit(MemoryLimit{2ull << 30, 3ull << 30}, &total, &free_bytes);  // usage past the limit
  CHECK(free_bytes == 0);
  total = 64ull << 30, free_bytes = 48ull << 30;
  cap_by_limit(std::nullopt, &total, &free_bytes);
  CHECK(total == 64ull << 30);
  CHECK(free_bytes == 48ull << 30);
}

// ---------------------------------------------------------------------------------------------
// The host's side: /proc/meminfo (rhi/cpu/meminfo.cpp).

TEST_CASE("meminfo: MemTotal and MemAvailable in bytes, wherever their lines are", "[cgroup]") {
  uint64_t total = 0, available = 0;
  REQUIRE(kiln::meminfo::parse("MemTotal:       24684092 kB\nMemFree:        21497404 kB\n"
                               "MemAvailable:   23980240 kB\nBuffers: 1 kB\n",
                               &total, &available));
  CHECK(total == 24684092ull * 1024);
  CHECK(available == 23980240ull * 1024);
  REQUIRE(kiln::meminfo::parse("Buffers: 1 kB\nMemAvailable: 7 kB\nMemTotal: 9 kB\n", &total,
                               &available));
  CHECK(total == 9 * 1024);
  CHECK(available == 7 * 1024);
}

TEST_CASE("meminfo: a missing or broken field is no reading, and changes nothing", "[cgroup]") {
  uint64_t total = 1, available = 2;
  CHECK_FALSE(kiln::meminfo::parse("MemTotal: 9 kB\nMemFree: 5 kB\n", &total, &available));  // < 3.14
  CHECK_FALSE(kiln::meminfo::parse("MemTotal: x kB\nMemAvailable: 7 kB\n", &total, &available));
  CHECK_FALSE(kiln::meminfo::parse("MemTotal: 9 kB\nMemAvailable:", &total, &available));  // cut off
  CHECK_FALSE(kiln::meminfo::parse("XMemTotal: 9 kB\nMemAvailable: 7 kB\n", &total, &available));
  CHECK_FALSE(kiln::meminfo::parse("MemTotal: 99999999999999999999 kB\nMemAvailable: 7 kB\n",
                                   &total, &available));
  CHECK_FALSE(kiln::meminfo::parse("", &total, &available));
  CHECK(total == 1);
  CHECK(available == 2);
}

TEST_CASE("meminfo: this host's /proc/meminfo reads as the file says", "[cgroup]") {
  std::ifstream file("/proc/meminfo");
  REQUIRE(file);
  uint64_t file_total_kib = 0;
  for (std::string key; file >> key;) {
    if (key == "MemTotal:") {
      file >> file_total_kib;
      break;
    }
  }
  uint64_t total = 0, available = 0;
  REQUIRE(kiln::meminfo::read(&total, &available));
  CHECK(total == file_total_kib * 1024);  // constant while the machine runs
  CHECK(available > 0);
  CHECK(available <= total);
}
