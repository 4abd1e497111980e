// The InvalidTypeError overloads of calls that match no signature (see signatures.h).
//
// Threading: the GIL is held. Errors: InvalidTypeError, built by error_mapping.h.
#include "signatures.h"

#include <fmt/format.h>

#include <string>

#include "error_mapping.h"

namespace kiln::python {

[[noreturn]] void raise_signature_mismatch(const char *name, const char *parameters,
                                           const py::args &args, const py::kwargs &kwargs) {
  std::string given = std::string(py::repr(args));
  if (!kwargs.empty()) given += " and keywords " + std::string(py::repr(kwargs));
  if (given.size() > 200) given = given.substr(0, 200) + "...";
  raise_invalid_type(name, fmt::format("{}{} does not take the arguments {}", name, parameters, given));
}

void typed_mismatch(py::module_ &scope, const char *name, const char *parameters) {
  scope.def(name, [name, parameters](py::args args, py::kwargs kwargs) {
    raise_signature_mismatch(name, parameters, args, kwargs);
  });
}

}  // namespace kiln::python
