# Runs one fuzz target for SECONDS on its committed seeds (read only), new
# inputs and any crash input in WORK. cmake -DEXE= -DSEEDS= -DWORK= -DSECONDS= -P smoke.cmake
file(REMOVE_RECURSE ${WORK})
file(MAKE_DIRECTORY ${WORK}/corpus)
execute_process(COMMAND ${EXE} -max_total_time=${SECONDS} -print_final_stats=1 -artifact_prefix=${WORK}/
                        ${WORK}/corpus ${SEEDS}
                RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "${EXE} failed (${rc}); the input is in ${WORK}")
endif()
