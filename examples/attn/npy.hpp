// examples/attn/npy.hpp — reading and writing NumPy .npy files for
// continuum-attn, on top of xtensor's xnpy (xt::load_npy / xt::dump_npy).
//
// Why a wrapper: xnpy (xtensor 0.24, Debian 12) trusts the file. Read as-is,
//   * a truncated data section is not detected: istream::read's short count is
//     never checked, so the tail of the array is uninitialised memory;
//   * a truncated header is read into an uninitialised buffer;
//   * the 16-bit header length is assembled from signed chars, so a valid
//     header whose length has its low byte ≥ 0x80 (e.g. 182, which NumPy
//     writes when the header needs 192 bytes) is read with a length of ~65 000;
//   * shape entries are parsed with `stream >> size_t`, so "-3" wraps to
//     2^64 - 3 and "x" becomes 0; the element count can overflow;
//   * trailing bytes after the data are ignored.
// So every file is read whole and its header is validated here (magic,
// version, length, dictionary, dtype, shape, exact data length); only then is
// the array decoded by xnpy, from a canonical header xnpy itself writes.
// The header grammar is NumPy's (HeaderParser), never more lenient; sizes are
// checked against the file's own length before memory is reserved.
// Every error is an NpyError whose message starts with the file name.
#pragma once

#include <Eigen/Core>  // Eigen::half: float16 data, converted to nearest even

#include <xtensor/xadapt.hpp>
#include <xtensor/xarray.hpp>
#include <xtensor/xnpy.hpp>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <regex>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include <fcntl.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

namespace attn {

/// A problem with a named file; what() reads "<path>: <problem>".
struct NpyError : std::runtime_error {
  NpyError(const std::string& path, const std::string& problem)
      : std::runtime_error(path + ": " + problem) {}
};

/// A file's element type, or (bf16) a storage type the tool converts to:
/// .npy has no bfloat16, so no file is read or written as bf16. float16 is
/// NumPy's '<f2' (IEEE binary16).
enum class DType { f32, f64, i32, i64, bf16, f16 };

inline const char* dtype_name(DType t) {
  switch (t) {
    case DType::f32: return "float32";
    case DType::f64: return "float64";
    case DType::i32: return "int32";
    case DType::bf16: return "bfloat16";
    case DType::f16: return "float16";
    default: return "int64";
  }
}

/// A loaded array: row-major values (floats widened to double, which is
/// exact; integers as int64), its shape and the file's dtype.
struct Array {
  std::string path;
  DType dtype = DType::f64;
  std::vector<std::size_t> shape;
  std::vector<double> real;         ///< for f16 / f32 / f64 files (exactly)
  std::vector<std::int64_t> integer;  ///< for i32 / i64 files

  std::size_t size() const {
    std::size_t n = 1;
    for (auto s : shape) n *= s;
    return n;
  }
  bool is_real() const { return dtype == DType::f16 || dtype == DType::f32 || dtype == DType::f64; }
  std::string shape_str() const {
    if (shape.size() > 6) return "(" + std::to_string(shape.size()) + "-D)";
    std::string s = "(";
    for (std::size_t i = 0; i < shape.size(); ++i)
      s += (i ? ", " : "") + std::to_string(shape[i]);
    return s + (shape.size() == 1 ? ",)" : ")");
  }
};

namespace detail {

/// The bytes of a regular file, read whole: its size is taken from the file
/// system first, so a device such as /dev/zero, a pipe or a folder is refused
/// (it would otherwise be read until memory runs out) and memory is reserved
/// once. Every error names the file.
inline std::string read_whole_file(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) throw NpyError(path, std::string("cannot open: ") + std::strerror(errno));
  if (!S_ISREG(st.st_mode))
    throw NpyError(path, S_ISDIR(st.st_mode) ? "not a regular file (a folder)" : "not a regular file");
  std::ifstream in(path, std::ios::binary);
  if (!in) throw NpyError(path, std::string("cannot open: ") + std::strerror(errno));
  std::string bytes;
  try {
    bytes.resize(static_cast<std::size_t>(st.st_size));
  } catch (const std::exception&) {
    throw NpyError(path, "not enough memory to read its " + std::to_string(st.st_size) + " bytes");
  }
  in.read(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  if (static_cast<std::size_t>(in.gcount()) != bytes.size() || in.peek() != std::char_traits<char>::eof())
    throw NpyError(path, "read error (the file changed while it was read?)");
  return bytes;
}

/// The header dictionary of NumPy's format, parsed by the rules of NumPy's
/// reader (ast.literal_eval of a dict with exactly the keys descr,
/// fortran_order and shape; shape a tuple of ints) restricted to what .npy
/// writers produce, so that nothing NumPy rejects is accepted:
///   * between tokens: space, tab, form feed, CR, LF (not vertical tab or
///     other bytes Python's tokenizer rejects); before '{' spaces and tabs;
///   * keys and descr: '...' or "..." without escapes; each key once;
///   * fortran_order: True or False;
///   * shape: (), (n,), (n, m, ...) with an optional trailing comma; each n a
///     Python 3 decimal literal: 0, 00, 12, 1_000 (not 03, -1, +1, 0x10);
///     (12) is an int, not a tuple.
/// NumPy also accepts comments, line continuations, hex literals, implicit
/// string concatenation and duplicate keys; no writer emits them, so they are
/// refused here with the position.
class HeaderParser {
 public:
  HeaderParser(const std::string& text, const std::string& path) : t_(text), path_(path) {}

  struct Dict {
    std::string descr;
    bool fortran_order = false;
    std::vector<std::size_t> shape;
  };

  Dict parse() {
    Dict d;
    while (at_any(" \t")) ++i_;
    expect('{');
    bool seen[3] = {false, false, false};
    skip_space();
    while (!peek('}')) {
      const std::string key = string_literal("a key");
      static const char* keys[3] = {"descr", "fortran_order", "shape"};
      int k = 0;
      while (k < 3 && key != keys[k]) ++k;
      if (k == 3) fail("unexpected key '" + key + "' (need descr, fortran_order, shape)");
      if (seen[k]) fail("key '" + key + "' appears twice");
      seen[k] = true;
      skip_space();
      expect(':');
      skip_space();
      if (k == 0) d.descr = string_literal("descr (a string)");
      if (k == 1) d.fortran_order = boolean();
      if (k == 2) d.shape = shape();
      skip_space();
      if (!peek(',')) break;
      ++i_;
      skip_space();
    }
    expect('}');
    skip_space();
    if (i_ != t_.size()) fail("unexpected characters after the dictionary");
    for (int k = 0; k < 3; ++k)
      if (!seen[k]) fail(std::string("missing key '") + (k == 0 ? "descr" : k == 1 ? "fortran_order" : "shape") + "'");
    return d;
  }

 private:
  const std::string& t_;
  const std::string& path_;
  std::size_t i_ = 0;

  [[noreturn]] void fail(const std::string& what) const {
    throw NpyError(path_, "malformed header: " + what + " at byte " + std::to_string(i_) + " of the header");
  }
  bool peek(char c) const { return i_ < t_.size() && t_[i_] == c; }
  bool at_any(const char* set) const { return i_ < t_.size() && t_[i_] != '\0' && std::strchr(set, t_[i_]); }
  void skip_space() {
    while (at_any(" \t\f\r\n")) ++i_;
  }
  void expect(char c) {
    if (!peek(c)) fail(std::string("expected '") + c + "'");
    ++i_;
  }
  std::string string_literal(const char* what) {
    if (!peek('\'') && !peek('"')) fail(std::string("expected ") + what);
    const char quote = t_[i_++];
    const std::size_t start = i_;
    while (i_ < t_.size() && t_[i_] != quote) {
      const unsigned char c = static_cast<unsigned char>(t_[i_]);
      if (c == '\\' || c < 0x20 || c >= 0x7f) fail("unsupported character in a string");
      ++i_;
    }
    if (i_ == t_.size()) fail("unterminated string");
    return t_.substr(start, i_++ - start);
  }
  bool boolean() {
    for (const char* word : {"True", "False"})
      if (t_.compare(i_, std::strlen(word), word) == 0) {
        i_ += std::strlen(word);
        if (i_ < t_.size() && (std::isalnum(static_cast<unsigned char>(t_[i_])) || t_[i_] == '_'))
          fail("fortran_order must be True or False");
        return word[0] == 'T';
      }
    fail("fortran_order must be True or False");
  }
  /// A Python 3 decimal integer literal, at most 18 digits.
  std::size_t integer() {
    const std::size_t start = i_;
    std::string digits;
    while (i_ < t_.size() && (std::isdigit(static_cast<unsigned char>(t_[i_])) || t_[i_] == '_')) {
      if (t_[i_] == '_' && (i_ == start || t_[i_ - 1] == '_')) fail("malformed integer in shape");
      if (t_[i_] != '_') digits += t_[i_];
      ++i_;
    }
    if (digits.empty()) fail("expected a non-negative integer in shape");
    if (t_[i_ - 1] == '_') fail("malformed integer in shape");
    if (i_ < t_.size() && (std::isalpha(static_cast<unsigned char>(t_[i_])) || t_[i_] == '.'))
      fail("shape entries must be decimal integers");
    if (digits[0] == '0' && digits.find_first_not_of('0') != std::string::npos)
      fail("leading zeros in a non-zero integer (a syntax error in Python 3)");
    if (digits.size() > 18) fail("shape entry " + digits + " is too large");
    return static_cast<std::size_t>(std::stoull(digits));
  }
  std::vector<std::size_t> shape() {
    std::vector<std::size_t> dims;
    if (!peek('(')) fail("shape must be a tuple");
    ++i_;
    skip_space();
    bool comma = false;
    while (!peek(')')) {
      dims.push_back(integer());
      skip_space();
      comma = peek(',');
      if (!comma) break;
      ++i_;
      skip_space();
    }
    if (!peek(')')) fail("expected ',' or ')' in shape");
    ++i_;
    if (dims.size() == 1 && !comma) fail("shape (n) is an int, not a tuple: write (n,)");
    return dims;
  }
};

/// A count as %.4g ("1e+12").
inline std::string num_text(double x) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.4g", x);
  return buf;
}

inline std::string shape_text(const std::vector<std::size_t>& shape) {
  std::string s = "(";
  for (std::size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + (shape.size() == 1 ? ",)" : ")");
}

struct Header {
  DType dtype;
  bool fortran_order;
  std::vector<std::size_t> shape;
  std::size_t data_offset;
};

/// Validates the .npy header (format versions 1.0 and 2.0; NumPy's spec:
/// numpy.org/doc/stable/reference/generated/numpy.lib.format.html).
inline Header parse_header(const std::string& bytes, const std::string& path) {
  static const char magic[] = "\x93NUMPY";
  if (bytes.empty()) throw NpyError(path, "empty file (0 bytes), not a .npy file");
  if (bytes.size() < 10 || bytes.compare(0, 6, magic, 6) != 0)
    throw NpyError(path, "not a .npy file (bad magic bytes)");
  const auto byte = [&](std::size_t i) { return static_cast<unsigned char>(bytes[i]); };
  const unsigned major = byte(6), minor = byte(7);
  std::size_t len = 0, off = 0;
  if (major == 1 && minor == 0) {
    len = byte(8) | (std::size_t(byte(9)) << 8);
    off = 10;
  } else if (major == 2 && minor == 0) {
    if (bytes.size() < 12) throw NpyError(path, "truncated header");
    len = byte(8) | (std::size_t(byte(9)) << 8) | (std::size_t(byte(10)) << 16) |
          (std::size_t(byte(11)) << 24);
    off = 12;
  } else {
    throw NpyError(path, "unsupported .npy format version " + std::to_string(major) + "." +
                             std::to_string(minor) + " (1.0 and 2.0 are supported)");
  }
  // NumPy's own reader refuses headers over 10000 bytes (np.load's max_header_size);
  // the bound also keeps std::regex's recursion shallow.
  if (len > 10000) throw NpyError(path, "header of " + std::to_string(len) + " bytes is too long");
  if (len > bytes.size() - off) throw NpyError(path, "truncated header");
  const std::string dict = bytes.substr(off, len);
  const HeaderParser::Dict d = HeaderParser(dict, path).parse();

  // Which dtypes the reader accepts, by role (the roles' own checks say the same).
  static const std::string kDtypesAccepted =
      "queries, keys, values, dO and temperatures are float16, float32 or float64; "
      "--ranges files int32 or int64";
  Header h;
  static const std::regex descr_re(R"(^([<>|=]?)([a-zA-Z])(\d+)$)");
  std::smatch m;
  if (!std::regex_match(d.descr, m, descr_re))
    throw NpyError(path, "unsupported dtype '" + d.descr + "' (" + kDtypesAccepted + ")");
  const std::string order = m[1], kind = m[2], width = m[3];
  if (order == ">") throw NpyError(path, "big-endian data is not supported; use '<' (little-endian)");
  if (kind == "f" && width == "2") h.dtype = DType::f16;
  else if (kind == "f" && width == "4") h.dtype = DType::f32;
  else if (kind == "f" && width == "8") h.dtype = DType::f64;
  else if (kind == "i" && width == "4") h.dtype = DType::i32;
  else if (kind == "i" && width == "8") h.dtype = DType::i64;
  else
    throw NpyError(path, "unsupported dtype '" + d.descr + "' (" + kDtypesAccepted + ")");
  h.fortran_order = d.fortran_order;
  h.shape = d.shape;

  // The element count, bounded before anything is allocated: the data must
  // be exactly count × word bytes of the file.
  // As NumPy: the bytes of the non-zero sizes, itemsize × Π n, must fit
  // int64 (shape (0, 10^15, 10^15) is "too big" there too).
  const std::string dims = shape_text(h.shape);
  const std::size_t word = h.dtype == DType::f16 ? 2 : (h.dtype == DType::f32 || h.dtype == DType::i32) ? 4 : 8;
  constexpr std::size_t limit = std::size_t(std::numeric_limits<std::int64_t>::max());
  std::size_t nbytes = word;
  for (const std::size_t n : h.shape) {
    if (n == 0) continue;
    if (nbytes > limit / n) throw NpyError(path, "shape " + dims + " is too large");
    nbytes *= n;
  }
  const bool empty = std::find(h.shape.begin(), h.shape.end(), std::size_t(0)) != h.shape.end();
  const std::size_t count = empty ? 0 : nbytes / word;
  const std::size_t want = count * word, have = bytes.size() - off - len;
  if (have < want)
    throw NpyError(path, "truncated data: shape " + dims + " needs " + std::to_string(want) +
                             " bytes, the file has " + std::to_string(have));
  if (have > want)
    throw NpyError(path, std::to_string(have - want) + " unexpected bytes after the data");
  h.data_offset = off + len;
  return h;
}

/// Decodes the validated payload with xnpy, from a canonical header written
/// by xnpy itself (so xnpy's header reader never sees the caller's bytes).
template <class T, class Out>
void decode(const std::string& bytes, const Header& h, const std::string& path,
            std::vector<Out>& out) {
  // An empty array has nothing to decode; xnpy's strides, products of the
  // other sizes, could overflow (shape (0, 10^15, 10^15)).
  if (std::find(h.shape.begin(), h.shape.end(), std::size_t(0)) != h.shape.end()) {
    out.clear();
    return;
  }
  std::ostringstream canon;
  xt::detail::write_header(canon, xt::detail::build_typestring<T>(), h.fortran_order, h.shape);
  // xnpy reads the 16-bit header length through signed chars (see above).
  if (static_cast<unsigned char>(canon.str()[8]) >= 0x80)
    throw NpyError(path, "shape (" + std::to_string(h.shape.size()) + " dims) too long for xnpy");
  canon.write(bytes.data() + h.data_offset,
              static_cast<std::streamsize>(bytes.size() - h.data_offset));
  std::istringstream in(canon.str());
  auto loaded = xt::load_npy<T>(in);
  if (std::vector<std::size_t>(loaded.shape().begin(), loaded.shape().end()) != h.shape)
    throw NpyError(path, "xnpy decoded a different shape");
  // Assigning to a row-major array transposes Fortran-ordered data.
  xt::xarray<T, xt::layout_type::row_major> rm = loaded;
  out.assign(rm.data(), rm.data() + rm.size());
}

}  // namespace detail

/// Parses the bytes of a .npy file (see load); `path` names it in errors.
inline Array load_bytes(const std::string& bytes, const std::string& path) {
  const detail::Header h = detail::parse_header(bytes, path);
  Array a;
  a.path = path;
  a.dtype = h.dtype;
  a.shape = h.shape;
  try {
    switch (h.dtype) {
      case DType::f32: detail::decode<float>(bytes, h, path, a.real); break;
      case DType::f64: detail::decode<double>(bytes, h, path, a.real); break;
      case DType::i32: detail::decode<std::int32_t>(bytes, h, path, a.integer); break;
      case DType::i64: detail::decode<std::int64_t>(bytes, h, path, a.integer); break;
      case DType::f16: {  // xnpy has no float16: its bits as uint16, then Eigen's exact widening
        std::vector<std::uint16_t> bits;
        detail::decode<std::uint16_t>(bytes, h, path, bits);
        a.real.resize(bits.size());
        for (std::size_t i = 0; i < bits.size(); ++i)
          a.real[i] = double(Eigen::numext::bit_cast<Eigen::half>(bits[i]));
        break;
      }
      case DType::bf16: break;  // never a file's dtype (parse_header)
    }
  } catch (const NpyError&) {
    throw;
  } catch (const std::bad_alloc&) {
    throw NpyError(path, "not enough memory for shape " + a.shape_str());
  } catch (const std::exception& e) {
    throw NpyError(path, std::string("cannot decode: ") + e.what());
  }
  return a;
}

/// Loads a .npy file (float16/float32/float64/int32/int64, C or Fortran order).
/// \throws NpyError naming the file and the problem.
inline Array load(const std::string& path) { return load_bytes(detail::read_whole_file(path), path); }

/// The bytes of a .npy file holding `data` (row-major) with `shape`, written
/// by xnpy. T = float, double (or uint16_t, for encode_float16).
template <class T>
std::string encode(const std::vector<T>& data, const std::vector<std::size_t>& shape) {
  std::size_t n = 1;
  for (auto s : shape) n *= s;
  if (n != data.size()) throw std::logic_error("npy encode: shape does not match the data");
  if (shape.empty()) {
    xt::xarray<T> scalar = xt::xarray<T>::from_shape({});
    scalar() = data[0];
    return xt::dump_npy(scalar);
  }
  auto view = xt::adapt(data.data(), n, xt::no_ownership(), shape);
  return xt::dump_npy(view);
}

/// The bytes of a float16 ('<f2') .npy file holding `data` rounded to
/// float16 (to nearest even, through float: Eigen::half). xnpy has no float16
/// type, so its uint16 file of the bits is written and its descr '<u2' (same
/// length) renamed.
template <class T>
std::string encode_float16(const std::vector<T>& data, const std::vector<std::size_t>& shape) {
  std::vector<std::uint16_t> bits(data.size());
  for (std::size_t i = 0; i < data.size(); ++i)
    bits[i] = Eigen::numext::bit_cast<std::uint16_t>(Eigen::half(float(data[i])));
  std::string bytes = encode(bits, shape);
  const std::size_t at = bytes.find("'<u2'");
  if (at == std::string::npos || at > 128) throw std::logic_error("npy encode_float16: no '<u2' descr in xnpy's header");
  bytes.replace(at, 5, "'<f2'");
  return bytes;
}

/// Writes a set of files atomically as a group: every file goes to a
/// temporary in its target's folder first, created with mkstemp (a name
/// unique to this run: ".NAME.XXXXXX", so concurrent runs writing the same
/// outputs and leftovers of killed runs never collide); only when all are
/// written and closed, and no target is a folder, are they renamed into
/// place. On any error the temporaries are removed and no output file
/// appears. A symbolic link's file is replaced (the link stays); a device,
/// FIFO or socket in a target's place is an error, never renamed over.
/// (Two concurrent runs into one folder each replace whole files; which
/// run's file each name ends up holding is unspecified.)
class AtomicWriter {
 public:
  AtomicWriter() = default;
  AtomicWriter(const AtomicWriter&) = delete;
  AtomicWriter& operator=(const AtomicWriter&) = delete;
  ~AtomicWriter() { discard(); }

  /// Creates the folder `dir` and its missing parents. The folders it
  /// created are removed again, if they are still empty, unless commit()
  /// succeeds: a failed run leaves no empty folders behind either.
  void create_folders(const std::string& dir) {
    namespace fs = std::filesystem;
    fs::path p(dir);
    while (!p.empty() && p.filename().empty() && p != p.root_path()) p = p.parent_path();  // "out/" -> "out"
    std::vector<fs::path> missing;
    std::error_code ec;
    for (; !p.empty() && !fs::exists(p, ec); p = p.parent_path()) {
      missing.push_back(p);
      if (p == p.root_path()) break;
    }
    for (auto it = missing.rbegin(); it != missing.rend(); ++it) {
      const bool made = fs::create_directory(*it, ec);
      if (ec) throw NpyError(dir, "cannot create the folder: " + ec.message());
      if (made) folders_.push_back(*it);
    }
    if (!fs::is_directory(dir, ec)) throw NpyError(dir, "cannot create the folder: a file has this name");
  }

  void add(const std::string& path, const std::string& bytes) {
    namespace fs = std::filesystem;
    fs::path target(path);
    std::error_code ec;
    // A symbolic link: the file it names is replaced and the link stays (a
    // rename onto the link would replace the link itself).
    if (fs::is_symlink(fs::symlink_status(target, ec))) {
      target = fs::weakly_canonical(target, ec);
      if (ec) throw NpyError(path, "cannot resolve the symbolic link: " + ec.message());
    }
    // A device, FIFO or socket is never renamed over (as root, `--out
    // /dev/null` would make /dev/null a regular file); a folder is refused
    // by commit().
    const fs::file_status st = fs::status(target, ec);
    if (fs::exists(st) && !fs::is_regular_file(st) && !fs::is_directory(st))
      throw NpyError(path, "cannot replace: not a regular file (a device, FIFO or socket); name a file");
    std::string tmpl = (target.parent_path() / ("." + target.filename().string() + ".XXXXXX")).string();
    const int fd = ::mkstemp(tmpl.data());
    if (fd < 0) throw NpyError(path, std::string("cannot create a temporary file: ") + std::strerror(errno));
    temps_.push_back({tmpl, target.string()});
    // mkstemp creates the file 0600; give it the permissions a plain create
    // would (0666 less the umask).
    const mode_t mask = ::umask(0);
    ::umask(mask);
    bool ok = ::fchmod(fd, 0666 & ~mask) == 0;
    int err = ok ? 0 : errno;
    for (std::size_t done = 0; ok && done < bytes.size();) {
      const ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        ok = false;
        err = n < 0 ? errno : EIO;
      } else {
        done += static_cast<std::size_t>(n);
      }
    }
    if (::close(fd) != 0 && ok) {
      ok = false;
      err = errno;
    }
    if (!ok) throw NpyError(path, std::string("write failed: ") + std::strerror(err));
  }
  /// Renames every temporary into place.
  void commit() {
    // A rename can still fail half-way (e.g. a folder already holds that
    // name); check every target first so that no file is renamed then.
    for (auto& t : temps_) {
      std::error_code ec;
      if (std::filesystem::is_directory(t.second, ec))
        throw NpyError(t.second, "cannot replace: a folder has this name");
    }
    for (std::size_t i = 0; i < temps_.size(); ++i) {
      if (std::rename(temps_[i].first.c_str(), temps_[i].second.c_str()) != 0) {
        const int err = errno;
        temps_.erase(temps_.begin(), temps_.begin() + static_cast<std::ptrdiff_t>(i));
        throw NpyError(temps_.front().second, std::string("cannot rename into place: ") + std::strerror(err));
      }
    }
    temps_.clear();
    folders_.clear();
  }
  /// Removes the temporaries not renamed yet, then the folders
  /// create_folders made, deepest first, where they are empty.
  void discard() {
    for (auto& t : temps_) std::remove(t.first.c_str());
    temps_.clear();
    std::error_code ec;
    for (auto it = folders_.rbegin(); it != folders_.rend(); ++it) std::filesystem::remove(*it, ec);
    folders_.clear();
  }

 private:
  std::vector<std::pair<std::string, std::string>> temps_;
  std::vector<std::filesystem::path> folders_;  // created by create_folders, parents first
};

}  // namespace attn
