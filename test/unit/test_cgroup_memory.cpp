// The CPU device's view of a container's memory limit (rhi/cpu/cgroup_memory.cpp).
#include <catch2/catch.hpp>

#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "cgroup_memory.h"

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
