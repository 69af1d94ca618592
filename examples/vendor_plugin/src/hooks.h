/*
 * hooks.h -- the acme device, as the plugin-support library sees it.
 */
#ifndef ACME_HOOKS_H_
#define ACME_HOOKS_H_

#include "dks.h"

/* hooks.c: what the library calls to count, describe and use the devices. */
extern const dks_device_hooks acme_hooks;

#endif /* ACME_HOOKS_H_ */
