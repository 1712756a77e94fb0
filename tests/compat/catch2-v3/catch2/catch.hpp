// <catch2/catch.hpp> for Catch2 3, which no longer has it (cmake/Catch2Compat.cmake
// puts this folder on the include path only when Catch2 3 is found). The tests
// use Catch2 2's names; this maps the ones that moved.
#pragma once
#include <catch2/catch_all.hpp>

#include <string>

using Catch::Approx;

namespace Catch {
// v2's string matcher Contains is v3's ContainsSubstring (v3's Contains is
// the range matcher).
inline Matchers::StringContainsMatcher Contains(const std::string& s,
                                               CaseSensitive cs = CaseSensitive::Yes) {
  return Matchers::ContainsSubstring(s, cs);
}
template <typename T>
using MatcherBase = Matchers::MatcherBase<T>;
}  // namespace Catch

// v2: CATCH_CONFIG_MAIN makes the including file define main().
#if defined(CATCH_CONFIG_MAIN)
int main(int argc, char* argv[]) { return Catch::Session().run(argc, argv); }
#endif
