// Bindings for the trace's wire encoding (ctxcore/wire.hpp): a block of the assembly's
// trace rows, read from its columns, as serialized `TraceEntry` entries of a repeated
// field, ready to be merged into the response message.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>  // std::optional: a None column

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "bindings.hpp"
#include "ctxcore/wire.hpp"

namespace py = pybind11;

namespace ctxcore_py {
namespace {

using I64 = py::array_t<std::int64_t, py::array::c_style | py::array::forcecast>;
using I32 = py::array_t<std::int32_t, py::array::c_style | py::array::forcecast>;
using F64 = py::array_t<double, py::array::c_style | py::array::forcecast>;
using Bool = py::array_t<bool, py::array::c_style | py::array::forcecast>;

// A sequence's items (a list or tuple is read in place).
struct Items {
  py::object fast;
  PyObject** items;
  std::size_t n;

  Items(const py::handle& seq, const char* what) {
    fast = py::reinterpret_steal<py::object>(PySequence_Fast(seq.ptr(), what));
    if (!fast) throw py::error_already_set();
    items = PySequence_Fast_ITEMS(fast.ptr());
    n = static_cast<std::size_t>(PySequence_Fast_GET_SIZE(fast.ptr()));
  }
};

std::string_view utf8(PyObject* s, const char* what, std::size_t row) {
  if (!PyUnicode_Check(s)) {
    throw py::type_error(std::string(what) + " of trace row " + std::to_string(row) + " must be a str, got " +
                         Py_TYPE(s)->tp_name);
  }
  Py_ssize_t size = 0;
  const char* data = PyUnicode_AsUTF8AndSize(s, &size);  // cached on the str
  if (data == nullptr) throw py::error_already_set();    // a lone surrogate: not valid UTF-8
  return {data, static_cast<std::size_t>(size)};
}

template <typename A>
const typename A::value_type* column(const std::optional<A>& a, std::size_t n, const char* name) {
  if (!a) return nullptr;
  if (a->ndim() != 1 || static_cast<std::size_t>(a->shape(0)) != n) {
    throw py::value_error(std::string(name) + " must be a 1-D array of " + std::to_string(n) + " values");
  }
  return a->data();
}

py::bytes encode_trace_rows(const py::handle& ids, const py::handle& origins, const I64& at, const I32& reasons,
                            const std::optional<I64>& tokens, const std::optional<F64>& score,
                            const std::optional<F64>& relevance, const std::optional<Bool>& recounted,
                            std::int32_t hide_id_reason, std::uint32_t field, const py::handle& signals) {
  if (field == 0 || field >= (1u << 29)) throw py::value_error("field must be a protobuf field number");
  const Items id_items(ids, "ids must be a sequence");
  const Items origin_items(origins, "origins must be a sequence");
  if (at.ndim() != 1) throw py::value_error("at must be a 1-D array");
  const auto n = static_cast<std::size_t>(at.shape(0));
  const std::int64_t* rows = at.data();
  const std::int32_t* reason = column(std::optional<I32>(reasons), n, "reasons");
  const std::int64_t* tok = column(tokens, n, "tokens");
  const double* sc = column(score, n, "score");
  const double* rel = column(relevance, n, "relevance");
  const bool* rc = column(recounted, n, "recounted");
  std::optional<Items> signal_items;
  if (!signals.is_none()) {
    signal_items.emplace(signals, "signals must be a sequence");
    if (signal_items->n != n)
      throw py::value_error("signals must hold one str per trace row (" + std::to_string(n) + ")");
  }
  std::string out;
  out.reserve(n * 64);
  for (std::size_t k = 0; k < n; ++k) {
    const std::int64_t r = rows[k];
    if (r < 0 || static_cast<std::size_t>(r) >= id_items.n || static_cast<std::size_t>(r) >= origin_items.n) {
      throw py::index_error("trace row " + std::to_string(k) + " points at candidate " + std::to_string(r) +
                            ", outside the " + std::to_string(id_items.n) + " ids and " +
                            std::to_string(origin_items.n) + " origins");
    }
    ctxcore::wire::TraceEntry e;
    e.reason = reason[k];
    // Another tenant's memory ids never cross the boundary: such a row says only that
    // something was dropped, and how it was found.
    if (e.reason != hide_id_reason) e.memory_id = utf8(id_items.items[r], "the memory id", k);
    e.origin = utf8(origin_items.items[r], "the origin", k);
    e.tokens = tok != nullptr ? tok[k] : 0;
    e.score = sc != nullptr ? sc[k] : 0.0;
    e.relevance = rel != nullptr ? rel[k] : 0.0;
    e.recounted = rc != nullptr && rc[k];
    if (signal_items) e.signal = utf8(signal_items->items[k], "the signal", k);
    ctxcore::wire::append_trace_entry(out, field, e);
  }
  return py::bytes(out);
}

}  // namespace

void register_wire(py::module_& m) {
  m.def("encode_trace_rows", &encode_trace_rows, py::arg("ids"), py::arg("origins"), py::arg("at"), py::arg("reasons"),
        py::arg("tokens"), py::arg("score"), py::arg("relevance"), py::arg("recounted"), py::arg("hide_id_reason"),
        py::arg("field"), py::arg("signals") = py::none(),
        "Trace rows (row k is candidate at[k] of ids/origins; reasons are wire enum values; a None\n"
        "column is zeros; signals, when given, one str per row) as serialized entries of repeated field `field`. "
        "Private: used by\n"
        "ctxcore.service.convert.");
}

}  // namespace ctxcore_py
