// Fuzz target: the checkpoint reader (examples/lm/src/safetensors.cpp). Every
// input either throws std::runtime_error naming the file, or gives tensors
// whose data match their shapes and fill the file's data section exactly.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <string>

#include "safetensors.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string bytes(reinterpret_cast<const char*>(data), size);
  try {
    const lm::StFile f = lm::parse_safetensors(bytes, "fuzz.safetensors");
    std::uint64_t total = 0;
    for (const auto& [name, t] : f.tensors) {
      std::uint64_t n = 1;
      for (auto d : t.shape) n *= std::uint64_t(d);
      if (n != t.data.size()) {
        std::fprintf(stderr, "fuzz_safetensors: tensor '%s' has %zu values for its shape\n", name.c_str(),
                     t.data.size());
        std::abort();
      }
      total += 4 * n;
    }
    std::uint64_t header = 0;
    for (int i = 7; i >= 0; --i) header = header << 8 | data[i];
    if (8 + header + total != size) std::abort();  // the data section, exactly
    if (std::getenv("FUZZ_VERDICT")) {  // for differential.py
      std::fprintf(stderr, "VERDICT accept");
      for (const auto& [name, t] : f.tensors) std::fprintf(stderr, " %s:%zu", name.c_str(), t.data.size());
      std::fprintf(stderr, "\n");
    }
  } catch (const std::runtime_error& e) {
    if (std::string(e.what()).find("'fuzz.safetensors'") == std::string::npos) std::abort();
    if (std::getenv("FUZZ_VERDICT")) std::fprintf(stderr, "VERDICT reject %s\n", e.what());
  }
  return 0;
}
