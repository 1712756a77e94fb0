// data.hpp — text files as bytes (vocabulary 256), byte-range slices of a file,
// the seeded training batch sampler, and the evaluation windows.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "rng.hpp"

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

/// Random training windows: B offsets uniform in [0, n − L − 1] per step, from a
/// stream seeded by `seed` only (so every attention kernel sees the same batches).
class BatchSampler {
 public:
  BatchSampler(const std::vector<std::uint8_t>& data, int context, int batch,
               std::uint64_t seed);
  /// Fills inputs and targets, each [batch · context].
  void next(std::uint8_t* inputs, std::uint8_t* targets);

 private:
  const std::vector<std::uint8_t>& data_;
  int context_, batch_;
  Rng rng_;
};

/// One evaluation window: inputs [begin, begin + len), targets shifted by one;
/// only the last `scored` positions count (sliding windows).
struct EvalWindow {
  std::uint64_t begin;
  int len, scored;
};

/// Windows scoring every byte after the first exactly once: stride = context
/// gives non-overlapping windows; a smaller stride gives sliding windows in
/// which each window scores only its last `stride` targets (the first window
/// scores all of its targets).
std::vector<EvalWindow> eval_windows(std::uint64_t n_bytes, int context, int stride);

}  // namespace lm
