// continuum-attn — run the continuum / softmax / focal attention operator on
// NumPy .npy files (README.md, "Command line").
//
//   continuum-attn --q q.npy --k k.npy --v v.npy [--do do.npy] [options] --out DIR
//
// Inputs: float16, float32 or float64 files, 2-D [seq, dim] or 4-D [batch, heads, seq, dim]
// (q [B, Hq, Lq, D], k [B, Hk, Lk, D], v [B, Hk, Lk, Dv], do [B, Hq, Lq, Dv];
// Hq a multiple of Hk). Writes o.npy [.., Lq, Dv] and lse.npy [.., Lq]
// (natural log of the normaliser Z, MATH.md §4–5; -inf for an empty row) and,
// with --do, dq.npy, dk.npy, dv.npy (the shapes of q, k, v) and dtemp.npy
// (the shape of the temperature: () for a scalar, [Hq], or [B, Hq, Lq]).
// The inputs are converted to the storage dtype (the inputs' own unless
// --dtype float32 | float64 | bfloat16 | float16; the 16-bit types through
// float32); --compute picks the arithmetic (the library's Compute): by default
// the storage type's own (float32, bfloat16 and float16 storage compute in
// float, float64 in double),
// --compute float64 double arithmetic for any storage type (each output
// rounded once to the storage type), --compute float32 float arithmetic (with
// float64 storage it is a usage error). The same tiled kernels run in every
// case, --probs (P and the cell masses π) included. Outputs are written in the
// storage dtype (float32 for bfloat16 storage: .npy has no bfloat16; the
// values are the bfloat16 outputs, exactly) unless --out-dtype says otherwise;
// lse and dtemp, float in the library for every storage type but float64,
// are never written below float32. Any error: one line on stderr naming the
// file and the problem, exit status 1 (2 for a bad command line), and no
// output file written (all outputs go to temporary names and are renamed into
// place only when every one is written). After a successful run, the files of
// the fixed output names (o, lse, dq, dk, dv, dtemp, p, pi .npy) that this run
// did not write are removed from the folder, so that it holds exactly this
// run's outputs (an earlier run's dq.npy is not read as this one's).
#include <continuum/continuum.hpp>

#include <CLI/CLI.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <limits>
#include <new>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "cli_checks.hpp"
#include "npy.hpp"

namespace {

using attn::Array;
using attn::DType;
using attn::NpyError;
using continuum::index_t;

/// A problem with the command line or the combination of inputs.
struct UsageError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

struct Options {
  std::string q, k, v, dout, out;
  std::string kernel = "continuum";
  std::string temperature = "1";
  double scale = 0;
  bool scale_given = false;
  bool causal = false;
  index_t window = 0;                          // --window W: (W - 1, 0); 0 = none
  index_t window_left = -1, window_right = -1;  // negative = unlimited
  std::vector<std::string> ranges;
  std::string dtype, out_dtype, compute;
  int threads = 0;
  int print_rows = 0;
  bool probs = false;
};

/// [batch, heads, seq, dim] of a 2-D or 4-D array.
struct Dims {
  index_t b = 1, h = 1, s = 0, d = 0;
};

Dims dims_of(const Array& a, const char* role) {
  if (!a.is_real())
    throw NpyError(a.path, std::string("dtype ") + attn::dtype_name(a.dtype) +
                               ", expected float16, float32 or float64 (" + role + ")");
  if (a.shape.size() == 2) return {1, 1, index_t(a.shape[0]), index_t(a.shape[1])};
  if (a.shape.size() == 4)
    return {index_t(a.shape[0]), index_t(a.shape[1]), index_t(a.shape[2]), index_t(a.shape[3])};
  throw NpyError(a.path, "shape " + a.shape_str() + ": expected 2-D [seq, dim] or 4-D "
                         "[batch, heads, seq, dim] (" + role + ")");
}

std::string dstr(const Dims& d, bool four) {
  return four ? "(" + std::to_string(d.b) + ", " + std::to_string(d.h) + ", " +
                    std::to_string(d.s) + ", " + std::to_string(d.d) + ")"
              : "(" + std::to_string(d.s) + ", " + std::to_string(d.d) + ")";
}

std::optional<double> parse_number(const std::string& s) {
  try {
    std::size_t used = 0;
    const double x = std::stod(s, &used);
    if (used == s.size()) return x;
  } catch (const std::exception&) {
  }
  return std::nullopt;
}

/// The dtype named `s`, one of `allowed` (listed in the error otherwise).
DType parse_dtype(const std::string& s, const char* option, std::initializer_list<DType> allowed) {
  std::string names;
  std::size_t i = 0;
  for (DType t : allowed) {
    if (s == attn::dtype_name(t)) return t;
    names += std::string(i == 0 ? "" : i + 1 == allowed.size() ? " or " : ", ") + attn::dtype_name(t);
    ++i;
  }
  throw UsageError(std::string(option) + " must be " + names + ", not '" + s + "'");
}

/// The most elements an output the tool allocates may have (o, lse).
constexpr double max_output_elements = double(std::int64_t(1) << 31);

/// Everything validated and ready to compute.
struct Problem {
  Array q, k, v, dout;
  bool has_do = false, four_d = true;
  Dims dq, dk, dv;
  continuum::Kernel kernel = continuum::Kernel::continuum;
  continuum::TemperatureShape tshape = continuum::TemperatureShape::scalar;
  std::vector<double> tau;                 // 1, Hq, or B*Hq*Lq values
  std::vector<std::size_t> tau_out_shape;  // the shape dtemp.npy gets
  std::optional<double> scale;
  bool causal = false;
  index_t window_left = -1, window_right = -1;  // MATH.md §3; negative = unlimited
  bool has_ranges = false;
  std::vector<index_t> lo, hi;
  DType storage = DType::f64, out = DType::f64;
  DType compute = DType::f64;    // the arithmetic: float or double (Compute)
  int threads = 0;
  bool probs = false;
};

Problem validate(const Options& o) {
  Problem p;
  if (o.kernel == "continuum") p.kernel = continuum::Kernel::continuum;
  else if (o.kernel == "softmax") p.kernel = continuum::Kernel::softmax;
  else if (o.kernel == "focal") p.kernel = continuum::Kernel::focal;
  else throw UsageError("--kernel must be continuum, softmax or focal, not '" + o.kernel + "'");

  p.q = attn::load(o.q);
  p.k = attn::load(o.k);
  p.v = attn::load(o.v);
  p.dq = dims_of(p.q, "query");
  p.dk = dims_of(p.k, "key");
  p.dv = dims_of(p.v, "value");
  p.four_d = p.q.shape.size() == 4;
  const bool four = p.four_d;
  for (const Array* a : {&p.k, &p.v})
    if (a->shape.size() != p.q.shape.size())
      throw NpyError(a->path, "shape " + a->shape_str() + " is " + std::to_string(a->shape.size()) +
                                  "-D but " + p.q.path + " is " + std::to_string(p.q.shape.size()) + "-D");
  if (p.dk.b != p.dq.b)
    throw NpyError(p.k.path, "batch " + std::to_string(p.dk.b) + " does not match " + p.q.path +
                                 "'s batch " + std::to_string(p.dq.b));
  if (p.dk.d != p.dq.d)
    throw NpyError(p.k.path, "head_dim " + std::to_string(p.dk.d) + " does not match " + p.q.path +
                                 "'s head_dim " + std::to_string(p.dq.d));
  if (p.dk.h == 0 || p.dq.h % p.dk.h != 0)
    throw NpyError(p.k.path, std::to_string(p.dk.h) + " key heads: " + p.q.path + "'s " +
                                 std::to_string(p.dq.h) + " query heads must be a multiple (GQA)");
  if (p.dv.b != p.dk.b || p.dv.h != p.dk.h || p.dv.s != p.dk.s)
    throw NpyError(p.v.path, "shape " + p.v.shape_str() + " does not match " + p.k.path + "'s " +
                                 p.k.shape_str() + " in batch, heads or seq_len");

  DType in_dtype = p.q.dtype;
  for (const Array* a : {&p.k, &p.v})
    if (a->dtype != in_dtype && o.dtype.empty())
      throw NpyError(a->path, std::string("dtype ") + attn::dtype_name(a->dtype) + " differs from " +
                                  p.q.path + "'s " + attn::dtype_name(in_dtype) +
                                  " (pass --dtype to convert)");

  if (!o.dout.empty()) {
    p.has_do = true;
    p.dout = attn::load(o.dout);
    const Dims dd = dims_of(p.dout, "output gradient");
    const Dims want{p.dq.b, p.dq.h, p.dq.s, p.dv.d};
    if (p.dout.shape.size() != p.q.shape.size() || dd.b != want.b || dd.h != want.h ||
        dd.s != want.s || dd.d != want.d)
      throw NpyError(p.dout.path, "shape " + p.dout.shape_str() + ", expected " + dstr(want, four) +
                                      " (the output's shape)");
    if (p.dout.dtype != in_dtype && o.dtype.empty())
      throw NpyError(p.dout.path, std::string("dtype ") + attn::dtype_name(p.dout.dtype) +
                                      " differs from " + p.q.path + "'s " +
                                      attn::dtype_name(in_dtype) + " (pass --dtype to convert)");
  }
  p.storage = o.dtype.empty() ? in_dtype
                              : parse_dtype(o.dtype, "--dtype", {DType::f32, DType::f64, DType::bf16, DType::f16});
  // The 16-bit types compute in float; bfloat16 writes float32 files.
  const bool f64 = p.storage == DType::f64;
  p.out = !o.out_dtype.empty() ? parse_dtype(o.out_dtype, "--out-dtype", {DType::f32, DType::f64, DType::f16})
          : p.storage == DType::bf16 ? DType::f32
                                     : p.storage;
  p.compute = !o.compute.empty() ? parse_dtype(o.compute, "--compute", {DType::f32, DType::f64})
              : f64              ? DType::f64
                                 : DType::f32;
  if (p.compute == DType::f32 && p.storage == DType::f64)
    throw UsageError(std::string("--compute float32 needs float32 storage, but the storage type is float64 (") +
                     (o.dtype.empty() ? "the inputs' dtype; pass --dtype float32 to convert them"
                                      : "--dtype float64; use --dtype float32") +
                     ", or leave --compute out: float64 storage computes in float64)");

  // Temperature: a number, or a .npy with one value, one per query head [Hq],
  // or one per query [B, Hq, Lq] ([Lq] for 2-D inputs).
  if (auto num = parse_number(o.temperature)) {
    p.tau = {*num};
    if (!(std::isfinite(*num) && *num > 0))
      throw UsageError("--temperature must be finite and > 0, got " + o.temperature);
  } else {
    if (!std::filesystem::exists(o.temperature))
      throw UsageError("--temperature '" + o.temperature + "' is neither a number nor an existing .npy file");
    const Array t = attn::load(o.temperature);
    if (!t.is_real()) throw NpyError(t.path, "temperature must be float16, float32 or float64");
    const std::size_t n = t.size();
    const std::size_t per_query = std::size_t(p.dq.b * p.dq.h * p.dq.s);
    p.tau_out_shape = t.shape;
    if (t.shape.empty() || (t.shape.size() == 1 && n == 1 && !four)) {
      p.tshape = continuum::TemperatureShape::scalar;
    } else if (four && t.shape.size() == 1 && index_t(n) == p.dq.h) {
      p.tshape = continuum::TemperatureShape::per_head;
    } else if ((four && t.shape.size() == 3 && index_t(t.shape[0]) == p.dq.b &&
                index_t(t.shape[1]) == p.dq.h && index_t(t.shape[2]) == p.dq.s) ||
               (!four && t.shape.size() == 1 && n == per_query)) {
      p.tshape = continuum::TemperatureShape::per_query;
    } else {
      throw NpyError(t.path, "temperature shape " + t.shape_str() + ", expected () " +
                                 (four ? "or [heads] = (" + std::to_string(p.dq.h) +
                                             ",) or [batch, heads, seq] = (" +
                                             std::to_string(p.dq.b) + ", " + std::to_string(p.dq.h) +
                                             ", " + std::to_string(p.dq.s) + ")"
                                       : "or (1,) or [seq] = (" + std::to_string(p.dq.s) + ",)"));
    }
    p.tau = t.real;
    for (std::size_t i = 0; i < p.tau.size(); ++i)
      if (!(std::isfinite(p.tau[i]) && p.tau[i] > 0))
        throw NpyError(t.path, "temperature must be finite and > 0; element " + std::to_string(i) +
                                   " is " + std::to_string(p.tau[i]));
  }
  // The temperature is float32 unless the storage is float64 (accum_t): a
  // value that float32 rounds to 0 or inf is an error naming where it came
  // from, not the library's "got 0" about a value the caller never passed.
  if (p.storage != DType::f64)
    for (std::size_t i = 0; i < p.tau.size(); ++i) {
      const float f = static_cast<float>(p.tau[i]);
      if (std::isfinite(f) && f > 0) continue;
      char value[32], why[160];
      std::snprintf(value, sizeof value, "%.9g", p.tau[i]);
      std::snprintf(why, sizeof why, " is outside float32's range (%.3g to %.3g), and the temperature is float32 "
                    "for %s storage; use --dtype float64", double(std::numeric_limits<float>::denorm_min()),
                    double(std::numeric_limits<float>::max()), attn::dtype_name(p.storage));
      if (parse_number(o.temperature)) throw UsageError("--temperature " + o.temperature + why);
      throw NpyError(o.temperature, "temperature element " + std::to_string(i) + ": " + value + why);
    }

  if (o.scale_given) {
    if (!(std::isfinite(o.scale) && o.scale > 0))
      throw UsageError("--scale must be finite and > 0");
    p.scale = o.scale;
  }
  p.causal = o.causal;
  if (o.window < 0) throw UsageError("--window must be ≥ 0 (0 = no window)");
  p.window_left = o.window_left;
  p.window_right = o.window_right;
  if (o.window > 0) {  // the causal sliding window of W keys counting the diagonal
    p.window_left = o.window - 1;
    p.window_right = 0;
  }
  if (o.threads < 0) throw UsageError("--threads must be ≥ 0 (0 = OpenMP's default), got " + std::to_string(o.threads));
  p.threads = o.threads;
  if (o.print_rows < 0) throw UsageError("--print must be ≥ 0 (0 = print nothing), got " + std::to_string(o.print_rows));
  p.probs = o.probs;

  if (!o.ranges.empty()) {
    p.has_ranges = true;
    const Array lo = attn::load(o.ranges[0]), hi = attn::load(o.ranges[1]);
    for (const Array* a : {&lo, &hi}) {
      if (a->is_real()) throw NpyError(a->path, "ranges must be int32 or int64");
      const bool ok = a->shape.size() == 2 ? index_t(a->shape[0]) == p.dq.b &&
                                                 index_t(a->shape[1]) == p.dq.s
                                           : (!four && a->shape.size() == 1 &&
                                              index_t(a->shape[0]) == p.dq.s);
      if (!ok)
        throw NpyError(a->path, "shape " + a->shape_str() + ", expected [batch, seq_q] = (" +
                                    std::to_string(p.dq.b) + ", " + std::to_string(p.dq.s) + ")");
    }
    p.lo.assign(lo.integer.begin(), lo.integer.end());
    p.hi.assign(hi.integer.begin(), hi.integer.end());
    for (std::size_t i = 0; i < p.lo.size(); ++i)
      if (!(0 <= p.lo[i] && p.lo[i] <= p.hi[i] && p.hi[i] <= p.dk.s))
        throw NpyError(p.hi[i] > p.dk.s || p.hi[i] < 0 ? o.ranges[1] : o.ranges[0],
                       "range " + std::to_string(i) + " is [" + std::to_string(p.lo[i]) +
                                        ", " + std::to_string(p.hi[i]) + "); need 0 <= lo <= hi <= " +
                                        std::to_string(p.dk.s) + " (seq_len of " + p.k.path + ")");
  }
  if (p.probs && double(p.dq.b) * p.dq.h * p.dq.s * p.dk.s > double(1 << 26))
    throw UsageError("--probs: the [B, Hq, Lq, Lk] maps would exceed 2^26 elements");
  // The outputs o [B, Hq, Lq, Dv] and lse [B, Hq, Lq] are sized by the inputs'
  // shapes, not by their data (q or v may be empty, e.g. shape (10^12, 0)):
  // bounded before anything is allocated.
  const double rows = double(p.dq.b) * double(p.dq.h) * double(p.dq.s);
  if (rows > max_output_elements || rows * double(p.dv.d) > max_output_elements)
    throw NpyError(p.q.path, "shape " + p.q.shape_str() + " with " + p.v.path + "'s " + p.v.shape_str() +
                                 " asks for outputs of " + attn::detail::num_text(rows * double(std::max<index_t>(p.dv.d, 1))) +
                                 " elements (o: [B, Hq, Lq, Dv], lse: [B, Hq, Lq]); at most 2^31 are allowed");
  return p;
}

template <class T>
std::vector<T> convert(const std::vector<double>& x) {
  std::vector<T> r;
  r.reserve(x.size());
  for (double v : x) r.push_back(T(v));  // bfloat16: through float32 (Eigen)
  return r;
}

/// An input's values in the storage type T, rounded once; a finite value that
/// T cannot hold (it would round to ±inf: float16 beyond ±65504, float32 and
/// bfloat16 beyond ~3.4e38) is an error naming the file, not a silent inf.
template <class T>
std::vector<T> convert_input(const Array& a, DType storage) {
  std::vector<T> r = convert<T>(a.real);
  for (std::size_t i = 0; i < r.size(); ++i)
    if (std::isfinite(a.real[i]) && !std::isfinite(static_cast<double>(r[i]))) {
      char msg[160];
      std::snprintf(msg, sizeof msg, "element %zu (%.9g) is beyond the largest finite %s (%.9g); use a wider --dtype",
                    i, a.real[i], attn::dtype_name(storage),
                    static_cast<double>(std::numeric_limits<T>::max()));
      throw NpyError(a.path, msg);
    }
  return r;
}

template <class T>
std::string encode_as(const std::vector<T>& x, const std::vector<std::size_t>& shape, DType out) {
  if (out == DType::f16) return attn::encode_float16(x, shape);
  if (out == DType::f32) return attn::encode(std::vector<float>(x.begin(), x.end()), shape);
  return attn::encode(std::vector<double>(x.begin(), x.end()), shape);
}

std::vector<std::size_t> shape_of(const Dims& d, bool four) {
  if (four) return {std::size_t(d.b), std::size_t(d.h), std::size_t(d.s), std::size_t(d.d)};
  return {std::size_t(d.s), std::size_t(d.d)};
}

/// Every output file name the tool writes, with any options.
constexpr const char* kOutputNames[] = {"o.npy",  "lse.npy",   "dq.npy", "dk.npy",
                                        "dv.npy", "dtemp.npy", "p.npy",  "pi.npy"};

/// After a successful run: removes from `out_dir` those of the tool's output
/// names that this run did not write (an earlier run's dq.npy beside this
/// run's o.npy would be read as this run's), so that the folder holds exactly
/// this run's outputs. Only those names, and only a regular file or a
/// symbolic link (the link, not the file it names); anything else in the
/// folder is left alone.
void remove_stale_outputs(const std::string& out_dir, const std::vector<std::pair<std::string, std::string>>& written) {
  namespace fs = std::filesystem;
  for (const char* name : kOutputNames) {
    if (std::any_of(written.begin(), written.end(), [&](const auto& f) { return f.first == name; })) continue;
    const fs::path path = fs::path(out_dir) / name;
    std::error_code ec;
    const fs::file_status st = fs::symlink_status(path, ec);
    if (!fs::is_regular_file(st) && !fs::is_symlink(st)) continue;
    fs::remove(path, ec);
    if (ec)
      throw attn::NpyError(path.string(), "this run's outputs are written, but this output of an earlier run "
                                          "cannot be removed: " + ec.message());
  }
}

template <class T>
void print_rows(const char* name, const std::vector<T>& x, index_t rows, index_t cols,
                index_t limit) {
  const int digits = std::numeric_limits<T>::max_digits10;
  for (index_t i = 0; i < rows && i < limit; ++i) {
    std::printf("%s[%lld] =", name, static_cast<long long>(i));
    for (index_t j = 0; j < cols; ++j) std::printf(" % .*g", digits, double(x[i * cols + j]));
    std::printf("\n");
  }
}

/// Runs the operator on storage type T (the arithmetic: p.compute) and writes
/// the outputs (returns the file list).
template <class T>
std::vector<std::string> compute(const Problem& p, const std::string& out_dir, int print) {
  const bool four = p.four_d;
  const std::vector<T> q = convert_input<T>(p.q, p.storage), k = convert_input<T>(p.k, p.storage),
                       v = convert_input<T>(p.v, p.storage);
  const Dims dq = p.dq, dk = p.dk, dv = p.dv;
  const Dims dout{dq.b, dq.h, dq.s, dv.d};
  using A = continuum::accum_t<T>;  // lse, τ and dτ: float for 16-bit storage
  std::vector<T> out(std::size_t(dout.b * dout.h * dout.s * dout.d));
  std::vector<A> lse(std::size_t(dq.b * dq.h * dq.s));
  const std::vector<A> tau = convert<A>(p.tau);
  const std::size_t maps = p.probs ? std::size_t(dq.b * dq.h * dq.s * dk.s) : 0;
  std::vector<T> probs(maps), cell_mass(maps);

  using CView = continuum::TensorView<const T>;
  using View = continuum::TensorView<T>;
  continuum::Temperature<A> temperature;
  temperature.shape = p.tshape;
  temperature.value = tau[0];
  temperature.data = p.tshape == continuum::TemperatureShape::scalar ? nullptr : tau.data();
  continuum::Visibility vis;
  vis.causal = p.causal;
  vis.window_left = p.window_left;
  vis.window_right = p.window_right;
  if (p.has_ranges) {
    vis.range_lo = p.lo.data();
    vis.range_hi = p.hi.data();
  }
  const auto set_common = [&](auto& args) {  // what forward and backward share
    args.query = CView::bhsd(q.data(), dq.b, dq.h, dq.s, dq.d);
    args.key = CView::bhsd(k.data(), dk.b, dk.h, dk.s, dk.d);
    args.value = CView::bhsd(v.data(), dv.b, dv.h, dv.s, dv.d);
    args.kernel = p.kernel;
    args.temperature = temperature;
    args.scale = p.scale;
    args.visibility = vis;
    args.compute = p.compute == DType::f64 ? continuum::Compute::float64 : continuum::Compute::automatic;
    args.num_threads = p.threads;
  };

  continuum::ForwardArgs<T> fa;
  set_common(fa);
  fa.out = View::bhsd(out.data(), dout.b, dout.h, dout.s, dout.d);
  fa.lse = lse.data();
  if (p.probs) {
    fa.probs = probs.data();
    fa.cell_mass = cell_mass.data();
  }
  continuum::attention_forward(continuum::cpu, fa);

  std::vector<T> gq, gk, gv;
  std::vector<A> gtau;
  if (p.has_do) {
    const std::vector<T> g = convert_input<T>(p.dout, p.storage);
    gq.resize(q.size());
    gk.resize(k.size());
    gv.resize(v.size());
    gtau.resize(tau.size());
    continuum::BackwardArgs<T> ba;
    set_common(ba);
    ba.out = CView::bhsd(out.data(), dout.b, dout.h, dout.s, dout.d);
    ba.grad_out = CView::bhsd(g.data(), dout.b, dout.h, dout.s, dout.d);
    ba.lse = lse.data();
    ba.grad_query = View::bhsd(gq.data(), dq.b, dq.h, dq.s, dq.d);
    ba.grad_key = View::bhsd(gk.data(), dk.b, dk.h, dk.s, dk.d);
    ba.grad_value = View::bhsd(gv.data(), dv.b, dv.h, dv.s, dv.d);
    ba.grad_temperature = gtau.data();
    continuum::attention_backward(continuum::cpu, ba);
  }

  // Encode everything before touching the output folder.
  namespace fs = std::filesystem;
  std::vector<std::pair<std::string, std::string>> files;
  std::vector<std::size_t> lse_shape = four ? std::vector<std::size_t>{std::size_t(dq.b), std::size_t(dq.h), std::size_t(dq.s)}
                                            : std::vector<std::size_t>{std::size_t(dq.s)};
  files.push_back({"o.npy", encode_as(out, shape_of(dout, four), p.out)});
  const DType accum_out = p.out == DType::f16 ? DType::f32 : p.out;  // lse and dtemp: never below float32
  files.push_back({"lse.npy", encode_as(lse, lse_shape, accum_out)});
  if (p.has_do) {
    files.push_back({"dq.npy", encode_as(gq, shape_of(dq, four), p.out)});
    files.push_back({"dk.npy", encode_as(gk, shape_of(dk, four), p.out)});
    files.push_back({"dv.npy", encode_as(gv, shape_of(dv, four), p.out)});
    files.push_back({"dtemp.npy", encode_as(gtau, p.tau_out_shape, accum_out)});
  }
  if (p.probs) {
    auto map_shape = lse_shape;
    map_shape.push_back(std::size_t(dk.s));
    files.push_back({"p.npy", encode_as(probs, map_shape, p.out)});
    files.push_back({"pi.npy", encode_as(cell_mass, map_shape, p.out)});
  }

  attn::AtomicWriter writer;
  writer.create_folders(out_dir);
  std::vector<std::string> written;
  for (auto& f : files) {
    const std::string path = (fs::path(out_dir) / f.first).string();
    writer.add(path, f.second);
    written.push_back(path);
  }
  writer.commit();
  remove_stale_outputs(out_dir, files);

  if (print > 0) {
    std::printf("first rows of batch 0, head 0 (lse is the natural log of Z):\n");
    print_rows("lse", lse, dq.s, 1, print);
    print_rows("o", out, dq.s, dv.d, print);
    if (p.has_do) print_rows("dq", gq, dq.s, dq.d, print);
  }
  return written;
}

// ---- --make-example: deterministic inputs without Python -------------------

/// Uniform in [-1, 1) from the raw 64-bit Mersenne Twister stream (portable:
/// std::uniform_real_distribution differs between standard libraries).
double uniform(std::mt19937_64& rng) {
  return double(rng() >> 11) * 0x1.0p-53 * 2.0 - 1.0;
}

void make_example(const std::string& dir, const std::vector<index_t>& shape, DType dtype,
                  std::uint64_t seed) {
  if (shape.size() != 5)
    throw UsageError("--example-shape takes 5 numbers: batch heads seq_q seq_k head_dim");
  for (index_t s : shape)
    if (s < 1 || s > 4096) throw UsageError("--example-shape: each size must be in [1, 4096]");
  const std::size_t b = shape[0], h = shape[1], lq = shape[2], lk = shape[3], d = shape[4];
  std::mt19937_64 rng(seed);
  auto gen = [&](std::size_t n) {
    std::vector<double> x(n);
    for (auto& e : x) e = uniform(rng);
    return x;
  };
  namespace fs = std::filesystem;
  attn::AtomicWriter writer;
  writer.create_folders(dir);
  const std::pair<const char*, std::vector<std::size_t>> arrays[] = {
      {"q.npy", {b, h, lq, d}}, {"k.npy", {b, h, lk, d}}, {"v.npy", {b, h, lk, d}},
      {"do.npy", {b, h, lq, d}}};
  for (const auto& a : arrays) {
    std::size_t n = 1;
    for (auto s : a.second) n *= s;
    const std::vector<double> x = gen(n);
    writer.add((fs::path(dir) / a.first).string(), encode_as(x, a.second, dtype));
  }
  writer.commit();
  std::printf("wrote %s/{q,k,v,do}.npy: batch %zu, heads %zu, seq_q %zu, seq_k %zu, head_dim %zu, "
              "%s, uniform in [-1, 1), seed %llu\n",
              dir.c_str(), b, h, lq, lk, d, attn::dtype_name(dtype),
              static_cast<unsigned long long>(seed));
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  std::string make_dir, example_dtype = "float64";
  std::vector<index_t> example_shape{1, 2, 16, 16, 8};
  std::uint64_t seed = 1;

  CLI::App app{
      "continuum-attn: continuum / softmax / focal attention on .npy files (MATH.md §4-§6).\n"
      "Writes o.npy and lse.npy, with --do also dq.npy, dk.npy, dv.npy, dtemp.npy, with --probs p.npy, pi.npy.\n"
      "Any error: one line naming the file, exit status 1 (2 for a bad option value),\n"
      "and no output file written."};
  app.option_defaults()->always_capture_default();
  app.add_option("--q", o.q, "query .npy: [seq_q, dim] or [batch, heads, seq_q, dim]");
  app.add_option("--k", o.k, "key .npy: [seq_k, dim] or [batch, kv_heads, seq_k, dim]");
  app.add_option("--v", o.v, "value .npy: [seq_k, dim_v] or [batch, kv_heads, seq_k, dim_v]");
  app.add_option("--do", o.dout, "output gradient .npy (shape of o): also run the backward");
  app.add_option("--out", o.out,
                 "output folder (created if missing); after a successful run it holds exactly this run's "
                 "outputs: files of an earlier run named o, lse, dq, dk, dv, dtemp, p or pi .npy that this "
                 "run does not write are removed (nothing else is touched; a failed run changes nothing)");
  app.add_option("--kernel", o.kernel, "continuum | softmax | focal")
      ->check(CLI::IsMember({"continuum", "softmax", "focal"}));
  app.add_option("--temperature", o.temperature,
                 "tau > 0: a number, or a .npy with one value, [heads] or [batch, heads, seq_q]");
  auto* scale = app.add_option("--scale", o.scale, "softmax scale; scores are scale/tau * q.k")
                    ->default_str("1/sqrt(head_dim)");
  app.add_flag("--causal", o.causal, "causal, bottom-right aligned (MATH.md §3)");
  auto* window = app.add_option("--window", o.window,
                                "W keys counting the diagonal and none after it: (W - 1, 0); 0 = no window")
                   ->check(attn::in_range_of_64_bits<index_t>());
  auto* left = app.add_option("--window-left", o.window_left,
                              "sliding window: keys up to L before the diagonal key (negative = unlimited)")
                   ->check(attn::in_range_of_64_bits<index_t>());
  auto* right = app.add_option("--window-right", o.window_right,
                               "sliding window: keys up to R after the diagonal key (negative = unlimited)")
                   ->check(attn::in_range_of_64_bits<index_t>());
  window->excludes(left)->excludes(right);
  app.add_option("--ranges", o.ranges, "lo.npy hi.npy: per-query visible keys [lo, hi), int, [batch, seq_q]")
      ->expected(2);
  app.add_option("--dtype", o.dtype,
                 "storage type float32 | float64 | bfloat16 | float16 the inputs are converted to (default: the "
                 "inputs'; bfloat16 and float16 compute in float32, bfloat16 writes float32 files)");
  app.add_option("--compute", o.compute,
                 "arithmetic float32 | float64 (default: the storage type's; float32 for bfloat16 and float16). float32: not with float64 storage; "
                 "float64: double arithmetic, each output rounded once")
      ->check(CLI::IsMember({"float32", "float64"}))
      ->default_str("the storage type's");
  app.add_option("--out-dtype", o.out_dtype,
                 "output type float32 | float64 | float16 (default: the storage type; lse and dtemp at least float32)");
  app.add_option("--threads", o.threads, "OpenMP threads (0 = default); results do not depend on it");
  app.add_flag("--probs", o.probs, "also write p.npy (weights P) and pi.npy (cell masses), [.., seq_q, seq_k] "
                                   "(the same kernels; o and lse do not change)");
  app.add_option("--print", o.print_rows, "print the first N rows of lse and o (batch 0, head 0)");
  app.add_option("--make-example", make_dir, "write deterministic q/k/v/do .npy inputs to this folder and exit");
  app.add_option("--example-shape", example_shape, "batch heads seq_q seq_k head_dim for --make-example")
      ->expected(5)
      ->check(attn::in_range_of_64_bits<index_t>());
  app.add_option("--example-dtype", example_dtype, "float32 | float64 | float16 for --make-example");
  app.add_option("--seed", seed, "random seed for --make-example")->check(attn::in_range_of_64_bits<std::uint64_t>());
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {  // one line, status 2, as documented
    std::fprintf(stderr, "continuum-attn: error: %s (see --help)\n", e.what());
    return 2;
  }
  o.scale_given = scale->count() > 0;

  try {
    if (!make_dir.empty()) {
      make_example(make_dir, example_shape,
                   parse_dtype(example_dtype, "--example-dtype", {DType::f32, DType::f64, DType::f16}), seed);
      return 0;
    }
    for (auto* req : {&o.q, &o.k, &o.v, &o.out})
      if (req->empty()) throw UsageError("--q, --k, --v and --out are required (see --help)");
    const Problem p = validate(o);
    const auto written = p.storage == DType::f32    ? compute<float>(p, o.out, o.print_rows)
                         : p.storage == DType::bf16 ? compute<continuum::bfloat16>(p, o.out, o.print_rows)
                         : p.storage == DType::f16  ? compute<continuum::float16>(p, o.out, o.print_rows)
                                                    : compute<double>(p, o.out, o.print_rows);
    std::printf("continuum-attn: kernel %s, storage %s, compute %s, wrote", o.kernel.c_str(),
                attn::dtype_name(p.storage), attn::dtype_name(p.compute));
    for (const auto& f : written) std::printf(" %s", f.c_str());
    std::printf(" (%s)\n", attn::dtype_name(p.out));
    return 0;
  } catch (const UsageError& e) {
    std::fprintf(stderr, "continuum-attn: error: %s\n", e.what());
    return 2;
  } catch (const std::bad_alloc&) {
    std::fprintf(stderr, "continuum-attn: error: not enough memory for the inputs %s, %s, %s and their outputs\n",
                 o.q.c_str(), o.k.c_str(), o.v.c_str());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "continuum-attn: error: %s\n", e.what());
    return 1;
  }
}
