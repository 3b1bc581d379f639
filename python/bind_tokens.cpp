// Binding for the token estimator: an Estimator object holds one family's calibrated
// tables (converted and validated once) and estimates one text or a batch. Texts are read
// in place from the str objects' own code-point storage: no copy, no UTF-8 encoding.
// The per-text path is a plain C function (Estimator.counter) that returns the count
// object itself, since for short texts the call costs more than the scan, reached from
// ctxcore.estimate_tokens without a Python frame (fast_estimate).
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <structmember.h>  // after Python.h, which pybind11 includes

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "bindings.hpp"
#include "ctxcore/estimator.hpp"

namespace py = pybind11;

namespace ctxcore_py {
namespace {

using U16Array = py::array_t<std::uint16_t, py::array::c_style | py::array::forcecast>;
using U32Array = py::array_t<std::uint32_t, py::array::c_style | py::array::forcecast>;
using I64Array = py::array_t<std::int64_t, py::array::c_style | py::array::forcecast>;
using BoolArray = py::array_t<bool, py::array::c_style | py::array::forcecast>;
using U8Array = py::array_t<std::uint8_t, py::array::c_style | py::array::forcecast>;

// The code points of a str, as the core reads them. CPython stores every str as fixed-width
// units of 1, 2 or 4 bytes; lone surrogates are just code points there.
ctxcore::CodePoints code_points(const py::handle& obj, std::size_t index) {
  if (!PyUnicode_Check(obj.ptr())) {
    throw py::type_error("text at index " + std::to_string(index) + " must be str, got " +
                         std::string(py::str(py::type::of(obj).attr("__name__"))));
  }
#if PY_VERSION_HEX < 0x030C0000
  if (PyUnicode_READY(obj.ptr()) != 0) throw py::error_already_set();
#endif
  return {PyUnicode_DATA(obj.ptr()), static_cast<std::size_t>(PyUnicode_GET_LENGTH(obj.ptr())),
          static_cast<unsigned>(PyUnicode_KIND(obj.ptr()))};
}

char32_t single_code_point(const py::str& s, const char* name) {
  const ctxcore::CodePoints t = code_points(s, 0);
  if (t.size != 1) throw std::invalid_argument(std::string(name) + " must be one character");
  switch (t.width) {
    case 1:
      return static_cast<const std::uint8_t*>(t.data)[0];
    case 2:
      return static_cast<const std::uint16_t*>(t.data)[0];
    default:
      return static_cast<const std::uint32_t*>(t.data)[0];
  }
}

template <class T>
std::vector<T> to_vector(const py::array_t<T, py::array::c_style | py::array::forcecast>& a, const char* name) {
  if (a.ndim() != 1) throw std::invalid_argument(std::string(name) + " must be a 1-D array");
  return {a.data(), a.data() + a.shape(0)};
}

// Below this many code points, releasing and re-taking the GIL costs more than the
// estimate itself, so short texts keep it; the batch form always releases it.
constexpr std::size_t kReleaseGilCodePoints = 16 * 1024;
// A counter keeps the result objects of estimates below this many tokens, built once each.
constexpr std::size_t kCachedCounts = 4096;

std::int64_t estimate_one(const ctxcore::CodePoints& t, const ctxcore::EstimatorParams& params) {
  if (t.size < kReleaseGilCodePoints) return ctxcore::estimate_tokens(t, params);
  // Safe: the caller holds a reference to the str for the whole call; str objects are
  // immutable, and the scan touches no Python object.
  py::gil_scoped_release nogil;
  return ctxcore::estimate_tokens(t, params);
}

// The texts of a list or tuple (or other sequence), each checked to be a str, with a
// reference held on each: its storage must outlive the GIL-free section even if another
// thread mutates the caller's list meanwhile.
class Texts {
 public:
  explicit Texts(const py::handle& texts) {
    if (PyUnicode_Check(texts.ptr())) throw py::type_error("texts must be a sequence of str, not a str");
    seq_ = py::reinterpret_steal<py::object>(PySequence_Fast(texts.ptr(), "texts must be a sequence of str"));
    if (!seq_) throw py::error_already_set();
    const auto n = static_cast<std::size_t>(PySequence_Fast_GET_SIZE(seq_.ptr()));
    PyObject** items = PySequence_Fast_ITEMS(seq_.ptr());
    items_.reserve(n);
    views_.reserve(n);
    for (std::size_t i = 0; i < n; ++i) {
      views_.push_back(code_points(items[i], i));
      Py_INCREF(items[i]);
      items_.push_back(items[i]);
    }
  }
  ~Texts() {
    for (PyObject* o : items_) Py_DECREF(o);
  }
  Texts(const Texts&) = delete;
  Texts& operator=(const Texts&) = delete;
  const std::vector<ctxcore::CodePoints>& views() const { return views_; }

 private:
  py::object seq_;
  std::vector<PyObject*> items_;
  std::vector<ctxcore::CodePoints> views_;
};

// The state behind a counter (Estimator.counter): one text in, one count object out, with
// no argument parsing on the way. Lives in a capsule that is the function's `self`.
struct CounterState {
  py::object owner;  // the Estimator whose params are read
  const ctxcore::EstimatorParams* params = nullptr;
  py::object make;  // value -> count object
  std::vector<py::object> cache;
};

constexpr const char* kCounterCapsule = "ctxcore._core.estimate_counter";

void counter_free(PyObject* capsule) {
  delete static_cast<CounterState*>(PyCapsule_GetPointer(capsule, kCounterCapsule));
}

PyObject* counter_call(PyObject* self, PyObject* text) {
  auto* state = static_cast<CounterState*>(PyCapsule_GetPointer(self, kCounterCapsule));
  if (state == nullptr) return nullptr;
  if (!PyUnicode_Check(text)) {
    PyObject* name = PyType_GetName(Py_TYPE(text));
    if (name == nullptr) return nullptr;
    PyErr_Format(PyExc_TypeError, "text must be a str, got %U", name);
    Py_DECREF(name);
    return nullptr;
  }
  try {
    const std::int64_t v = estimate_one(code_points(text, 0), *state->params);
    const auto index = static_cast<std::size_t>(v);
    if (index < kCachedCounts && state->cache[index]) return state->cache[index].inc_ref().ptr();
    py::object made = state->make(v);
    // Safe to share: a count object is immutable (the caller's factory makes frozen ones).
    if (index < kCachedCounts) state->cache[index] = made;
    return made.release().ptr();
  } catch (py::error_already_set& e) {
    e.restore();
    return nullptr;
  } catch (const std::exception& e) {
    PyErr_SetString(PyExc_RuntimeError, e.what());
    return nullptr;
  }
}

PyMethodDef counter_def = {"estimate_count", counter_call, METH_O,
                           "The estimate of one str, as the object the counter's factory makes of it."};

// ctxcore.estimate_tokens(text, family) without a Python frame: a callable object that finds
// the family's counter (Estimator.counter) in `counters`, the dict ctxcore.tokens keeps them
// in, and calls it directly. Everything else (a family with no counter yet, keywords, a
// family that is no str, a counter of another kind) goes to `fallback`, the Python function
// that defines the behaviour, which also lends the object its name, documentation and
// signature (functools.update_wrapper, on the object's own __dict__).
struct FastEstimate {
  PyObject ob_base;  // PyObject_HEAD
  vectorcallfunc vectorcall;
  PyObject* counters;  // dict: family -> counter
  PyObject* fallback;  // the Python function
  PyObject* dict;      // __dict__
};

PyObject* fast_estimate_call(PyObject* callable, PyObject* const* args, std::size_t nargsf, PyObject* kwnames) {
  auto* self = reinterpret_cast<FastEstimate*>(callable);
  if (PyVectorcall_NARGS(nargsf) == 2 && kwnames == nullptr && PyUnicode_CheckExact(args[1])) {
    PyObject* counter = PyDict_GetItemWithError(self->counters, args[1]);  // borrowed
    if (counter != nullptr) {
      // Held for the call: making the count runs Python code, which may drop the counter.
      Py_INCREF(counter);
      PyObject* result = PyCFunction_Check(counter) && PyCFunction_GET_FUNCTION(counter) == counter_call
                             ? counter_call(PyCFunction_GET_SELF(counter), args[0])
                             : PyObject_CallOneArg(counter, args[0]);
      Py_DECREF(counter);
      return result;
    }
    if (PyErr_Occurred()) return nullptr;
  }
  return PyObject_Vectorcall(self->fallback, args, nargsf, kwnames);
}

int fast_estimate_traverse(PyObject* o, visitproc visit, void* arg) {
  auto* self = reinterpret_cast<FastEstimate*>(o);
  Py_VISIT(Py_TYPE(o));
  Py_VISIT(self->counters);
  Py_VISIT(self->fallback);
  Py_VISIT(self->dict);
  return 0;
}

int fast_estimate_clear(PyObject* o) {
  auto* self = reinterpret_cast<FastEstimate*>(o);
  Py_CLEAR(self->counters);
  Py_CLEAR(self->fallback);
  Py_CLEAR(self->dict);
  return 0;
}

void fast_estimate_dealloc(PyObject* o) {
  PyTypeObject* type = Py_TYPE(o);
  PyObject_GC_UnTrack(o);
  fast_estimate_clear(o);
  type->tp_free(o);
  Py_DECREF(type);
}

// Pickled by reference, as the function it stands for is.
PyObject* fast_estimate_reduce(PyObject* o, PyObject*) { return PyObject_GetAttrString(o, "__qualname__"); }

PyMemberDef fast_estimate_members[] = {
    {"__vectorcalloffset__", T_PYSSIZET, offsetof(FastEstimate, vectorcall), READONLY, nullptr},
    {"__dictoffset__", T_PYSSIZET, offsetof(FastEstimate, dict), READONLY, nullptr},
    {nullptr, 0, 0, 0, nullptr},
};
PyGetSetDef fast_estimate_getset[] = {
    {"__dict__", PyObject_GenericGetDict, PyObject_GenericSetDict, nullptr, nullptr},
    {nullptr, nullptr, nullptr, nullptr, nullptr},
};
PyMethodDef fast_estimate_methods[] = {
    {"__reduce__", fast_estimate_reduce, METH_NOARGS, nullptr},
    {nullptr, nullptr, 0, nullptr},
};
PyType_Slot fast_estimate_slots[] = {
    {Py_tp_dealloc, reinterpret_cast<void*>(fast_estimate_dealloc)},
    {Py_tp_traverse, reinterpret_cast<void*>(fast_estimate_traverse)},
    {Py_tp_clear, reinterpret_cast<void*>(fast_estimate_clear)},
    {Py_tp_call, reinterpret_cast<void*>(PyVectorcall_Call)},
    {Py_tp_members, fast_estimate_members},
    {Py_tp_getset, fast_estimate_getset},
    {Py_tp_methods, fast_estimate_methods},
    {0, nullptr},
};
PyType_Spec fast_estimate_spec = {"ctxcore._core.FastEstimate", sizeof(FastEstimate), 0,
                                  Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL,
                                  fast_estimate_slots};

py::object fast_estimate(const py::dict& counters, const py::function& fallback) {
  static PyObject* type = PyType_FromSpec(&fast_estimate_spec);  // lives as long as the module
  if (type == nullptr) throw py::error_already_set();
  auto* self = PyObject_GC_New(FastEstimate, reinterpret_cast<PyTypeObject*>(type));
  if (self == nullptr) throw py::error_already_set();
  Py_INCREF(type);  // each instance holds its heap type
  self->vectorcall = fast_estimate_call;
  self->counters = counters.inc_ref().ptr();
  self->fallback = fallback.inc_ref().ptr();
  self->dict = nullptr;
  PyObject_GC_Track(self);
  return py::reinterpret_steal<py::object>(reinterpret_cast<PyObject*>(self));
}

class Estimator {
 public:
  Estimator(unsigned pair_bits, const U16Array& latin_costs, const U32Array& pair_entries, const U16Array& block_costs,
            double scale, double spread, unsigned word_mode, const U8Array& char_classes, const py::bytes& words,
            std::uint32_t word_cost, double word_scale) {
    params_.pair_bits = pair_bits;
    params_.latin_costs = to_vector(latin_costs, "latin_costs");
    params_.pair_entries = to_vector(pair_entries, "pair_entries");
    params_.block_costs = to_vector(block_costs, "block_costs");
    params_.scale = scale;
    params_.spread = spread;
    params_.word_scale = word_scale;
    ctxcore::set_words(params_, word_mode, to_vector(char_classes, "char_classes"),
                       static_cast<std::string_view>(words), word_cost);
    ctxcore::prepare(params_);
  }

  std::int64_t estimate(const py::handle& text) const { return estimate_one(code_points(text, 0), params_); }

  py::array_t<std::int64_t> estimate_batch(const py::handle& texts) const {
    const Texts held(texts);
    const auto& views = held.views();
    py::array_t<std::int64_t> out(static_cast<py::ssize_t>(views.size()));
    std::int64_t* dst = out.mutable_data();
    {
      // Safe: every text is kept alive by `held` and is immutable; `out` is ours alone;
      // the scan creates and frees no Python object.
      py::gil_scoped_release nogil;
      ctxcore::estimate_tokens_batch(ctxcore::View<ctxcore::CodePoints>{views.data(), views.size()}, params_, dst);
    }
    return out;
  }

  // A function of one str that returns make(estimate), for the per-text path: a plain
  // C function (no pybind11 argument parsing), whose results below kCachedCounts are
  // built once and shared.
  static py::object counter(const py::object& self, const py::function& make) {
    auto state = std::make_unique<CounterState>();
    state->owner = self;
    state->params = &self.cast<const Estimator&>().params_;
    state->make = make;
    state->cache.resize(kCachedCounts);
    py::capsule capsule(state.get(), kCounterCapsule, &counter_free);
    state.release();  // the capsule owns it now
    PyObject* fn = PyCFunction_New(&counter_def, capsule.ptr());
    if (fn == nullptr) throw py::error_already_set();
    return py::reinterpret_steal<py::object>(fn);
  }

  // Prices the formatter's pieces of `text` (see ctxcore::price_pieces).
  py::array_t<std::int64_t> price_pieces(const py::str& text, const I64Array& ends, const BoolArray& any_prefix,
                                         const py::str& prefix_a, const py::str& prefix_b) const {
    const ctxcore::CodePoints t = code_points(text, 0);
    if (ends.ndim() != 1 || any_prefix.ndim() != 1) throw std::invalid_argument("ends and any_prefix must be 1-D");
    const char32_t a = single_code_point(prefix_a, "prefix_a");
    const char32_t b = single_code_point(prefix_b, "prefix_b");
    const auto n = static_cast<std::size_t>(ends.shape(0));
    py::array_t<std::int64_t> out(static_cast<py::ssize_t>(n));
    std::int64_t* dst = out.mutable_data();
    const ctxcore::View<std::int64_t> e{ends.data(), n};
    // bool is one byte here; reading it through unsigned char is always allowed.
    const ctxcore::View<std::uint8_t> f{reinterpret_cast<const std::uint8_t*>(any_prefix.data()),
                                        static_cast<std::size_t>(any_prefix.shape(0))};
    {
      // Safe: `text` and the arrays are held by the caller's frame (str is immutable;
      // the arrays were converted above and are ours), `out` is ours alone, and the scan
      // creates and frees no Python object.
      py::gil_scoped_release nogil;
      ctxcore::price_pieces(t, e, f, a, b, params_, dst);
    }
    return out;
  }

  // Each text's raw cost in cost units (before the margin), one row (units, sure) each:
  // the whole cost and the part of it priced as whole vocabulary words. For the calibration.
  py::array_t<std::uint64_t> raw_batch(const py::sequence& texts) const {
    if (py::isinstance<py::str>(texts)) throw py::type_error("texts must be a sequence of str, not a str");
    const std::size_t n = py::len(texts);
    py::array_t<std::uint64_t> out({static_cast<py::ssize_t>(n), py::ssize_t{2}});
    std::uint64_t* dst = out.mutable_data();
    for (std::size_t i = 0; i < n; ++i) {
      py::object item = texts[i];
      const ctxcore::RawCost r = ctxcore::raw_cost(code_points(item, i), params_);
      dst[2 * i] = r.units;
      dst[2 * i + 1] = r.sure;
    }
    return out;
  }

  // The words the word model prices in `text`, one row (begin, end, found) each, in
  // code-point offsets. For the calibration.
  py::array_t<std::int64_t> words(const py::str& text) const {
    std::vector<std::int64_t> rows;
    ctxcore::for_each_word(code_points(text, 0), params_, [&](std::size_t b, std::size_t e, bool found) {
      rows.push_back(static_cast<std::int64_t>(b));
      rows.push_back(static_cast<std::int64_t>(e));
      rows.push_back(found ? 1 : 0);
    });
    py::array_t<std::int64_t> out({static_cast<py::ssize_t>(rows.size() / 3), py::ssize_t{3}});
    std::copy(rows.begin(), rows.end(), out.mutable_data());
    return out;
  }

  unsigned word_mode() const { return params_.words.mode; }
  unsigned pair_bits() const { return params_.pair_bits; }
  double scale() const { return params_.scale; }
  double spread() const { return params_.spread; }
  double word_scale() const { return params_.word_scale; }

 private:
  ctxcore::EstimatorParams params_;
};

template <class Unit>
void fill_buckets(const Unit* cps, std::size_t n, unsigned bits, std::uint64_t* pair, std::uint32_t* block) {
  char32_t prev = 0;
  for (std::size_t i = 0; i < n; ++i) {
    const auto cp = static_cast<char32_t>(cps[i]);
    // One number per pair: the direct index, or (tag << bits | index) + kLatinPairs.
    const ctxcore::PairSlot slot = ctxcore::pair_slot(prev, cp, bits);
    pair[i] = slot.direct ? slot.index : ctxcore::kLatinPairs + ((std::uint64_t{slot.tag} << bits) | slot.index);
    block[i] = static_cast<std::uint32_t>(ctxcore::block_of(cp));
    prev = cp;
  }
}

// Per code point of `text`: its packed pair number and its block. What the calibration
// averages exact token starts over; private.
std::pair<py::array_t<std::uint64_t>, py::array_t<std::uint32_t>> estimator_buckets(const py::str& text,
                                                                                    unsigned bits) {
  if (bits < ctxcore::kMinPairBits || bits > ctxcore::kMaxPairBits)
    throw std::invalid_argument("bits must be in [" + std::to_string(ctxcore::kMinPairBits) + ", " +
                                std::to_string(ctxcore::kMaxPairBits) + "], got " + std::to_string(bits));
  const ctxcore::CodePoints t = code_points(text, 0);
  py::array_t<std::uint64_t> pair(static_cast<py::ssize_t>(t.size));
  py::array_t<std::uint32_t> block(static_cast<py::ssize_t>(t.size));
  switch (t.width) {
    case 1:
      fill_buckets(static_cast<const std::uint8_t*>(t.data), t.size, bits, pair.mutable_data(), block.mutable_data());
      break;
    case 2:
      fill_buckets(static_cast<const std::uint16_t*>(t.data), t.size, bits, pair.mutable_data(), block.mutable_data());
      break;
    default:
      fill_buckets(static_cast<const std::uint32_t*>(t.data), t.size, bits, pair.mutable_data(), block.mutable_data());
      break;
  }
  return {pair, block};
}

}  // namespace

void register_tokens(py::module_& m) {
  m.attr("ESTIMATOR_BLOCKS") = ctxcore::kBlocks;
  m.attr("ESTIMATOR_LATIN_PAIRS") = ctxcore::kLatinPairs;
  m.attr("ESTIMATOR_COST_UNIT") = ctxcore::kCostUnit;
  m.attr("ESTIMATOR_UNSEEN_PAIR") = ctxcore::kUnseenPair;
  m.attr("ESTIMATOR_CLASS_LIMIT") = ctxcore::kClassLimit;
  py::class_<Estimator>(m, "Estimator", "One tokenizer family's estimator. Private: use ctxcore.estimate_tokens.")
      .def(py::init<unsigned, const U16Array&, const U32Array&, const U16Array&, double, double, unsigned,
                    const U8Array&, const py::bytes&, std::uint32_t, double>(),
           py::arg("pair_bits"), py::arg("latin_costs"), py::arg("pair_entries"), py::arg("block_costs"),
           py::arg("scale"), py::arg("spread"), py::kw_only(), py::arg("word_mode") = 0,
           py::arg("char_classes") = U8Array(0), py::arg("words") = py::bytes(""), py::arg("word_cost") = 0,
           py::arg("word_scale") = 1.0)
      .def("raw_batch", &Estimator::raw_batch, py::arg("texts"))
      .def("words", &Estimator::words, py::arg("text"))
      .def_property_readonly("word_mode", &Estimator::word_mode)
      .def("estimate", &Estimator::estimate, py::arg("text"))
      .def("estimate_batch", &Estimator::estimate_batch, py::arg("texts"))
      .def("counter", &Estimator::counter, py::arg("make"))
      .def("price_pieces", &Estimator::price_pieces, py::arg("text"), py::arg("ends"), py::arg("any_prefix"),
           py::arg("prefix_a"), py::arg("prefix_b"))
      .def_property_readonly("pair_bits", &Estimator::pair_bits)
      .def_property_readonly("scale", &Estimator::scale)
      .def_property_readonly("spread", &Estimator::spread)
      .def_property_readonly("word_scale", &Estimator::word_scale);
  m.def("fast_estimate", &fast_estimate, py::arg("counters"), py::arg("fallback"),
        "estimate_tokens without a Python frame: the counter of `counters[family]`, else `fallback`. "
        "Private: used by ctxcore.tokens.");
  m.def("estimator_buckets", &estimator_buckets, py::arg("text"), py::arg("bits"),
        "Per code point: packed pair number and block. Private: used by the calibration.");
}

}  // namespace ctxcore_py
