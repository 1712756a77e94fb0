#include "data.hpp"

#include <sys/stat.h>

#include <cerrno>
#include <cmath>
#include <cstring>
#include <fstream>
#include <sstream>
#include <stdexcept>

namespace lm {

namespace {
bool parse_fraction(const std::string& s, double& out) {
  if (s.empty()) return false;
  char* end = nullptr;
  out = std::strtod(s.c_str(), &end);
  return end == s.c_str() + s.size() && std::isfinite(out);
}
std::string fmt(double v) {
  std::ostringstream o;
  o << v;
  return o.str();
}
}  // namespace

std::string TextSlice::label() const {
  std::string base = path;
  const auto slash = base.find_last_of('/');
  if (slash != std::string::npos) base = base.substr(slash + 1);
  if (from == 0 && to == 1) return base;
  return base + "[" + fmt(from) + "," + fmt(to) + ")";
}

TextSlice load_slice(const std::string& spec) {
  TextSlice s;
  s.spec = s.path = spec;
  // "PATH:FROM:TO", parsed from the right so PATH may itself contain ':'.
  const auto c2 = spec.rfind(':');
  if (c2 != std::string::npos && c2 > 0) {
    const auto c1 = spec.rfind(':', c2 - 1);
    double a, b;
    if (c1 != std::string::npos && parse_fraction(spec.substr(c1 + 1, c2 - c1 - 1), a) &&
        parse_fraction(spec.substr(c2 + 1), b)) {
      if (!(a >= 0 && b <= 1 && a < b))
        throw std::runtime_error("data: bad range in '" + spec +
                                 "': need 0 <= FROM < TO <= 1");
      s.path = spec.substr(0, c1);
      s.from = a;
      s.to = b;
    }
  }
  struct stat st {};
  if (::stat(s.path.c_str(), &st) != 0)
    throw std::runtime_error("data: cannot open '" + s.path + "': " + std::strerror(errno));
  if (!S_ISREG(st.st_mode))
    throw std::runtime_error("data: '" + s.path + "' is not a regular file" +
                             (S_ISDIR(st.st_mode) ? " (a folder)" : ""));
  std::ifstream in(s.path, std::ios::binary);
  if (!in) throw std::runtime_error("data: cannot open '" + s.path + "'");
  std::vector<std::uint8_t> all((std::istreambuf_iterator<char>(in)),
                                std::istreambuf_iterator<char>());
  if (in.bad()) throw std::runtime_error("data: error reading '" + s.path + "'");
  if (all.empty()) throw std::runtime_error("data: '" + s.path + "' is empty");
  const auto n = all.size();
  s.begin = std::uint64_t(std::floor(s.from * double(n)));
  s.end = s.to == 1 ? n : std::uint64_t(std::floor(s.to * double(n)));
  if (s.end <= s.begin)
    throw std::runtime_error("data: slice '" + spec + "' of a " + std::to_string(n) +
                             "-byte file is empty");
  s.bytes.assign(all.begin() + std::ptrdiff_t(s.begin), all.begin() + std::ptrdiff_t(s.end));
  return s;
}

std::vector<EvalWindow> eval_windows(std::uint64_t n, int context, int stride) {
  if (stride <= 0 || stride > context) stride = context;
  std::vector<EvalWindow> w;
  if (n < 2) return w;
  const std::uint64_t last = n - 1;  // inputs are bytes [0, n-1), targets [1, n)
  std::uint64_t prev_end = 0;
  for (std::uint64_t begin = 0; begin < last; begin += std::uint64_t(stride)) {
    const std::uint64_t end = std::min<std::uint64_t>(begin + std::uint64_t(context), last);
    w.push_back({begin, int(end - begin), int(end - prev_end)});
    prev_end = end;
    if (end == last) break;
  }
  return w;
}

}  // namespace lm
