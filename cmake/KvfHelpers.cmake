# Build helpers shared by every folder: warnings, sanitizers, ccache, tests, format check.

find_program(KVF_CCACHE ccache)
if(KVF_CCACHE)
  # base_dir makes cache hits independent of where the checkout lives (worktrees, CI clones).
  get_filename_component(KVF_CCACHE_BASE "${PROJECT_SOURCE_DIR}/.." ABSOLUTE)
  set(CMAKE_CXX_COMPILER_LAUNCHER ${CMAKE_COMMAND} -E env CCACHE_BASEDIR=${KVF_CCACHE_BASE}
      CCACHE_NOHASHDIR=1 ${KVF_CCACHE})
endif()

add_library(kvf_warnings INTERFACE)
target_compile_options(kvf_warnings INTERFACE
  -Wall -Wextra -Wpedantic $<$<CXX_COMPILER_ID:GNU>:-Wshadow=local> -Wnon-virtual-dtor
  -Wcast-align
  -Wno-missing-field-initializers
  # GCC 12 flags Asio's awaitable frame operator new/delete pair as mismatched (a false
  # positive on coroutine frames).
  $<$<CXX_COMPILER_ID:GNU>:-Wno-mismatched-new-delete>
  $<$<BOOL:${KVF_WERROR}>:-Werror>)
add_library(kvf::warnings ALIAS kvf_warnings)

if((KVF_SANITIZE AND KVF_TSAN) OR (KVF_FUZZ AND KVF_TSAN))
  message(FATAL_ERROR "KVF_TSAN cannot be combined with KVF_SANITIZE or KVF_FUZZ")
endif()
if(KVF_SANITIZE OR KVF_FUZZ)
  # GCC 12's -Wmaybe-uninitialized misfires on instrumented code (std::variant / std::optional
  # moves in the simulator's event queue); the normal build keeps the warning.
  # clang 14's -fsanitize=function (part of undefined) cannot place its prologue data on
  # coroutine frames split into other sections ("Cannot represent a difference across
  # sections" from the assembler): off for clang, which leaves every other UBSan check on.
  add_compile_options(-fsanitize=address,undefined -fno-omit-frame-pointer
                      -fno-sanitize-recover=undefined
                      $<$<CXX_COMPILER_ID:GNU>:-Wno-maybe-uninitialized>
                      $<$<CXX_COMPILER_ID:Clang>:-fno-sanitize=function>)
  add_link_options(-fsanitize=address,undefined)
endif()
if(KVF_FUZZ)
  if(NOT CMAKE_CXX_COMPILER_ID STREQUAL "Clang")
    message(FATAL_ERROR "KVF_FUZZ needs clang (libFuzzer): configure with CXX=clang++-14")
  endif()
  # Coverage instrumentation everywhere; only the fuzz targets link libFuzzer's main.
  add_compile_options(-fsanitize=fuzzer-no-link)
endif()
if(KVF_TSAN)
  # GCC warns that it cannot instrument atomic_thread_fence (used by Asio and spdlog); TSan
  # then relies on the atomics around it, which is what those libraries do anyway.
  add_compile_options(-fsanitize=thread -fno-omit-frame-pointer
                      $<$<CXX_COMPILER_ID:GNU>:-Wno-tsan>
                      $<$<CXX_COMPILER_ID:GNU>:-Wno-maybe-uninitialized>)
  add_link_options(-fsanitize=thread)
endif()

# Boost.Asio defaults shared by every target that includes it.
add_compile_definitions(BOOST_ASIO_NO_DEPRECATED BOOST_ASIO_DISABLE_BOOST_COROUTINE
                        BOOST_BEAST_USE_STD_STRING_VIEW)

# kvf_optimize_hot(target ...): -O3 instead of RelWithDebInfo's -O2 for libraries whose loops
# dominate the simulator's and the router's time (the option comes after the config's flags).
function(kvf_optimize_hot)
  foreach(target ${ARGN})
    target_compile_options(${target} PRIVATE $<$<CONFIG:RelWithDebInfo>:-O3>)
  endforeach()
endfunction()

# kvf_library(NAME folder SOURCES ... DEPS ...): one library per top-level folder,
# alias kvf::<folder>, includes from the repository root.
function(kvf_library folder)
  cmake_parse_arguments(ARG "" "" "SOURCES;DEPS" ${ARGN})
  set(target kvf_${folder})
  add_library(${target} STATIC ${ARG_SOURCES})
  add_library(kvf::${folder} ALIAS ${target})
  target_include_directories(${target} PUBLIC ${PROJECT_SOURCE_DIR})
  target_link_libraries(${target} PUBLIC ${ARG_DEPS} PRIVATE kvf::warnings)
endfunction()

# kvf_binary(NAME kvf-foo SOURCES main.cc DEPS ...): an executable in build/bin. It follows the
# command-line convention of common/cli.h (and gets the build's version for --version);
# tests/integration/cli_conventions_test.cc checks every file in build/bin.
function(kvf_binary name)
  cmake_parse_arguments(ARG "" "" "SOURCES;DEPS" ${ARGN})
  add_executable(${name} ${ARG_SOURCES})
  target_link_libraries(${name} PRIVATE ${ARG_DEPS} kvf_version kvf::warnings)
  set_property(GLOBAL APPEND PROPERTY KVF_INSTALLED_TARGETS ${name})
  set_target_properties(${name} PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${PROJECT_BINARY_DIR}/bin)
endfunction()

# kvf_test(NAME name SOURCES ... DEPS ... [LABELS ...] [TIMEOUT s]): a GoogleTest binary
# registered with CTest as one test. Tests run in parallel (ctest -j), so each must pick
# its own ports and bound its own run time.
function(kvf_test name)
  cmake_parse_arguments(ARG "" "TIMEOUT" "SOURCES;DEPS;LABELS" ${ARGN})
  if(NOT KVF_BUILD_TESTS)
    return()
  endif()
  add_executable(${name} ${ARG_SOURCES})
  target_link_libraries(${name} PRIVATE ${ARG_DEPS} GTest::gtest GTest::gmock GTest::gtest_main
                                        kvf::warnings)
  set_target_properties(${name} PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${PROJECT_BINARY_DIR}/tests)
  if(NOT ARG_TIMEOUT)
    set(ARG_TIMEOUT 300)
  endif()
  add_test(NAME ${name} COMMAND ${name} --gtest_color=no
           WORKING_DIRECTORY ${PROJECT_SOURCE_DIR})
  set_tests_properties(${name} PROPERTIES TIMEOUT ${ARG_TIMEOUT}
    ENVIRONMENT "KVF_BIN_DIR=${PROJECT_BINARY_DIR}/bin;KVF_SOURCE_DIR=${PROJECT_SOURCE_DIR}")
  if(ARG_LABELS)
    set_tests_properties(${name} PROPERTIES LABELS "${ARG_LABELS}")
  endif()
endfunction()

# kvf_benchmark(NAME name SOURCES ... DEPS ...): a Google Benchmark binary in build/bin; its
# main() is experiments/bench/bench_main.h's benchmarkMain (description first in --help).
function(kvf_benchmark name)
  cmake_parse_arguments(ARG "" "" "SOURCES;DEPS" ${ARGN})
  if(NOT KVF_BUILD_BENCHMARKS)
    return()
  endif()
  add_executable(${name} ${ARG_SOURCES})
  target_link_libraries(${name} PRIVATE ${ARG_DEPS} kvf_bench_main benchmark::benchmark
                                        kvf_version kvf::warnings)
  set_property(GLOBAL APPEND PROPERTY KVF_INSTALLED_TARGETS ${name})
  set_target_properties(${name} PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${PROJECT_BINARY_DIR}/bin)
endfunction()

# kvf_script(SOURCE file NAME installed-name): a script installed into build/bin under the kvf-*
# name it prints, with "@KVF_VERSION@" replaced by the build's version (at build time, by
# kvf_add_version_target).
function(kvf_script)
  cmake_parse_arguments(ARG "" "SOURCE;NAME" "" ${ARGN})
  set_property(GLOBAL APPEND_STRING PROPERTY KVF_SCRIPTS
               "${CMAKE_CURRENT_SOURCE_DIR}/${ARG_SOURCE}>${PROJECT_BINARY_DIR}/bin/${ARG_NAME}|")
  set_property(GLOBAL APPEND PROPERTY KVF_SCRIPT_OUTPUTS "${PROJECT_BINARY_DIR}/bin/${ARG_NAME}")
endfunction()

# kvf_add_version_target(): object library kvf_version (objects, so link order never matters) (common/version.h) from a source the build
# regenerates from git and the build type on every build (cmake/KvfVersion.cmake), and the
# scripts of kvf_script(). Call once, after every kvf_script().
function(kvf_add_version_target)
  set(out ${PROJECT_BINARY_DIR}/generated/kvf_version.cc)
  get_property(scripts GLOBAL PROPERTY KVF_SCRIPTS)
  get_property(script_outputs GLOBAL PROPERTY KVF_SCRIPT_OUTPUTS)
  add_custom_target(kvf_version_stamp ALL
    COMMAND ${CMAKE_COMMAND} -DKVF_SOURCE_DIR=${PROJECT_SOURCE_DIR} -DKVF_OUTPUT=${out}
            -DKVF_PROJECT_VERSION=${PROJECT_VERSION} -DKVF_BUILD_TYPE=${CMAKE_BUILD_TYPE}
            "-DKVF_SCRIPTS=${scripts}" -P ${PROJECT_SOURCE_DIR}/cmake/KvfVersion.cmake
    BYPRODUCTS ${out} ${script_outputs}
    COMMENT "version: git revision and build type" VERBATIM)
  add_library(kvf_version OBJECT ${out})
  target_include_directories(kvf_version PUBLIC ${PROJECT_SOURCE_DIR})
  add_dependencies(kvf_version kvf_version_stamp)
endfunction()

# format / format-check: clang-format over every tracked C++ source.
function(kvf_add_format_targets)
  find_program(KVF_CLANG_FORMAT NAMES clang-format clang-format-14)
  if(NOT KVF_CLANG_FORMAT)
    return()
  endif()
  add_custom_target(format-check
    COMMAND ${PROJECT_SOURCE_DIR}/scripts/format --check
    WORKING_DIRECTORY ${PROJECT_SOURCE_DIR}
    COMMENT "clang-format check" VERBATIM)
  add_custom_target(format
    COMMAND ${PROJECT_SOURCE_DIR}/scripts/format
    WORKING_DIRECTORY ${PROJECT_SOURCE_DIR}
    COMMENT "clang-format" VERBATIM)
endfunction()
