# `cmake --install`: the meshflow executable, the headers under include/meshflow/, the libraries,
# a CMake package (find_package(meshflow) gives meshflow::meshflow) and meshflow.pc.
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

set(meshflow_components core mesh comm plan data kernels ops graph runtime dtensor train auto)
foreach(c ${meshflow_components})
  set_target_properties(meshflow_${c} PROPERTIES EXPORT_NAME ${c})
  add_library(meshflow::${c} ALIAS meshflow_${c})
endforeach()

install(TARGETS meshflow RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
install(TARGETS meshflow_core meshflow_mesh meshflow_comm meshflow_plan meshflow_data meshflow_runtime
                meshflow_kernels meshflow_ops meshflow_graph meshflow_dtensor meshflow_train
                meshflow_auto meshflow_infer meshflow_library
        EXPORT meshflowTargets
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR})
install(DIRECTORY meshflow/ DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/meshflow
        FILES_MATCHING PATTERN "*.h" PATTERN "testdata" EXCLUDE)
install(EXPORT meshflowTargets NAMESPACE meshflow:: FILE meshflowTargets.cmake
        DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/meshflow)
configure_package_config_file(${CMAKE_CURRENT_LIST_DIR}/meshflowConfig.cmake.in
  ${CMAKE_CURRENT_BINARY_DIR}/meshflowConfig.cmake
  INSTALL_DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/meshflow)
write_basic_package_version_file(${CMAKE_CURRENT_BINARY_DIR}/meshflowConfigVersion.cmake
  COMPATIBILITY SameMinorVersion)
install(FILES ${CMAKE_CURRENT_BINARY_DIR}/meshflowConfig.cmake
              ${CMAKE_CURRENT_BINARY_DIR}/meshflowConfigVersion.cmake
        DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/meshflow)

if(MESHFLOW_MPI)
  set(meshflow_pc_requires "fmt nlohmann_json openblas sleef libcrypto sentencepiece ompi-cxx")
  set(meshflow_pc_cflags "-DMESHFLOW_HAVE_MPI")
else()
  set(meshflow_pc_requires "fmt nlohmann_json openblas sleef libcrypto sentencepiece")
  set(meshflow_pc_cflags "")
endif()
# The .pc file finds the prefix from where it lies, so `cmake --install --prefix P` works for any P.
file(RELATIVE_PATH meshflow_pc_to_prefix "${CMAKE_INSTALL_FULL_LIBDIR}/pkgconfig"
     "${CMAKE_INSTALL_PREFIX}")
configure_file(${CMAKE_CURRENT_LIST_DIR}/meshflow.pc.in ${CMAKE_CURRENT_BINARY_DIR}/meshflow.pc @ONLY)
install(FILES ${CMAKE_CURRENT_BINARY_DIR}/meshflow.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)
