// safetensors.hpp — checkpoints in the safetensors format
// (https://github.com/huggingface/safetensors): an 8-byte little-endian header
// length N, N bytes of JSON {name: {dtype, shape, data_offsets: [begin, end]},
// "__metadata__": {string: string}}, then the raw little-endian tensor bytes.
// Only F32 is written and read here. Writes are atomic (temp file + rename);
// loads validate everything and throw std::runtime_error with the reason.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace lm {

struct StTensor {
  std::vector<std::int64_t> shape;
  std::vector<float> data;
};

struct StFile {
  std::map<std::string, std::string> metadata;
  std::map<std::string, StTensor> tensors;
};

/// Writes `file` to `path` atomically. Throws std::runtime_error on I/O errors.
void save_safetensors(const std::string& path, const StFile& file);

/// Reads and validates `path`: truncated files, a malformed or oversized
/// header, unknown dtypes, shapes that disagree with the byte ranges, ranges
/// out of bounds, overlapping or leaving holes → std::runtime_error.
/// A regular file only: devices, pipes and folders are refused; every error
/// names the file. The header must parse as JSON in full (JSON whitespace
/// may pad it, as the reference loader allows; anything else, a NUL
/// included, is an error).
StFile load_safetensors(const std::string& path);

/// load_safetensors on the file's bytes; `path` names it in errors.
StFile parse_safetensors(const std::string& bytes, const std::string& path);

/// Writes `text` to `path` atomically (temp file in the same folder + rename).
void write_file_atomic(const std::string& path, const std::string& text);

}  // namespace lm
