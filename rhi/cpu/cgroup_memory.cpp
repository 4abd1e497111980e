#include "cgroup_memory.h"

#include <fstream>
#include <sstream>

namespace kiln::cgroup {
namespace {

// The first line of a file, or nullopt.
std::optional<std::string> first_line(const std::string &path) {
  std::ifstream file(path);
  std::string line;
  if (!file || !std::getline(file, line)) return std::nullopt;
  return line;
}

std::optional<uint64_t> read_bytes(const std::string &path) {
  auto line = first_line(path);
  if (!line || line->empty() || line->front() < '0' || line->front() > '9') return std::nullopt;
  return std::stoull(*line);
}

std::optional<MemoryLimit> limit_at(const std::string &dir, const char *limit_file,
                                    const char *usage_file) {
  constexpr uint64_t kUnlimited = uint64_t{1} << 60;  // v1 writes ~2^63 rounded to pages
  auto limit = read_bytes(dir + "/" + limit_file);   // v2 "max" does not parse: unlimited
  auto usage = read_bytes(dir + "/" + usage_file);
  if (!limit || !usage || *limit >= kUnlimited) return std::nullopt;
  return MemoryLimit{*limit, *usage};
}

}  // namespace

namespace {

// Where this process's cgroup limit lives: the directory and the two file names.
struct LimitFiles {
  std::string dir;
  const char *limit_file = nullptr;
  const char *usage_file = nullptr;
};

std::optional<LimitFiles> find_limit_files(const std::string &proc_self_cgroup,
                                           const std::string &cgroup_root);

}  // namespace

std::optional<MemoryLimit> read_memory_limit(const std::string &proc_self_cgroup,
                                             const std::string &cgroup_root) {
  auto files = find_limit_files(proc_self_cgroup, cgroup_root);
  if (!files) return std::nullopt;
  return limit_at(files->dir, files->limit_file, files->usage_file);
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
  if (v2_path && first_line(cgroup_root + *v2_path + "/memory.max"))
    return LimitFiles{cgroup_root + *v2_path, "memory.max", "memory.current"};
  if (v1_path)
    return LimitFiles{cgroup_root + "/memory" + *v1_path, "memory.limit_in_bytes", "memory.usage_in_bytes"};
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
  return limit_at(files->dir, files->limit_file, files->usage_file);
}

}  // namespace kiln::cgroup
