#include "safetensors.hpp"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <limits>
#include <stdexcept>

#include <nlohmann/json.hpp>

#include "npy.hpp"  // examples/attn: attn::AtomicWriter

namespace lm {

namespace {

bool little_endian() {
  const std::uint32_t one = 1;
  unsigned char c;
  std::memcpy(&c, &one, 1);
  return c == 1;
}

[[noreturn]] void fail(const std::string& path, const std::string& why) {
  throw std::runtime_error("checkpoint '" + path + "': " + why);
}

}  // namespace

void write_file_atomic(const std::string& path, const std::string& text) {
  attn::AtomicWriter writer;  // examples/attn/npy.hpp: mkstemp, then rename
  writer.add(path, text);
  writer.commit();
}

void save_safetensors(const std::string& path, const StFile& file) {
  if (!little_endian()) throw std::runtime_error("safetensors: big-endian hosts unsupported");
  nlohmann::json header = nlohmann::json::object();
  if (!file.metadata.empty()) header["__metadata__"] = file.metadata;
  std::uint64_t offset = 0;
  for (const auto& [name, t] : file.tensors) {
    std::uint64_t n = 1;
    for (auto s : t.shape) n *= std::uint64_t(s);
    if (n != t.data.size())
      throw std::runtime_error("safetensors: tensor '" + name + "' shape/data mismatch");
    header[name] = {{"dtype", "F32"},
                    {"shape", t.shape},
                    {"data_offsets", {offset, offset + 4 * n}}};
    offset += 4 * n;
  }
  std::string h = header.dump();
  while (h.size() % 8) h.push_back(' ');  // the format allows trailing spaces
  std::string out(8, '\0');
  const std::uint64_t hn = h.size();
  std::memcpy(&out[0], &hn, 8);
  out += h;
  out.reserve(out.size() + offset);
  for (const auto& [name, t] : file.tensors)
    out.append(reinterpret_cast<const char*>(t.data.data()), t.data.size() * 4);
  write_file_atomic(path, out);
}

/// The bytes of a regular file, read whole: the size comes from the file
/// system first, so /dev/zero, a pipe or a folder is refused with the path
/// instead of being read until memory runs out.
std::string read_regular_file(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) fail(path, std::string("cannot open: ") + std::strerror(errno));
  if (!S_ISREG(st.st_mode)) fail(path, S_ISDIR(st.st_mode) ? "not a regular file (a folder)" : "not a regular file");
  std::ifstream in(path, std::ios::binary);
  if (!in) fail(path, std::string("cannot open: ") + std::strerror(errno));
  std::string bytes;
  try {
    bytes.resize(static_cast<std::size_t>(st.st_size));
  } catch (const std::exception&) {
    fail(path, "not enough memory to read its " + std::to_string(st.st_size) + " bytes");
  }
  in.read(bytes.data(), std::streamsize(bytes.size()));
  if (std::size_t(in.gcount()) != bytes.size() || in.peek() != std::char_traits<char>::eof())
    fail(path, "read error (the file changed while it was read?)");
  return bytes;
}

StFile load_safetensors(const std::string& path) { return parse_safetensors(read_regular_file(path), path); }

StFile parse_safetensors(const std::string& bytes, const std::string& path) {
  if (!little_endian()) throw std::runtime_error("safetensors: big-endian hosts unsupported");
  if (bytes.size() < 8) fail(path, "truncated (" + std::to_string(bytes.size()) +
                                       " bytes, the header length alone needs 8)");
  std::uint64_t hn = 0;
  std::memcpy(&hn, bytes.data(), 8);
  if (hn > 100u * 1024 * 1024) fail(path, "header length " + std::to_string(hn) + " is implausible");
  if (8 + hn > bytes.size())
    fail(path, "truncated: header claims " + std::to_string(hn) + " bytes but the file has " +
                   std::to_string(bytes.size() - 8) + " after the length");
  // The reference loader parses the header as a whole with serde_json: JSON
  // whitespace may pad it, anything else after the JSON is an error. nlohmann
  // would stop at a NUL (its end-of-input marker) and ignore the rest; a NUL
  // is never valid JSON outside a string, nor unescaped inside one.
  const std::size_t nul = bytes.find('\0', 8);
  if (nul < 8 + hn)
    fail(path, "NUL byte at offset " + std::to_string(nul - 8) + " of the JSON header (trailing characters)");
  nlohmann::json header;
  try {
    header = nlohmann::json::parse(bytes.begin() + 8, bytes.begin() + 8 + std::ptrdiff_t(hn));
  } catch (const nlohmann::json::exception& e) {
    fail(path, std::string("malformed JSON header: ") + e.what());
  }
  if (!header.is_object()) fail(path, "header is not a JSON object");
  const std::uint64_t buffer = bytes.size() - 8 - hn;
  const char* data = bytes.data() + 8 + hn;

  StFile file;
  std::vector<std::pair<std::uint64_t, std::uint64_t>> ranges;
  for (auto it = header.begin(); it != header.end(); ++it) {
    const std::string& name = it.key();
    const auto& v = it.value();
    if (name == "__metadata__") {
      if (!v.is_object()) fail(path, "__metadata__ is not an object");
      for (auto m = v.begin(); m != v.end(); ++m) {
        if (!m.value().is_string()) fail(path, "__metadata__ value '" + m.key() + "' is not a string");
        file.metadata[m.key()] = m.value().get<std::string>();
      }
      continue;
    }
    if (!v.is_object() || !v.contains("dtype") || !v.contains("shape") ||
        !v.contains("data_offsets"))
      fail(path, "tensor '" + name + "' lacks dtype, shape or data_offsets");
    if (!v["dtype"].is_string() || v["dtype"].get<std::string>() != "F32")
      fail(path, "tensor '" + name + "' has dtype " + v["dtype"].dump() + " (only F32 is supported)");
    const auto& sh = v["shape"];
    const auto& off = v["data_offsets"];
    if (!sh.is_array()) fail(path, "tensor '" + name + "' shape is not an array");
    if (!off.is_array() || off.size() != 2 || !off[0].is_number_unsigned() ||
        !off[1].is_number_unsigned())
      fail(path, "tensor '" + name + "' data_offsets must be two non-negative integers");
    StTensor t;
    std::uint64_t n = 1;
    for (const auto& d : sh) {
      if (!d.is_number_unsigned()) fail(path, "tensor '" + name + "' has a bad dimension " + d.dump());
      const std::uint64_t dim = d.get<std::uint64_t>();
      if (dim != 0 && n > std::numeric_limits<std::uint64_t>::max() / 8 / dim)
        fail(path, "tensor '" + name + "' shape overflows");
      n *= dim;
      t.shape.push_back(std::int64_t(dim));
    }
    const auto b = off[0].get<std::uint64_t>(), e = off[1].get<std::uint64_t>();
    if (b > e || e > buffer)
      fail(path, "tensor '" + name + "' data_offsets [" + std::to_string(b) + ", " +
                     std::to_string(e) + ") outside the " + std::to_string(buffer) +
                     "-byte data (file truncated?)");
    if (e - b != 4 * n)
      fail(path, "tensor '" + name + "' has " + std::to_string(e - b) + " bytes but its shape needs " +
                     std::to_string(4 * n));
    t.data.resize(n);
    if (n) std::memcpy(t.data.data(), data + b, 4 * n);
    ranges.emplace_back(b, e);
    file.tensors.emplace(name, std::move(t));
  }
  std::sort(ranges.begin(), ranges.end());
  std::uint64_t at = 0;
  for (const auto& [b, e] : ranges) {
    if (b != at) fail(path, b < at ? "tensor byte ranges overlap" : "tensor byte ranges leave a hole");
    at = e;
  }
  if (at != buffer)
    fail(path, std::to_string(buffer - at) + " bytes after the last tensor (corrupt file)");
  return file;
}

}  // namespace lm
