// continuum-lm — the paper's byte-level language-modelling experiment (MATH.md §9):
// continuum vs softmax vs focal attention in one decoder-only Transformer.
// Subcommands: train, eval, compare, sweep, generate, plot, plot-attention.
// See examples/lm/README.md.
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <sstream>
#include <type_traits>

#include <CLI/CLI.hpp>

#include "runner.hpp"
#include "safetensors.hpp"

namespace fs = std::filesystem;
using namespace lm;

namespace {

#ifndef LM_DEFAULT_DATA_DIR
#define LM_DEFAULT_DATA_DIR ""
#endif

std::string default_train() {
  const std::string p = std::string(LM_DEFAULT_DATA_DIR) + "/train.txt";
  return std::string(LM_DEFAULT_DATA_DIR).empty() || !fs::exists(p) ? "" : p;
}
std::vector<std::string> default_valid() {
  const std::string p = std::string(LM_DEFAULT_DATA_DIR) + "/valid.txt";
  if (std::string(LM_DEFAULT_DATA_DIR).empty() || !fs::exists(p)) return {};
  return {p + ":0:0.5", p + ":0.5:1"};
}

/// Every Config field as a CLI option (--d-model, --learn-temperature, …);
/// after parsing, apply() overrides a preset with the fields that were given.
struct ConfigOptions {
  Config values;
  std::vector<std::pair<CLI::Option*, std::function<void(Config&)>>> fields;
  CLI::Option* preset_opt = nullptr;

  template <class T>
  void add(CLI::App* app, const char* name, T Config::*member, const char* help) {
    std::string flag = std::string("--") + name;
    for (auto& ch : flag)
      if (ch == '_') ch = '-';
    CLI::Option* opt;
    if constexpr (std::is_same_v<T, bool>) opt = app->add_flag(flag, values.*member, help);
    else opt = app->add_option(flag, values.*member, help);
    if (std::string(name) == "preset") preset_opt = opt;
    else fields.emplace_back(opt, [this, member](Config& c) { c.*member = values.*member; });
  }
  void attach(CLI::App* app) {
#define LM_ADD(type, name, def, help) add<type>(app, #name, &Config::name, help);
    LM_CONFIG_FIELDS(LM_ADD)
#undef LM_ADD
  }
  Config apply() const {
    Config c = preset(preset_opt && preset_opt->count() ? values.preset : std::string("cpu"));
    for (const auto& [opt, set] : fields)
      if (opt->count()) set(c);
    c.validate();
    return c;
  }
};

std::string fmt_tau(double t) {
  std::ostringstream o;
  o << t;
  return o.str();
}

void write_compare(const std::vector<std::string>& dirs, const std::string& json_out,
                   const std::string& csv_out, const std::string& txt_out) {
  const auto cmp = compare_runs(dirs);
  const std::string table = format_table(cmp);
  std::cout << table << std::flush;
  if (!json_out.empty()) write_file_atomic(json_out, cmp.dump(2) + "\n");
  if (!csv_out.empty()) write_file_atomic(csv_out, format_csv(cmp));
  if (!txt_out.empty()) write_file_atomic(txt_out, table);
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"continuum-lm: byte-level LM with continuum, softmax or focal attention (MATH.md §9)"};
  app.require_subcommand(1);

  // train
  auto* train = app.add_subcommand("train", "train one run; writes result.json in --out");
  ConfigOptions train_cfg;
  train_cfg.attach(train);
  TrainSpec ts;
  ts.train = default_train();
  std::vector<std::string> valid = default_valid();
  bool no_ckpt = false, quiet = false;
  train->add_option("--train", ts.train, "training text (PATH or PATH:FROM:TO)")->capture_default_str();
  train->add_option("--valid", valid, "validation slices, repeatable (PATH or PATH:FROM:TO)")->capture_default_str();
  train->add_option("--out", ts.out_dir, "output folder")->required();
  train->add_flag("--no-checkpoint", no_ckpt, "do not write model.safetensors");
  train->add_flag("--quiet", quiet, "no progress output");

  // eval
  auto* eval = app.add_subcommand("eval", "evaluate a checkpoint on validation slices");
  std::string eval_ckpt, eval_json;
  std::vector<std::string> eval_valid = default_valid();
  int eval_stride = -1, eval_threads = -1, eval_batch = -1;
  eval->add_option("--checkpoint", eval_ckpt, "model.safetensors")->required();
  eval->add_option("--valid", eval_valid, "validation slices (PATH or PATH:FROM:TO)")->capture_default_str();
  eval->add_option("--stride", eval_stride, "window stride (0 = non-overlapping)");
  eval->add_option("--eval-batch", eval_batch, "windows per forward");
  eval->add_option("--threads", eval_threads, "threads");
  eval->add_option("--json", eval_json, "also write the results here");

  // compare
  auto* compare = app.add_subcommand("compare", "paper-style table from finished runs");
  std::vector<std::string> cmp_dirs;
  std::string cmp_json, cmp_csv;
  compare->add_option("runs", cmp_dirs, "folders searched recursively for result.json")->required();
  compare->add_option("--json", cmp_json, "write the table as JSON");
  compare->add_option("--csv", cmp_csv, "write the table as CSV");

  // sweep
  auto* sweep = app.add_subcommand("sweep", "grid of runs (kernels x seeds x contexts x temperatures), resumable");
  ConfigOptions sweep_cfg;
  sweep_cfg.attach(sweep);
  std::vector<std::string> kernels{"continuum", "softmax", "focal"};
  std::vector<std::uint64_t> seeds{0, 1, 2, 3, 4};
  std::vector<int> contexts;
  std::vector<double> temps;
  std::string sweep_out, sweep_train = default_train();
  std::vector<std::string> sweep_valid = default_valid();
  bool sweep_no_ckpt = false;
  sweep->add_option("--kernels", kernels, "attention kernels")->delimiter(',')->capture_default_str();
  sweep->add_option("--seeds", seeds, "seeds")->delimiter(',')->capture_default_str();
  sweep->add_option("--contexts", contexts, "context lengths (default: the preset's)")->delimiter(',');
  sweep->add_option("--temperatures", temps, "temperatures (default: the preset's)")->delimiter(',');
  sweep->add_option("--train", sweep_train, "training text")->capture_default_str();
  sweep->add_option("--valid", sweep_valid, "validation slices, repeatable")->capture_default_str();
  sweep->add_option("--out", sweep_out, "output folder (one sub-folder per run)")->required();
  sweep->add_flag("--no-checkpoint", sweep_no_ckpt, "do not write checkpoints");

  // generate
  auto* gen = app.add_subcommand("generate", "sample text from a checkpoint (KV cache)");
  std::string gen_ckpt, prompt = "Once upon a time";
  int gen_bytes = 300, top_k = 0, gen_threads = 1;
  double sample_t = 0.8;
  std::uint64_t gen_seed = 0;
  gen->add_option("--checkpoint", gen_ckpt, "model.safetensors")->required();
  gen->add_option("--prompt", prompt, "prompt text")->capture_default_str();
  gen->add_option("--bytes", gen_bytes, "bytes to generate")->capture_default_str();
  gen->add_option("--sample-temperature", sample_t, "sampling temperature (0 = greedy)")->capture_default_str();
  gen->add_option("--top-k", top_k, "sample among the k most likely bytes (0 = all)");
  gen->add_option("--seed", gen_seed, "sampling seed");
  gen->add_option("--threads", gen_threads, "threads")->capture_default_str();

  // plots
  auto* plot = app.add_subcommand("plot", "PNG of validation curves per kernel (gnuplot)");
  std::vector<std::string> plot_dirs;
  std::string plot_out = "curves.png";
  plot->add_option("runs", plot_dirs, "folders with result.json")->required();
  plot->add_option("--out", plot_out, "PNG path")->capture_default_str();
  auto* patt = app.add_subcommand("plot-attention",
                                  "PNG: continuum cell masses pi next to softmax probabilities of one head");
  std::string pa_ca, pa_sm, pa_text =
      "Once upon a time, there was a little girl named Lily. She loved to play outside.", pa_out = "attention.png";
  int pa_layer = 0, pa_head = 0;
  patt->add_option("--checkpoint", pa_ca, "continuum checkpoint")->required();
  patt->add_option("--softmax-checkpoint", pa_sm, "softmax checkpoint (optional)");
  patt->add_option("--text", pa_text, "one sentence")->capture_default_str();
  patt->add_option("--layer", pa_layer, "layer")->capture_default_str();
  patt->add_option("--head", pa_head, "head")->capture_default_str();
  patt->add_option("--out", pa_out, "PNG path")->capture_default_str();

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }

  try {
    if (*train) {
      ts.cfg = train_cfg.apply();
      ts.valid = valid;
      ts.save_checkpoint = !no_ckpt;
      ts.progress = !quiet;
      if (ts.train.empty())
        throw std::runtime_error("train: no --train given and ../shared/data/tinystories is absent");
      std::cerr << "config: " << to_json(ts.cfg).dump() << "\n";
      const auto r = train_run(ts);
      std::cout << r["valid"].dump(2) << "\n";
    } else if (*eval) {
      Model<float> m = load_checkpoint(eval_ckpt);
      Config c = m.config();
      if (eval_stride >= 0) c.stride = eval_stride;
      if (eval_batch > 0) c.eval_batch = eval_batch;
      if (eval_threads >= 0) c.threads = eval_threads;
      c.validate();
      Model<float> model(c);
      model.params() = m.params();
      set_threads(c.threads);
      nlohmann::json out = nlohmann::json::array();
      for (const auto& spec : eval_valid) {
        const TextSlice s = load_slice(spec);
        const EvalResult r = evaluate(model, s.bytes);
        out.push_back({{"spec", spec}, {"label", s.label()}, {"bytes", s.bytes.size()},
                       {"bytes_scored", r.bytes_scored}, {"nats_per_byte", r.nats_per_byte},
                       {"bits_per_byte", r.nats_per_byte / std::log(2.0)}});
      }
      std::cout << out.dump(2) << "\n";
      if (!eval_json.empty()) write_file_atomic(eval_json, out.dump(2) + "\n");
    } else if (*compare) {
      write_compare(cmp_dirs, cmp_json, cmp_csv, "");
    } else if (*sweep) {
      const Config base = sweep_cfg.apply();
      if (sweep_train.empty())
        throw std::runtime_error("sweep: no --train given and ../shared/data/tinystories is absent");
      if (contexts.empty()) contexts = {base.context};
      if (temps.empty()) temps = {base.temperature};
      for (const auto& k : kernels) {
        Config c = base;
        c.attention = k;
        c.validate();
      }
      std::cerr << "config: " << to_json(base).dump() << "\n";
      fs::create_directories(sweep_out);
      const std::size_t total = kernels.size() * seeds.size() * contexts.size() * temps.size();
      std::size_t done = 0;
      for (auto seed : seeds)
        for (int ctx : contexts)
          for (double tau : temps)
            for (const auto& k : kernels) {
              ++done;
              Config c = base;
              c.attention = k;
              c.seed = seed;
              c.context = ctx;
              c.temperature = tau;
              c.validate();
              const std::string dir = sweep_out + "/" + k + "_ctx" + std::to_string(ctx) + "_tau" +
                                      fmt_tau(tau) + "_seed" + std::to_string(seed);
              if (fs::exists(dir + "/result.json")) {
                std::cerr << "[" << done << "/" << total << "] skip " << dir << " (result.json exists)\n";
                continue;
              }
              std::cerr << "[" << done << "/" << total << "] " << dir << "\n";
              TrainSpec s;
              s.cfg = c;
              s.train = sweep_train;
              s.valid = sweep_valid;
              s.out_dir = dir;
              s.save_checkpoint = !sweep_no_ckpt;
              train_run(s);
            }
      write_compare({sweep_out}, sweep_out + "/compare.json", sweep_out + "/compare.csv",
                    sweep_out + "/compare.txt");
      plot_curves({sweep_out}, sweep_out + "/curves.png");
    } else if (*gen) {
      Model<float> m = load_checkpoint(gen_ckpt);
      set_threads(gen_threads);
      std::cout << generate(m, prompt, gen_bytes, sample_t, top_k, gen_seed) << "\n";
    } else if (*plot) {
      return plot_curves(plot_dirs, plot_out) ? 0 : 1;
    } else if (*patt) {
      return plot_attention(pa_ca, pa_sm, pa_text, pa_layer, pa_head, pa_out) ? 0 : 1;
    }
  } catch (const std::exception& e) {
    std::cerr << "continuum-lm: error: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
