# The data and checkpoint layer of ptrt (token files, safetensors, checkpoints, atomic files).
# Included from runtime/CMakeLists.txt after add_library(ptrt ...).
target_sources(ptrt PRIVATE
  ${CMAKE_CURRENT_LIST_DIR}/io.c
  ${CMAKE_CURRENT_LIST_DIR}/data.c
  ${CMAKE_CURRENT_LIST_DIR}/safetensors.c
  ${CMAKE_CURRENT_LIST_DIR}/checkpoint.c)
