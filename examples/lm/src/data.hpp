// data.hpp — text files as bytes (vocabulary 256), byte-range slices of a file,
// and the evaluation windows (README.md, "The metric").
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace lm {

/// A text file, or a byte range of one, read as bytes.
/// Spec: "PATH" (whole file) or "PATH:FROM:TO" with FROM < TO fractions in
/// [0, 1] of the file's size (byte [floor(FROM·n), floor(TO·n))). Two slices
/// "PATH:0:0.5" and "PATH:0.5:1" are disjoint and cover the file.
struct TextSlice {
  std::string spec, path;
  double from = 0, to = 1;
  std::uint64_t begin = 0, end = 0;  ///< byte range in the file
  std::vector<std::uint8_t> bytes;
  std::string label() const;  ///< "valid.txt[0,0.5)" or "valid.txt"
};

/// Reads a slice. Throws std::runtime_error naming the path for a missing or
/// unreadable file, an empty file or slice, or a malformed range.
TextSlice load_slice(const std::string& spec);

/// One evaluation window: inputs [begin, begin + len), targets shifted by one;
/// only the last `scored` positions count (sliding windows).
struct EvalWindow {
  std::uint64_t begin;
  int len, scored;
};

/// Windows scoring every byte after the first exactly once, for a text of
/// n_bytes bytes: window k starts at byte k·stride and holds
/// len = min(context, n − 1 − begin) inputs; it stops after the first window
/// that reaches the last input byte n − 2. stride = context (or 0, or any
/// value outside [1, context]) gives non-overlapping windows, each scoring all
/// of its len targets; a smaller stride gives sliding windows in which every
/// window but the first scores only the targets past the previous window's
/// end. Empty for n_bytes < 2.
std::vector<EvalWindow> eval_windows(std::uint64_t n_bytes, int context, int stride);

}  // namespace lm
