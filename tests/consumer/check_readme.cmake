# cmake -P: fails unless README.md quotes tests/consumer/main.cpp verbatim, so
# the usage example in the README is the one the consumer tests compile and run.
file(READ ${README} _readme)
file(READ ${EXAMPLE} _example)
string(FIND "${_readme}" "${_example}" _at)
if(_at EQUAL -1)
  message(FATAL_ERROR "README.md does not contain tests/consumer/main.cpp verbatim; "
                      "copy the file into the README's C++ example block")
endif()
message(STATUS "README.md quotes tests/consumer/main.cpp verbatim")
