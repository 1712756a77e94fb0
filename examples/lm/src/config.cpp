#include "config.hpp"

#include <set>

namespace lm {

continuum::Kernel Config::kernel() const {
  if (attention == "continuum") return continuum::Kernel::continuum;
  if (attention == "softmax") return continuum::Kernel::softmax;
  if (attention == "focal") return continuum::Kernel::focal;
  throw std::invalid_argument("attention: unknown kernel '" + attention +
                              "' (expected continuum, softmax or focal)");
}

void Config::validate() const {
  auto need = [](bool ok, const std::string& what) {
    if (!ok) throw std::invalid_argument("config: " + what);
  };
  kernel();  // throws for an unknown kernel name
  need(n_layer >= 1, "n_layer must be >= 1");
  need(d_model >= 1 && n_head >= 1, "d_model and n_head must be >= 1");
  need(d_model % n_head == 0, "d_model (" + std::to_string(d_model) +
                                  ") must be a multiple of n_head (" +
                                  std::to_string(n_head) + ")");
  need(context >= 2, "context must be >= 2");
  need(mlp_mult >= 1, "mlp_mult must be >= 1");
  need(temperature > 0, "temperature must be > 0");
  need(focal_tau_min > 0 && focal_tau_max > focal_tau_min,
       "need 0 < focal_tau_min < focal_tau_max");
  need((temperature >= focal_tau_min && temperature <= focal_tau_max) || !focal_learned(),
       "focal: temperature must lie in [focal_tau_min, focal_tau_max]");
  need(batch_size >= 1, "batch_size must be >= 1");
  need(steps >= 0, "steps must be >= 0");
  need(lr > 0, "lr must be > 0");
  need(min_lr_ratio >= 0 && min_lr_ratio <= 1, "min_lr_ratio must be in [0, 1]");
  need(warmup_steps >= 0, "warmup_steps must be >= 0");
  need(weight_decay >= 0, "weight_decay must be >= 0");
  need(beta1 >= 0 && beta1 < 1 && beta2 >= 0 && beta2 < 1, "betas must be in [0, 1)");
  need(adam_eps > 0, "adam_eps must be > 0");
  need(grad_clip >= 0, "grad_clip must be >= 0");
  need(init_std > 0, "init_std must be > 0");
  need(eval_every >= 0, "eval_every must be >= 0");
  need(eval_bytes >= 2, "eval_bytes must be >= 2");
  need(eval_batch >= 1, "eval_batch must be >= 1");
  need(stride >= 0 && stride <= context, "stride must be in [0, context]");
  need(threads >= 0, "threads must be >= 0");
}

Config preset(const std::string& name) {
  Config c;  // defaults are the `cpu` preset
  c.preset = name;
  if (name == "cpu") {
    return c;
  }
  if (name == "paper") {
    // MATH.md §9: 6 layers, about 5 M parameters (d_model 256, 8 heads: our choice).
    c.n_layer = 6; c.d_model = 256; c.n_head = 8; c.context = 192;
    c.batch_size = 32; c.steps = 20000; c.lr = 1e-3; c.warmup_steps = 500;
    c.eval_every = 1000; c.eval_bytes = 262144;
    return c;
  }
  if (name == "demo") {
    // A couple of minutes per kernel on 2 cores.
    c.steps = 120; c.warmup_steps = 12; c.eval_every = 40; c.eval_bytes = 8192;
    return c;
  }
  if (name == "smoke") {
    // Seconds; used by the tests.
    c.n_layer = 2; c.d_model = 32; c.n_head = 2; c.context = 32;
    c.batch_size = 8; c.steps = 400; c.lr = 3e-3; c.warmup_steps = 20;
    c.eval_every = 100; c.eval_bytes = 4096; c.eval_batch = 16;
    return c;
  }
  throw std::invalid_argument("preset: unknown preset '" + name +
                              "' (expected paper, cpu, demo or smoke)");
}

nlohmann::json to_json(const Config& c) {
  nlohmann::json j;
#define LM_TO_JSON(type, name, def, help) j[#name] = c.name;
  LM_CONFIG_FIELDS(LM_TO_JSON)
#undef LM_TO_JSON
  return j;
}

Config from_json(const nlohmann::json& j, Config c) {
  if (!j.is_object()) throw std::invalid_argument("config: expected a JSON object");
  std::set<std::string> known;
#define LM_FROM_JSON(type, name, def, help)                                        \
  known.insert(#name);                                                             \
  if (j.contains(#name)) {                                                         \
    try {                                                                          \
      c.name = j.at(#name).get<type>();                                            \
    } catch (const nlohmann::json::exception&) {                                   \
      throw std::invalid_argument("config: field '" #name "' has the wrong type"); \
    }                                                                              \
  }
  LM_CONFIG_FIELDS(LM_FROM_JSON)
#undef LM_FROM_JSON
  for (auto it = j.begin(); it != j.end(); ++it)
    if (!known.count(it.key()))
      throw std::invalid_argument("config: unknown field '" + it.key() + "'");
  return c;
}

}  // namespace lm
