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
                                        const py::args &args, const py::kwargs &kwargs,
                                        const char *owner) {
  if (args.empty())
    raise_invalid_type(name, fmt::format("{} is a method of {}: call it on an instance, "
                                         "x.{}{}, or pass the instance first",
                                         name, owner, name, parameters));
  raise_signature_mismatch(name, parameters, py::args(args[py::slice(1, std::nullopt, 1)]), kwargs);
}

void typed_mismatch(py::module_ &scope, const char *name, const char *parameters) {
  scope.def(name, [name, parameters](py::args args, py::kwargs kwargs) {
    raise_signature_mismatch(name, parameters, args, kwargs);
  });
}

void typed_method_mismatch(py::handle cls, const char *name, const char *parameters) {
  py::setattr(cls, name,
              py::cpp_function(
                  [name, parameters](py::args args, py::kwargs kwargs) {
                    raise_method_mismatch(name, parameters, args, kwargs);
                  },
                  py::name(name), py::is_method(cls), py::sibling(py::getattr(cls, name, py::none()))));
}

void typed_mismatch_for_existing(py::handle cls, const char *owner,
                                 std::initializer_list<std::pair<const char *, const char *>> names) {
  for (const auto &[name, parameters] : names) {
    const py::object existing = py::getattr(cls, name, py::none());
    // Only a pybind11 function can take another overload (its sibling chain); anything else
    // (a slot inherited from object) would be replaced, not extended.
    const py::handle function = PyInstanceMethod_Check(existing.ptr()) ? PyInstanceMethod_GET_FUNCTION(existing.ptr())
                                : PyMethod_Check(existing.ptr())       ? PyMethod_GET_FUNCTION(existing.ptr())
                                                                       : existing.ptr();
    if (!function || !PyCFunction_Check(function.ptr()) ||
        PyCFunction_GET_SELF(function.ptr()) == nullptr ||  // METH_STATIC has no self
        !py::isinstance<py::capsule>(PyCFunction_GET_SELF(function.ptr())))
      continue;
    py::setattr(cls, name,
                py::cpp_function(
                    [name, parameters, owner](py::args args, py::kwargs kwargs) {
                      raise_method_mismatch(name, parameters, args, kwargs, owner);
                    },
                    py::name(name), py::is_method(cls), py::sibling(existing)));
  }
}

}  // namespace kiln::python
