// Tests of continuum-lm: whole-model gradient check against central finite
// differences (double), KV-cache decoding vs the full causal forward (MATH.md §7.9),
// smoke training beats the byte-unigram entropy, determinism, evaluation
// windows, checkpoint validation, the comparison statistics, bad inputs.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "data.hpp"
#include "model.hpp"
#include "optim.hpp"
#include "runner.hpp"
#include "safetensors.hpp"

namespace fs = std::filesystem;
using namespace lm;
using Catch::Matchers::Contains;

namespace {

fs::path temp_dir(const std::string& name) {
  const fs::path d = fs::temp_directory_path() / ("continuum-lm-test-" + name);
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

/// Real English text for the training tests: the TinyStories slice when
/// ../shared is present, else this test's own source (always there).
std::string english_text_path() {
  const std::string ts = std::string(LM_TEST_DATA_DIR) + "/train.txt";
  if (fs::exists(ts)) return ts;
  return __FILE__;
}

Config tiny(const std::string& kernel) {
  Config c = preset("smoke");
  c.n_layer = 2;
  c.d_model = 8;
  c.n_head = 2;
  c.context = 6;
  c.mlp_mult = 2;
  c.attention = kernel;
  c.init_std = 0.3;  // large enough that attention is far from uniform
  c.threads = 1;
  return c;
}

}  // namespace

// ---------------------------------------------------------------------------
// Whole-model gradient check: every parameter, central differences in double.
// With h = 1e-5 the truncation error is O(h²·f''') ≈ 1e-10 and the rounding
// error ≈ ε·|loss|/h ≈ 1e-10, so 1e-6 relative (floored at 1e-2 of the largest
// gradient, below which relative error is meaningless) has ample margin while
// any wrong term (O(1) relative) fails.

TEST_CASE("gradient check: whole model, every parameter, central differences", "[grad]") {
  struct Variant { std::string kernel; bool learn; };
  auto v = GENERATE(Variant{"continuum", false}, Variant{"softmax", false},
                    Variant{"continuum", true}, Variant{"softmax", true},
                    Variant{"focal", false});
  Config c = tiny(v.kernel);
  c.learn_temperature = v.learn;
  INFO("kernel " << v.kernel << (v.learn ? " (learned tau)" : ""));
  set_threads(1);  // tiny matrices: OpenMP teams would only add overhead
  Model<double> m(c);
  m.init(7);
  Rng rng(11);
  for (auto& p : m.params()) p += 0.05 * rng.normal();  // non-trivial biases, gains, τ
  for (const auto& t : m.layout().tensors)  // focal: τ_i varies but stays inside the clip
    if (t.name.find("focal.weight") != std::string::npos)
      for (std::size_t i = 0; i < t.size; ++i) m.params()[t.offset + i] = 0.02 * rng.normal();
  const int B = 2, L = 5;
  std::vector<std::uint8_t> in(B * L), tg(B * L);
  for (int i = 0; i < B * L; ++i) {
    in[i] = std::uint8_t(97 + rng.below(6));
    tg[i] = std::uint8_t(97 + rng.below(6));
  }
  const double loss = m.forward(in.data(), tg.data(), B, L, true);
  REQUIRE(std::isfinite(loss));
  if (c.focal_learned())
    for (int l = 0; l < c.n_layer; ++l)
      for (double t : m.temperatures(l)) {
        REQUIRE(t > c.focal_tau_min + 1e-3);  // the clip is inactive: FD is valid
        REQUIRE(t < c.focal_tau_max - 1e-3);
      }
  m.backward();
  const std::vector<double> g = m.grads();
  double gmax = 0;
  for (double x : g) gmax = std::max(gmax, std::abs(x));
  REQUIRE(gmax > 0);
  const double h = 1e-5;
  double worst = 0;
  std::string worst_name;
  for (const auto& t : m.layout().tensors)
    for (std::size_t i = 0; i < t.size; ++i) {
      double& p = m.params()[t.offset + i];
      const double p0 = p;
      p = p0 + h;
      const double lp = m.forward(in.data(), tg.data(), B, L, false);
      p = p0 - h;
      const double lm_ = m.forward(in.data(), tg.data(), B, L, false);
      p = p0;
      const double fd = (lp - lm_) / (2 * h);
      const double an = g[t.offset + i];
      const double rel = std::abs(fd - an) / std::max(std::abs(an), 1e-2 * gmax);
      if (rel > worst) {
        worst = rel;
        worst_name = t.name + "[" + std::to_string(i) + "] fd=" + std::to_string(fd) +
                     " analytic=" + std::to_string(an);
      }
    }
  INFO("worst: " << worst_name << ", " << m.num_params() << " parameters");
  CHECK(worst <= 1e-6);
}

// ---------------------------------------------------------------------------

TEST_CASE("KV-cache decoding gives the full causal forward's logits (MATH.md §7.9)", "[decode]") {
  auto kernel = GENERATE(std::string("continuum"), std::string("softmax"), std::string("focal"));
  INFO(kernel);
  Config c = preset("smoke");
  c.attention = kernel;
  c.context = 24;
  c.init_std = 0.2;
  c.threads = 1;
  Model<float> m(c);
  m.init(3);
  Rng rng(5);
  if (kernel == "focal")  // non-constant per-token temperatures
    for (const auto& t : m.layout().tensors)
      if (t.name.find("focal.weight") != std::string::npos)
        for (std::size_t i = 0; i < t.size; ++i) m.params()[t.offset + i] = float(0.02 * rng.normal());
  const int L = 20;
  std::vector<std::uint8_t> text(L);
  for (auto& b : text) b = std::uint8_t(32 + rng.below(90));
  m.forward(text.data(), nullptr, 1, L, false);
  const Mat<float> full = m.logits();

  auto check_rows = [&](const Mat<float>& got, int first_row) {
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
  }
  SECTION("prefill then decode") {
    auto cache = m.make_cache();
    check_rows(m.forward_cached(text.data(), 13, cache), 0);
    for (int i = 13; i < L; ++i) check_rows(m.forward_cached(&text[i], 1, cache), i);
  }
}

// ---------------------------------------------------------------------------

TEST_CASE("smoke preset: validation loss drops below the byte-unigram entropy", "[train]") {
  const auto dir = temp_dir("smoke");
  const std::string path = english_text_path();
  TrainSpec s;
  s.cfg = preset("smoke");
  s.cfg.threads = 1;
  // Disjoint slices, small enough for seconds: train on the first 40 %, validate
  // on 2 % at the end (≈ 40 kB of TinyStories).
  s.train = path + ":0:0.4";
  s.valid = {path + ":0.98:1"};
  s.out_dir = dir.string();
  s.progress = false;
  const TextSlice valid = load_slice(s.valid[0]);
  const double h1 = unigram_entropy(valid.bytes);
  const auto r = train_run(s);
  const double nll = r["valid"][0]["nats_per_byte"].get<double>();
  INFO("unigram entropy " << h1 << " nats/byte, smoke model " << nll << " on " << path);
  CHECK(nll < h1);
  // result.json and the checkpoint exist and round-trip.
  REQUIRE(fs::exists(dir / "result.json"));
  const auto saved = nlohmann::json::parse(read(dir / "result.json"));
  CHECK(saved["valid"][0]["nats_per_byte"].get<double>() == nll);
  CHECK(saved["tokens_seen"].get<std::int64_t>() == s.cfg.tokens_budget());
  CHECK(saved["config"]["preset"] == "smoke");
  Model<float> back = load_checkpoint((dir / "model.safetensors").string());
  const auto again = evaluate(back, valid.bytes);
  CHECK(std::abs(again.nats_per_byte - nll) <= 1e-6 * nll);
}

TEST_CASE("determinism: same seed, same losses bit for bit, same batches for every kernel",
          "[train]") {
  const std::string path = english_text_path();
  const TextSlice text = load_slice(path + ":0:0.2");
  auto losses = [&](const std::string& kernel, std::uint64_t seed) {
    Config c = preset("smoke");
    c.attention = kernel;
    c.seed = seed;
    c.threads = 2;
    set_threads(2);
    Model<float> m(c);
    m.init(seed);
    AdamW<float> opt(m.layout(), c);
    BatchSampler bs(text.bytes, c.context, c.batch_size, seed);
    std::vector<std::uint8_t> in(std::size_t(c.batch_size) * c.context), tg(in.size());
    std::vector<double> out;
    for (int step = 0; step < 8; ++step) {
      bs.next(in.data(), tg.data());
      out.push_back(m.forward(in.data(), tg.data(), c.batch_size, c.context, true));
      m.backward();
      clip_grad_norm(m.grads(), c.grad_clip);
      opt.step(m.params(), m.grads(), learning_rate(c, step));
    }
    return out;
  };
  const auto a = losses("continuum", 4), b = losses("continuum", 4), c = losses("continuum", 5);
  CHECK(a == b);
  CHECK(a != c);
  // Same seed: same initial weights and batches, so the first loss (before any
  // update) is nearly the same for every kernel at init; the streams match.
  Config cc = preset("smoke");
  std::vector<std::uint8_t> i1(std::size_t(cc.batch_size) * cc.context), t1(i1.size()), i2(i1), t2(i1);
  BatchSampler s1(text.bytes, cc.context, cc.batch_size, 9), s2(text.bytes, cc.context, cc.batch_size, 9);
  for (int k = 0; k < 5; ++k) {
    s1.next(i1.data(), t1.data());
    s2.next(i2.data(), t2.data());
    CHECK(i1 == i2);
  }
  Config ca = preset("smoke"), cs = ca;
  cs.attention = "softmax";
  Model<float> ma(ca), ms(cs);
  ma.init(1);
  ms.init(1);
  CHECK(ma.params() == ms.params());
}

// ---------------------------------------------------------------------------

TEST_CASE("evaluation windows score every byte after the first exactly once", "[eval]") {
  for (std::uint64_t n : {2u, 3u, 17u, 100u, 193u, 1000u})
    for (int ctx : {4, 16, 192})
      for (int stride : {0, 1, 3, ctx}) {
        const auto w = eval_windows(n, ctx, stride);
        std::vector<int> seen(n, 0);
        for (const auto& x : w) {
          REQUIRE(x.len >= 1);
          REQUIRE(x.len <= ctx);
          REQUIRE(x.scored >= 1);
          REQUIRE(x.scored <= x.len);
          REQUIRE(x.begin + x.len <= n - 1);
          for (int t = x.len - x.scored; t < x.len; ++t) seen[x.begin + t + 1]++;
        }
        CHECK(seen[0] == 0);
        for (std::uint64_t i = 1; i < n; ++i) CHECK(seen[i] == 1);
      }
}

TEST_CASE("evaluate: non-overlapping windows equal a manual per-window sum", "[eval]") {
  Config c = preset("smoke");
  c.context = 8;
  c.eval_batch = 3;
  Model<float> m(c);
  m.init(2);
  std::vector<std::uint8_t> text(45);
  for (std::size_t i = 0; i < text.size(); ++i) text[i] = std::uint8_t("hello world, "[i % 13]);
  const auto r = evaluate(m, text);
  double total = 0;
  for (std::size_t b = 0; b + 1 < text.size(); b += 8) {
    const int len = int(std::min<std::size_t>(8, text.size() - 1 - b));
    m.forward(&text[b], &text[b + 1], 1, len, false);
    for (double x : m.nll()) total += x;
  }
  CHECK(r.bytes_scored == 44);
  CHECK(std::abs(r.nats_per_byte - total / 44) <= 1e-6);
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
  CHECK_THROWS_WITH(load_slice((dir / "missing.txt").string()), Contains("cannot open"));
  CHECK_THROWS_WITH(load_slice((dir / "empty.txt").string()), Contains("is empty"));
  CHECK_THROWS_WITH(load_slice((dir / "t.txt").string() + ":0.7:0.2"), Contains("bad range"));
  CHECK_THROWS_WITH(BatchSampler(a.bytes, 32, 2, 0), Contains("fewer than context + 1"));
  CHECK_THROWS_WITH(preset("huge"), Contains("unknown preset"));
  Config c = preset("smoke");
  c.d_model = 30;
  c.n_head = 4;
  CHECK_THROWS_WITH(c.validate(), Contains("multiple of n_head"));
}

// ---------------------------------------------------------------------------

TEST_CASE("checkpoints: round trip, truncated, malformed, mismatched files are rejected",
          "[checkpoint]") {
  const auto dir = temp_dir("ckpt");
  Config c = preset("smoke");
  c.attention = "focal";
  Model<float> m(c);
  m.init(1);
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
    j["wpe"]["shape"] = {4, 32};  // bytes no longer match the shape
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
    cfg["context"] = 64;
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
    CHECK_THROWS_WITH(load_checkpoint(path), Contains("no config"));
    const auto g = load_safetensors(path);
    CHECK(g.tensors.at("x").data == std::vector<float>{1.f, 2.f});
  }
  CHECK_THROWS_WITH(load_checkpoint((dir / "nope").string()), Contains("cannot open"));
  {
    // A NUL after the JSON (was: nlohmann stopped there and the rest was
    // ignored; the reference loader reports trailing characters). JSON
    // whitespace as padding stays valid (save_safetensors pads with spaces).
    for (const std::string pad : {std::string("\0", 1), std::string("  \0", 3), std::string(" x")}) {
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
  Config c = preset("smoke");
  c.d_model = 1 << 20;
  c.n_head = 1;
  c.mlp_mult = 1024;
  StFile f;
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
  for (const std::string p : {dir.string(), std::string("/dev/null"), std::string("/dev/zero")})
    CHECK_THROWS_WITH(load_checkpoint(p), Contains("'" + p + "'") && Contains("not a regular file"));

  // Atomic write: no temp file left behind.
  for (const auto& e : fs::directory_iterator(dir))
    CHECK(e.path().string().find(".tmp.") == std::string::npos);
}

// ---------------------------------------------------------------------------

TEST_CASE("compare: paired differences, Student-t CI and seeds won", "[compare]") {
  const auto dir = temp_dir("compare");
  // continuum − softmax per seed: −0.02, −0.01, −0.03, +0.01, −0.02.
  const double ca[] = {1.00, 1.10, 0.90, 1.05, 0.95};
  const double sm[] = {1.02, 1.11, 0.93, 1.04, 0.97};
  for (int s = 0; s < 5; ++s)
    for (int k = 0; k < 2; ++k) {
      Config c = preset("cpu");
      c.attention = k ? "softmax" : "continuum";
      c.seed = std::uint64_t(s);
      nlohmann::json r = {{"config", to_json(c)},
                          {"valid", {{{"label", "v[0,0.5)"}, {"nats_per_byte", k ? sm[s] : ca[s]}}}}};
      const auto d = dir / (c.attention + std::to_string(s));
      fs::create_directories(d);
      write(d / "result.json", r.dump());
    }
  const auto cmp = compare_runs({dir.string()});
  REQUIRE(cmp["settings"].size() == 1);
  const auto& p = cmp["settings"][0]["valid"][0]["paired"][0];
  CHECK(p["vs"] == "softmax");
  CHECK(p["n"] == 5);
  CHECK(p["seeds_won"] == 4);
  const double mean = -0.014, sd = std::sqrt((0.006 * 0.006 + 0.004 * 0.004 + 0.016 * 0.016 +
                                              0.024 * 0.024 + 0.006 * 0.006) / 4);
  CHECK(std::abs(p["mean_diff"].get<double>() - mean) < 1e-12);
  CHECK(std::abs(p["sd"].get<double>() - sd) < 1e-12);
  const double hw = 2.776 * sd / std::sqrt(5.0);
  CHECK(std::abs(p["ci95"][0].get<double>() - (mean - hw)) < 1e-12);
  CHECK(std::abs(p["ci95"][1].get<double>() - (mean + hw)) < 1e-12);
  CHECK(t_quantile_975(1) == 12.706);
  CHECK(t_quantile_975(4) == 2.776);
  const std::string table = format_table(cmp);
  CHECK_THAT(table, Contains("continuum - softmax"));
  CHECK_THAT(table, Contains("4/5"));
  CHECK_THAT(format_csv(cmp), Contains("continuum-softmax,5,"));
}

TEST_CASE("learning-rate schedule: warm-up then cosine to min_lr", "[optim]") {
  Config c = preset("smoke");
  c.lr = 1e-3;
  c.warmup_steps = 10;
  c.steps = 110;
  c.min_lr_ratio = 0.1;
  CHECK(learning_rate(c, 0) == Approx(1e-4));
  CHECK(learning_rate(c, 9) == Approx(1e-3));
  CHECK(learning_rate(c, 60) == Approx(0.55e-3));
  CHECK(learning_rate(c, 110) == Approx(1e-4));
}
