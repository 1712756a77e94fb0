#include "runner.hpp"

#include <algorithm>
#include <cmath>
#include <optional>
#include <stdexcept>

#ifdef _OPENMP
#include <omp.h>
#endif

#include "rng.hpp"
#include "safetensors.hpp"

namespace lm {

void set_threads(int n) {
  // Eigen's own products stay single-threaded: the model splits them by rows
  // (model.hpp gemm) and the operator parallelises itself.
  Eigen::setNbThreads(1);
#ifdef _OPENMP
  if (n > 0) omp_set_num_threads(n);
#else
  (void)n;
#endif
}

// ---------------------------------------------------------------- evaluation

EvalResult evaluate(Model<float>& model, const std::vector<std::uint8_t>& all,
                    const EvalOptions& opt) {
  const int context = model.config().context;
  const std::uint64_t n = all.size();
  if (n < 2)
    throw std::invalid_argument("evaluate: the text has " + std::to_string(n) +
                                " byte(s); at least 2 are needed (the first byte is never scored)");
  if (opt.stride < 0 || opt.stride > context)
    throw std::invalid_argument("evaluate: stride " + std::to_string(opt.stride) +
                                " outside [0, context=" + std::to_string(context) + "]");
  if (opt.eval_batch < 1) throw std::invalid_argument("evaluate: eval_batch must be >= 1");
  const auto windows = eval_windows(n, context, opt.stride);
  double total = 0;
  std::uint64_t scored = 0;
  std::vector<std::uint8_t> in, tg;
  // Batch consecutive windows of equal length.
  for (std::size_t w0 = 0; w0 < windows.size();) {
    const int len = windows[w0].len;
    std::size_t w1 = w0;
    while (w1 < windows.size() && windows[w1].len == len && int(w1 - w0) < opt.eval_batch) ++w1;
    const int B = int(w1 - w0);
    in.resize(std::size_t(B) * len);
    tg.resize(in.size());
    for (int b = 0; b < B; ++b)
      for (int t = 0; t < len; ++t) {
        in[std::size_t(b) * len + t] = all[windows[w0 + b].begin + t];
        tg[std::size_t(b) * len + t] = all[windows[w0 + b].begin + t + 1];
      }
    model.forward(in.data(), tg.data(), B, len);
    const auto& nll = model.nll();
    for (int b = 0; b < B; ++b)
      for (int t = len - windows[w0 + b].scored; t < len; ++t) {
        total += nll[std::size_t(b) * len + t];
        ++scored;
      }
    w0 = w1;
  }
  if (scored != n - 1) throw std::logic_error("evaluate: scored " + std::to_string(scored) +
                                              " bytes instead of " + std::to_string(n - 1));
  EvalResult r;
  r.bytes_scored = scored;
  r.nats_per_byte = total / double(scored);
  return r;
}

Mat<float> window_logits(Model<float>& model, const std::vector<std::uint8_t>& bytes) {
  if (bytes.empty()) throw std::invalid_argument("logits: the text is empty");
  const int L = int(std::min<std::size_t>(bytes.size(), std::size_t(model.config().context)));
  model.forward(bytes.data(), nullptr, 1, L);
  return model.logits();
}

// ---------------------------------------------------------------- checkpoints

void save_checkpoint(const std::string& path, const Model<float>& model,
                     const nlohmann::json& extra) {
  StFile f;
  f.metadata["format"] = "continuum-lm";
  f.metadata["config"] = to_json(model.config()).dump();
  if (!extra.is_null()) f.metadata["run"] = extra.dump();
  const auto& p = model.params();
  for (const auto& t : model.layout().tensors)
    f.tensors[t.name] = StTensor{t.shape, std::vector<float>(p.begin() + std::ptrdiff_t(t.offset),
                                                             p.begin() + std::ptrdiff_t(t.offset + t.size))};
  save_safetensors(path, f);
}

Model<float> load_checkpoint(const std::string& path) {
  StFile f = load_safetensors(path);
  auto bad = [&](const std::string& why) -> std::runtime_error {
    return std::runtime_error("checkpoint '" + path + "': " + why);
  };
  const auto format = f.metadata.find("format");
  if (format == f.metadata.end())
    throw bad("no \"format\" in __metadata__ (not a continuum-lm checkpoint)");
  if (format->second != "continuum-lm")
    throw bad("__metadata__ format is '" + format->second + "', not 'continuum-lm'");
  if (!f.metadata.count("config")) throw bad("no config in __metadata__ (not a continuum-lm checkpoint)");
  Config cfg;
  try {
    cfg = from_json(nlohmann::json::parse(f.metadata["config"]));
    cfg.validate();
  } catch (const std::exception& e) {
    throw bad(std::string("bad config in __metadata__: ") + e.what());
  }
  // Everything is checked against the tensors the file holds before the
  // model is allocated: its size then follows from the file's own data, not
  // from the metadata alone (a 200-byte file could ask for gigabytes). Every
  // block has tensors, so n_layer is bounded by the file's tensor count first
  // (the Layout lists n_layer blocks).
  if (std::size_t(cfg.n_layer) > f.tensors.size())
    throw bad("the config's " + std::to_string(cfg.n_layer) + " layers need more tensors than the file's " +
              std::to_string(f.tensors.size()));
  const Layout layout(cfg);
  for (const auto& t : layout.tensors) {
    auto it = f.tensors.find(t.name);
    if (it == f.tensors.end()) throw bad("missing tensor '" + t.name + "'");
    if (it->second.shape != t.shape) {
      std::string got, want;
      for (auto s : it->second.shape) got += std::to_string(s) + " ";
      for (auto s : t.shape) want += std::to_string(s) + " ";
      throw bad("tensor '" + t.name + "' has shape [ " + got + "], the config needs [ " + want + "]");
    }
    for (float v : it->second.data)
      if (!std::isfinite(v)) throw bad("tensor '" + t.name + "' has a non-finite value");
  }
  if (f.tensors.size() != layout.tensors.size()) {
    for (const auto& t : layout.tensors) f.tensors.erase(t.name);
    throw bad("unexpected tensor '" + f.tensors.begin()->first + "'");
  }
  std::optional<Model<float>> model;
  try {
    model.emplace(cfg);
  } catch (const std::bad_alloc&) {
    throw bad("not enough memory for the model's " + std::to_string(layout.total) + " parameters");
  }
  auto& p = model->params();
  for (const auto& t : layout.tensors) {
    const auto& data = f.tensors.at(t.name).data;
    std::copy(data.begin(), data.end(), p.begin() + std::ptrdiff_t(t.offset));
  }
  return std::move(*model);
}

// ---------------------------------------------------------------- generate

std::string generate(Model<float>& model, const std::string& prompt, int n_bytes,
                     double sample_temperature, int top_k, std::uint64_t seed) {
  if (prompt.empty()) throw std::invalid_argument("generate: the prompt must not be empty");
  if (!(sample_temperature >= 0) || !std::isfinite(sample_temperature))
    throw std::invalid_argument("generate: --sample-temperature must be finite and >= 0");
  if (n_bytes < 0) throw std::invalid_argument("generate: --bytes must be >= 0");
  if (top_k < 0) throw std::invalid_argument("generate: --top-k must be >= 0");
  const int ctx = model.config().context;
  Rng rng(seed, 3);
  std::vector<std::uint8_t> text(prompt.begin(), prompt.end());
  auto cache = model.make_cache();
  // (Re-)encode the text into an empty cache: all of it when it fits, else its
  // last max(context/2, 1) bytes (sliding the window when the cache is full).
  auto prefill = [&]() {
    cache.length = 0;
    const std::size_t keep = text.size() < std::size_t(ctx) ? text.size() : std::max<std::size_t>(ctx / 2, 1);
    return model.forward_cached(text.data() + (text.size() - keep), int(keep), cache);
  };
  Mat<float> logits = prefill();
  for (int i = 0; i < n_bytes; ++i) {
    const auto row = logits.row(logits.rows() - 1);
    if (!row.allFinite())
      throw std::runtime_error("generate: the logits of byte " + std::to_string(text.size()) +
                               " are not finite: the model's logits overflow float");
    std::vector<double> pr(256);
    int next = 0;
    if (sample_temperature == 0) {
      Eigen::Index arg = 0;
      row.maxCoeff(&arg);
      next = int(arg);
    } else {
      std::vector<int> idx(256);
      for (int v = 0; v < 256; ++v) idx[v] = v;
      std::sort(idx.begin(), idx.end(), [&](int a, int b) { return row(a) > row(b) || (row(a) == row(b) && a < b); });
      const int k = top_k > 0 ? std::min(top_k, 256) : 256;
      double s = 0;
      for (int j = 0; j < k; ++j) s += (pr[j] = std::exp((row(idx[j]) - row(idx[0])) / sample_temperature));
      double u = rng.uniform() * s;
      next = idx[k - 1];
      for (int j = 0; j < k; ++j) {
        if ((u -= pr[j]) < 0) { next = idx[j]; break; }
      }
    }
    text.push_back(std::uint8_t(next));
    if (cache.length >= cache.capacity) {
      logits = prefill();  // slide: re-encode the last half context
    } else {
      const std::uint8_t b = std::uint8_t(next);
      logits = model.forward_cached(&b, 1, cache);
    }
  }
  return std::string(text.begin(), text.end());
}

}  // namespace lm
