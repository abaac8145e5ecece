# find_package(rtdeploy): the runtime for C and C++ controllers.
#
#   cmake -Drtdeploy_DIR=<repository>/controller/ffi/cmake ...
#   cmake -DCMAKE_PREFIX_PATH=<prefix> ...   (installed: controller/ffi/CMakeLists.txt)
#
# gives the imported target rtdeploy::rtdeploy (librtdeploy.a, rtdeploy.h and
# rtdeploy.hpp, the C libraries a Rust static library needs),
# rtdeploy::malloc_trap (rtdeploy_malloc_trap.c: C's and C++'s allocations
# seen by the allocation trap) and
# rtdeploy_messages(TARGET FILE.msg...), which writes each description's C/C++
# header with `deploy gen --lang c` into the build tree and adds it to TARGET's
# include path. The library is cargo's (`cargo build -p rtdeploy-ffi
# --release`): RTDEPLOY_LIBRARY_DIR names its directory when it is not the
# repository's target/release or target/debug; RTDEPLOY_DEPLOY names the
# `deploy` binary when it is not on the PATH or there.

# Two layouts: the repository's (this file in controller/ffi/cmake) and an
# installed one (<prefix>/lib/cmake/rtdeploy, see controller/ffi/CMakeLists.txt).
if(EXISTS "${CMAKE_CURRENT_LIST_DIR}/../include/rtdeploy.h")
    get_filename_component(_rtdeploy_include "${CMAKE_CURRENT_LIST_DIR}/../include" ABSOLUTE)
    get_filename_component(_rtdeploy_repo "${CMAKE_CURRENT_LIST_DIR}/../../.." ABSOLUTE)
    set(_rtdeploy_lib_hints ${_rtdeploy_repo}/target/release ${_rtdeploy_repo}/target/debug)
    set(_rtdeploy_bin_hints ${_rtdeploy_lib_hints})
else()
    get_filename_component(_rtdeploy_prefix "${CMAKE_CURRENT_LIST_DIR}/../../.." ABSOLUTE)
    set(_rtdeploy_include "${_rtdeploy_prefix}/include")
    set(_rtdeploy_lib_hints "${CMAKE_CURRENT_LIST_DIR}/../..")
    set(_rtdeploy_bin_hints "${_rtdeploy_prefix}/bin")
endif()

set(RTDEPLOY_LIBRARY_DIR "" CACHE PATH "the directory of librtdeploy.a (cargo's target/<profile>)")
find_library(RTDEPLOY_STATIC_LIBRARY
    NAMES librtdeploy.a
    HINTS ${RTDEPLOY_LIBRARY_DIR} ${_rtdeploy_lib_hints}
    NO_DEFAULT_PATH)
find_program(RTDEPLOY_DEPLOY deploy
    HINTS ${_rtdeploy_bin_hints})

include(FindPackageHandleStandardArgs)
find_package_handle_standard_args(rtdeploy
    REQUIRED_VARS RTDEPLOY_STATIC_LIBRARY RTDEPLOY_DEPLOY)

if(rtdeploy_FOUND AND NOT TARGET rtdeploy::rtdeploy)
    find_package(Threads REQUIRED)
    add_library(rtdeploy::rtdeploy STATIC IMPORTED)
    set_target_properties(rtdeploy::rtdeploy PROPERTIES
        IMPORTED_LOCATION "${RTDEPLOY_STATIC_LIBRARY}"
        INTERFACE_INCLUDE_DIRECTORIES "${_rtdeploy_include}"
        # What a Rust static library needs of the C library.
        INTERFACE_LINK_LIBRARIES "Threads::Threads;gcc_s;util;rt;m;dl")
endif()

# rtdeploy::malloc_trap: the allocation trap for C and C++ (link it into the
# program; needs C among the project's languages).
get_property(_rtdeploy_languages GLOBAL PROPERTY ENABLED_LANGUAGES)
if(rtdeploy_FOUND AND NOT TARGET rtdeploy_malloc_trap AND "C" IN_LIST _rtdeploy_languages)
    add_library(rtdeploy_malloc_trap OBJECT "${_rtdeploy_include}/rtdeploy_malloc_trap.c")
    target_include_directories(rtdeploy_malloc_trap PRIVATE "${_rtdeploy_include}")
    add_library(rtdeploy::malloc_trap ALIAS rtdeploy_malloc_trap)
endif()

# rtdeploy_messages(TARGET FILE.msg...): the descriptions' headers for TARGET.
function(rtdeploy_messages target)
    set(out_dir "${CMAKE_CURRENT_BINARY_DIR}/rtdeploy-messages")
    set(headers "")
    foreach(msg IN LISTS ARGN)
        get_filename_component(abs "${msg}" ABSOLUTE)
        get_filename_component(name "${msg}" NAME_WE)
        list(APPEND headers "${out_dir}/${name}.h")
        list(APPEND sources "${abs}")
    endforeach()
    add_custom_command(
        OUTPUT ${headers}
        COMMAND ${RTDEPLOY_DEPLOY} gen --lang c --out ${out_dir} ${sources}
        DEPENDS ${sources}
        COMMENT "deploy gen --lang c: ${headers}")
    add_custom_target(${target}_rtdeploy_messages DEPENDS ${headers})
    add_dependencies(${target} ${target}_rtdeploy_messages)
    target_include_directories(${target} PRIVATE "${out_dir}")
endfunction()
