// Fuzz target: the .npy reader (examples/attn/npy.hpp). Every input either
// throws NpyError whose message starts with the file's name, or gives an
// array whose values match its shape and dtype.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "npy.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string bytes(reinterpret_cast<const char*>(data), size);
  try {
    const attn::Array a = attn::load_bytes(bytes, "fuzz.npy");
    const std::size_t have = a.is_real() ? a.real.size() : a.integer.size();
    if (std::getenv("FUZZ_VERDICT")) {  // for differential.py
      std::fprintf(stderr, "VERDICT accept %s %s", attn::dtype_name(a.dtype), attn::detail::shape_text(a.shape).c_str());
      for (std::size_t i = 0; i < have; ++i)
        std::fprintf(stderr, a.is_real() ? " %.17g" : " %.0f", a.is_real() ? a.real[i] : double(a.integer[i]));
      std::fprintf(stderr, "\n");
    }
    if (have != a.size() || (a.is_real() ? !a.integer.empty() : !a.real.empty())) {
      std::fprintf(stderr, "fuzz_npy: %zu values for shape %s\n", have, a.shape_str().c_str());
      std::abort();
    }
  } catch (const attn::NpyError& e) {
    if (std::string(e.what()).rfind("fuzz.npy: ", 0) != 0) std::abort();
    if (std::getenv("FUZZ_VERDICT")) std::fprintf(stderr, "VERDICT reject %s\n", e.what());
  }
  return 0;
}
