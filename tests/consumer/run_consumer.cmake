# cmake -P driver for one consumer test (see consumer_tests.cmake).
# Inputs: MODE, MAIN_BUILD, WORK, CONSUMER_SOURCE, CONTINUUM_SOURCE, GENERATOR,
# CXX, LAUNCHER, BUILD_TYPE.
cmake_minimum_required(VERSION 3.21)

function(step)
  string(JOIN " " _shown ${ARGN})
  message(STATUS "consumer(${MODE}): ${_shown}")
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE _rc)
  if(NOT _rc EQUAL 0)
    message(FATAL_ERROR "consumer(${MODE}): failed (${_rc}): ${_shown}")
  endif()
endfunction()

file(REMOVE_RECURSE ${WORK})
set(_args -S ${CONSUMER_SOURCE} -B ${WORK}/build -G ${GENERATOR}
          -DCMAKE_CXX_COMPILER=${CXX} -DCONTINUUM_CONSUMER_MODE=${MODE})
if(LAUNCHER)
  list(APPEND _args -DCMAKE_CXX_COMPILER_LAUNCHER=${LAUNCHER})
endif()
if(BUILD_TYPE)
  list(APPEND _args -DCMAKE_BUILD_TYPE=${BUILD_TYPE})
endif()

if(MODE STREQUAL "find_package")
  step(${CMAKE_COMMAND} --install ${MAIN_BUILD} --prefix ${WORK}/prefix)
  foreach(_f include/continuum/continuum.hpp include/continuum/attention/params.hpp
             share/cmake/continuum/continuumConfig.cmake
             share/cmake/continuum/continuumConfigVersion.cmake
             share/cmake/continuum/continuumTargets.cmake)
    if(NOT EXISTS ${WORK}/prefix/${_f})
      message(FATAL_ERROR "consumer(find_package): ${_f} was not installed")
    endif()
  endforeach()
  # found through CMAKE_PREFIX_PATH, as a user would; never via the package registry.
  list(APPEND _args -DCMAKE_PREFIX_PATH=${WORK}/prefix -DCMAKE_FIND_USE_PACKAGE_REGISTRY=OFF)
elseif(MODE STREQUAL "add_subdirectory")
  list(APPEND _args -DCONTINUUM_SOURCE_DIR=${CONTINUUM_SOURCE})
else()
  message(FATAL_ERROR "unknown MODE '${MODE}'")
endif()

step(${CMAKE_COMMAND} ${_args})
step(${CMAKE_COMMAND} --build ${WORK}/build)
step(${WORK}/build/consumer)
