# ptc-tokenize: the byte-level tokenizer (text -> llm.c token files). Included from
# tools/CMakeLists.txt.
add_executable(ptc-tokenize ${CMAKE_CURRENT_LIST_DIR}/ptc-tokenize.c)
target_link_libraries(ptc-tokenize PRIVATE ptrt)

# The demo corpus, tokenized at build time (the repository ships only the text):
# build/examples/data/corpus_train.bin and corpus_val.bin (the last 10% of the text).
set(PTC_CORPUS_TXT ${PROJECT_SOURCE_DIR}/examples/data/corpus.txt)
set(PTC_CORPUS_DIR ${PROJECT_BINARY_DIR}/examples/data)
add_custom_command(
  OUTPUT ${PTC_CORPUS_DIR}/corpus_train.bin ${PTC_CORPUS_DIR}/corpus_val.bin
  COMMAND ${CMAKE_COMMAND} -E make_directory ${PTC_CORPUS_DIR}
  COMMAND ptc-tokenize ${PTC_CORPUS_TXT} -o ${PTC_CORPUS_DIR}/corpus_train.bin
          --val-fraction 0.1 --val-output ${PTC_CORPUS_DIR}/corpus_val.bin
  DEPENDS ptc-tokenize ${PTC_CORPUS_TXT}
  COMMENT "Tokenizing examples/data/corpus.txt"
  VERBATIM)
add_custom_target(example-data ALL
  DEPENDS ${PTC_CORPUS_DIR}/corpus_train.bin ${PTC_CORPUS_DIR}/corpus_val.bin)
