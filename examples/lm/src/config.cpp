#include "config.hpp"

#include <cmath>
#include <cstdio>
#include <limits>
#include <string>
#include <utility>

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
  need(context >= 1, "context must be >= 1");
  need(mlp_mult >= 1, "mlp_mult must be >= 1");
  need(std::isfinite(temperature) && temperature > 0, "temperature must be finite and > 0");
  need(std::isfinite(focal_tau_max) && focal_tau_min > 0 && focal_tau_max > focal_tau_min,
       "need 0 < focal_tau_min < focal_tau_max");
  // The model runs in float: a value float rounds to 0 or +inf would reach
  // the first forward as an invalid temperature.
  for (const auto& [name, x] : {std::pair<const char*, double>{"temperature", temperature},
                                {"focal_tau_min", focal_tau_min}, {"focal_tau_max", focal_tau_max}}) {
    const float f = float(x);
    if (!(f > 0 && std::isfinite(f))) {
      char v[32];
      std::snprintf(v, sizeof v, "%.9g", x);
      need(false, std::string(name) + " " + v + " is outside float's range (1.4e-45 to 3.4e38): the model runs in float");
    }
  }
}

nlohmann::json to_json(const Config& c) {
  nlohmann::json j;
#define LM_TO_JSON(type, name, help) j[#name] = c.name;
  LM_CONFIG_FIELDS(LM_TO_JSON)
#undef LM_TO_JSON
  return j;
}

namespace {

[[noreturn]] void wrong(const char* name, const char* want, const nlohmann::json& v) {
  throw std::invalid_argument(std::string("config: key '") + name + "' must be " + want +
                              ", got " + v.dump());
}

void read(const nlohmann::json& v, const char* name, int& out) {
  // Integers only: 4.0 or 4.5 is a trainer bug, not a layer count.
  if (!v.is_number_integer()) wrong(name, "an integer", v);
  const auto x = v.get<std::int64_t>();
  if (v.is_number_unsigned() && v.get<std::uint64_t>() > std::uint64_t(std::numeric_limits<int>::max()))
    wrong(name, "an integer below 2^31", v);
  if (x < std::numeric_limits<int>::min() || x > std::numeric_limits<int>::max())
    wrong(name, "an integer below 2^31", v);
  out = int(x);
}
void read(const nlohmann::json& v, const char* name, double& out) {
  if (!v.is_number()) wrong(name, "a number", v);
  out = v.get<double>();
}
void read(const nlohmann::json& v, const char* name, bool& out) {
  if (!v.is_boolean()) wrong(name, "true or false", v);
  out = v.get<bool>();
}
void read(const nlohmann::json& v, const char* name, std::string& out) {
  if (!v.is_string()) wrong(name, "a string", v);
  out = v.get<std::string>();
}

}  // namespace

Config from_json(const nlohmann::json& j) {
  if (!j.is_object()) throw std::invalid_argument("config: expected a JSON object");
  Config c;
#define LM_FROM_JSON(type, name, help)                                                   \
  if (!j.contains(#name))                                                                \
    throw std::invalid_argument("config: missing key '" #name "' (" help ")");           \
  read(j.at(#name), #name, c.name);
  LM_CONFIG_FIELDS(LM_FROM_JSON)
#undef LM_FROM_JSON
  return c;
}

}  // namespace lm
