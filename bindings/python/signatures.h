// Calls whose arguments match no signature (too many or too few, an unknown keyword): the last
// overload of every kiln function and method, raising kiln.InvalidTypeError where pybind11 would
// raise a plain TypeError.
//
// Threading: the GIL is held (registration at import; the overloads run as ordinary calls).
// Errors: InvalidTypeError, built by error_mapping.h.
#pragma once

#include <pybind11/pybind11.h>

#include <initializer_list>
#include <utility>

namespace kiln::python {

namespace py = pybind11;

/// Raises InvalidTypeError for a call of `name` whose arguments do not match `parameters` (too
/// many or too few, an unknown keyword): what pybind11 would raise as a plain TypeError.
[[noreturn]] void raise_signature_mismatch(const char *name, const char *parameters,
                                           const py::args &args, const py::kwargs &kwargs);

/// Adds to function `name` of `scope` (a module or class) a last overload that takes anything
/// and raises InvalidTypeError (raise_signature_mismatch; `name` and `parameters` are literals): pybind11 tries it only when the real
/// one's arguments did not match, so the calls that match pay nothing.
void typed_mismatch(py::module_ &scope, const char *name, const char *parameters);

/// m.def(name, fn, extra...) followed by typed_mismatch(m, name, parameters): a function of the
/// module and its InvalidTypeError overload, defined together.
template <class Fn, class... Extra>
void def_typed(py::module_ &m, const char *name, const char *parameters, Fn &&fn,
               const Extra &...extra) {
  m.def(name, std::forward<Fn>(fn), extra...);
  typed_mismatch(m, name, parameters);
}

/// Raises InvalidTypeError for a call of method `name` of class `owner` ("kiln.ndarray") through
/// the class without an instance (`kiln.ndarray.free()`), or names the arguments after self that
/// match no signature.
[[noreturn]] void raise_method_mismatch(const char *name, const char *parameters,
                                        const py::args &args, const py::kwargs &kwargs,
                                        const char *owner = "kiln.ndarray");

/// typed_mismatch for method `name` of class `cls`; it also takes a call without self.
void typed_method_mismatch(py::handle cls, const char *name, const char *parameters);

/// typed_method_mismatch for methods class `cls` already has, defined by pybind11 itself (an
/// enum's __int__, __hash__, ...) or set as attributes: each of `names` whose value is a pybind11
/// function gets the InvalidTypeError overload, named "`owner`.name" in messages (`owner` and
/// every name are literals). `parameters` is what each takes after self.
void typed_mismatch_for_existing(py::handle cls, const char *owner,
                                 std::initializer_list<std::pair<const char *, const char *>> names);

}  // namespace kiln::python
