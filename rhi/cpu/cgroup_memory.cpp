#include "cgroup_memory.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <fstream>
#include <sstream>

namespace kiln::cgroup {
namespace {

// The first line of a file, or nullopt (used once, to find the files).
std::optional<std::string> first_line(const std::string &path) {
  std::ifstream file(path);
  std::string line;
  if (!file || !std::getline(file, line)) return std::nullopt;
  return line;
}

// The number a file starts with, read without touching the heap (the live check reads these on
// every refresh, between the allocations of the program it guards). nullopt when there is none
// ("max", empty, unreadable).
std::optional<uint64_t> read_bytes(const char *path) {
  const int fd = ::open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return std::nullopt;
  char text[64];
  const ssize_t n = ::read(fd, text, sizeof text);
  ::close(fd);
  if (n <= 0) return std::nullopt;
  uint64_t value = 0;
  const auto [end, ec] = std::from_chars(text, text + n, value);
  if (ec != std::errc() || end == text) return std::nullopt;
  return value;
}

// Where a cgroup's limit lives: the two files' full paths.
struct LimitFiles {
  std::string limit_path;
  std::string usage_path;
};

std::optional<MemoryLimit> limit_at(const LimitFiles &files) {
  constexpr uint64_t kUnlimited = uint64_t{1} << 60;  // v1 writes ~2^63 rounded to pages
  auto limit = read_bytes(files.limit_path.c_str());  // v2 "max" does not parse: unlimited
  auto usage = read_bytes(files.usage_path.c_str());
  if (!limit || !usage || *limit >= kUnlimited) return std::nullopt;
  return MemoryLimit{*limit, *usage};
}

}  // namespace

namespace {

std::optional<LimitFiles> find_limit_files(const std::string &proc_self_cgroup,
                                           const std::string &cgroup_root);

}  // namespace

std::optional<MemoryLimit> read_memory_limit(const std::string &proc_self_cgroup,
                                             const std::string &cgroup_root) {
  auto files = find_limit_files(proc_self_cgroup, cgroup_root);
  if (!files) return std::nullopt;
  return limit_at(*files);
}

namespace {

std::optional<LimitFiles> find_limit_files(const std::string &proc_self_cgroup,
                                           const std::string &cgroup_root) {
  std::istringstream lines(proc_self_cgroup);
  std::string line;
  std::optional<std::string> v1_path, v2_path;
  while (std::getline(lines, line)) {
    // "hierarchy-id:controllers:path"
    const auto first = line.find(':');
    const auto second = first == std::string::npos ? first : line.find(':', first + 1);
    if (second == std::string::npos) continue;
    const std::string controllers = line.substr(first + 1, second - first - 1);
    const std::string path = line.substr(second + 1);
    if (line.compare(0, first, "0") == 0 && controllers.empty()) v2_path = path;
    std::istringstream names(controllers);
    for (std::string name; std::getline(names, name, ',');)
      if (name == "memory") v1_path = path;
  }
  // v2 when its files are there (a limit of "max" still means v2 answers: no limit), else v1.
  if (v2_path && first_line(cgroup_root + *v2_path + "/memory.max")) {
    const std::string dir = cgroup_root + *v2_path;
    return LimitFiles{dir + "/memory.max", dir + "/memory.current"};
  }
  if (v1_path) {
    const std::string dir = cgroup_root + "/memory" + *v1_path;
    return LimitFiles{dir + "/memory.limit_in_bytes", dir + "/memory.usage_in_bytes"};
  }
  return std::nullopt;
}

}  // namespace

std::optional<MemoryLimit> own_memory_limit() {
  // A process does not change cgroup on its own: find the files once, read them every time.
  static const std::optional<LimitFiles> files = [] {
    std::ifstream file("/proc/self/cgroup");
    std::stringstream text;
    if (file) text << file.rdbuf();
    return find_limit_files(text.str(), "/sys/fs/cgroup");
  }();
  if (!files) return std::nullopt;
  return limit_at(*files);
}

void cap_by_limit(const std::optional<MemoryLimit> &limit, uint64_t *total_bytes,
                  uint64_t *free_bytes) {
  if (!limit) return;
  *total_bytes = std::min(*total_bytes, limit->limit_bytes);
  const uint64_t left =
      limit->limit_bytes > limit->usage_bytes ? limit->limit_bytes - limit->usage_bytes : 0;
  *free_bytes = std::min(*free_bytes, left);
}

}  // namespace kiln::cgroup
