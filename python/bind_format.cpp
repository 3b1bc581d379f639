// Binding for the serializer: the directive, messages, memories and tools JSON in, the
// formatted text with its section spans (and, for pricing, its pieces) out.
//
// Messages and memories are read here, not in Python: format_context runs in the request
// path over thousands of memories, and one C-level pass over the items (dict lookups or
// attribute reads, type checks) costs a fraction of a Python loop doing the same. Every
// problem found is raised as ctxcore.InvalidFormatInput naming the item.
#include <pybind11/gil_safe_call_once.h>
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <tuple>
#include <utility>
#include <vector>

#include "bindings.hpp"
#include "ctxcore/serializer.hpp"

namespace py = pybind11;

namespace ctxcore_py {
namespace {

using ctxcore::FormatSection;

constexpr const char* kSectionNames[ctxcore::kFormatSections] = {"directive", "history", "memories", "tools"};

PYBIND11_CONSTINIT py::gil_safe_call_once_and_store<py::object> invalid_format_type;

// A str from bytes that may not be valid UTF-8 (an id holding a surrogate, as written by
// "surrogatepass"): an error message must never fail to build.
py::str lenient_str(std::string_view s) {
  PyObject* raw = PyUnicode_DecodeUTF8(s.data(), static_cast<Py_ssize_t>(s.size()), "replace");
  if (raw == nullptr) throw py::error_already_set();
  return py::reinterpret_steal<py::str>(raw);
}

// Raises ctxcore.InvalidFormatInput with its attributes set. `item_id` is the memory's
// own id object (None when it has none), so the caller gets back exactly what it passed.
[[noreturn]] void raise_invalid(const py::str& message, FormatSection section, std::int64_t index,
                                const py::object& item_id) {
  const py::object& type = invalid_format_type.get_stored();
  py::object exc = type(message);
  exc.attr("section") = kSectionNames[static_cast<std::size_t>(section)];
  exc.attr("index") = index;
  exc.attr("item_id") = item_id;
  PyErr_SetObject(type.ptr(), exc.ptr());
  throw py::error_already_set();
}

// Python objects the conversion needs, looked up once.
struct Statics {
  py::object mapping;  // collections.abc.Mapping
  py::object real;     // numbers.Real
  py::str id, text, score, source, created_at, role, content;
};

Statics& statics() {
  PYBIND11_CONSTINIT static py::gil_safe_call_once_and_store<Statics> storage;
  return storage
      .call_once_and_store_result([]() {
        Statics s;
        s.mapping = py::module_::import("collections.abc").attr("Mapping");
        s.real = py::module_::import("numbers").attr("Real");
        s.id = py::str("id");
        s.text = py::str("text");
        s.score = py::str("score");
        s.source = py::str("source");
        s.created_at = py::str("created_at");
        s.role = py::str("role");
        s.content = py::str("content");
        return s;
      })
      .get_stored();
}

std::string type_name(py::handle obj) { return py::str(py::type::of(obj).attr("__name__")); }

// How an id appears in a message: its repr, cut to 80 code points.
std::string shown(const py::handle& id) {
  constexpr Py_ssize_t kShown = 80;
  const Py_ssize_t n = PyUnicode_GET_LENGTH(id.ptr());
  py::object cut = py::reinterpret_steal<py::object>(PyUnicode_Substring(id.ptr(), 0, std::min(n, kShown)));
  if (!cut) throw py::error_already_set();
  py::str r = py::repr(cut);
  Py_ssize_t size = 0;
  const char* data = PyUnicode_AsUTF8AndSize(r.ptr(), &size);
  if (data == nullptr) throw py::error_already_set();  // a repr is always encodable
  return std::string(data, static_cast<std::size_t>(size)) + (n > kShown ? "..." : "");
}

// Keeps alive every object whose UTF-8 buffer is handed to the core.
class Buffers {
 public:
  explicit Buffers(std::size_t n) { keep_.reserve(n); }

  // The UTF-8 of a str. PyUnicode_AsUTF8AndSize caches it on the str (for ASCII it is the
  // str's own data, no copy); a str holding a lone surrogate has no UTF-8, so its bytes
  // are made with "surrogatepass" and the core replaces the surrogate, counted.
  std::string_view utf8(py::handle s) {
    Py_ssize_t size = 0;
    const char* data = PyUnicode_AsUTF8AndSize(s.ptr(), &size);
    if (data != nullptr) {
      keep_.push_back(py::reinterpret_borrow<py::object>(s));
      return {data, static_cast<std::size_t>(size)};
    }
    PyErr_Clear();
    PyObject* raw = PyUnicode_AsEncodedString(s.ptr(), "utf-8", "surrogatepass");
    if (raw == nullptr) throw py::error_already_set();
    py::object bytes = py::reinterpret_steal<py::object>(raw);
    const std::string_view view(PyBytes_AS_STRING(raw), static_cast<std::size_t>(PyBytes_GET_SIZE(raw)));
    keep_.push_back(std::move(bytes));
    return view;
  }

 private:
  std::vector<py::object> keep_;
};

// One field of an item: a dict or other Mapping key, else an attribute. Returns a null
// object when the field is absent.
py::object field(py::handle item, const py::str& key, bool is_dict, bool is_mapping) {
  if (is_dict) {
    PyObject* v = PyDict_GetItemWithError(item.ptr(), key.ptr());
    if (v == nullptr && PyErr_Occurred()) throw py::error_already_set();
    return py::reinterpret_borrow<py::object>(v);
  }
  PyObject* v = is_mapping ? PyObject_GetItem(item.ptr(), key.ptr()) : PyObject_GetAttr(item.ptr(), key.ptr());
  if (v == nullptr) {
    if (PyErr_ExceptionMatches(is_mapping ? PyExc_KeyError : PyExc_AttributeError)) {
      PyErr_Clear();
      return {};
    }
    throw py::error_already_set();
  }
  return py::reinterpret_steal<py::object>(v);
}

struct ItemKind {
  bool is_dict;
  bool is_mapping;
};

ItemKind kind_of(py::handle item) {
  if (PyDict_Check(item.ptr())) return {true, true};
  const int m = PyObject_IsInstance(item.ptr(), statics().mapping.ptr());
  if (m < 0) throw py::error_already_set();
  return {false, m == 1};
}

std::vector<ctxcore::Message> read_history(const py::handle& seq, Buffers& buf) {
  const Statics& st = statics();
  py::object fast = py::reinterpret_steal<py::object>(PySequence_Fast(seq.ptr(), "history must be a sequence"));
  if (!fast) throw py::error_already_set();
  const std::size_t n = static_cast<std::size_t>(PySequence_Fast_GET_SIZE(fast.ptr()));
  PyObject** items = PySequence_Fast_ITEMS(fast.ptr());
  std::vector<ctxcore::Message> out(n);
  for (std::size_t i = 0; i < n; ++i) {
    const py::handle item(items[i]);
    const auto where = [&] { return "message at index " + std::to_string(i) + ": "; };
    const auto fail = [&](const std::string& what) -> void {
      raise_invalid(py::str(where() + what), FormatSection::History, static_cast<std::int64_t>(i), py::none());
    };
    const ItemKind k = kind_of(item);
    py::object role = field(item, st.role, k.is_dict, k.is_mapping);
    py::object content = field(item, st.content, k.is_dict, k.is_mapping);
    if (!role) fail("missing 'role' (a mapping key or an attribute)");
    if (!content) fail("missing 'content' (a mapping key or an attribute)");
    if (!PyUnicode_Check(role.ptr())) fail("role must be str, got " + type_name(role));
    if (!PyUnicode_Check(content.ptr())) fail("content must be str, got " + type_name(content));
    out[i].role = buf.utf8(role);
    out[i].content = buf.utf8(content);
  }
  return out;
}

// `created_at` (a str) is read in the compact rendering only, where the Python layer has
// written it from the record's time when the request named it.
std::vector<ctxcore::Memory> read_memories(const py::handle& seq, Buffers& buf, bool created_at) {
  const Statics& st = statics();
  py::object fast = py::reinterpret_steal<py::object>(PySequence_Fast(seq.ptr(), "memories must be a sequence"));
  if (!fast) throw py::error_already_set();
  const std::size_t n = static_cast<std::size_t>(PySequence_Fast_GET_SIZE(fast.ptr()));
  PyObject** items = PySequence_Fast_ITEMS(fast.ptr());
  std::vector<ctxcore::Memory> out(n);
  for (std::size_t i = 0; i < n; ++i) {
    const py::handle item(items[i]);
    const ItemKind k = kind_of(item);
    py::object id_value = py::none();  // set once the id is known to be a non-empty str
    const auto fail = [&](const std::string& what) -> void {
      const std::string who = id_value.is_none() ? "memory at index " + std::to_string(i)
                                                 : "memory " + shown(id_value) + " (index " + std::to_string(i) + ")";
      raise_invalid(py::str(who + ": " + what), FormatSection::Memories, static_cast<std::int64_t>(i), id_value);
    };
    ctxcore::Memory& m = out[i];
    py::object id = field(item, st.id, k.is_dict, k.is_mapping);
    if (!id) fail("missing 'id' (a mapping key or an attribute)");
    if (!PyUnicode_Check(id.ptr())) fail("id must be str, got " + type_name(id));
    m.id = buf.utf8(id);
    if (m.id.empty()) fail("id must be a non-empty str");
    id_value = id;

    py::object text = field(item, st.text, k.is_dict, k.is_mapping);
    if (!text) fail("missing 'text' (a mapping key or an attribute)");
    if (!PyUnicode_Check(text.ptr())) fail("text must be str, got " + type_name(text));
    m.text = buf.utf8(text);

    py::object score = field(item, st.score, k.is_dict, k.is_mapping);
    if (score && !score.is_none()) {
      if (PyBool_Check(score.ptr())) fail("score must be a real number or None, got bool");
      if (PyFloat_Check(score.ptr())) {
        m.score = PyFloat_AS_DOUBLE(score.ptr());
      } else {
        const int real = PyObject_IsInstance(score.ptr(), st.real.ptr());
        if (real < 0) throw py::error_already_set();
        if (real == 0) fail("score must be a real number or None, got " + type_name(score));
        m.score = PyFloat_AsDouble(score.ptr());
        if (m.score == -1.0 && PyErr_Occurred()) {
          PyErr_Clear();
          fail("score is not convertible to a float");
        }
      }
      if (!std::isfinite(m.score)) fail("score must be finite, got " + std::string(py::repr(score)));
      m.has_score = true;
    }

    py::object source = field(item, st.source, k.is_dict, k.is_mapping);
    if (source && !source.is_none()) {
      if (!PyUnicode_Check(source.ptr())) fail("source must be str or None, got " + type_name(source));
      m.source = buf.utf8(source);
      m.has_source = true;
    }

    if (created_at) {
      py::object created = field(item, st.created_at, k.is_dict, k.is_mapping);
      if (created && !created.is_none()) {
        if (!PyUnicode_Check(created.ptr())) fail("created_at must be str or None, got " + type_name(created));
        m.created_at = buf.utf8(created);
        m.has_created_at = true;
      }
    }
  }
  return out;
}

std::string_view optional_str(const py::object& obj, const char* what, FormatSection section, Buffers& buf) {
  if (obj.is_none()) return {};
  if (!PyUnicode_Check(obj.ptr()))
    raise_invalid(py::str(std::string(what) + " must be str or None, got " + type_name(obj)), section, -1, py::none());
  return buf.utf8(obj);
}

// Decodes the serializer's output (valid UTF-8 by construction) into a str's storage of
// code unit T. The core reports the length in code points and the largest code point, so
// the str is allocated once at its final size and kind, and ASCII runs are widened eight
// bytes at a time.
template <class T>
void decode_into(const std::string& text, T* dst) {
  const auto* p = reinterpret_cast<const unsigned char*>(text.data());
  const auto* const end = p + text.size();
  while (p < end) {
    while (end - p >= 8) {
      std::uint64_t eight;
      std::memcpy(&eight, p, 8);
      if (eight & 0x8080808080808080ULL) break;
      for (int k = 0; k < 8; ++k) dst[k] = static_cast<T>(p[k]);
      p += 8;
      dst += 8;
    }
    if (p == end) break;
    const std::uint32_t c = *p;
    if (c < 0x80) {
      *dst++ = static_cast<T>(c);
      p += 1;
    } else if (c < 0xE0) {
      *dst++ = static_cast<T>(((c & 0x1FU) << 6) | (p[1] & 0x3FU));
      p += 2;
    } else if (c < 0xF0) {
      *dst++ = static_cast<T>(((c & 0x0FU) << 12) | ((p[1] & 0x3FU) << 6) | (p[2] & 0x3FU));
      p += 3;
    } else {
      *dst++ = static_cast<T>(((c & 0x07U) << 18) | ((p[1] & 0x3FU) << 12) | ((p[2] & 0x3FU) << 6) | (p[3] & 0x3FU));
      p += 4;
    }
  }
}

py::str to_str(const ctxcore::FormattedText& r) {
  const auto n = static_cast<Py_ssize_t>(r.code_points);
  const auto max_char = static_cast<Py_UCS4>(std::max<char32_t>(r.max_code_point, 0x7F));
  PyObject* raw = PyUnicode_New(n, max_char);
  if (raw == nullptr) throw py::error_already_set();
  py::str out = py::reinterpret_steal<py::str>(raw);
  switch (PyUnicode_KIND(raw)) {
    case PyUnicode_1BYTE_KIND:
      if (max_char < 0x80) {
        std::memcpy(PyUnicode_DATA(raw), r.text.data(), r.text.size());  // ASCII: the bytes are the str
      } else {
        decode_into(r.text, static_cast<Py_UCS1*>(PyUnicode_DATA(raw)));
      }
      break;
    case PyUnicode_2BYTE_KIND:
      decode_into(r.text, static_cast<Py_UCS2*>(PyUnicode_DATA(raw)));
      break;
    default:
      decode_into(r.text, static_cast<Py_UCS4*>(PyUnicode_DATA(raw)));
      break;
  }
  return out;
}

using Spans = std::vector<std::tuple<int, std::size_t, std::size_t>>;
using Pieces = std::vector<std::tuple<int, std::size_t>>;
using Formatted = std::tuple<py::str, Spans, std::int64_t, Pieces>;

// What both format functions return: the text, its section spans and piece ends (code
// points), and how many characters were replaced.
Formatted to_python(const ctxcore::FormattedText& r) {
  py::str text = to_str(r);
  Spans spans;
  for (const auto& sp : r.sections)
    spans.emplace_back(static_cast<int>(sp.section), sp.begin.code_point, sp.end.code_point);
  Pieces pieces;
  for (const auto& p : r.pieces) pieces.emplace_back(static_cast<int>(p.kind), p.end.code_point);
  return {std::move(text), std::move(spans), r.replaced_chars, std::move(pieces)};
}

ctxcore::MemoryFormat to_memory_format(int v) {
  if (v != static_cast<int>(ctxcore::MemoryFormat::Verbose) && v != static_cast<int>(ctxcore::MemoryFormat::Compact))
    throw py::value_error("memory_format must be 0 (verbose) or 1 (compact), got " + std::to_string(v));
  return static_cast<ctxcore::MemoryFormat>(v);
}

Formatted format_context(const py::object& directive, const py::object& history, const py::object& memories,
                         const py::object& tools_json, const py::str& nonce, bool memories_frame, bool record_pieces,
                         int memory_format) {
  Buffers buf(8);
  ctxcore::FormatInput in;
  in.directive = optional_str(directive, "directive", FormatSection::Directive, buf);
  in.tools_json = optional_str(tools_json, "tools JSON", FormatSection::Tools, buf);
  in.nonce = buf.utf8(nonce);
  Buffers items(2 * static_cast<std::size_t>(py::len(memories)) + 2 * static_cast<std::size_t>(py::len(history)));
  const std::vector<ctxcore::Message> messages = read_history(history, items);
  const std::vector<ctxcore::Memory> mems =
      read_memories(memories, items, to_memory_format(memory_format) == ctxcore::MemoryFormat::Compact);
  in.history = {messages.data(), messages.size()};
  in.memories = {mems.data(), mems.size()};
  ctxcore::FormatOptions opt{memories_frame, record_pieces, to_memory_format(memory_format)};

  ctxcore::FormattedText r;
  {
    // Safe: from here on only plain C++ data is touched. Every string the core reads is
    // owned by a Python object held in `buf` or `items`; nothing here creates or frees a
    // Python object.
    py::gil_scoped_release nogil;
    r = ctxcore::format_context(in, opt);
  }

  return to_python(r);
}

// The columnar form of format_context for the assembly: memory k of the context is row
// order[k] of (ids, texts, scores, sources), its score rounded to four decimal places so
// that the text carries no float noise. `attributes` says which optional attributes are
// written (bit 0 the score, bit 1 the source, bit 2 the creation time, from `created`: a
// column of str or None by row, required with bit 2); with `handles` memory k's id is the handle
// "m{k+1}" instead of its row's id. The columns come from validated records
// (ctxcore.MemoryRecord); their types are checked again here all the same.
Formatted format_columns(const py::object& directive, const py::object& history, const py::list& ids,
                         const py::list& texts, const py::array_t<double, py::array::c_style>& scores,
                         const py::list& sources, const py::array_t<std::int64_t, py::array::c_style>& order,
                         const py::object& tools_json, const py::str& nonce, bool memories_frame, bool record_pieces,
                         int memory_format, int attributes, bool handles, const py::object& created) {
  if (attributes < 0 || attributes > 7)
    throw py::value_error(
        "format_columns: attributes must be a mask of 1 (score), 2 (source) and 4 (created_at), got " +
        std::to_string(attributes));
  const auto rows = static_cast<std::size_t>(PyList_GET_SIZE(ids.ptr()));
  if (static_cast<std::size_t>(PyList_GET_SIZE(texts.ptr())) != rows ||
      static_cast<std::size_t>(PyList_GET_SIZE(sources.ptr())) != rows || scores.ndim() != 1 ||
      static_cast<std::size_t>(scores.shape(0)) != rows || order.ndim() != 1)
    throw py::value_error("format_columns: ids, texts, scores and sources must be columns of one length");
  const bool with_created = (attributes & 4) != 0;
  if (with_created &&
      (!PyList_Check(created.ptr()) || static_cast<std::size_t>(PyList_GET_SIZE(created.ptr())) != rows))
    throw py::value_error("format_columns: created must be a list of one length with the other columns");
  Buffers buf(8);
  ctxcore::FormatInput in;
  in.directive = optional_str(directive, "directive", FormatSection::Directive, buf);
  in.tools_json = optional_str(tools_json, "tools JSON", FormatSection::Tools, buf);
  in.nonce = buf.utf8(nonce);
  const auto n = static_cast<std::size_t>(order.shape(0));
  Buffers items((with_created ? 4 : 3) * n + 2 * static_cast<std::size_t>(py::len(history)));
  const std::vector<ctxcore::Message> messages = read_history(history, items);
  std::vector<ctxcore::Memory> mems(n);
  // The handles' text, written before any view of it is taken (no reallocation after).
  std::vector<std::string> handle_text(handles ? n : 0);
  for (std::size_t k = 0; k < handle_text.size(); ++k) handle_text[k] = "m" + std::to_string(k + 1);
  const double* sc = scores.data();
  const std::int64_t* ord = order.data();
  for (std::size_t k = 0; k < n; ++k) {
    const std::int64_t row = ord[k];
    if (row < 0 || static_cast<std::size_t>(row) >= rows) throw py::index_error("format_columns: row out of range");
    const auto r = static_cast<Py_ssize_t>(row);
    PyObject* id = PyList_GET_ITEM(ids.ptr(), r);
    PyObject* text = PyList_GET_ITEM(texts.ptr(), r);
    PyObject* source = PyList_GET_ITEM(sources.ptr(), r);
    const auto fail = [&](const std::string& what) -> void {
      raise_invalid(py::str("memory at index " + std::to_string(k) + ": " + what), FormatSection::Memories,
                    static_cast<std::int64_t>(k), py::none());
    };
    if (!PyUnicode_Check(id) || PyUnicode_GET_LENGTH(id) == 0) fail("id must be a non-empty str");
    if (!PyUnicode_Check(text)) fail("text must be str");
    if (!std::isfinite(sc[row])) fail("score must be finite");
    ctxcore::Memory& m = mems[k];
    m.id = handles ? std::string_view(handle_text[k]) : items.utf8(id);
    m.text = items.utf8(text);
    m.score = std::nearbyint(sc[row] * 1e4) / 1e4;
    m.has_score = (attributes & 1) != 0;
    if ((attributes & 2) != 0 && source != Py_None) {
      if (!PyUnicode_Check(source)) fail("source must be str or None");
      m.source = items.utf8(source);
      m.has_source = true;
    }
    if (with_created) {
      PyObject* when = PyList_GET_ITEM(created.ptr(), r);
      if (when != Py_None) {
        if (!PyUnicode_Check(when)) fail("created_at must be str or None");
        m.created_at = items.utf8(when);
        m.has_created_at = true;
      }
    }
  }
  in.history = {messages.data(), messages.size()};
  in.memories = {mems.data(), mems.size()};
  ctxcore::FormatOptions opt{memories_frame, record_pieces, to_memory_format(memory_format)};
  ctxcore::FormattedText r;
  {
    py::gil_scoped_release nogil;  // as in format_context: only C++ data from here on
    r = ctxcore::format_context(in, opt);
  }
  return to_python(r);
}

}  // namespace

void register_format(py::module_& m) {
  m.attr("MIN_NONCE_HEX_DIGITS") = ctxcore::kMinNonceHexDigits;
  m.attr("SAFETY_SENTENCE") = py::str(ctxcore::kSafetySentence.data(), ctxcore::kSafetySentence.size());
  m.attr("MIN_COMPACT_NONCE_DIGITS") = ctxcore::kMinCompactNonceDigits;
  m.attr("MIN_COMPACT_NONCE_WORDS") = ctxcore::kMinCompactNonceWords;
  m.attr("MAX_COMPACT_NONCE_WORD_LETTERS") = ctxcore::kMaxCompactNonceWordLetters;
  m.attr("COMPACT_SAFETY_SENTENCE") =
      py::str(ctxcore::kCompactSafetySentence.data(), ctxcore::kCompactSafetySentence.size());
  m.attr("FORMAT_SECTIONS") = py::make_tuple(kSectionNames[0], kSectionNames[1], kSectionNames[2], kSectionNames[3]);

  invalid_format_type.call_once_and_store_result([&]() -> py::object {
    py::object type = py::exception<ctxcore::InvalidFormatInput>(m, "InvalidFormatInput", PyExc_ValueError);
    type.attr("__doc__") =
        "Input to format_context or formatter_overhead is not valid. `section` names the section\n"
        "('directive', 'history', 'memories' or 'tools'), `index` the offending item's position in\n"
        "it (or -1), `item_id` a memory's id when it has one (or None).";
    type.attr("section") = py::none();
    type.attr("index") = -1;
    type.attr("item_id") = py::none();
    return type;
  });
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const ctxcore::InvalidFormatInput& e) {
      // Errors raised by the core itself (a C++ caller's view of the same checks).
      const py::object& type = invalid_format_type.get_stored();
      py::object exc = type(lenient_str(e.what()));
      exc.attr("section") = kSectionNames[static_cast<std::size_t>(e.section())];
      exc.attr("index") = e.index();
      exc.attr("item_id") = e.item_id().empty() ? py::none() : py::object(lenient_str(e.item_id()));
      PyErr_SetObject(type.ptr(), exc.ptr());
    }
  });

  m.def("format_context", &format_context, py::arg("directive"), py::arg("history"), py::arg("memories"),
        py::arg("tools_json"), py::arg("nonce"), py::arg("memories_frame"), py::arg("record_pieces"),
        py::arg("memory_format") = 0, "Serialize validated sections. Private: call ctxcore.format_context.");
  m.def("format_columns", &format_columns, py::arg("directive"), py::arg("history"), py::arg("ids"), py::arg("texts"),
        py::arg("scores"), py::arg("sources"), py::arg("order"), py::arg("tools_json"), py::arg("nonce"),
        py::arg("memories_frame") = false, py::arg("record_pieces") = false, py::arg("memory_format") = 0,
        py::arg("attributes") = 3, py::arg("handles") = false, py::arg("created") = py::none(),
        "Serialize with the memories given as columns. Private: used by ctxcore.assembly.");
}

}  // namespace ctxcore_py
