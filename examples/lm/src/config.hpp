// config.hpp — the model's architecture as stored in a checkpoint's
// `__metadata__["config"]` (a JSON object string written by the PyTorch
// trainer, experiments/tinystories): the eleven keys below, all required.
// Every other key of that object (the trainer's optimiser, budget, seed,
// preset, thread count …) is ignored: continuum-lm only runs the model.
#pragma once

#include <stdexcept>
#include <string>

#include <nlohmann/json.hpp>

#include <continuum/math/density.hpp>

namespace lm {

/// One X-macro list of the architecture keys: (type, name, help).
#define LM_CONFIG_FIELDS(X)                                                        \
  X(int, n_layer, "number of Transformer blocks")                                 \
  X(int, d_model, "model width C")                                                \
  X(int, n_head, "attention heads (d_model must be a multiple)")                  \
  X(int, context, "context length in bytes (rows of wpe)")                        \
  X(int, mlp_mult, "MLP hidden width F = mlp_mult * d_model")                     \
  X(std::string, attention, "attention kernel: continuum|softmax|focal")          \
  X(double, temperature, "attention temperature tau (when not learned)")          \
  X(bool, learn_temperature, "a per-layer learned log-temperature (continuum, softmax)") \
  X(bool, focal_fixed, "focal with one fixed temperature (= softmax, MATH.md §8)") \
  X(double, focal_tau_min, "focal per-token temperature lower clip")              \
  X(double, focal_tau_max, "focal per-token temperature upper clip")

struct Config {
  int n_layer = 4, d_model = 128, n_head = 4, context = 192, mlp_mult = 4;
  std::string attention = "continuum";
  double temperature = 0.30;
  bool learn_temperature = false, focal_fixed = false;
  double focal_tau_min = 0.05, focal_tau_max = 2.0;

  int head_dim() const { return d_model / n_head; }
  continuum::Kernel kernel() const;
  /// Focal attention has a learned per-token temperature unless focal_fixed.
  bool focal_learned() const { return attention == "focal" && !focal_fixed; }
  /// A per-layer learned log-temperature (continuum/softmax, or fixed focal).
  bool scalar_learned() const { return learn_temperature && !focal_learned(); }
  /// Throws std::invalid_argument naming the first bad field.
  void validate() const;
};

/// The eleven architecture keys.
nlohmann::json to_json(const Config& c);
/// Reads the eleven architecture keys of `j` (a JSON object): each must be
/// present with its JSON type (integer, string, number, boolean; integers in
/// range). Other keys are ignored. Throws std::invalid_argument naming the key.
/// Does not validate() the values.
Config from_json(const nlohmann::json& j);

}  // namespace lm
