// The InvalidTypeError overloads of calls that match no signature (see signatures.h).
//
// Threading: the GIL is held. Errors: InvalidTypeError, built by error_mapping.h.
#include "signatures.h"

#include <fmt/format.h>

#include <optional>
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

[[noreturn]] void raise_method_mismatch(const char *name, const char *parameters,
                                        const py::args &args, const py::kwargs &kwargs) {
  if (args.empty())
    raise_invalid_type(name, fmt::format("{} is a method of kiln.ndarray: call it on an array, "
                                         "a.{}{}, or pass the array first",
                                         name, name, parameters));
  raise_signature_mismatch(name, parameters, py::args(args[py::slice(1, std::nullopt, 1)]), kwargs);
}

void typed_mismatch(py::module_ &scope, const char *name, const char *parameters) {
  scope.def(name, [name, parameters](py::args args, py::kwargs kwargs) {
    raise_signature_mismatch(name, parameters, args, kwargs);
  });
}

}  // namespace kiln::python
