// Core exceptions as Python exceptions. ctxcore::InvalidCandidate becomes
// ctxcore.InvalidCandidate (a ValueError) carrying the offending `index` and
// `candidate_id`; std::invalid_argument keeps pybind11's mapping to ValueError.
#include <pybind11/gil_safe_call_once.h>
#include <pybind11/pybind11.h>

#include "bindings.hpp"
#include "ctxcore/packer.hpp"

namespace py = pybind11;

namespace ctxcore_py {

void register_errors(py::module_& m) {
  PYBIND11_CONSTINIT static py::gil_safe_call_once_and_store<py::object> invalid_candidate;
  invalid_candidate.call_once_and_store_result([&]() -> py::object {
    py::object type = py::exception<ctxcore::InvalidCandidate>(m, "InvalidCandidate", PyExc_ValueError);
    type.attr("__doc__") =
        "A candidate (or the candidate set) is not valid input. `index` is the input\n"
        "position of the offending candidate, or -1; `candidate_id` its id, or None.";
    type.attr("index") = -1;
    type.attr("candidate_id") = py::none();
    return type;
  });
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const ctxcore::InvalidCandidate& e) {
      const py::object& type = invalid_candidate.get_stored();
      py::object exc = type(e.what());
      exc.attr("index") = e.index();
      exc.attr("candidate_id") = e.index() >= 0 ? py::object(py::str(e.candidate_id())) : py::none();
      PyErr_SetObject(type.ptr(), exc.ptr());
    }
  });
}

}  // namespace ctxcore_py
