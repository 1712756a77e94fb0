# continuum_catch2 — Catch2 for every test executable, version 2 or 3.
# The tests are written against Catch2 2 (Debian 12 ships 2.13). Catch2 3
# (Ubuntu 24.04, the GPU machines) has no <catch2/catch.hpp>: with it, the
# shim in tests/compat/catch2-v3 provides that header and the few v2 names the
# tests use, so the same sources build against either.
find_package(Catch2 REQUIRED)
include(Catch)
add_library(continuum_catch2 INTERFACE)
target_link_libraries(continuum_catch2 INTERFACE Catch2::Catch2)
if(Catch2_VERSION VERSION_GREATER_EQUAL 3)
  target_include_directories(continuum_catch2 INTERFACE
    ${PROJECT_SOURCE_DIR}/tests/compat/catch2-v3)
elseif(Catch2_VERSION VERSION_LESS 2)
  message(FATAL_ERROR "continuum's tests need Catch2 2 or 3, found ${Catch2_VERSION}")
endif()
