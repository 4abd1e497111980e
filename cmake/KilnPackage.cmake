# The C++ package: `cmake --install <build> [--prefix P]` installs kiln's public headers, its static
# libraries, kiln-ops (when KILN_BUILD_TOOLS) and a CMake package, so that another project can write
#   find_package(kiln 0.2 REQUIRED)
#   target_link_libraries(app PRIVATE kiln::executor)
# The targets carry the C++23 requirement, the include directory and their dependencies (fmt,
# Threads and LLVM 19, found again by kilnConfig.cmake). kiln::executor pulls in the others:
# kiln::rhi (RhiResult, devices), kiln::memory (budget, ledger, pool), kiln::codegen (JIT, PTX,
# code objects) and kiln::llvm_gpu_pipeline (its LLVM pipeline).
include(CMakePackageConfigHelpers)

set(KILN_INSTALL_CMAKEDIR ${CMAKE_INSTALL_LIBDIR}/cmake/kiln)
set(kiln_package_targets kiln_rhi kiln_memory kiln_codegen kiln_llvm_gpu_pipeline kiln_executor)
foreach(target IN LISTS kiln_package_targets)
  string(REGEX REPLACE "^kiln_" "" export_name ${target})
  set_target_properties(${target} PROPERTIES EXPORT_NAME ${export_name})
endforeach()

install(TARGETS ${kiln_package_targets} EXPORT kilnTargets
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR})
if(TARGET kiln-ops)  # KILN_BUILD_TOOLS
  install(TARGETS kiln-ops RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
endif()
# Public headers only: each layer's include/. Its internal/ headers are never installed (they are on
# kiln's targets' build interface alone); test/package/check_installed_package.sh checks both.
foreach(layer rhi runtime executor)
  install(DIRECTORY ${PROJECT_SOURCE_DIR}/${layer}/include/ DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
endforeach()

install(EXPORT kilnTargets NAMESPACE kiln:: DESTINATION ${KILN_INSTALL_CMAKEDIR})
configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/kilnConfig.cmake.in
                              ${PROJECT_BINARY_DIR}/kilnConfig.cmake
                              INSTALL_DESTINATION ${KILN_INSTALL_CMAKEDIR})
# 0.x: a minor version may break the API, so only the same major.minor matches.
write_basic_package_version_file(${PROJECT_BINARY_DIR}/kilnConfigVersion.cmake
                                 COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/kilnConfig.cmake ${PROJECT_BINARY_DIR}/kilnConfigVersion.cmake
        DESTINATION ${KILN_INSTALL_CMAKEDIR})
