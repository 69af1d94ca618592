// The collectives half of the devkit PaddlePaddle bridge (bridge_ccl.cc):
// Paddle's xccl_* hooks forwarded onto the plugin's CCL section. bridge.cc
// hands it what it shares with the rest of the bridge, once the plugin is
// loaded, through register_collectives.
#pragma once

#include <cstdint>
#include <string>

#include "devkit.h"
#include "paddle/phi/backends/device_ext.h"

namespace devkit_paddle {

struct BridgeAccess {
  const DK_DeviceApi* api;  // the plugin's table; NULL when it did not load
  // (handle, byte offset) of a pointer Paddle holds; false when it is in no live allocation.
  bool (*resolve)(const void* pointer, DK_Mem* mem, size_t* offset);
  // A DK_Status as a C_Status, reporting the plugin's message on failure.
  C_Status (*status)(DK_Status status, const char* function);
  // The calling thread's current device (Paddle's set_device): a communicator's device.
  int32_t (*current_device)();
  void (*report)(const std::string& what);  // a line on stderr, as the bridge reports
};

// Fills the xccl_* entries of `interface` (none when access.api is NULL).
void register_collectives(C_DeviceInterface* interface, const BridgeAccess& access);

}  // namespace devkit_paddle
