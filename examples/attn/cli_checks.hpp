// cli_checks.hpp — a CLI11 check the command-line tools share (continuum-attn,
// continuum-lm).
#pragma once

#include <CLI/CLI.hpp>

#include <cerrno>
#include <cstdlib>
#include <string>
#include <type_traits>

namespace attn {

/// CLI11 (2.1) saturates a 64-bit integer option that overflows (2^64 + 2
/// would run as the largest index, i.e. as an unlimited window) and takes
/// "-1" for an unsigned one as 2^64 − 1. This check sees the text first and
/// rejects what the type cannot hold; anything else is left to CLI11's own
/// conversion.
template <class T>
CLI::Validator in_range_of_64_bits() {
  static_assert(sizeof(T) == 8 && std::is_integral_v<T>);
  return CLI::Validator(
      [](std::string& text) -> std::string {
        const char* what = std::is_signed_v<T> ? "a signed" : "an unsigned";
        if constexpr (!std::is_signed_v<T>)
          if (text.find('-') != std::string::npos)
            return text + " is negative: the option is " + what + " 64-bit integer";
        char* end = nullptr;
        errno = 0;
        if constexpr (std::is_signed_v<T>)
          static_cast<void>(std::strtoll(text.c_str(), &end, 0));
        else
          static_cast<void>(std::strtoull(text.c_str(), &end, 0));
        if (errno == ERANGE) return text + " is out of range: the option is " + what + " 64-bit integer";
        return {};
      },
      "");
}

}  // namespace attn
