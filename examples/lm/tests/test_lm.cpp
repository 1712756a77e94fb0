// Tests of continuum-lm (CPU inference): the metric on a hand-computed case and
// its window bookkeeping, KV-cache decoding vs the full causal forward
// (MATH.md §7.9), the checkpoint contract (config keys, corruption, hostile
// files), and the executable end to end on checkpoints written here with
// random weights (eval --json, logits .npy, generate), plus its errors.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <sys/stat.h>
#include <sys/wait.h>

#include "data.hpp"
#include "model.hpp"
#include "npy.hpp"
#include "rng.hpp"
#include "runner.hpp"
#include "safetensors.hpp"

namespace fs = std::filesystem;
using namespace lm;
using Catch::Contains;
using Catch::StartsWith;

namespace {

fs::path temp_dir(const std::string& name) {
  const fs::path d = fs::path(LM_TEST_TMP) / ("t-" + name);
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

void write(const fs::path& p, const std::string& s) {
  std::ofstream f(p, std::ios::binary);
  f << s;
}

std::string read(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
}

Config small(const std::string& kernel) {
  Config c;
  c.n_layer = 2;
  c.d_model = 16;
  c.n_head = 2;
  c.context = 24;
  c.mlp_mult = 2;
  c.attention = kernel;
  return c;
}

/// Random weights large enough that attention is far from uniform: N(0, sd)
/// for every matrix, embedding and bias, LayerNorm gains 1 + N(0, 0.1),
/// log τ = log(cfg τ) + N(0, 0.1), focal w ~ N(0, 0.02) with b = cfg τ (per-token
/// τ varying around 0.3, inside the clip).
Model<float> random_model(const Config& c, std::uint64_t seed, double sd = 0.3) {
  Model<float> m(c);
  Rng rng(seed, 7);
  for (const auto& t : m.layout().tensors) {
    float* p = m.params().data() + t.offset;
    const bool gain = t.name.find("ln_") != std::string::npos && t.name.find(".weight") != std::string::npos;
    for (std::size_t i = 0; i < t.size; ++i) {
      double v = sd * rng.normal();
      if (t.name.find("log_temperature") != std::string::npos) v = std::log(c.temperature) + 0.1 * rng.normal();
      else if (t.name.find("focal.bias") != std::string::npos) v = c.temperature;
      else if (t.name.find("focal.weight") != std::string::npos) v = 0.02 * rng.normal();
      else if (gain) v = 1 + 0.1 * rng.normal();
      p[i] = float(v);
    }
  }
  return m;
}

std::vector<std::uint8_t> random_text(std::size_t n, std::uint64_t seed) {
  Rng rng(seed, 9);
  std::vector<std::uint8_t> t(n);
  for (auto& b : t) b = std::uint8_t(32 + rng.below(90));
  return t;
}

/// Runs the continuum-lm executable; returns its exit status, stdout, stderr.
struct Run {
  int status;
  std::string out, err;
};
Run run_lm(const std::string& args, const fs::path& dir) {
  const fs::path o = dir / "stdout.txt", e = dir / "stderr.txt";
  const std::string cmd = "'" + std::string(LM_EXE) + "' " + args + " >'" + o.string() + "' 2>'" +
                          e.string() + "'";
  const int rc = std::system(cmd.c_str());
  Run r{rc, read(o), read(e)};
  if (rc != -1 && WIFEXITED(rc)) r.status = WEXITSTATUS(rc);
  UNSCOPED_INFO("$ " << cmd << "\nexit status " << r.status << ", stderr: " << r.err);
  return r;
}

}  // namespace

// ---------------------------------------------------------------------------
// The metric on a model whose predictions are known in closed form.
//
// d_model 2, every block weight zero (attention and MLP add nothing), so the
// final x = wte[byte] + wpe[pos]. wpe[0] = (+100, 0), wpe[p > 0] = (−100, 0),
// wte['a'] = (ln 3, 0), all other bytes 0. LayerNorm of (x0, 0) is
// (sign x0, −sign x0) to 1e-9; ln_f = gain (1, 0), bias 0 gives hf = (±1, 0),
// and the tied logits are z_a = ±ln 3, z_other = 0. So a window's position 0
// predicts 'a' with p = 3/258 (any other byte 1/258), every later position
// with p = (1/3)/(255 + 1/3) = 1/766 (any other byte 3/766).

TEST_CASE("metric: mean NLL over every byte after the first, windows restart at position 0",
          "[eval]") {
  Config c;
  c.n_layer = 1;
  c.d_model = 2;
  c.n_head = 1;
  c.context = 4;
  c.mlp_mult = 1;
  c.attention = GENERATE(std::string("continuum"), std::string("softmax"), std::string("focal"));
  INFO(c.attention);
  Model<float> m(c);
  for (const auto& t : m.layout().tensors)
    if (t.name.find("ln_") != std::string::npos && t.name.find(".weight") != std::string::npos)
      for (std::size_t i = 0; i < t.size; ++i) m.params()[t.offset + i] = 1;
  if (c.focal_learned()) m.tensor("h.0.attn.focal.bias")[0] = 0.3f;
  m.tensor("ln_f.weight")[1] = 0;
  m.tensor("wte")['a' * 2] = float(std::log(3.0));
  float* wpe = m.tensor("wpe");
  for (int p = 0; p < c.context; ++p) wpe[p * 2] = p == 0 ? 100.f : -100.f;

  const std::string s = "xaxxxaxxxa";  // n = 10: targets 1 … 9; 'a' at 1, 5, 9
  const std::vector<std::uint8_t> text(s.begin(), s.end());
  const double first_a = std::log(258.0 / 3);
  const double later_a = std::log(766.0), later_x = std::log(766.0 / 3);
  SECTION("non-overlapping: windows [0,4) [4,8) [8,9); 'a' at 1, 5, 9 is each at position 0") {
    const EvalResult r = evaluate(m, text, {0, 16});
    CHECK(r.bytes_scored == 9);
    CHECK(r.nats_per_byte == Approx((3 * first_a + 6 * later_x) / 9).epsilon(1e-6));
    // One window per forward pass: the same number.
    CHECK(evaluate(m, text, {0, 1}).nats_per_byte == Approx(r.nats_per_byte).epsilon(1e-7));
  }
  SECTION("stride 2: windows at 0, 2, 4, 6; only byte 1 is predicted from position 0") {
    const EvalResult r = evaluate(m, text, {2, 16});
    CHECK(r.bytes_scored == 9);
    CHECK(r.nats_per_byte == Approx((first_a + 6 * later_x + 2 * later_a) / 9).epsilon(1e-6));
  }
  SECTION("the first byte is never scored") {
    const std::string t2 = "axx";  // targets 'x' (pos 0), 'x' (pos 1)
    const EvalResult r = evaluate(m, std::vector<std::uint8_t>(t2.begin(), t2.end()));
    CHECK(r.bytes_scored == 2);
    CHECK(r.nats_per_byte == Approx((std::log(258.0) + later_x) / 2).epsilon(1e-6));
  }
  CHECK_THROWS_WITH(evaluate(m, {std::uint8_t('a')}), Contains("at least 2"));
  CHECK_THROWS_WITH(evaluate(m, text, {5, 16}), Contains("stride 5 outside"));
}

TEST_CASE("evaluation windows score every byte after the first exactly once", "[eval]") {
  for (std::uint64_t n : {2u, 3u, 17u, 100u, 193u, 1000u})
    for (int ctx : {1, 4, 16, 192})
      for (int stride : {0, 1, 3, ctx}) {
        const auto w = eval_windows(n, ctx, stride);
        std::vector<int> seen(n, 0);
        std::uint64_t next_begin = 0;
        for (const auto& x : w) {
          REQUIRE(x.len >= 1);
          REQUIRE(x.len <= ctx);
          REQUIRE(x.scored >= 1);
          REQUIRE(x.scored <= x.len);
          REQUIRE(x.begin + x.len <= n - 1);
          REQUIRE(x.begin == next_begin);  // window k starts at k·stride
          next_begin += std::uint64_t(stride >= 1 && stride <= ctx ? stride : ctx);
          for (int t = x.len - x.scored; t < x.len; ++t) seen[x.begin + t + 1]++;
        }
        CHECK(seen[0] == 0);
        for (std::uint64_t i = 1; i < n; ++i) CHECK(seen[i] == 1);
      }
  CHECK(eval_windows(1, 4, 0).empty());
}

TEST_CASE("evaluate: non-overlapping windows equal a manual per-window sum", "[eval]") {
  Config c = small("continuum");
  c.context = 8;
  Model<float> m = random_model(c, 2);
  std::vector<std::uint8_t> text(45);
  for (std::size_t i = 0; i < text.size(); ++i) text[i] = std::uint8_t("hello world, "[i % 13]);
  const auto r = evaluate(m, text, {0, 3});
  double total = 0;
  for (std::size_t b = 0; b + 1 < text.size(); b += 8) {
    const int len = int(std::min<std::size_t>(8, text.size() - 1 - b));
    m.forward(&text[b], &text[b + 1], 1, len);
    for (double x : m.nll()) total += x;
  }
  CHECK(r.bytes_scored == 44);
  CHECK(r.nats_per_byte == Approx(total / 44).epsilon(1e-6));
  // Random weights are not uniform: the number is not ln 256.
  CHECK(std::abs(r.nats_per_byte - std::log(256.0)) > 1e-2);
}

// ---------------------------------------------------------------------------

TEST_CASE("KV-cache decoding gives the full causal forward's logits (MATH.md §7.9)", "[decode]") {
  struct Variant { std::string kernel; bool learn; };
  auto v = GENERATE(Variant{"continuum", false}, Variant{"softmax", false}, Variant{"focal", false},
                    Variant{"continuum", true}, Variant{"softmax", true});
  Config c = small(v.kernel);
  c.learn_temperature = v.learn;
  INFO(v.kernel << (v.learn ? " (learned log tau)" : ""));
  Model<float> m = random_model(c, 3);
  const int L = 20;
  const auto text = random_text(L, 5);
  m.forward(text.data(), nullptr, 1, L);
  const Mat<float> full = m.logits();
  if (c.focal_learned()) {  // the per-token temperatures really vary
    const auto& tau = m.temperatures(0);
    CHECK(*std::max_element(tau.begin(), tau.end()) - *std::min_element(tau.begin(), tau.end()) > 1e-3);
  }

  auto check_rows = [&](const Mat<float>& got, int first_row) {
    REQUIRE(got.cols() == 256);
    for (int i = 0; i < got.rows(); ++i) {
      const double scale = full.row(first_row + i).cwiseAbs().maxCoeff();
      const double err = (got.row(i) - full.row(first_row + i)).cwiseAbs().maxCoeff();
      INFO("row " << first_row + i << " max abs err " << err << " scale " << scale);
      CHECK(err <= 1e-5 * scale);
    }
  };
  SECTION("token by token") {
    auto cache = m.make_cache();
    for (int i = 0; i < L; ++i) check_rows(m.forward_cached(&text[i], 1, cache), i);
    CHECK(cache.length == L);
  }
  SECTION("prefill then decode") {
    auto cache = m.make_cache();
    check_rows(m.forward_cached(text.data(), 13, cache), 0);
    for (int i = 13; i < L; ++i) check_rows(m.forward_cached(&text[i], 1, cache), i);
  }
  SECTION("a row's logits do not depend on later bytes (causal)") {
    auto other = text;
    other[15] = std::uint8_t(other[15] ^ 1);
    m.forward(other.data(), nullptr, 1, L);
    CHECK(m.logits().topRows(15) == full.topRows(15));
    CHECK(m.logits().row(15) != full.row(15));
  }
  SECTION("the cache refuses more than context tokens") {
    auto cache = m.make_cache();
    const auto longer = random_text(std::size_t(c.context) + 1, 6);
    m.forward_cached(longer.data(), c.context, cache);
    CHECK_THROWS_WITH(m.forward_cached(&longer[std::size_t(c.context)], 1, cache), Contains("capacity"));
  }
}

// ---------------------------------------------------------------------------

TEST_CASE("data: slices are disjoint halves, bad inputs give clear errors", "[data]") {
  const auto dir = temp_dir("data");
  write(dir / "t.txt", "abcdefghij");
  write(dir / "empty.txt", "");
  const auto a = load_slice((dir / "t.txt").string() + ":0:0.5");
  const auto b = load_slice((dir / "t.txt").string() + ":0.5:1");
  CHECK(std::string(a.bytes.begin(), a.bytes.end()) == "abcde");
  CHECK(std::string(b.bytes.begin(), b.bytes.end()) == "fghij");
  CHECK(a.label() == "t.txt[0,0.5)");
  CHECK(b.begin == 5);
  CHECK(b.end == 10);
  // floor(FROM·n): 0.33·10 = 3.3 → byte 3; 0.66·10 = 6.6 → byte 6.
  const auto m = load_slice((dir / "t.txt").string() + ":0.33:0.66");
  CHECK(std::string(m.bytes.begin(), m.bytes.end()) == "def");
  CHECK_THROWS_WITH(load_slice((dir / "missing.txt").string()), Contains("cannot open"));
  CHECK_THROWS_WITH(load_slice((dir / "empty.txt").string()), Contains("is empty"));
  CHECK_THROWS_WITH(load_slice((dir / "t.txt").string() + ":0.7:0.2"), Contains("bad range"));
  CHECK_THROWS_WITH(load_slice((dir / "t.txt").string() + ":0:0.05"), Contains("is empty"));
  CHECK_THROWS_WITH(load_slice(dir.string()), Contains("not a regular file (a folder)"));
  Config c = small("continuum");
  c.d_model = 30;
  c.n_head = 4;
  CHECK_THROWS_WITH(c.validate(), Contains("multiple of n_head"));
}

// ---------------------------------------------------------------------------

TEST_CASE("config: the eleven architecture keys are required and typed, other keys ignored",
          "[checkpoint]") {
  // What the PyTorch trainer writes: json.dumps(dataclasses.asdict(cfg)).
  const std::string trainer =
      R"({"preset": "cpu", "n_layer": 4, "d_model": 96, "n_head": 3, "context": 192, "mlp_mult": 4,)"
      R"( "attention": "focal", "temperature": 0.3, "learn_temperature": false, "focal_fixed": false,)"
      R"( "focal_tau_min": 0.05, "focal_tau_max": 2.0, "batch_size": 16, "steps": 2500, "lr": 0.003,)"
      R"( "min_lr_ratio": 0.1, "warmup_steps": 100, "weight_decay": 0.1, "beta1": 0.9, "beta2": 0.95,)"
      R"( "adam_eps": 1e-08, "grad_clip": 1.0, "init_std": 0.02, "eval_every": 250, "eval_bytes": 16384,)"
      R"( "eval_batch": 16, "seed": 3, "threads": 2, "autocast": "none", "some_future_key": [1, 2]})";
  const Config c = from_json(nlohmann::json::parse(trainer));
  CHECK(c.n_layer == 4);
  CHECK(c.d_model == 96);
  CHECK(c.n_head == 3);
  CHECK(c.context == 192);
  CHECK(c.mlp_mult == 4);
  CHECK(c.attention == "focal");
  CHECK(c.temperature == 0.3);
  CHECK(c.focal_learned());
  CHECK(c.focal_tau_max == 2.0);
  CHECK_NOTHROW(c.validate());
  CHECK(from_json(to_json(c)).focal_tau_min == 0.05);

  auto with = [&](const std::string& key, const nlohmann::json& value) {
    auto j = nlohmann::json::parse(trainer);
    if (value.is_discarded()) j.erase(key);
    else j[key] = value;
    return j;
  };
  const nlohmann::json gone(nlohmann::json::value_t::discarded);
  for (const char* key : {"n_layer", "d_model", "n_head", "context", "mlp_mult", "attention", "temperature",
                          "learn_temperature", "focal_fixed", "focal_tau_min", "focal_tau_max"})
    CHECK_THROWS_WITH(from_json(with(key, gone)), Contains(std::string("missing key '") + key + "'"));
  CHECK_THROWS_WITH(from_json(with("n_layer", 4.0)), Contains("'n_layer' must be an integer"));
  CHECK_THROWS_WITH(from_json(with("context", 1ull << 40)), Contains("'context' must be an integer below 2^31"));
  CHECK_THROWS_WITH(from_json(with("temperature", "0.3")), Contains("'temperature' must be a number"));
  CHECK_THROWS_WITH(from_json(with("focal_fixed", 0)), Contains("'focal_fixed' must be true or false"));
  CHECK_THROWS_WITH(from_json(with("attention", 1)), Contains("'attention' must be a string"));
  CHECK_THROWS_WITH(from_json(nlohmann::json::array()), Contains("JSON object"));
  CHECK(from_json(with("temperature", 1)).temperature == 1.0);  // an integral number is a number
  CHECK_THROWS_WITH(from_json(with("attention", "linear")).validate(), Contains("unknown kernel 'linear'"));
  CHECK_THROWS_WITH(from_json(with("temperature", -1)).validate(), Contains("temperature"));
  // The model runs in float: values float rounds to 0 or +inf are refused at
  // load, not at the first forward.
  CHECK_THROWS_WITH(from_json(with("temperature", 1e-320)).validate(), Contains("config: temperature 9.9998") && Contains("is outside float's range"));
  CHECK_THROWS_WITH(from_json(with("focal_tau_max", 1e39)).validate(), Contains("focal_tau_max 1e+39 is outside float's range"));
  CHECK_THROWS_WITH(from_json(with("focal_tau_min", 1e-50)).validate(), Contains("focal_tau_min 1e-50 is outside float's range"));
  CHECK_NOTHROW(from_json(with("temperature", 1e-40)).validate());  // a float subnormal: representable
}

TEST_CASE("checkpoints: the format tag and the config are checked, trainer keys are ignored",
          "[checkpoint]") {
  const auto dir = temp_dir("ckpt-meta");
  Model<float> m = random_model(small("softmax"), 4);
  const std::string path = (dir / "m.safetensors").string();
  save_checkpoint(path, m);
  StFile f = load_safetensors(path);
  auto cfg = nlohmann::json::parse(f.metadata.at("config"));
  cfg["lr"] = 3e-3;
  cfg["autocast"] = "bf16";
  cfg["preset"] = "cpu";
  f.metadata["config"] = cfg.dump();
  f.metadata["run"] = R"({"seed": 0})";
  save_safetensors(path, f);
  CHECK(load_checkpoint(path).params() == m.params());

  f.metadata["format"] = "gpt2";
  save_safetensors(path, f);
  CHECK_THROWS_WITH(load_checkpoint(path), Contains("m.safetensors") && Contains("format is 'gpt2'"));
  f.metadata.erase("format");
  save_safetensors(path, f);
  CHECK_THROWS_WITH(load_checkpoint(path), Contains("not a continuum-lm checkpoint"));
  f.metadata["format"] = "continuum-lm";
  cfg.erase("temperature");
  f.metadata["config"] = cfg.dump();
  save_safetensors(path, f);
  CHECK_THROWS_WITH(load_checkpoint(path), Contains("m.safetensors") && Contains("missing key 'temperature'"));
  f.metadata["config"] = "{not json";
  save_safetensors(path, f);
  CHECK_THROWS_WITH(load_checkpoint(path), Contains("bad config in __metadata__"));
  // A learned-temperature config needs its log_temperature tensors.
  cfg = nlohmann::json::parse(to_json(m.config()).dump());
  cfg["learn_temperature"] = true;
  f.metadata["config"] = cfg.dump();
  save_safetensors(path, f);
  CHECK_THROWS_WITH(load_checkpoint(path), Contains("missing tensor 'h.0.attn.log_temperature'"));
  // And a tensor the config does not describe is refused.
  cfg["learn_temperature"] = false;
  f.metadata["config"] = cfg.dump();
  f.tensors["h.0.attn.log_temperature"] = StTensor{{1}, {0.f}};
  save_safetensors(path, f);
  CHECK_THROWS_WITH(load_checkpoint(path), Contains("unexpected tensor 'h.0.attn.log_temperature'"));
  // Non-finite weights.
  f.tensors.erase("h.0.attn.log_temperature");
  f.tensors.at("ln_f.bias").data[3] = std::nanf("");
  save_safetensors(path, f);
  CHECK_THROWS_WITH(load_checkpoint(path), Contains("tensor 'ln_f.bias' has a non-finite value"));
}

TEST_CASE("checkpoints: round trip, truncated, malformed, mismatched files are rejected",
          "[checkpoint]") {
  const auto dir = temp_dir("ckpt");
  Model<float> m = random_model(small("focal"), 1);
  const std::string path = (dir / "m.safetensors").string();
  save_checkpoint(path, m);
  Model<float> back = load_checkpoint(path);
  CHECK(back.params() == m.params());
  CHECK(back.config().attention == "focal");
  const std::string good = read(path);
  std::uint64_t hn = 0;
  std::memcpy(&hn, good.data(), 8);
  const std::string header = good.substr(8, hn);

  auto expect = [&](const std::string& bytes, const std::string& why) {
    const std::string p = (dir / "bad.safetensors").string();
    write(p, bytes);
    CHECK_THROWS_WITH(load_checkpoint(p), Contains(why));
  };
  expect("", "truncated");
  expect(good.substr(0, 5), "truncated");
  expect(good.substr(0, 8 + hn / 2), "truncated");
  expect(good.substr(0, good.size() - 4), "outside");
  expect(good + "xxxx", "after the last tensor");
  {
    std::string s = good;
    s[8 + 1] = '#';  // breaks the JSON
    expect(s, "malformed JSON header");
  }
  {
    std::string s = good;
    const std::uint64_t huge = 1ull << 40;
    std::memcpy(&s[0], &huge, 8);
    expect(s, "implausible");
  }
  {
    auto j = nlohmann::json::parse(header);
    j["wpe"]["dtype"] = "F16";
    std::string h = j.dump();
    std::string s(8, '\0');
    const std::uint64_t n = h.size();
    std::memcpy(&s[0], &n, 8);
    expect(s + h + good.substr(8 + hn), "dtype");
  }
  {
    auto j = nlohmann::json::parse(header);
    j["wpe"]["shape"] = {4, 16};  // bytes no longer match the shape
    std::string h = j.dump();
    std::string s(8, '\0');
    const std::uint64_t n = h.size();
    std::memcpy(&s[0], &n, 8);
    expect(s + h + good.substr(8 + hn), "shape needs");
  }
  {
    // A valid file whose shapes disagree with its config: context changed.
    auto j = nlohmann::json::parse(header);
    auto cfg = nlohmann::json::parse(j["__metadata__"]["config"].get<std::string>());
    cfg["context"] = 64;  // was 24
    j["__metadata__"]["config"] = cfg.dump();
    std::string h = j.dump();
    std::string s(8, '\0');
    const std::uint64_t n = h.size();
    std::memcpy(&s[0], &n, 8);
    expect(s + h + good.substr(8 + hn), "the config needs");
  }
  {
    StFile f;
    f.tensors["x"] = StTensor{{2}, {1.f, 2.f}};
    save_safetensors(path, f);
    CHECK_THROWS_WITH(load_checkpoint(path), Contains("not a continuum-lm checkpoint"));
    const auto g = load_safetensors(path);
    CHECK(g.tensors.at("x").data == std::vector<float>{1.f, 2.f});
  }
  CHECK_THROWS_WITH(load_checkpoint((dir / "nope").string()), Contains("cannot open"));
  {
    // A NUL after the JSON (was: nlohmann stopped there and the rest was
    // ignored; the reference loader reports trailing characters). JSON
    // whitespace as padding stays valid (save_safetensors pads with spaces).
    for (const std::string& pad : {std::string("\0", 1), std::string("  \0", 3), std::string(" x")}) {
      std::string h = header + pad;
      std::string s(8, '\0');
      const std::uint64_t n = h.size();
      std::memcpy(&s[0], &n, 8);
      expect(s + h + good.substr(8 + hn), pad.back() == 'x' ? "malformed JSON header" : "NUL byte");
    }
    std::string h = header + " \t\r\n";
    std::string s(8, '\0');
    const std::uint64_t n = h.size();
    std::memcpy(&s[0], &n, 8);
    write(path, s + h + good.substr(8 + hn));
    CHECK(load_checkpoint(path).params() == m.params());
  }
}

TEST_CASE("checkpoints: checked before anything is allocated, and folders and devices are refused", "[checkpoint]") {
  const auto dir = temp_dir("ckpt-hostile");
  // A small file whose config asks for a model of 2^50 + parameters and that
  // holds no tensor (was: the model was allocated from the metadata first, a
  // bare std::bad_alloc; a smaller such config allocated 1.59 GB before
  // "missing tensor").
  Config c = small("continuum");
  c.d_model = 1 << 20;
  c.n_head = 1;
  c.mlp_mult = 1024;
  StFile f;
  f.metadata["format"] = "continuum-lm";
  f.metadata["config"] = to_json(c).dump();
  const std::string path = (dir / "huge.safetensors").string();
  save_safetensors(path, f);
  CHECK(fs::file_size(path) < 2000);
  CHECK_THROWS_WITH(load_checkpoint(path), Contains("huge.safetensors") && Contains("tensors"));
  // The right tensor count but one shape too large: refused from the shapes.
  c.n_layer = 1;
  f.metadata["config"] = to_json(c).dump();
  for (int i = 0; i < 16; ++i) f.tensors["t" + std::to_string(i)] = StTensor{{1}, {0.f}};
  save_safetensors(path, f);
  CHECK_THROWS_WITH(load_checkpoint(path), Contains("huge.safetensors") && Contains("missing tensor 'wte'"));
  // Folders and devices: a one-line error naming the path (was: a folder
  // read as an empty file; /dev/zero read until memory ran out).
  for (const std::string& p : {dir.string(), std::string("/dev/null"), std::string("/dev/zero")})
    CHECK_THROWS_WITH(load_checkpoint(p), Contains("'" + p + "'") && Contains("not a regular file"));

  // Atomic write: no temp file left behind.
  for (const auto& e : fs::directory_iterator(dir))
    CHECK(e.path().string().find(".tmp.") == std::string::npos);
}

// ---------------------------------------------------------------------------
// The executable end to end, on checkpoints with random weights.

TEST_CASE("continuum-lm eval: JSON per slice equals evaluate() on the loaded checkpoint", "[cli]") {
  const std::string kernel = GENERATE(std::string("continuum"), std::string("softmax"), std::string("focal"));
  INFO(kernel);
  const auto dir = temp_dir("cli-eval-" + kernel);
  Model<float> m = random_model(small(kernel), 11);
  const std::string ckpt = (dir / "model.safetensors").string();
  save_checkpoint(ckpt, m, {{"note", "random weights"}});
  const auto text = random_text(301, 12);
  write(dir / "valid.txt", std::string(text.begin(), text.end()));
  const std::string v = (dir / "valid.txt").string();

  const Run r = run_lm("eval --checkpoint " + ckpt + " --valid " + v + ":0:0.5 --valid " + v +
                           ":0.5:1 --valid " + v + " --threads 1 --json " + (dir / "eval.json").string(),
                       dir);
  REQUIRE(r.status == 0);
  const auto out = nlohmann::json::parse(r.out);
  CHECK(nlohmann::json::parse(read(dir / "eval.json")) == out);
  CHECK(out["config"]["attention"] == kernel);
  CHECK(out["parameters"] == m.num_params());
  CHECK(out["stride"] == 24);
  REQUIRE(out["valid"].size() == 3);
  set_threads(1);
  m.set_num_threads(1);
  const Model<float> back = load_checkpoint(ckpt);
  CHECK(back.params() == m.params());
  const std::vector<std::uint8_t> halves[3] = {{text.begin(), text.begin() + 150},
                                                {text.begin() + 150, text.end()}, text};
  const char* labels[3] = {"valid.txt[0,0.5)", "valid.txt[0.5,1)", "valid.txt"};
  for (int i = 0; i < 3; ++i) {
    const auto& s = out["valid"][i];
    const EvalResult want = evaluate(m, halves[i]);
    CHECK(s["label"] == labels[i]);
    CHECK(s["bytes"] == halves[i].size());
    CHECK(s["bytes_scored"] == halves[i].size() - 1);
    CHECK(s["nats_per_byte"].get<double>() == Approx(want.nats_per_byte).epsilon(1e-12));
    CHECK(s["bits_per_byte"].get<double>() == Approx(want.nats_per_byte / std::log(2.0)).epsilon(1e-12));
  }
  CHECK(out["valid"][0]["byte_end"] == 150);
  CHECK(out["valid"][1]["byte_begin"] == 150);

  // --stride and --eval-batch reach evaluate().
  const Run s = run_lm("eval --checkpoint " + ckpt + " --valid " + v + " --threads 1 --stride 5 --eval-batch 2", dir);
  REQUIRE(s.status == 0);
  const auto so = nlohmann::json::parse(s.out);
  CHECK(so["stride"] == 5);
  CHECK(so["valid"][0]["nats_per_byte"].get<double>() ==
        Approx(evaluate(m, text, {5, 2}).nats_per_byte).epsilon(1e-12));
  CHECK(so["valid"][0]["nats_per_byte"] != out["valid"][2]["nats_per_byte"]);
}

TEST_CASE("continuum-lm logits: float32 [L, 256] .npy of the first window", "[cli]") {
  const auto dir = temp_dir("cli-logits");
  Model<float> m = random_model(small("focal"), 21);
  const std::string ckpt = (dir / "model.safetensors").string();
  save_checkpoint(ckpt, m);
  const auto text = random_text(100, 22);
  write(dir / "t.txt", std::string(text.begin(), text.end()));
  set_threads(1);
  m.set_num_threads(1);
  struct Case { std::string spec; std::size_t begin, rows; };
  // 100 bytes > context 24: the first 24; bytes [90, 100): all 10.
  for (const Case& k : {Case{"t.txt", 0, 24}, Case{"t.txt:0.9:1", 90, 10}}) {
    INFO(k.spec);
    const std::string out = (dir / "logits.npy").string();
    const Run r = run_lm("logits --checkpoint " + ckpt + " --text-file " + (dir / k.spec).string() +
                             " --threads 1 --out " + out, dir);
    REQUIRE(r.status == 0);
    const attn::Array a = attn::load(out);
    CHECK(a.dtype == attn::DType::f32);
    REQUIRE(a.shape == std::vector<std::size_t>{k.rows, 256});
    m.forward(text.data() + k.begin, nullptr, 1, int(k.rows));
    const Mat<float>& z = m.logits();
    double err = 0;
    for (std::size_t i = 0; i < a.size(); ++i) err = std::max(err, std::abs(a.real[i] - double(z.data()[i])));
    CHECK(err <= 1e-6 * z.cwiseAbs().maxCoeff());
  }
}

TEST_CASE("continuum-lm generate: greedy = argmax of the full forward, sampling is seeded", "[cli]") {
  const std::string kernel = GENERATE(std::string("continuum"), std::string("focal"));
  INFO(kernel);
  const auto dir = temp_dir("cli-gen-" + kernel);
  Model<float> m = random_model(small(kernel), 31, 0.5);
  const std::string ckpt = (dir / "model.safetensors").string();
  save_checkpoint(ckpt, m);
  // Greedy decoding without a cache: the whole text through forward() per byte.
  const std::string prompt = "Once";
  std::vector<std::uint8_t> text(prompt.begin(), prompt.end());
  for (int i = 0; i < 16; ++i) {  // 4 + 16 = 20 bytes ≤ context 24: no sliding
    m.forward(text.data(), nullptr, 1, int(text.size()));
    Eigen::Index arg = 0;
    m.logits().row(m.logits().rows() - 1).maxCoeff(&arg);
    text.push_back(std::uint8_t(arg));
  }
  const std::string greedy(text.begin(), text.end());
  const std::string base = "generate --checkpoint " + ckpt + " --prompt " + prompt + " --bytes 16 ";
  const Run g = run_lm(base + "--sample-temperature 0", dir);
  REQUIRE(g.status == 0);
  CHECK(g.out == greedy + "\n");
  const Run k1 = run_lm(base + "--sample-temperature 1 --top-k 1 --seed 5", dir);
  CHECK(k1.out == greedy + "\n");
  const Run s1 = run_lm(base + "--sample-temperature 1 --seed 1", dir);
  const Run s1b = run_lm(base + "--sample-temperature 1 --seed 1", dir);
  const Run s2 = run_lm(base + "--sample-temperature 1 --seed 2", dir);
  REQUIRE(s1.status == 0);
  CHECK(s1.out == s1b.out);
  CHECK(s1.out != s2.out);
  CHECK(s1.out.size() == prompt.size() + 16 + 1);
  CHECK(s1.out.compare(0, prompt.size(), prompt) == 0);
  // Longer than the context: the cache slides (re-encodes its last half).
  const Run longer = run_lm("generate --checkpoint " + ckpt + " --prompt " + prompt + " --bytes 100 --seed 3", dir);
  REQUIRE(longer.status == 0);
  CHECK(longer.out.size() == prompt.size() + 100 + 1);
  CHECK(generate(m, prompt, 0, 0.0, 0, 0) == prompt);
  CHECK_THROWS_WITH(generate(m, "", 5, 0.0, 0, 0), Contains("prompt must not be empty"));
  CHECK_THROWS_WITH(generate(m, prompt, 5, -1.0, 0, 0), Contains("sample-temperature"));
}

TEST_CASE("continuum-lm: bad inputs give a one-line error naming the file and exit 1 (2 for a bad command line)",
          "[cli]") {
  const auto dir = temp_dir("cli-errors");
  Model<float> m = random_model(small("softmax"), 41);
  const std::string ckpt = (dir / "model.safetensors").string();
  save_checkpoint(ckpt, m);
  write(dir / "one.txt", "x");
  write(dir / "ok.txt", "hello, world");
  write(dir / "empty.txt", "");
  const std::string e = "eval --checkpoint " + ckpt + " --valid ";
  struct Case { std::string args, message; int status = 1; };
  for (const Case& k : {
           Case{e + (dir / "missing.txt").string(), "data: cannot open '" + (dir / "missing.txt").string() + "'"},
           Case{e + (dir / "empty.txt").string(), "empty.txt' is empty"},
           Case{e + (dir / "one.txt").string(), "one.txt' has fewer than 2 bytes"},
           Case{e + (dir / "ok.txt").string() + ":0.5:0.2", "bad range"},
           Case{e + (dir / "ok.txt").string() + " --stride 25", "--stride 25 outside [0, context=24]"},
           Case{e + (dir / "ok.txt").string() + " --eval-batch 0", "--eval-batch must be >= 1", 2},
           Case{e + (dir / "ok.txt").string() + " --stride -1", "--stride -1: must be >= 0", 2},
           Case{"eval --checkpoint " + (dir / "ok.txt").string() + " --valid " + (dir / "ok.txt").string(),
                "checkpoint '" + (dir / "ok.txt").string() + "'"},
           Case{"logits --checkpoint " + ckpt + " --text-file " + (dir / "empty.txt").string() + " --out " +
                    (dir / "l.npy").string(), "is empty"},
           Case{"logits --checkpoint " + ckpt + " --text-file " + (dir / "ok.txt").string() + " --out " +
                    (dir / "no-such-folder" / "l.npy").string(), "l.npy"},
           Case{"generate --checkpoint " + ckpt + " --prompt ''", "prompt must not be empty", 2},
           Case{"generate --checkpoint " + ckpt + " --bytes -1", "--bytes must be >= 0", 2},
           Case{"generate --checkpoint " + ckpt + " --top-k -1", "--top-k must be >= 0", 2},
           Case{"generate --checkpoint " + ckpt + " --sample-temperature -1", "--sample-temperature must be", 2},
       }) {
    INFO(k.args);
    const Run r = run_lm(k.args, dir);
    CHECK(r.status == k.status);
    CHECK_THAT(r.err, Contains("continuum-lm: error: ") && Contains(k.message));
    CHECK(r.out.empty());
  }
  CHECK_FALSE(fs::exists(dir / "l.npy"));
  // The training subcommands are gone (the PyTorch trainer has them), not
  // ignored: an unknown subcommand is named, with the valid ones (was: CLI11's
  // "A subcommand is required", though a word was given).
  for (const char* removed : {"train", "sweep", "compare", "plot", "plot-attention"}) {
    const Run r = run_lm(std::string(removed) + " " + (dir / "runs").string(), dir);
    CHECK(r.status == 2);
    CHECK_THAT(r.err, StartsWith("continuum-lm: error: unknown subcommand '" + std::string(removed) + "'") &&
                          Contains("expected eval, logits or generate") &&
                          Contains("experiments/tinystories/main.py " + std::string(removed)));
    CHECK(std::count(r.err.begin(), r.err.end(), '\n') == 1);
  }
  for (const char* word : {"bogus", "Eval", "evaluate"}) {
    const Run r = run_lm(word, dir);
    CHECK(r.status == 2);
    CHECK_THAT(r.err, StartsWith("continuum-lm: error: unknown subcommand '" + std::string(word) + "'") &&
                          Contains("expected eval, logits or generate") && !Contains("main.py"));
  }
}

TEST_CASE("continuum-lm: a bad command line is one line 'continuum-lm: error: ...', exit 2", "[cli]") {
  const auto dir = temp_dir("cli-usage");
  Model<float> m = random_model(small("softmax"), 43);
  const std::string ckpt = (dir / "model.safetensors").string();
  save_checkpoint(ckpt, m);
  write(dir / "ok.txt", "hello, world");
  const std::string ok = (dir / "ok.txt").string();
  struct Case { std::string args, message; };
  for (const Case& k : {
           Case{"", "a subcommand is required: eval, logits or generate"},
           Case{"--bogus", "unknown option '--bogus'"},
           Case{"eval", "--checkpoint is required"},
           Case{"eval --checkpoint " + ckpt + " --valid " + ok + " --bogus", "--bogus"},
           Case{"eval --checkpoint " + ckpt + " --valid " + ok + " --threads abc", "--threads"},
           // The tool's own check, not the library's "num_threads: must be >= 0".
           Case{"eval --checkpoint " + ckpt + " --valid " + ok + " --threads -2", "--threads -2: must be >= 0"},
           Case{"logits --checkpoint " + ckpt + " --text-file " + ok + " --out " + (dir / "l.npy").string() +
                    " --threads -2", "--threads -2: must be >= 0"},
           Case{"generate --checkpoint " + ckpt + " --threads -2", "--threads -2: must be >= 0"},
       }) {
    INFO(k.args);
    const Run r = run_lm(k.args, dir);
    CHECK(r.status == 2);
    CHECK_THAT(r.err, StartsWith("continuum-lm: error: ") && Contains(k.message) && !Contains("continuum::"));
    CHECK(std::count(r.err.begin(), r.err.end(), '\n') == 1);
    CHECK(r.out.empty());
  }
  CHECK_FALSE(fs::exists(dir / "l.npy"));
  const Run h = run_lm("--help", dir);
  CHECK(h.status == 0);
  CHECK_THAT(h.out, Contains("Exit status"));
}

TEST_CASE("continuum-lm eval: the default slices are the experiment's selection and test slices of valid.txt", "[cli]") {
  const auto dir = temp_dir("cli-default-valid");
  const Run h = run_lm("eval --help", dir);
  REQUIRE(h.status == 0);
  CHECK_THAT(h.out, Contains("valid.txt:0:0.2") && Contains("valid.txt:0.2:0.6") && Contains("valid.txt:0.6:1") &&
                        !Contains("0:0.5") && !Contains("0.5:1"));
  Model<float> m = random_model(small("softmax"), 47);
  const std::string ckpt = (dir / "model.safetensors").string();
  save_checkpoint(ckpt, m);
  const Run r = run_lm("eval --checkpoint " + ckpt + " --threads 1 --eval-batch 64", dir);
  if (r.status == 1 && r.err.find("is absent") != std::string::npos) {
    WARN("../shared/data/tinystories/valid.txt is absent: the default slices are not run");
    return;
  }
  REQUIRE(r.status == 0);
  const auto j = nlohmann::json::parse(r.out);
  REQUIRE(j["valid"].size() == 3);
  const char* labels[3] = {"valid.txt[0,0.2)", "valid.txt[0.2,0.6)", "valid.txt[0.6,1)"};
  for (int i = 0; i < 3; ++i) CHECK(j["valid"][i]["label"] == labels[i]);
  CHECK(j["valid"][0]["byte_begin"] == 0);
  CHECK(j["valid"][0]["byte_end"] == j["valid"][1]["byte_begin"]);
  CHECK(j["valid"][1]["byte_end"] == j["valid"][2]["byte_begin"]);
}

TEST_CASE("continuum-lm: outputs never replace a FIFO or a symbolic link, and are checked before the work",
          "[cli]") {
  const auto dir = temp_dir("cli-outputs");
  Model<float> m = random_model(small("softmax"), 51);
  const std::string ckpt = (dir / "model.safetensors").string();
  save_checkpoint(ckpt, m);
  write(dir / "ok.txt", "hello, world");
  const std::string fifo = (dir / "fifo").string();
  REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
  const std::string logits = "logits --checkpoint " + ckpt + " --text-file " + (dir / "ok.txt").string() + " --out ";
  const std::string eval = "eval --checkpoint " + ckpt + " --valid " + (dir / "ok.txt").string() + " --json ";
  for (const std::string& args : {logits + fifo, eval + fifo}) {
    const Run r = run_lm(args, dir);  // (was: the FIFO renamed over with a regular file, status 0)
    CHECK(r.status == 1);
    CHECK_THAT(r.err, Contains("not a regular file"));
    CHECK(fs::is_fifo(fifo));
  }
  // A symbolic link: the file it names is written, the link stays.
  write(dir / "target.json", "old");
  fs::create_symlink(dir / "target.json", dir / "link.json");
  REQUIRE(run_lm(eval + (dir / "link.json").string(), dir).status == 0);
  CHECK(fs::is_symlink(dir / "link.json"));
  CHECK_THAT(read(dir / "target.json"), Contains("nats_per_byte"));
  // A folder that does not exist: refused before the evaluation, naming the path given.
  const std::string missing = (dir / "no-such-folder" / "e.json").string();
  const Run r = run_lm(eval + missing, dir);
  CHECK(r.status == 1);
  CHECK_THAT(r.err, Contains(missing + ": cannot create a temporary file"));
  CHECK(r.out.empty());  // no result printed: nothing was evaluated
  // No temporary is left behind.
  for (const auto& e : fs::directory_iterator(dir)) CHECK(e.path().filename().string().rfind(".", 0) != 0);
}

TEST_CASE("continuum-lm: non-finite logits are an error, never a silent NaN", "[cli]") {
  const auto dir = temp_dir("cli-nonfinite");
  Model<float> m = random_model(small("continuum"), 61);
  for (const auto& t : m.layout().tensors)  // finite weights whose products overflow float
    if (t.name == "wte")
      for (std::size_t i = 0; i < t.size; ++i) m.params()[t.offset + i] = 3e37f;
  const std::string ckpt = (dir / "model.safetensors").string();
  save_checkpoint(ckpt, m);
  write(dir / "ok.txt", "hello, world");
  const std::string text = (dir / "ok.txt").string();
  for (const std::string& args : {"eval --checkpoint " + ckpt + " --valid " + text,
                                  "logits --checkpoint " + ckpt + " --text-file " + text + " --out " +
                                      (dir / "l.npy").string(),
                                  "generate --checkpoint " + ckpt + " --bytes 3"}) {
    const Run r = run_lm(args, dir);  // (was: null nats/byte, NaN logits, NUL bytes; status 0)
    CHECK(r.status == 1);
    CHECK_THAT(r.err, Contains("not finite"));
  }
  CHECK_FALSE(fs::exists(dir / "l.npy"));
}

TEST_CASE("continuum-lm generate: a context-1 model, paths that are not UTF-8, seeds beyond 64 bits", "[cli]") {
  const auto dir = temp_dir("cli-edges");
  Config c = small("continuum");
  c.context = 1;  // each step sees one byte: the cache re-encodes the last byte
  Model<float> m = random_model(c, 71, 0.5);
  const std::string ckpt = (dir / "model.safetensors").string();
  save_checkpoint(ckpt, m);
  const Run g = run_lm("generate --checkpoint " + ckpt + " --prompt Once --bytes 6 --sample-temperature 0", dir);
  REQUIRE(g.status == 0);  // (was: "0 tokens exceed the cache capacity 1")
  std::string want = "Once";
  for (int i = 0; i < 6; ++i) {  // greedy, from the last byte alone
    const std::uint8_t last = std::uint8_t(want.back());
    m.forward(&last, nullptr, 1, 1);
    Eigen::Index arg = 0;
    m.logits().row(0).maxCoeff(&arg);
    want.push_back(char(arg));
  }
  CHECK(g.out == want + "\n");
  // A text path with a byte that is not UTF-8: the JSON shows U+FFFD (was: a
  // JSON error after the whole evaluation).
  const std::string odd = (dir / "t\xff.txt").string();
  write(odd, "hello, world");
  const Run e = run_lm("eval --checkpoint " + ckpt + " --valid '" + odd + "'", dir);
  CHECK(e.status == 0);
  CHECK_THAT(e.out, Contains("t\xef\xbf\xbd.txt"));
  for (const char* bad : {"-1", "18446744073709551616"}) {
    const Run r = run_lm("generate --checkpoint " + ckpt + " --seed " + bad, dir);
    CHECK(r.status != 0);  // (was: taken as 2^64 - 1)
    CHECK_THAT(r.err, Contains("--seed"));
  }
}
