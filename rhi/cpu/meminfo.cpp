#include "meminfo.h"

#include <fcntl.h>
#include <unistd.h>

#include <charconv>

namespace kiln::meminfo {
namespace {

// The number after `key` at the start of a line, times 1024; false if absent.
bool field(std::string_view text, std::string_view key, uint64_t *bytes) {
  std::size_t at = text.find(key);
  while (at != std::string_view::npos && at != 0 && text[at - 1] != '\n')
    at = text.find(key, at + 1);
  if (at == std::string_view::npos) return false;
  std::size_t i = at + key.size();
  while (i < text.size() && text[i] == ' ') ++i;
  uint64_t kib = 0;
  const char *first = text.data() + i;
  const auto [end, ec] = std::from_chars(first, text.data() + text.size(), kib);
  if (ec != std::errc() || end == first || kib > (UINT64_MAX >> 10)) return false;
  *bytes = kib << 10;
  return true;
}

}  // namespace

bool parse(std::string_view text, uint64_t *total_bytes, uint64_t *available_bytes) {
  uint64_t total = 0, available = 0;
  if (!field(text, "MemTotal:", &total) || !field(text, "MemAvailable:", &available)) return false;
  *total_bytes = total;
  *available_bytes = available;
  return true;
}

bool read(uint64_t *total_bytes, uint64_t *available_bytes) {
  const int fd = ::open("/proc/meminfo", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  char text[1024];  // MemTotal, MemFree and MemAvailable are its first three lines
  std::size_t size = 0;
  while (size < sizeof text) {
    const ssize_t n = ::read(fd, text + size, sizeof text - size);
    if (n <= 0) break;
    size += static_cast<std::size_t>(n);
  }
  ::close(fd);
  return parse(std::string_view(text, size), total_bytes, available_bytes);
}

}  // namespace kiln::meminfo
