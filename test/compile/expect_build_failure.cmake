# Builds TARGET in BUILD_DIR and passes only if the build fails because a [[nodiscard]] result was
# dropped (-Werror=unused-result), not for any other reason. Run by test/compile/CMakeLists.txt.
execute_process(COMMAND ${CMAKE_COMMAND} --build ${BUILD_DIR} --target ${TARGET}
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
if(rc EQUAL 0)
  message(FATAL_ERROR "${TARGET} drops a result and still built: the [[nodiscard]] on "
                      "RhiExpected/RhiStatus/RhiResult, or -Werror=unused-result in kiln's "
                      "CMakeLists.txt, is gone")
endif()
if(NOT out MATCHES "nodiscard" OR NOT out MATCHES "unused-result")
  message(FATAL_ERROR "${TARGET} failed to build, but not for a dropped result:\n${out}")
endif()
message(STATUS "${TARGET}: the dropped result is an error, as it should be")
