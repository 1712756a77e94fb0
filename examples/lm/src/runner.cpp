#include "runner.hpp"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <map>
#include <optional>
#include <set>
#include <sstream>

#ifdef _OPENMP
#include <omp.h>
#endif

#include "optim.hpp"
#include "safetensors.hpp"

namespace fs = std::filesystem;

namespace lm {

void set_threads(int n) {
  Eigen::setNbThreads(1);
  if (n <= 0) return;
#ifdef _OPENMP
  omp_set_num_threads(n);
#endif
  // Eigen's own products stay single-threaded: the model splits them by rows
  // (model.hpp gemm) and the operator parallelises itself.
  Eigen::setNbThreads(1);
}

namespace {

std::string utc_now() {
  const std::time_t t = std::time(nullptr);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&t));
  return buf;
}

std::string duration(double s) {
  const long v = long(std::max(0.0, s) + 0.5);
  std::ostringstream o;
  if (v >= 3600) o << v / 3600 << "h" << std::setw(2) << std::setfill('0') << (v / 60) % 60 << "m";
  else if (v >= 60) o << v / 60 << "m" << std::setw(2) << std::setfill('0') << v % 60 << "s";
  else o << v << "s";
  return o.str();
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

// ---------------------------------------------------------------- evaluation

EvalResult evaluate(Model<float>& model, const std::vector<std::uint8_t>& all,
                    std::uint64_t max_bytes) {
  const Config& c = model.config();
  const std::uint64_t n = max_bytes > 0 ? std::min<std::uint64_t>(max_bytes, all.size())
                                        : all.size();
  EvalResult r;
  if (n < 2) return r;
  const auto windows = eval_windows(n, c.context, c.stride);
  double total = 0;
  std::vector<std::uint8_t> in, tg;
  // Batch consecutive windows of equal length.
  for (std::size_t w0 = 0; w0 < windows.size();) {
    const int len = windows[w0].len;
    std::size_t w1 = w0;
    while (w1 < windows.size() && windows[w1].len == len && int(w1 - w0) < c.eval_batch) ++w1;
    const int B = int(w1 - w0);
    in.resize(std::size_t(B) * len);
    tg.resize(in.size());
    for (int b = 0; b < B; ++b)
      for (int t = 0; t < len; ++t) {
        in[std::size_t(b) * len + t] = all[windows[w0 + b].begin + t];
        tg[std::size_t(b) * len + t] = all[windows[w0 + b].begin + t + 1];
      }
    model.forward(in.data(), tg.data(), B, len, /*keep_cache=*/false);
    const auto& nll = model.nll();
    for (int b = 0; b < B; ++b)
      for (int t = len - windows[w0 + b].scored; t < len; ++t)
        total += nll[std::size_t(b) * len + t];
    w0 = w1;
  }
  r.bytes_scored = n - 1;
  r.nats_per_byte = total / double(n - 1);
  return r;
}

double unigram_entropy(const std::vector<std::uint8_t>& bytes) {
  std::vector<double> count(256, 0.0);
  for (auto b : bytes) count[b] += 1;
  double h = 0;
  for (double k : count)
    if (k > 0) h -= k / double(bytes.size()) * std::log(k / double(bytes.size()));
  return h;
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

// ---------------------------------------------------------------- training

nlohmann::json train_run(const TrainSpec& spec) {
  Config cfg = spec.cfg;
  cfg.validate();
  set_threads(cfg.threads);
  const TextSlice train = load_slice(spec.train);
  std::vector<TextSlice> valid;
  for (const auto& v : spec.valid) valid.push_back(load_slice(v));
  if (train.bytes.size() < std::size_t(cfg.context) + 1)
    throw std::runtime_error("data: context " + std::to_string(cfg.context) +
                             " is longer than the training text '" + train.spec + "' (" +
                             std::to_string(train.bytes.size()) + " bytes)");
  for (const auto& v : valid)
    if (v.bytes.size() < 2)
      throw std::runtime_error("data: validation slice '" + v.spec + "' has fewer than 2 bytes");
  if (spec.out_dir.empty()) throw std::runtime_error("train: --out is required");
  fs::create_directories(spec.out_dir);

  Model<float> model(cfg);
  model.init(cfg.seed);
  AdamW<float> opt(model.layout(), cfg);
  BatchSampler sampler(train.bytes, cfg.context, cfg.batch_size, cfg.seed);

  const bool tty = spec.progress && ::isatty(::fileno(stderr));
  if (spec.progress)
    std::cerr << "continuum-lm: " << cfg.attention << " tau=" << cfg.temperature
              << (cfg.learn_temperature ? " (learned)" : "") << " seed=" << cfg.seed << ", "
              << model.num_params() << " parameters, " << cfg.steps << " steps x "
              << cfg.batch_size << " x " << cfg.context << " = " << cfg.tokens_budget()
              << " tokens -> " << spec.out_dir << "\n";

  const std::string log_path = spec.out_dir + "/train_log.jsonl";
  std::ofstream log(log_path, std::ios::trunc);
  if (!log) throw std::runtime_error("cannot write '" + log_path + "'");

  std::vector<std::uint8_t> in(std::size_t(cfg.batch_size) * cfg.context), tg(in.size());
  nlohmann::json curve = nlohmann::json::array();
  auto curve_point = [&](int step, double train_loss) {
    nlohmann::json pt = {{"step", step},
                         {"tokens", std::int64_t(step) * cfg.batch_size * cfg.context},
                         {"train_loss", train_loss}};
    nlohmann::json vals = nlohmann::json::array();
    for (const auto& v : valid)
      vals.push_back(evaluate(model, v.bytes, std::uint64_t(cfg.eval_bytes)).nats_per_byte);
    pt["valid_prefix_nats_per_byte"] = vals;
    curve.push_back(pt);
    nlohmann::json rec = pt;
    rec["event"] = "eval";
    log << rec.dump() << "\n" << std::flush;
    return vals;
  };

  const auto t0 = std::chrono::steady_clock::now();
  double eval_time = 0, ema = 0, last_loss = 0;
  for (int step = 0; step < cfg.steps; ++step) {
    sampler.next(in.data(), tg.data());
    const double loss = model.forward(in.data(), tg.data(), cfg.batch_size, cfg.context, true);
    if (!std::isfinite(loss))
      throw std::runtime_error("train: loss is " + std::to_string(loss) + " at step " +
                               std::to_string(step) + " (diverged; lower --lr?)");
    model.backward();
    const double gnorm = clip_grad_norm(model.grads(), cfg.grad_clip);
    const double lr = learning_rate(cfg, step);
    opt.step(model.params(), model.grads(), lr);
    last_loss = loss;
    ema = step == 0 ? loss : 0.95 * ema + 0.05 * loss;
    log << nlohmann::json{{"event", "step"}, {"step", step + 1}, {"loss", loss},
                          {"lr", lr}, {"grad_norm", gnorm},
                          {"elapsed_s", seconds_since(t0)}}.dump()
        << "\n" << std::flush;
    const bool do_eval = cfg.eval_every > 0 && (step + 1) % cfg.eval_every == 0 && step + 1 < cfg.steps;
    if (do_eval) {
      const auto te = std::chrono::steady_clock::now();
      const auto vals = curve_point(step + 1, ema);
      eval_time += seconds_since(te);
      if (spec.progress && !tty) {
        std::cerr << "  step " << step + 1 << "/" << cfg.steps << " valid-prefix";
        for (double v : vals) std::cerr << " " << std::fixed << std::setprecision(4) << v;
        std::cerr << " nats/byte\n" << std::defaultfloat;
      }
    }
    if (spec.progress) {
      const double el = seconds_since(t0);
      const double train_el = std::max(1e-9, el - eval_time);
      const double tps = double(step + 1) * cfg.batch_size * cfg.context / train_el;
      const double eta = train_el / (step + 1) * (cfg.steps - step - 1);
      std::ostringstream line;
      line << "step " << step + 1 << "/" << cfg.steps << "  loss " << std::fixed
           << std::setprecision(4) << ema << "  " << std::setprecision(0) << tps
           << " tok/s  ETA " << duration(eta);
      if (tty) std::cerr << "\r" << line.str() << "   " << std::flush;
      else if ((step + 1) % 25 == 0 || step + 1 == cfg.steps) std::cerr << "  " << line.str() << "\n";
    }
  }
  if (tty) std::cerr << "\n";
  const double train_time = seconds_since(t0) - eval_time;
  if (cfg.steps > 0) curve_point(cfg.steps, ema);

  // Final evaluation over every byte of each validation slice.
  const auto te = std::chrono::steady_clock::now();
  nlohmann::json vres = nlohmann::json::array();
  for (const auto& v : valid) {
    const EvalResult r = evaluate(model, v.bytes);
    vres.push_back({{"spec", v.spec},
                    {"path", v.path},
                    {"label", v.label()},
                    {"from", v.from},
                    {"to", v.to},
                    {"byte_begin", v.begin},
                    {"byte_end", v.end},
                    {"bytes", v.bytes.size()},
                    {"bytes_scored", r.bytes_scored},
                    {"nats_per_byte", r.nats_per_byte},
                    {"bits_per_byte", r.nats_per_byte / std::log(2.0)}});
    if (spec.progress)
      std::cerr << "  valid " << v.label() << ": " << std::fixed << std::setprecision(4)
                << r.nats_per_byte << " nats/byte (" << r.bytes_scored << " bytes)\n"
                << std::defaultfloat;
  }
  const double final_eval_time = seconds_since(te);

  nlohmann::json result = {
      {"program", "continuum-lm"},
      {"date", utc_now()},
      {"config", to_json(cfg)},
      {"attention", cfg.attention},
      {"seed", cfg.seed},
      {"num_params", model.num_params()},
      {"train", {{"spec", train.spec}, {"path", train.path}, {"bytes", train.bytes.size()}}},
      {"train_time_s", train_time},
      {"eval_time_s", eval_time + final_eval_time},
      {"tokens_seen", cfg.tokens_budget()},
      {"final_train_loss", last_loss},
      {"valid", vres},
      {"curve", curve}};
  // Learned temperatures, for the record.
  nlohmann::json taus = nlohmann::json::array();
  for (const auto& t : model.layout().tensors)
    if (t.name.find("log_temperature") != std::string::npos)
      taus.push_back(std::exp(double(model.params()[t.offset])));
    else if (t.name.find("focal.bias") != std::string::npos)
      taus.push_back(double(model.params()[t.offset]));
  if (!taus.empty()) result["learned_temperature"] = taus;
  if (spec.save_checkpoint) {
    save_checkpoint(spec.out_dir + "/model.safetensors", model,
                    {{"seed", cfg.seed}, {"tokens_seen", cfg.tokens_budget()}});
    result["checkpoint"] = "model.safetensors";
  }
  log << nlohmann::json{{"event", "done"}, {"valid", vres}}.dump() << "\n";
  write_file_atomic(spec.out_dir + "/result.json", result.dump(2) + "\n");
  return result;
}

// ---------------------------------------------------------------- compare

double t_quantile_975(int df) {
  // t_{0.975, df}, standard tables (e.g. NIST/SEMATECH e-Handbook 1.3.6.7.2).
  static const double table[] = {0,      12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365,
                                 2.306,  2.262,  2.228, 2.201, 2.179, 2.160, 2.145, 2.131,
                                 2.120,  2.110,  2.101, 2.093, 2.086, 2.080, 2.074, 2.069,
                                 2.064,  2.060,  2.056, 2.052, 2.048, 2.045, 2.042};
  if (df < 1) return std::nan("");
  if (df <= 30) return table[df];
  if (df <= 40) return 2.042;   // conservative: the value at the next tabulated df below
  if (df <= 60) return 2.021;
  if (df <= 120) return 2.000;
  return 1.980;
}

namespace {

struct Stats {
  int n = 0;
  double mean = 0, sd = 0;
};
Stats stats(const std::vector<double>& v) {
  Stats s;
  s.n = int(v.size());
  if (!s.n) return s;
  for (double x : v) s.mean += x;
  s.mean /= s.n;
  if (s.n > 1) {
    for (double x : v) s.sd += (x - s.mean) * (x - s.mean);
    s.sd = std::sqrt(s.sd / (s.n - 1));
  }
  return s;
}

/// A "setting": every config field that must match for runs to be comparable
/// (all but the kernel, seed and bookkeeping fields).
nlohmann::json setting_of(const nlohmann::json& cfg) {
  nlohmann::json s = cfg;
  for (const char* k : {"attention", "seed", "threads", "eval_every", "eval_bytes", "eval_batch",
                        "focal_fixed", "focal_tau_min", "focal_tau_max"})
    s.erase(k);
  return s;
}

std::string setting_label(const nlohmann::json& s) {
  std::ostringstream o;
  o << s.value("preset", std::string("?")) << ": " << s.value("n_layer", 0) << "L d"
    << s.value("d_model", 0) << " h" << s.value("n_head", 0) << " ctx " << s.value("context", 0)
    << ", tau " << s.value("temperature", 0.0)
    << (s.value("learn_temperature", false) ? " (learned)" : " (fixed)") << ", "
    << s.value("steps", 0) << " steps x " << s.value("batch_size", 0);
  return o.str();
}

}  // namespace

nlohmann::json compare_runs(const std::vector<std::string>& dirs) {
  // setting → label → kernel → seed → nats/byte
  std::map<std::string, nlohmann::json> settings;
  std::map<std::string, std::map<std::string, std::map<std::string, std::map<std::uint64_t, double>>>> data;
  std::map<std::string, std::vector<std::string>> label_order;
  int files = 0;
  for (const auto& d : dirs) {
    if (!fs::exists(d)) throw std::runtime_error("compare: '" + d + "' does not exist");
    std::vector<fs::path> found;
    if (fs::is_regular_file(d)) found.push_back(d);
    else
      for (const auto& e : fs::recursive_directory_iterator(d))
        if (e.is_regular_file() && e.path().filename() == "result.json") found.push_back(e.path());
    std::sort(found.begin(), found.end());
    for (const auto& f : found) {
      nlohmann::json r;
      try {
        std::ifstream in(f);
        r = nlohmann::json::parse(in);
        const auto set = setting_of(r.at("config"));
        const std::string key = set.dump();
        settings[key] = set;
        const std::string kernel = r.at("config").at("attention");
        const std::uint64_t seed = r.at("config").at("seed");
        for (const auto& v : r.at("valid")) {
          const std::string label = v.at("label");
          auto& lo = label_order[key];
          if (std::find(lo.begin(), lo.end(), label) == lo.end()) lo.push_back(label);
          data[key][label][kernel][seed] = v.at("nats_per_byte").get<double>();
        }
        ++files;
      } catch (const std::exception& e) {
        throw std::runtime_error("compare: cannot read '" + f.string() + "': " + e.what());
      }
    }
  }
  if (!files) throw std::runtime_error("compare: no result.json found");

  nlohmann::json out = {{"runs", files}, {"settings", nlohmann::json::array()}};
  for (const auto& [key, set] : settings) {
    nlohmann::json sj = {{"setting", set}, {"label", setting_label(set)}, {"valid", nlohmann::json::array()}};
    for (const auto& label : label_order[key]) {
      const auto& byk = data[key][label];
      nlohmann::json vj = {{"label", label}, {"kernels", nlohmann::json::array()},
                           {"paired", nlohmann::json::array()}};
      for (const char* k : {"continuum", "softmax", "focal"}) {
        auto it = byk.find(k);
        if (it == byk.end()) continue;
        std::vector<double> v;
        nlohmann::json per_seed = nlohmann::json::object();
        for (const auto& [s, x] : it->second) {
          v.push_back(x);
          per_seed[std::to_string(s)] = x;
        }
        const Stats st = stats(v);
        vj["kernels"].push_back({{"kernel", k}, {"n", st.n}, {"mean", st.mean}, {"sd", st.sd},
                                 {"per_seed", per_seed}});
      }
      auto ca = byk.find("continuum");
      for (const char* other : {"softmax", "focal"}) {
        auto ot = byk.find(other);
        if (ca == byk.end() || ot == byk.end()) continue;
        std::vector<double> d;
        nlohmann::json per_seed = nlohmann::json::object();
        int won = 0;
        for (const auto& [s, x] : ca->second) {
          auto y = ot->second.find(s);
          if (y == ot->second.end()) continue;
          d.push_back(x - y->second);
          per_seed[std::to_string(s)] = x - y->second;
          won += x < y->second;
        }
        if (d.empty()) continue;
        const Stats st = stats(d);
        nlohmann::json pj = {{"vs", other}, {"n", st.n}, {"mean_diff", st.mean}, {"sd", st.sd},
                             {"seeds_won", won}, {"per_seed", per_seed}};
        if (st.n >= 2) {
          const double h = t_quantile_975(st.n - 1) * st.sd / std::sqrt(double(st.n));
          pj["ci95"] = {st.mean - h, st.mean + h};
        }
        vj["paired"].push_back(pj);
      }
      sj["valid"].push_back(vj);
    }
    out["settings"].push_back(sj);
  }
  return out;
}

std::string format_table(const nlohmann::json& cmp) {
  std::ostringstream o;
  o << std::fixed;
  for (const auto& s : cmp.at("settings")) {
    o << "## " << s.at("label").get<std::string>() << "\n";
    for (const auto& v : s.at("valid")) {
      o << "\nvalidation: " << v.at("label").get<std::string>() << "   (mean NLL, nats/byte)\n";
      o << "  kernel      seeds   mean ± sd\n";
      for (const auto& k : v.at("kernels"))
        o << "  " << std::left << std::setw(10) << k.at("kernel").get<std::string>() << std::right
          << std::setw(7) << k.at("n").get<int>() << "   " << std::setprecision(4)
          << k.at("mean").get<double>() << " ± " << k.at("sd").get<double>() << "\n";
      if (!v.at("paired").empty()) {
        o << "  paired difference        mean      95% CI (t)              seeds won   per seed\n";
        for (const auto& p : v.at("paired")) {
          o << "  continuum - " << std::left << std::setw(9) << p.at("vs").get<std::string>()
            << std::right << "  " << std::showpos << std::setprecision(4)
            << p.at("mean_diff").get<double>() << "   ";
          std::ostringstream ci;
          ci << std::fixed << std::showpos << std::setprecision(4);
          if (p.contains("ci95")) ci << "[" << p["ci95"][0].get<double>() << ", " << p["ci95"][1].get<double>() << "]";
          else ci << "(n/a: 1 seed)";
          o << std::left << std::setw(24) << ci.str() << std::right << std::noshowpos << "  "
            << p.at("seeds_won").get<int>() << "/" << p.at("n").get<int>() << "       ";
          for (auto it = p.at("per_seed").begin(); it != p.at("per_seed").end(); ++it)
            o << "s" << it.key() << ":" << std::showpos << std::setprecision(4)
              << it.value().get<double>() << " " << std::noshowpos;
          o << "\n";
        }
      }
    }
    o << "\n";
  }
  return o.str();
}

std::string format_csv(const nlohmann::json& cmp) {
  std::ostringstream o;
  o << std::setprecision(10);
  o << "setting,valid,row,n,mean,sd,ci_lo,ci_hi,seeds_won\n";
  for (const auto& s : cmp.at("settings"))
    for (const auto& v : s.at("valid")) {
      const std::string pre = "\"" + s.at("label").get<std::string>() + "\",\"" +
                              v.at("label").get<std::string>() + "\",";
      for (const auto& k : v.at("kernels"))
        o << pre << k.at("kernel").get<std::string>() << "," << k.at("n").get<int>() << ","
          << k.at("mean").get<double>() << "," << k.at("sd").get<double>() << ",,,\n";
      for (const auto& p : v.at("paired")) {
        o << pre << "continuum-" << p.at("vs").get<std::string>() << "," << p.at("n").get<int>()
          << "," << p.at("mean_diff").get<double>() << "," << p.at("sd").get<double>() << ",";
        if (p.contains("ci95")) o << p["ci95"][0].get<double>() << "," << p["ci95"][1].get<double>();
        else o << ",";
        o << "," << p.at("seeds_won").get<int>() << "\n";
      }
    }
  return o.str();
}

// ---------------------------------------------------------------- generate

std::string generate(Model<float>& model, const std::string& prompt, int n_bytes,
                     double sample_temperature, int top_k, std::uint64_t seed) {
  if (prompt.empty()) throw std::invalid_argument("generate: the prompt must not be empty");
  if (sample_temperature < 0) throw std::invalid_argument("generate: --sample-temperature must be >= 0");
  const int ctx = model.config().context;
  Rng rng(seed, 3);
  std::vector<std::uint8_t> text(prompt.begin(), prompt.end());
  auto cache = model.make_cache();
  // (Re-)encode the text into an empty cache: all of it when it fits, else its
  // last context/2 bytes (sliding the window when the cache is full).
  auto prefill = [&]() {
    cache.length = 0;
    const std::size_t keep = text.size() < std::size_t(ctx) ? text.size() : std::size_t(ctx) / 2;
    return model.forward_cached(text.data() + (text.size() - keep), int(keep), cache);
  };
  Mat<float> logits = prefill();
  for (int i = 0; i < n_bytes; ++i) {
    const auto row = logits.row(logits.rows() - 1);
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

// ---------------------------------------------------------------- plots

namespace {
bool have_gnuplot() { return std::system("command -v gnuplot >/dev/null 2>&1") == 0; }

bool run_gnuplot(const std::string& script_path) {
  const std::string cmd = "gnuplot '" + script_path + "' 2>&1";
  if (std::system(cmd.c_str()) != 0) {
    std::cerr << "continuum-lm: gnuplot failed on " << script_path << "\n";
    return false;
  }
  return true;
}
}  // namespace

bool plot_curves(const std::vector<std::string>& dirs, const std::string& png) {
  if (!have_gnuplot()) {
    std::cerr << "continuum-lm: gnuplot not found (apt-get install gnuplot-nox); no plot\n";
    return false;
  }
  // kernel → tokens → values over seeds (first validation slice's prefix curve).
  std::map<std::string, std::map<std::int64_t, std::vector<double>>> curves;
  std::string vlabel;
  for (const auto& d : dirs)
    for (const auto& e : fs::recursive_directory_iterator(d)) {
      if (!e.is_regular_file() || e.path().filename() != "result.json") continue;
      std::ifstream in(e.path());
      const auto r = nlohmann::json::parse(in);
      if (vlabel.empty() && !r["valid"].empty()) vlabel = r["valid"][0]["label"];
      for (const auto& pt : r["curve"])
        if (!pt["valid_prefix_nats_per_byte"].empty())
          curves[r["attention"]][pt["tokens"].get<std::int64_t>()].push_back(
              pt["valid_prefix_nats_per_byte"][0].get<double>());
    }
  if (curves.empty()) throw std::runtime_error("plot: no result.json with curves under the given folders");
  const fs::path out(png);
  const fs::path dir = out.parent_path().empty() ? fs::path(".") : out.parent_path();
  fs::create_directories(dir);
  std::ostringstream plot;
  plot << "set terminal pngcairo size 900,600\nset output '" << png << "'\n"
       << "set title 'Validation NLL (prefix of " << vlabel << "), mean over seeds'\n"
       << "set xlabel 'training tokens'\nset ylabel 'nats / byte'\nset grid\nset key top right\n"
       << "plot ";
  bool first = true;
  for (const auto& [k, pts] : curves) {
    const std::string dat = (dir / (out.stem().string() + "-" + k + ".dat")).string();
    std::ofstream f(dat);
    for (const auto& [tok, v] : pts) f << tok << " " << stats(v).mean << " " << stats(v).sd << "\n";
    plot << (first ? "" : ", ") << "'" << dat << "' using 1:2 with linespoints title '" << k << "'";
    first = false;
  }
  plot << "\n";
  const std::string gp = (dir / (out.stem().string() + ".gp")).string();
  write_file_atomic(gp, plot.str());
  return run_gnuplot(gp);
}

bool plot_attention(const std::string& ca_ckpt, const std::string& sm_ckpt,
                    const std::string& text, int layer, int head, const std::string& png) {
  if (!have_gnuplot()) {
    std::cerr << "continuum-lm: gnuplot not found (apt-get install gnuplot-nox); no plot\n";
    return false;
  }
  if (text.size() < 2) throw std::invalid_argument("plot-attention: --text needs at least 2 bytes");
  const fs::path out(png);
  const fs::path dir = out.parent_path().empty() ? fs::path(".") : out.parent_path();
  fs::create_directories(dir);
  struct Panel { std::string dat, title; };
  std::vector<Panel> panels;
  auto add = [&](const std::string& ckpt, bool want_cell_mass, bool want_probs) {
    Model<float> m = load_checkpoint(ckpt);
    const int L = int(std::min<std::size_t>(text.size(), std::size_t(m.config().context)));
    if (layer < 0 || layer >= m.config().n_layer || head < 0 || head >= m.config().n_head)
      throw std::invalid_argument("plot-attention: layer/head out of range for " + ckpt);
    std::vector<std::uint8_t> in(text.begin(), text.begin() + L);
    m.forward(in.data(), nullptr, 1, L, false);
    std::vector<float> P, pi;
    m.attention_maps(layer, P, pi);
    auto dump = [&](const std::vector<float>& M, const std::string& what) {
      const std::string dat = (dir / (out.stem().string() + "-" + m.config().attention + "-" + what + ".dat")).string();
      std::ofstream f(dat);
      for (int i = 0; i < L; ++i) {
        for (int j = 0; j < L; ++j) f << M[(std::size_t(head) * L + i) * L + j] << (j + 1 < L ? " " : "");
        f << "\n";
      }
      panels.push_back({dat, m.config().attention + (what == "pi" ? " cell masses pi" : " probabilities P")});
    };
    if (want_cell_mass) dump(pi, "pi");
    if (want_probs) dump(P, "P");
    return L;
  };
  int L = add(ca_ckpt, true, sm_ckpt.empty());
  if (!sm_ckpt.empty()) L = std::min(L, add(sm_ckpt, false, true));
  std::ostringstream plot;
  plot << "set terminal pngcairo size " << 600 * panels.size() << ",640\nset output '" << png << "'\n"
       << "set multiplot layout 1," << panels.size() << "\nset size ratio -1\n"
       << "set xrange [-0.5:" << L - 0.5 << "]\nset yrange [" << L - 0.5 << ":-0.5]\n"
       << "set xlabel 'key position'\nset ylabel 'query position'\nset palette rgb 33,13,10\n"
       << "set cbrange [0:*]\n";
  for (const auto& p : panels)
    plot << "set title \"" << p.title << " (layer " << layer << ", head " << head << ")\"\n"
         << "plot '" << p.dat << "' matrix with image notitle\n";
  plot << "unset multiplot\n";
  const std::string gp = (dir / (out.stem().string() + ".gp")).string();
  write_file_atomic(gp, plot.str());
  return run_gnuplot(gp);
}

}  // namespace lm
