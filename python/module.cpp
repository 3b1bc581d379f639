// ctxcore._core: the compiled core's Python face. One register_<area>() per core area;
// this file owns the module, the exception mapping and the version.
#include <pybind11/pybind11.h>

#include "bindings.hpp"

namespace py = pybind11;

#ifndef CTXCORE_VERSION
#define CTXCORE_VERSION "0+unknown"
#endif

PYBIND11_MODULE(_core, m) {
  m.doc() = "ctxcore's compiled core. Use the public API in `ctxcore`; this module is private.";
  m.attr("__version__") = CTXCORE_VERSION;
  ctxcore_py::register_errors(m);
  ctxcore_py::register_pack(m);
  ctxcore_py::register_format(m);
  ctxcore_py::register_tokens(m);
  ctxcore_py::register_columns(m);
  ctxcore_py::register_wire(m);
}
