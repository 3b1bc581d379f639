// Binding for the packer: ids (a list or tuple of str) and numpy arrays in, a result
// object whose arrays are views into the C++ vectors it owns.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <string>
#include <string_view>
#include <vector>

#include "bindings.hpp"
#include "ctxcore/packer.hpp"

namespace py = pybind11;

namespace ctxcore_py {
namespace {

using Int64Array = py::array_t<std::int64_t, py::array::c_style | py::array::forcecast>;
using DoubleArray = py::array_t<double, py::array::c_style | py::array::forcecast>;
using BoolArray = py::array_t<bool, py::array::c_style | py::array::forcecast>;

template <class T>
ctxcore::View<T> view_1d(const py::array_t<T, py::array::c_style | py::array::forcecast>& a, const char* name) {
  if (a.ndim() != 1)
    throw ctxcore::InvalidCandidate(std::string(name) + " must be 1-D, got " + std::to_string(a.ndim()) + " dimensions",
                                    -1, "");
  return {a.data(), static_cast<std::size_t>(a.shape(0))};
}

// A result that owns its vectors; `indices` and `reasons` are numpy views kept alive by it.
// `ids` is the selected id objects themselves, in emit order, built in C++ beside the pack.
struct PackOutput {
  ctxcore::PackResult r;
  py::tuple ids;
  py::tuple candidate_ids;  // every input id, input order: the tuple the packer read
};

PackOutput pack_arrays(const py::sequence& ids, const Int64Array& tokens, const DoubleArray& scores,
                       const py::object& pinned, std::int64_t budget, std::int64_t bucket_tokens,
                       std::int64_t cell_ceiling, std::int64_t search_node_limit, std::int64_t core_cell_limit,
                       double rank_tolerance, const py::object& groups) {
  if (!py::isinstance<py::list>(ids) && !py::isinstance<py::tuple>(ids))
    throw py::type_error("ids must be a list or tuple of str");
  // A tuple of the ids holds a reference to each: the UTF-8 buffers below belong to the
  // str objects, and must outlive the GIL-free section even if another thread mutates the
  // caller's list. A list is copied into one (a pointer copy); a tuple is used as it is.
  py::tuple id_tuple = PyTuple_CheckExact(ids.ptr()) ? py::reinterpret_borrow<py::tuple>(ids)
                                                     : py::reinterpret_steal<py::tuple>(PySequence_Tuple(ids.ptr()));
  if (!id_tuple) throw py::error_already_set();
  const std::size_t n = static_cast<std::size_t>(PyTuple_GET_SIZE(id_tuple.ptr()));
  PyObject** items = &PyTuple_GET_ITEM(id_tuple.ptr(), 0);
  std::vector<std::string_view> views;
  views.reserve(n);
  for (std::size_t i = 0; i < n; ++i) {
    PyObject* item = items[i];
    if (PyUnicode_CheckExact(item) && PyUnicode_IS_COMPACT_ASCII(item)) {
      // ASCII text is its own UTF-8: read the buffer in place (what PyUnicode_AsUTF8AndSize
      // returns for such a str, without the call).
      views.emplace_back(static_cast<const char*>(PyUnicode_DATA(item)),
                         static_cast<std::size_t>(PyUnicode_GET_LENGTH(item)));
      continue;
    }
    if (!PyUnicode_Check(item)) {
      throw ctxcore::InvalidCandidate(
          "candidate at index " + std::to_string(i) + ": id must be str, got " + std::string(Py_TYPE(item)->tp_name),
          static_cast<std::int64_t>(i), "");
    }
    Py_ssize_t size = 0;
    const char* utf8 = PyUnicode_AsUTF8AndSize(item, &size);
    if (utf8 == nullptr) {
      PyErr_Clear();
      throw ctxcore::InvalidCandidate(
          "candidate at index " + std::to_string(i) + ": id is not encodable as UTF-8 (lone surrogate)",
          static_cast<std::int64_t>(i), "");
    }
    views.emplace_back(utf8, static_cast<std::size_t>(size));
  }
  ctxcore::PackInput in;
  in.ids = {views.data(), views.size()};
  in.tokens = view_1d(tokens, "tokens");
  in.scores = view_1d(scores, "scores");
  BoolArray pinned_array;
  if (!pinned.is_none()) {
    pinned_array = BoolArray::ensure(pinned);
    if (!pinned_array) throw py::type_error("pinned must be a 1-D array of bool or None");
    const auto v = view_1d(pinned_array, "pinned");
    // bool is one byte here; reading it through unsigned char is always allowed.
    in.pinned = {reinterpret_cast<const std::uint8_t*>(v.data), v.size};
  }
  // Held in a plain object: a default-constructed array_t would allocate an empty array on
  // every call, and the call without groups is the hot one.
  py::object groups_keep;
  if (!groups.is_none()) {
    Int64Array groups_array = Int64Array::ensure(groups);
    if (!groups_array) throw py::type_error("groups must be a 1-D array of int64 or None");
    in.groups = view_1d(groups_array, "groups");
    groups_keep = std::move(groups_array);
  }
  ctxcore::PackOptions opt{bucket_tokens, cell_ceiling, search_node_limit, core_cell_limit, rank_tolerance};
  PackOutput out;
  out.candidate_ids = id_tuple;
  {
    // Safe: from here on only plain C++ data is touched. The arrays and id strings are
    // kept alive by references held above; nothing here creates or frees Python objects.
    py::gil_scoped_release nogil;
    out.r = ctxcore::pack(in, budget, opt);
  }
  // The very str objects the packer read (held by `id_tuple`), not a second read of `ids`.
  out.ids = py::tuple(static_cast<py::ssize_t>(out.r.indices.size()));
  for (std::size_t k = 0; k < out.r.indices.size(); ++k) {
    PyObject* id = items[static_cast<std::size_t>(out.r.indices[k])];
    Py_INCREF(id);
    PyTuple_SET_ITEM(out.ids.ptr(), static_cast<py::ssize_t>(k), id);
  }
  return out;
}

}  // namespace

void register_pack(py::module_& m) {
  m.attr("MAX_TOKENS") = ctxcore::kMaxTokens;
  m.attr("MAX_CANDIDATES") = ctxcore::kMaxCandidates;

  py::class_<PackOutput>(m, "PackOutput", "Raw packer output; wrapped by ctxcore.PackResult.")
      .def_property_readonly("indices",
                             [](py::object self) {
                               auto& v = self.cast<PackOutput&>().r.indices;
                               py::array_t<std::int64_t> a({static_cast<py::ssize_t>(v.size())}, {sizeof(std::int64_t)},
                                                           v.data(), self);
                               a.attr("setflags")(py::arg("write") = false);
                               return a;
                             })
      .def_property_readonly("reasons",
                             [](py::object self) {
                               auto& v = self.cast<PackOutput&>().r.reasons;
                               static_assert(sizeof(ctxcore::Reason) == 1, "Reason is one byte");
                               py::array_t<std::uint8_t> a({static_cast<py::ssize_t>(v.size())}, {std::size_t{1}},
                                                           reinterpret_cast<const std::uint8_t*>(v.data()), self);
                               a.attr("setflags")(py::arg("write") = false);
                               return a;
                             })
      .def_property_readonly("ids", [](const PackOutput& o) { return o.ids; })
      .def_property_readonly("candidate_ids", [](const PackOutput& o) { return o.candidate_ids; })
      .def_property_readonly("summary",
                             [](const PackOutput& o) {
                               // Every scalar at once, for the wrapper: one call instead of twelve.
                               return py::make_tuple(o.r.tokens_used, o.r.total_score, o.r.upper_bound,
                                                     static_cast<int>(o.r.path), o.r.evaluated, o.r.excluded_for_budget,
                                                     o.r.truncated, o.r.proven_optimal, o.r.dp_cells, o.r.search_nodes,
                                                     o.r.dominated, o.r.free_items);
                             })
      .def_property_readonly("tokens_used", [](const PackOutput& o) { return o.r.tokens_used; })
      .def_property_readonly("total_score", [](const PackOutput& o) { return o.r.total_score; })
      .def_property_readonly("upper_bound", [](const PackOutput& o) { return o.r.upper_bound; })
      .def_property_readonly("path", [](const PackOutput& o) { return static_cast<int>(o.r.path); })
      .def_property_readonly("evaluated", [](const PackOutput& o) { return o.r.evaluated; })
      .def_property_readonly("excluded_for_budget", [](const PackOutput& o) { return o.r.excluded_for_budget; })
      .def_property_readonly("truncated", [](const PackOutput& o) { return o.r.truncated; })
      .def_property_readonly("proven_optimal", [](const PackOutput& o) { return o.r.proven_optimal; })
      .def_property_readonly("dp_cells", [](const PackOutput& o) { return o.r.dp_cells; })
      .def_property_readonly("search_nodes", [](const PackOutput& o) { return o.r.search_nodes; })
      .def_property_readonly("dominated", [](const PackOutput& o) { return o.r.dominated; })
      .def_property_readonly("free_items", [](const PackOutput& o) { return o.r.free_items; })
      .def_property_readonly("rank_order", [](const PackOutput& o) { return o.r.rank_order; })
      .def_property_readonly("redundant", [](const PackOutput& o) { return o.r.redundant; });

  m.def("pack_arrays", &pack_arrays, py::arg("ids"), py::arg("tokens"), py::arg("scores"), py::arg("pinned"),
        py::arg("budget"), py::arg("bucket_tokens"), py::arg("cell_ceiling"), py::arg("search_node_limit"),
        py::arg("core_cell_limit"), py::arg("rank_tolerance") = 0.0, py::arg("groups") = py::none(),
        "Pack validated arrays. Private: call ctxcore.pack_arrays.");
}

}  // namespace ctxcore_py
