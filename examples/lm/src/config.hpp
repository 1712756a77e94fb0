// config.hpp — the experiment's configuration: model shape, attention kernel,
// temperature, optimiser and budget, with the named presets `paper`, `cpu`,
// `smoke` and `demo` (MATH.md §9). Every field can be overridden from the CLI and
// is stored in result.json and in checkpoints.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>

#include <nlohmann/json.hpp>

#include <continuum/math/density.hpp>

namespace lm {

/// One X-macro list of every configuration field: (type, name, default, help).
/// Used for the struct, JSON (de)serialisation, the CLI and printing.
#define LM_CONFIG_FIELDS(X)                                                                    \
  X(std::string, preset, "cpu", "preset the other fields start from (paper|cpu|smoke|demo)")  \
  X(int, n_layer, 4, "number of Transformer blocks")                                          \
  X(int, d_model, 128, "model width")                                                         \
  X(int, n_head, 4, "attention heads (d_model must be a multiple)")                           \
  X(int, context, 192, "context length in bytes (max positions)")                            \
  X(int, mlp_mult, 4, "MLP hidden width = mlp_mult * d_model")                                \
  X(std::string, attention, "continuum", "attention kernel: continuum|softmax|focal")         \
  X(double, temperature, 0.30, "attention temperature tau (initial value when learned)")      \
  X(bool, learn_temperature, false,                                                           \
    "learn a per-layer log-temperature (continuum, softmax)")                                 \
  X(bool, focal_fixed, false,                                                                 \
    "focal with one fixed temperature (then identical to softmax; MATH.md §8)")                   \
  X(double, focal_tau_min, 0.05, "focal per-token temperature lower clip")                    \
  X(double, focal_tau_max, 2.0, "focal per-token temperature upper clip")                     \
  X(int, batch_size, 16, "sequences per optimiser step")                                      \
  X(int, steps, 250, "optimiser steps (token budget = steps*batch_size*context)")            \
  X(double, lr, 3e-3, "peak learning rate")                                                   \
  X(double, min_lr_ratio, 0.1, "final learning rate as a fraction of lr (cosine)")            \
  X(int, warmup_steps, 25, "linear warm-up steps")                                            \
  X(double, weight_decay, 0.1, "AdamW decoupled weight decay (matrices, embeddings)")        \
  X(double, beta1, 0.9, "AdamW beta1")                                                        \
  X(double, beta2, 0.95, "AdamW beta2")                                                       \
  X(double, adam_eps, 1e-8, "AdamW epsilon")                                                  \
  X(double, grad_clip, 1.0, "global gradient-norm clip (0 = off)")                            \
  X(double, init_std, 0.02, "initial weight standard deviation")                              \
  X(int, eval_every, 50, "steps between validation-curve points (0 = only at the end)")      \
  X(int, eval_bytes, 8192, "bytes of each validation file used for curve points")            \
  X(int, eval_batch, 16, "windows per forward pass in evaluation")                            \
  X(int, stride, 0, "evaluation stride (0 = context: non-overlapping windows)")               \
  X(std::uint64_t, seed, 0, "seed of the initialisation and of the batch order")              \
  X(int, threads, 2, "OpenMP threads (results are bitwise stable for a fixed count)")

struct Config {
#define LM_DECLARE(type, name, def, help) type name = def;
  LM_CONFIG_FIELDS(LM_DECLARE)
#undef LM_DECLARE

  int head_dim() const { return d_model / n_head; }
  continuum::Kernel kernel() const;
  /// Focal attention learns a per-token temperature unless focal_fixed.
  bool focal_learned() const { return attention == "focal" && !focal_fixed; }
  /// Per-layer learned log-temperature (continuum/softmax, or fixed focal).
  bool scalar_learned() const { return learn_temperature && !focal_learned(); }
  std::int64_t tokens_budget() const {
    return std::int64_t(steps) * batch_size * context;
  }
  /// Throws std::invalid_argument naming the first bad field.
  void validate() const;
};

/// The named presets. Throws std::invalid_argument for an unknown name.
Config preset(const std::string& name);

nlohmann::json to_json(const Config& c);
/// Fields missing from `j` keep their value in `base`; unknown keys are an error.
Config from_json(const nlohmann::json& j, Config base = Config{});

}  // namespace lm
