// continuum-lm — CPU inference for the byte-level language model of the
// paper's experiment (MATH.md §9), trained by the PyTorch trainer
// (experiments/tinystories): evaluate a checkpoint in nats/byte, write one
// window's logits as .npy, generate text with the KV cache.
// Subcommands: eval, logits, generate. See examples/lm/README.md.
// Exit status: 0 success; 2 a bad command line (CLI11's parse errors, an
// unknown or missing subcommand, an option value out of its range: checked
// before any file is read); 1 any other error (files, checkpoints, text).
#include <cmath>
#include <filesystem>
#include <iostream>

#include <CLI/CLI.hpp>

#include "cli_checks.hpp"  // examples/attn
#include "npy.hpp"  // examples/attn: the .npy writer of continuum-attn
#include "runner.hpp"
#include "safetensors.hpp"

namespace fs = std::filesystem;
using namespace lm;

namespace {

#ifndef LM_DEFAULT_DATA_DIR
#define LM_DEFAULT_DATA_DIR ""
#endif

/// The experiment's slices of ../shared/data/tinystories/valid.txt, when that
/// file exists: the selection slice [0, 0.2) and the two test slices [0.2, 0.6)
/// and [0.6, 1) (experiments/tinystories/main.py, DEFAULT_SELECT and
/// DEFAULT_TESTS), in that order.
std::vector<std::string> default_valid() {
  const std::string p = std::string(LM_DEFAULT_DATA_DIR) + "/valid.txt";
  if (std::string(LM_DEFAULT_DATA_DIR).empty() || !fs::exists(p)) return {};
  return {p + ":0:0.2", p + ":0.2:0.6", p + ":0.6:1"};
}

/// A bad command line: exit status 2 (any other error: 1).
struct UsageError : std::invalid_argument {
  using std::invalid_argument::invalid_argument;
};

constexpr const char* kSubcommands[] = {"eval", "logits", "generate"};
/// The PyTorch trainer's subcommands that continuum-lm does not have.
constexpr const char* kTrainerOnly[] = {"train", "sweep", "compare", "plot", "plot-attention"};

/// `word`, the first argument, when it is not a subcommand (nor --help): the
/// error naming it and the valid ones (CLI11 would only say that a subcommand
/// is required).
void check_subcommand(const std::string& word) {
  if (word == "-h" || word == "--help") return;
  if (!word.empty() && word[0] == '-')
    throw UsageError("unknown option '" + word + "' before the subcommand: expected eval, logits or generate");
  for (const char* s : kSubcommands)
    if (word == s) return;
  std::string msg = "unknown subcommand '" + word + "': expected eval, logits or generate";
  for (const char* t : kTrainerOnly)
    if (word == t) msg += "; '" + word + "' is the PyTorch trainer's: experiments/tinystories/main.py " + word;
  throw UsageError(msg);
}

void check_threads(int n) {
  if (n < 0) throw UsageError("--threads " + std::to_string(n) + ": must be >= 0 (0 = the runtime's default)");
}

/// Fails now, before the work, where `path` cannot be written later (no such
/// folder, a folder or a device in its place): a temporary is created there
/// and removed again.
void check_writable(const std::string& path) {
  attn::AtomicWriter probe;
  probe.add(path, "");
}

/// JSON text; bytes of a path that are not UTF-8 become U+FFFD instead of
/// failing the dump after the whole evaluation.
std::string json_text(const nlohmann::json& j) {
  return j.dump(2, ' ', false, nlohmann::json::error_handler_t::replace);
}

nlohmann::json describe(const std::string& path, const Model<float>& m) {
  return {{"checkpoint", path}, {"config", to_json(m.config())}, {"parameters", m.num_params()}};
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"continuum-lm: CPU inference for the byte-level LM (continuum, softmax or focal "
               "attention) of a PyTorch-trained checkpoint (MATH.md §9)"};
  app.require_subcommand(1);
  app.footer("Exit status: 0 success, 2 a bad command line (unknown subcommand or option, bad or out-of-range\n"
             "value), 1 any other error (files, checkpoints, text).");

  // eval
  auto* eval = app.add_subcommand("eval", "mean NLL in nats/byte of a checkpoint on text slices");
  std::string eval_ckpt, eval_json;
  std::vector<std::string> eval_valid = default_valid();
  EvalOptions eo;
  int eval_threads = 0;
  eval->add_option("--checkpoint", eval_ckpt, "model.safetensors")->required();
  eval->add_option("--valid", eval_valid,
                   "text slices, repeatable (PATH or PATH:FROM:TO); default: the experiment's selection slice "
                   "valid.txt:0:0.2 and test slices valid.txt:0.2:0.6, valid.txt:0.6:1 of " LM_DEFAULT_DATA_DIR
                   " when it exists")
      ->capture_default_str();
  eval->add_option("--stride", eo.stride,
                   "window stride in bytes (0 = context: non-overlapping windows)")
      ->capture_default_str();
  eval->add_option("--eval-batch", eo.eval_batch, "windows per forward pass")->capture_default_str();
  eval->add_option("--threads", eval_threads, "OpenMP threads (0 = the runtime's default)")
      ->capture_default_str();
  eval->add_option("--json", eval_json, "also write the results to this file");

  // logits
  auto* lg = app.add_subcommand("logits", "float32 logits [L, 256] of the first window of a text, as .npy");
  std::string lg_ckpt, lg_text, lg_out;
  int lg_threads = 0;
  lg->add_option("--checkpoint", lg_ckpt, "model.safetensors")->required();
  lg->add_option("--text-file", lg_text,
                 "text (PATH or PATH:FROM:TO); its first L = min(context, size) bytes are the window")
      ->required();
  lg->add_option("--out", lg_out, ".npy file to write")->required();
  lg->add_option("--threads", lg_threads, "OpenMP threads (0 = the runtime's default)")->capture_default_str();

  // generate
  auto* gen = app.add_subcommand("generate", "sample text from a checkpoint (KV cache)");
  std::string gen_ckpt, prompt = "Once upon a time";
  int gen_bytes = 300, top_k = 0, gen_threads = 1;
  double sample_t = 0.8;
  std::uint64_t gen_seed = 0;
  gen->add_option("--checkpoint", gen_ckpt, "model.safetensors")->required();
  gen->add_option("--prompt", prompt, "prompt text (not empty)")->capture_default_str();
  gen->add_option("--bytes", gen_bytes, "bytes to generate")->capture_default_str();
  gen->add_option("--sample-temperature", sample_t, "sampling temperature (0 = greedy)")->capture_default_str();
  gen->add_option("--top-k", top_k, "sample among the k most likely bytes (0 = all)")->capture_default_str();
  gen->add_option("--seed", gen_seed, "sampling seed")
      ->capture_default_str()
      ->check(attn::in_range_of_64_bits<std::uint64_t>());
  gen->add_option("--threads", gen_threads, "OpenMP threads (0 = the runtime's default)")->capture_default_str();

  try {
    if (argc > 1) check_subcommand(argv[1]);
    app.parse(argc, argv);
    // Option values out of their range: usage errors, before any file is read.
    if (*eval) {
      check_threads(eval_threads);
      if (eo.stride < 0) throw UsageError("eval: --stride " + std::to_string(eo.stride) + ": must be >= 0");
      if (eo.eval_batch < 1) throw UsageError("eval: --eval-batch must be >= 1");
    } else if (*lg) {
      check_threads(lg_threads);
    } else if (*gen) {
      check_threads(gen_threads);
      if (prompt.empty()) throw UsageError("generate: the prompt must not be empty");
      if (!(std::isfinite(sample_t) && sample_t >= 0))
        throw UsageError("generate: --sample-temperature must be finite and >= 0");
      if (gen_bytes < 0) throw UsageError("generate: --bytes must be >= 0");
      if (top_k < 0) throw UsageError("generate: --top-k must be >= 0");
    }
  } catch (const CLI::Success& e) {  // --help
    return app.exit(e);
  } catch (const CLI::ParseError& e) {  // one line, status 2, like the tool's own usage errors
    std::string what = e.what();
    if (what == "A subcommand is required") what = "a subcommand is required: eval, logits or generate";
    std::cerr << "continuum-lm: error: " << what << " (see --help)\n";
    return 2;
  } catch (const UsageError& e) {
    std::cerr << "continuum-lm: error: " << e.what() << " (see --help)\n";
    return 2;
  }

  try {
    if (*eval) {
      if (eval_valid.empty())
        throw std::runtime_error("eval: no --valid given and ../shared/data/tinystories/valid.txt is absent");
      if (!eval_json.empty()) check_writable(eval_json);
      Model<float> model = load_checkpoint(eval_ckpt);
      if (eo.stride > model.config().context)
        throw std::invalid_argument("eval: --stride " + std::to_string(eo.stride) + " outside [0, context=" +
                                    std::to_string(model.config().context) + "]");
      set_threads(eval_threads);
      model.set_num_threads(eval_threads);
      nlohmann::json out = describe(eval_ckpt, model);
      out["stride"] = eo.stride > 0 ? eo.stride : model.config().context;
      out["valid"] = nlohmann::json::array();
      for (const auto& spec : eval_valid) {
        const TextSlice s = load_slice(spec);
        if (s.bytes.size() < 2)
          throw std::runtime_error("data: slice '" + spec + "' has fewer than 2 bytes (nothing to score)");
        const EvalResult r = evaluate(model, s.bytes, eo);
        if (!std::isfinite(r.nats_per_byte))
          throw std::runtime_error("eval: the mean NLL on '" + spec + "' is not finite: the model's logits overflow "
                                   "float (checkpoint '" + eval_ckpt + "')");
        out["valid"].push_back({{"spec", spec}, {"path", s.path}, {"label", s.label()},
                                {"from", s.from}, {"to", s.to},
                                {"byte_begin", s.begin}, {"byte_end", s.end},
                                {"bytes", s.bytes.size()}, {"bytes_scored", r.bytes_scored},
                                {"nats_per_byte", r.nats_per_byte},
                                {"bits_per_byte", r.nats_per_byte / std::log(2.0)}});
      }
      std::cout << json_text(out) << "\n";
      if (!eval_json.empty()) write_file_atomic(eval_json, json_text(out) + "\n");
    } else if (*lg) {
      check_writable(lg_out);
      Model<float> model = load_checkpoint(lg_ckpt);
      set_threads(lg_threads);
      model.set_num_threads(lg_threads);
      const TextSlice s = load_slice(lg_text);
      const Mat<float> z = window_logits(model, s.bytes);
      if (!z.allFinite())
        throw std::runtime_error("logits: not finite: the model's logits overflow float (checkpoint '" + lg_ckpt +
                                 "'); nothing written");
      const std::vector<float> data(z.data(), z.data() + z.size());
      attn::AtomicWriter w;
      w.add(lg_out, attn::encode(data, {std::size_t(z.rows()), std::size_t(z.cols())}));
      w.commit();
      std::cerr << "continuum-lm: logits [" << z.rows() << ", " << z.cols() << "] of bytes ["
                << s.begin << ", " << s.begin + std::uint64_t(z.rows()) << ") of '" << s.path
                << "' -> " << lg_out << "\n";
    } else if (*gen) {
      Model<float> model = load_checkpoint(gen_ckpt);
      set_threads(gen_threads);
      model.set_num_threads(gen_threads);
      std::cout << generate(model, prompt, gen_bytes, sample_t, top_k, gen_seed) << "\n";
    }
  } catch (const std::exception& e) {
    std::cerr << "continuum-lm: error: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
