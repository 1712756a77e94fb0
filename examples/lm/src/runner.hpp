// runner.hpp — what the subcommands do: train a run, evaluate, compare
// finished runs, sweep a grid, generate text, plot. Each function throws
// std::exception with a clear message on bad input; main() turns it into a
// non-zero exit.
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

/// Mean NLL in nats/byte over every byte of `bytes` after the first, in
/// windows of cfg.context (stride = cfg.stride, 0 = non-overlapping);
/// `max_bytes` > 0 evaluates only that prefix.
EvalResult evaluate(Model<float>& model, const std::vector<std::uint8_t>& bytes,
                    std::uint64_t max_bytes = 0);

/// Byte-unigram entropy of `bytes` in nats (the loss of the best model that
/// ignores context) — the bar the smoke test must beat.
double unigram_entropy(const std::vector<std::uint8_t>& bytes);

struct TrainSpec {
  Config cfg;
  std::string train;                ///< training text spec (see load_slice)
  std::vector<std::string> valid;   ///< validation slice specs
  std::string out_dir;              ///< result.json, train_log.jsonl, model.safetensors
  bool save_checkpoint = true;
  bool progress = true;             ///< progress line / log lines on stderr
};

/// Trains one run, evaluates it on every validation slice and writes
/// out_dir/result.json (atomically). Returns the result.
nlohmann::json train_run(const TrainSpec& spec);

/// Checkpoints: all parameters (F32) plus the config in __metadata__.
void save_checkpoint(const std::string& path, const Model<float>& model,
                     const nlohmann::json& extra = {});
/// Loads and validates a checkpoint against the config stored in it.
Model<float> load_checkpoint(const std::string& path);

/// Reads every result.json under `dirs` (recursively) and builds the paper
/// table: per setting and validation slice, mean ± sd per kernel and paired
/// differences continuum − softmax and continuum − focal with a Student-t
/// 95 % CI over seeds and seeds won.
nlohmann::json compare_runs(const std::vector<std::string>& dirs);
/// Formats compare_runs' output as text, or as CSV rows.
std::string format_table(const nlohmann::json& cmp);
std::string format_csv(const nlohmann::json& cmp);

/// Two-sided 95 % Student t quantile t_{0.975, df} (table; df ≥ 1).
double t_quantile_975(int df);

/// Text generation with the KV cache.
std::string generate(Model<float>& model, const std::string& prompt, int n_bytes,
                     double sample_temperature, int top_k, std::uint64_t seed);

/// gnuplot PNGs. Return false (with a message on stderr) if gnuplot is missing.
bool plot_curves(const std::vector<std::string>& dirs, const std::string& png);
bool plot_attention(const std::string& continuum_ckpt, const std::string& softmax_ckpt,
                    const std::string& text, int layer, int head, const std::string& png);

/// Sets OpenMP's and Eigen's thread count (0 = leave the default).
void set_threads(int n);

}  // namespace lm
