# Consumer tests (after fmt's test/find-package-test and add-subdirectory-test):
# each configures, builds and runs the project in this folder against
#   find_package: an install of this build tree into a prefix inside the build folder;
#   add_subdirectory: this source tree.
# Included from tests/CMakeLists.txt.
set(_consumer_dir ${CMAKE_CURRENT_LIST_DIR})
set(_consumer_modes add_subdirectory)
if(CONTINUUM_INSTALL)
  list(PREPEND _consumer_modes find_package)
endif()
foreach(_mode ${_consumer_modes})
  add_test(NAME consumer:${_mode}
    COMMAND ${CMAKE_COMMAND}
      -DMODE=${_mode}
      -DMAIN_BUILD=${PROJECT_BINARY_DIR}
      -DWORK=${CMAKE_CURRENT_BINARY_DIR}/consumer-${_mode}
      -DCONSUMER_SOURCE=${_consumer_dir}
      -DCONTINUUM_SOURCE=${PROJECT_SOURCE_DIR}
      -DGENERATOR=${CMAKE_GENERATOR}
      -DCXX=${CMAKE_CXX_COMPILER}
      -DLAUNCHER=${CMAKE_CXX_COMPILER_LAUNCHER}
      -DBUILD_TYPE=${CMAKE_BUILD_TYPE}
      -P ${_consumer_dir}/run_consumer.cmake)
  set_tests_properties(consumer:${_mode} PROPERTIES TIMEOUT 900 LABELS consumer)
endforeach()

# The README's C++ usage example is tests/consumer/main.cpp, verbatim.
add_test(NAME consumer:readme_example
  COMMAND ${CMAKE_COMMAND} -DREADME=${PROJECT_SOURCE_DIR}/README.md
          -DEXAMPLE=${_consumer_dir}/main.cpp -P ${_consumer_dir}/check_readme.cmake)
