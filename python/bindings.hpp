// Registration entry points, one per core area, called from module.cpp.
#pragma once

#include <pybind11/pybind11.h>

namespace ctxcore_py {

void register_errors(pybind11::module_& m);
void register_pack(pybind11::module_& m);
void register_format(pybind11::module_& m);
void register_tokens(pybind11::module_& m);
void register_columns(pybind11::module_& m);
void register_wire(pybind11::module_& m);

}  // namespace ctxcore_py
