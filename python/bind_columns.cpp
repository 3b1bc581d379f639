// Bindings that turn a sequence of memory records into columns in one C-level pass.
//
// The request path handles thousands of `ctxcore.MemoryRecord` objects per call. Reading
// their fields attribute by attribute in Python costs a bytecode loop per field; here one
// loop reads every field the assembly needs (the records are validated when they are
// built, so only their type is checked) and returns lists of the str fields and numpy
// arrays of the numbers, which the rest of the pipeline gates, prices and packs as arrays.
#include <pybind11/gil_safe_call_once.h>
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <structmember.h>  // PyMemberDescrObject, T_OBJECT_EX (after Python.h, via pybind11)

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <tuple>
#include <utility>

#include "bindings.hpp"
#include "ctxcore/packer.hpp"

namespace py = pybind11;

namespace ctxcore_py {
namespace {

struct Names {
  py::str id, organization_id, agent_id, text, origin, similarity, confidence, importance, created_at, exact_tokens,
      fulltext_score;
};

const Names& names() {
  PYBIND11_CONSTINIT static py::gil_safe_call_once_and_store<Names> storage;
  return storage
      .call_once_and_store_result([]() {
        // Interned, as attribute names must be for the type attribute cache to serve them.
        const auto interned = [](const char* name) {
          return py::reinterpret_steal<py::str>(PyUnicode_InternFromString(name));
        };
        Names n;
        n.id = interned("id");
        n.organization_id = interned("organization_id");
        n.agent_id = interned("agent_id");
        n.text = interned("text");
        n.origin = interned("origin");
        n.similarity = interned("similarity");
        n.confidence = interned("confidence");
        n.importance = interned("importance");
        n.created_at = interned("created_at");
        n.exact_tokens = interned("exact_tokens");
        n.fulltext_score = interned("fulltext_score");
        return n;
      })
      .get_stored();
}

std::string type_name(py::handle obj) { return py::str(py::type::of(obj).attr("__name__")); }

py::object attr(py::handle obj, const py::str& name) {
  PyObject* v = PyObject_GetAttr(obj.ptr(), name.ptr());
  if (v == nullptr) throw py::error_already_set();
  return py::reinterpret_steal<py::object>(v);
}

// Reads one field of a record: straight from its slot when the item is exactly the
// record type and the type stores the field in a slot (what the interpreter's own
// specialized attribute load does), else through the generic attribute protocol (a
// subclass, or a type without slots).
class Field {
 public:
  Field(const py::handle& type, const py::str& name) : type_(type.ptr()), name_(name) {
    PyObject* d = PyObject_GetAttr(type.ptr(), name.ptr());
    if (d == nullptr) {
      PyErr_Clear();
      return;
    }
    if (Py_IS_TYPE(d, &PyMemberDescr_Type)) {
      auto* member = reinterpret_cast<PyMemberDescrObject*>(d);
      if (member->d_common.d_type == reinterpret_cast<PyTypeObject*>(type_) && member->d_member->type == T_OBJECT_EX)
        offset_ = member->d_member->offset;
    }
    Py_DECREF(d);
  }

  // A new reference to the field's value of `item`.
  py::object operator()(py::handle item) const {
    if (offset_ >= 0 && Py_TYPE(item.ptr()) == reinterpret_cast<PyTypeObject*>(type_)) {
      PyObject* v = *reinterpret_cast<PyObject**>(reinterpret_cast<char*>(item.ptr()) + offset_);
      if (v != nullptr) return py::reinterpret_borrow<py::object>(v);
    }
    return attr(item, name_);
  }

 private:
  PyObject* type_;
  const py::str& name_;
  Py_ssize_t offset_ = -1;
};

// A sequence as a list or tuple (PySequence_Fast), with its items.
struct Fast {
  py::object seq;
  PyObject** items;
  std::size_t n;
};

Fast fast(const py::handle& seq, const char* what) {
  PyObject* raw = PySequence_Fast(seq.ptr(), what);
  if (raw == nullptr) throw py::error_already_set();
  Fast f{py::reinterpret_steal<py::object>(raw), PySequence_Fast_ITEMS(raw),
         static_cast<std::size_t>(PySequence_Fast_GET_SIZE(raw))};
  return f;
}

void check_type(py::handle item, const py::handle& record_type, std::size_t i) {
  if (Py_TYPE(item.ptr()) == reinterpret_cast<PyTypeObject*>(record_type.ptr())) return;
  const int ok = PyObject_IsInstance(item.ptr(), record_type.ptr());
  if (ok < 0) throw py::error_already_set();
  if (ok == 0) throw py::type_error("item " + std::to_string(i) + " is " + type_name(item) + ", not a MemoryRecord");
}

bool equal(py::handle a, py::handle b) {
  if (a.ptr() == b.ptr()) return true;
  const int r = PyObject_RichCompareBool(a.ptr(), b.ptr(), Py_EQ);
  if (r < 0) throw py::error_already_set();
  return r == 1;
}

// Splits records into those of (organization, agent) and the rest, in order; raises
// TypeError naming the first item that is not a `record_type`.
std::pair<py::list, py::list> split_scope(const py::object& records, const py::object& record_type,
                                          const py::str& organization, const py::str& agent) {
  const Names& nm = names();
  const Fast f = fast(records, "expected a sequence of MemoryRecord");
  const Field org_of(record_type, nm.organization_id), agent_of(record_type, nm.agent_id);
  py::list ok(0);
  py::list foreign(0);
  for (std::size_t i = 0; i < f.n; ++i) {
    const py::handle item(f.items[i]);
    check_type(item, record_type, i);
    const bool mine = equal(org_of(item), organization) && equal(agent_of(item), agent);
    if (PyList_Append(mine ? ok.ptr() : foreign.ptr(), item.ptr()) != 0) throw py::error_already_set();
  }
  return {std::move(ok), std::move(foreign)};
}

// A float field: NaN for None.
double number(const py::object& v, const char* what, std::size_t i) {
  if (v.is_none()) return std::numeric_limits<double>::quiet_NaN();
  if (PyFloat_CheckExact(v.ptr())) return PyFloat_AS_DOUBLE(v.ptr());
  const double d = PyFloat_AsDouble(v.ptr());
  if (d == -1.0 && PyErr_Occurred()) {
    PyErr_Clear();
    throw py::type_error("item " + std::to_string(i) + ": " + what + " is " + type_name(v) + ", not a number");
  }
  return d;
}

// The stored exact count of `family` in a record's exact_tokens mapping, -1 when absent.
std::int64_t stored_count(const py::object& counts, const py::str& family, std::size_t i) {
  if (counts.is_none()) return -1;
  PyObject* v = nullptr;
  py::object held;
  if (PyDict_CheckExact(counts.ptr())) {
    v = PyDict_GetItemWithError(counts.ptr(), family.ptr());
    if (v == nullptr) {
      if (PyErr_Occurred()) throw py::error_already_set();
      return -1;
    }
  } else {
    v = PyObject_GetItem(counts.ptr(), family.ptr());
    if (v == nullptr) {
      if (!PyErr_ExceptionMatches(PyExc_KeyError)) throw py::error_already_set();
      PyErr_Clear();
      return -1;
    }
    held = py::reinterpret_steal<py::object>(v);
  }
  const std::string where = "item " + std::to_string(i) + ": exact_tokens[" + std::string(family) + "]";
  if (!PyLong_Check(v) || PyBool_Check(v)) throw py::type_error(where + " is " + type_name(v) + ", not an int");
  const long long n = PyLong_AsLongLong(v);
  if (n == -1 && PyErr_Occurred()) {
    PyErr_Clear();
    throw py::value_error(where + " is beyond 2**40");
  }
  if (n < 0) throw py::value_error(where + " is negative");
  if (n > ctxcore::kMaxTokens) throw py::value_error(where + " is beyond 2**40");
  return n;
}

// The index of `value` in `distinct`, appended when new.
std::int64_t code_of(py::list& distinct, const py::object& value) {
  const Py_ssize_t n = PyList_GET_SIZE(distinct.ptr());
  for (Py_ssize_t k = 0; k < n; ++k)
    if (PyList_GET_ITEM(distinct.ptr(), k) == value.ptr()) return k;
  for (Py_ssize_t k = 0; k < n; ++k)
    if (equal(PyList_GET_ITEM(distinct.ptr(), k), value)) return k;
  if (PyList_Append(distinct.ptr(), value.ptr()) != 0) throw py::error_already_set();
  return n;
}

using Columns = std::tuple<py::list, py::list, py::list, py::array_t<double>, py::array_t<double>, py::array_t<double>,
                           py::array_t<double>, py::array_t<std::int64_t>, py::list, py::array_t<std::int64_t>,
                           py::array_t<double>>;

// (ids, texts, origins, similarity, confidence, importance, created_at, stored counts of
// `family`, the distinct origins, each record's index into them, full-text score) of records of
// `record_type`; NaN for a None number, -1 for no stored count. Origins are few (an enum's
// members): each is matched by identity first, then by equality.
Columns memory_columns(const py::object& records, const py::object& record_type, const py::str& family) {
  const Names& nm = names();
  const Fast f = fast(records, "expected a sequence of MemoryRecord");
  const Field id_of(record_type, nm.id), text_of(record_type, nm.text), origin_of(record_type, nm.origin),
      similarity_of(record_type, nm.similarity), confidence_of(record_type, nm.confidence),
      importance_of(record_type, nm.importance), created_of(record_type, nm.created_at),
      counts_of(record_type, nm.exact_tokens), fulltext_of(record_type, nm.fulltext_score);
  const auto n = static_cast<py::ssize_t>(f.n);
  py::list ids(n), texts(n), origins(n);
  py::array_t<double> sim(n), conf(n), imp(n), created(n), fulltext(n);
  py::array_t<std::int64_t> stored(n), origin_code(n);
  py::list distinct(0);
  std::int64_t* oc = origin_code.mutable_data();
  double* s = sim.mutable_data();
  double* c = conf.mutable_data();
  double* im = imp.mutable_data();
  double* cr = created.mutable_data();
  double* ft = fulltext.mutable_data();
  std::int64_t* st = stored.mutable_data();
  for (std::size_t i = 0; i < f.n; ++i) {
    const py::handle item(f.items[i]);
    check_type(item, record_type, i);
    const auto k = static_cast<py::ssize_t>(i);
    PyList_SET_ITEM(ids.ptr(), k, id_of(item).release().ptr());
    PyList_SET_ITEM(texts.ptr(), k, text_of(item).release().ptr());
    py::object origin = origin_of(item);
    oc[i] = code_of(distinct, origin);
    PyList_SET_ITEM(origins.ptr(), k, origin.release().ptr());
    s[i] = number(similarity_of(item), "similarity", i);
    c[i] = number(confidence_of(item), "confidence", i);
    im[i] = number(importance_of(item), "importance", i);
    cr[i] = number(created_of(item), "created_at", i);
    st[i] = stored_count(counts_of(item), family, i);
    ft[i] = number(fulltext_of(item), "fulltext_score", i);
  }
  return {std::move(ids),      std::move(texts),       std::move(origins), std::move(sim),
          std::move(conf),     std::move(imp),         std::move(created), std::move(stored),
          std::move(distinct), std::move(origin_code), std::move(fulltext)};
}

// The index of the first value that is infinite, NaN (unless `allow_nan`) or outside
// [low, high]; -1 when every value passes. One pass over a float64 column, where the
// same checks in numpy are a temporary array and a reduction each.
py::ssize_t first_outside(const py::array_t<double, py::array::c_style | py::array::forcecast>& values, double low,
                          double high, bool allow_nan) {
  if (values.ndim() != 1) throw py::value_error("first_outside: values must be one-dimensional");
  const double* v = values.data();
  const py::ssize_t n = values.shape(0);
  for (py::ssize_t i = 0; i < n; ++i) {
    const double x = v[i];
    if (std::isnan(x)) {
      if (!allow_nan) return i;
      continue;
    }
    if (std::isinf(x) || x < low || x > high) return i;
  }
  return -1;
}

}  // namespace

void register_columns(py::module_& m) {
  m.def("split_scope", &split_scope, py::arg("records"), py::arg("record_type"), py::arg("organization"),
        py::arg("agent"), "Split records into (in scope, out of scope). Private: used by ctxcore.retrieval.");
  m.def("memory_columns", &memory_columns, py::arg("records"), py::arg("record_type"), py::arg("family"),
        "The records' fields as columns. Private: used by ctxcore.assembly.");
  m.def("first_outside", &first_outside, py::arg("values"), py::arg("low"), py::arg("high"),
        py::arg("allow_nan") = true,
        "Index of the first infinite, NaN (unless allowed) or out-of-range value, or -1. Private: used by "
        "ctxcore.memory.");
}

}  // namespace ctxcore_py
