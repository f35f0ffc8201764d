# Installs the systemd units and the environment file (packaging/CMakeLists.txt runs it from the
# install script, so that the paths written into the units are those of the install's own prefix:
# `cmake --install BUILD --prefix /usr` gives /usr/bin/kvfence and /etc/default/kvfence, whatever
# the build was configured with). DESTDIR is honoured by file(INSTALL).
#   in: KVF_PKG_SRC (packaging/), KVF_PKG_BIN (a scratch directory of the build tree)
if(CMAKE_INSTALL_PREFIX STREQUAL "/usr")
  set(_etc "/etc")
else()
  set(_etc "${CMAKE_INSTALL_PREFIX}/etc")
endif()
set(KVF_BIN "${CMAKE_INSTALL_PREFIX}/bin/kvfence")
set(KVF_ENV_FILE "${_etc}/default/kvfence")
set(KVF_CONF_DIR "${_etc}/kvfence")
file(READ "${KVF_PKG_SRC}/systemd/sandbox.conf" KVF_UNIT_SANDBOX)
file(MAKE_DIRECTORY "${KVF_PKG_BIN}/units")
foreach(u kvfence.service kvfence-router.service kvfence-prefill@.service kvfence-decode@.service)
  configure_file("${KVF_PKG_SRC}/systemd/${u}.in" "${KVF_PKG_BIN}/units/${u}" @ONLY)
  file(INSTALL "${KVF_PKG_BIN}/units/${u}" DESTINATION "${CMAKE_INSTALL_PREFIX}/lib/systemd/system"
       PERMISSIONS OWNER_READ OWNER_WRITE GROUP_READ WORLD_READ)
endforeach()
configure_file("${KVF_PKG_SRC}/default.kvfence" "${KVF_PKG_BIN}/units/kvfence" @ONLY)
file(INSTALL "${KVF_PKG_BIN}/units/kvfence" DESTINATION "${_etc}/default"
     PERMISSIONS OWNER_READ OWNER_WRITE GROUP_READ WORLD_READ)
