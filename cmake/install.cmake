# install.cmake - libkiln.so beside libkiln.a, the install rules, kiln.pc and
# the CMake package (find_package(kiln) -> kiln::kiln). Included by the top
# CMakeLists.txt after the `kiln` (static) and `kiln_cli` targets exist.
#
#   kiln         libkiln.a: PIC, every symbol (the tests and the CLI use internal ones)
#   kiln_shared  libkiln.so.MAJOR.MINOR.PATCH, SONAME libkiln.so.MAJOR (0.x: libkiln.so.0.MINOR),
#                made from the same objects; exports kiln_* only (hidden visibility,
#                KILN_API in include/kiln.h, and cmake/kiln.map)
#   kiln::kiln, kiln::kiln_static   the same names for add_subdirectory users as
#                find_package gives

# Before 1.0 every minor version may break the ABI: the SONAME carries it.
if(PROJECT_VERSION_MAJOR EQUAL 0)
  set(KILN_SOVERSION "0.${PROJECT_VERSION_MINOR}")
else()
  set(KILN_SOVERSION "${PROJECT_VERSION_MAJOR}")
endif()

add_library(kiln_shared SHARED $<TARGET_OBJECTS:kiln>)
set_target_properties(kiln_shared PROPERTIES
  OUTPUT_NAME kiln
  VERSION ${PROJECT_VERSION}
  SOVERSION ${KILN_SOVERSION}
  C_VISIBILITY_PRESET hidden
  EXPORT_NAME kiln
  LINK_DEPENDS ${PROJECT_SOURCE_DIR}/cmake/kiln.map)
target_include_directories(kiln_shared PUBLIC $<BUILD_INTERFACE:${PROJECT_SOURCE_DIR}/include>
                                              $<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}>)
# the dependencies are the library's own business: a program that embeds it
# links -lkiln and nothing else
target_link_libraries(kiln_shared PRIVATE PkgConfig::CJSON PkgConfig::PNG PkgConfig::XXHASH PkgConfig::UTF8PROC ${DNNL_LIB}
                                          OpenMP::OpenMP_C ${M_LIB} pthread)
if(KILN_HAVE_MPI)
  target_link_libraries(kiln_shared PRIVATE MPI::MPI_C)
endif()
target_link_options(kiln_shared PRIVATE "LINKER:--version-script=${PROJECT_SOURCE_DIR}/cmake/kiln.map"
                                        "LINKER:--no-undefined")
set_target_properties(kiln PROPERTIES EXPORT_NAME kiln_static)
add_library(kiln::kiln ALIAS kiln_shared)
add_library(kiln::kiln_static ALIAS kiln)

# ---- install ---------------------------------------------------------------
include(CMakePackageConfigHelpers)
set(KILN_CMAKE_DIR ${CMAKE_INSTALL_LIBDIR}/cmake/kiln)
install(TARGETS kiln_shared EXPORT kilnTargets
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
        INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(TARGETS kiln EXPORT kilnStaticTargets
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
        INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(TARGETS kiln_cli RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
install(FILES ${PROJECT_SOURCE_DIR}/include/kiln.h DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(FILES ${PROJECT_SOURCE_DIR}/docs/api.md DESTINATION ${CMAKE_INSTALL_DOCDIR})
install(EXPORT kilnTargets NAMESPACE kiln:: DESTINATION ${KILN_CMAKE_DIR})
install(EXPORT kilnStaticTargets NAMESPACE kiln:: DESTINATION ${KILN_CMAKE_DIR})
configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/kilnConfig.cmake.in
  ${PROJECT_BINARY_DIR}/kilnConfig.cmake INSTALL_DESTINATION ${KILN_CMAKE_DIR})
# 0.x: only the same minor version is compatible (as the SONAME says)
if(PROJECT_VERSION_MAJOR EQUAL 0)
  set(KILN_COMPAT SameMinorVersion)
else()
  set(KILN_COMPAT SameMajorVersion)
endif()
write_basic_package_version_file(${PROJECT_BINARY_DIR}/kilnConfigVersion.cmake
  VERSION ${PROJECT_VERSION} COMPATIBILITY ${KILN_COMPAT})
install(FILES ${PROJECT_BINARY_DIR}/kilnConfig.cmake ${PROJECT_BINARY_DIR}/kilnConfigVersion.cmake
        DESTINATION ${KILN_CMAKE_DIR})

# ---- kiln.pc -----------------------------------------------------------------
# Libs.private / Requires.private: what `pkg-config --static --libs kiln`
# needs to link libkiln.a; the shared library needs only -lkiln.
set(KILN_PC_REQUIRES_PRIVATE "libcjson libpng libxxhash libutf8proc")
set(KILN_PC_LIBS_PRIVATE "")
foreach(lib ${DNNL_LIB} ${M_LIB})
  string(APPEND KILN_PC_LIBS_PRIVATE " ${lib}")
endforeach()
# OpenMP: gcc's flag names libgomp (and its pthread)
string(APPEND KILN_PC_LIBS_PRIVATE " ${OpenMP_C_FLAGS} -lpthread")
if(KILN_HAVE_MPI)
  foreach(lib ${MPI_C_LIBRARIES})
    string(APPEND KILN_PC_LIBS_PRIVATE " ${lib}")
  endforeach()
endif()
string(STRIP "${KILN_PC_LIBS_PRIVATE}" KILN_PC_LIBS_PRIVATE)
# relocatable: the prefix relative to the .pc file's own folder (lib/pkgconfig
# -> ../.., lib/x86_64-linux-gnu/pkgconfig -> ../../..), so that
# `cmake --install --prefix P` and a moved prefix both work
file(RELATIVE_PATH KILN_PC_UP "/p/${CMAKE_INSTALL_LIBDIR}/pkgconfig" "/p")
string(REGEX REPLACE "/$" "" KILN_PC_UP "${KILN_PC_UP}")
configure_file(${PROJECT_SOURCE_DIR}/cmake/kiln.pc.in ${PROJECT_BINARY_DIR}/kiln.pc @ONLY)
install(FILES ${PROJECT_BINARY_DIR}/kiln.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)
