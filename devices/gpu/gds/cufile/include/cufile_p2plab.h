/* SPDX-License-Identifier: Apache-2.0 */
/*
 * p2plab's extensions of its cuFile library (libcufile.so): what cuFile
 * has no call for. The GPU memory calls (p2plab_gds_mem_alloc and the
 * others of p2plab_gds.h) are exported by libcufile.so as well and share
 * its registrations.
 */
#ifndef P2PLAB_CUFILE_P2PLAB_H
#define P2PLAB_CUFILE_P2PLAB_H

#include "cufile.h"
#include "p2plab_gds.h"

#ifdef __cplusplus
extern "C" {
#endif

/* This thread's last cuFileRead/cuFileWrite: which path moved which bytes
 * and why (P2PLAB_GDS_PATH_*, P2PLAB_GDS_REASON_*), or the error in
 * detail. Returns 0, or -1 when report is NULL or the thread has made no
 * transfer yet. */
int p2plab_cufile_last_report(struct p2plab_gds_io_report *report);

/* The full text of this thread's last cuFile failure ("" after a
 * success), e.g. why cuFileHandleDeregister (which returns void) failed;
 * valid until the thread's next cuFile call. */
const char *p2plab_cufile_last_error(void);

#ifdef __cplusplus
}
#endif

#endif /* P2PLAB_CUFILE_P2PLAB_H */
