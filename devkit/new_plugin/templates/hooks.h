/*
 * hooks.h -- the @name@ device, as the plugin-support library sees it.
 */
#ifndef @NAME@_HOOKS_H_
#define @NAME@_HOOKS_H_

#include "dks.h"

/* hooks.c: what the library calls to count, describe and use the devices. */
extern const dks_device_hooks @name@_hooks;

#endif /* @NAME@_HOOKS_H_ */
