// runner.hpp — what the subcommands do: load a checkpoint, evaluate it on
// text, compute one window's logits, generate text with the KV cache. Each
// function throws std::exception with a clear message on bad input; main()
// turns it into a non-zero exit.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "config.hpp"
#include "data.hpp"
#include "model.hpp"

namespace lm {

/// Mean NLL of a byte sequence under the model.
struct EvalResult {
  std::uint64_t bytes_scored = 0;  ///< every byte after the first (n − 1)
  double nats_per_byte = 0;
};

/// Evaluation settings (not part of a checkpoint).
struct EvalOptions {
  int stride = 0;      ///< 0 = context: non-overlapping windows
  int eval_batch = 16; ///< windows of equal length per forward pass
};

/// Mean NLL in nats/byte over every byte of `bytes` after the first, in the
/// windows of eval_windows(bytes.size(), context, stride) (README.md, "The
/// metric"). Throws std::invalid_argument for fewer than 2 bytes.
EvalResult evaluate(Model<float>& model, const std::vector<std::uint8_t>& bytes,
                    const EvalOptions& opt = {});

/// Checkpoints: all parameters (F32), `__metadata__` {"format": "continuum-lm",
/// "config": the architecture keys as a JSON string, "run": `extra` if given}.
/// The writer is the tests' (the PyTorch trainer writes the real ones).
void save_checkpoint(const std::string& path, const Model<float>& model,
                     const nlohmann::json& extra = {});
/// Loads and validates a checkpoint (README.md, "Checkpoint format"): the
/// safetensors container, the format tag, the config's architecture keys,
/// every tensor's name and shape against that config, finite values — all
/// before the model is allocated. Errors name the file.
Model<float> load_checkpoint(const std::string& path);

/// The logits [L, 256] of one window: the first L = min(context, size) bytes
/// of `bytes` at positions 0 … L−1 (row t predicts byte t+1).
Mat<float> window_logits(Model<float>& model, const std::vector<std::uint8_t>& bytes);

/// Text generation with the KV cache: the prompt is encoded into the cache,
/// then each new byte is one decode step (Lq = 1) against it. When the cache
/// is full, its last context/2 bytes are re-encoded into an empty cache.
/// sample_temperature 0 = greedy; top_k 0 = all 256 bytes.
std::string generate(Model<float>& model, const std::string& prompt, int n_bytes,
                     double sample_temperature, int top_k, std::uint64_t seed);

/// Sets OpenMP's thread count (0 = leave the default); Eigen stays single-threaded.
void set_threads(int n);

}  // namespace lm
