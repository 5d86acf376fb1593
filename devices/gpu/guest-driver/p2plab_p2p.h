/* SPDX-License-Identifier: GPL-2.0 */
/*
 * p2plab_gpu peer-memory API: lets another kernel module (a NIC, a capture
 * card) pin the VRAM behind a user's mapping of a p2plab_gpu allocation and
 * DMA into it. The flow follows NVIDIA's documented nvidia_p2p_* API
 * (nv-p2p.h):
 *
 *   p2plab_p2p_get_pages(va, len, &pt, free_cb, data)   pin, one entry per page
 *   p2plab_p2p_dma_map_pages(peer, pt, &map)           addresses for @peer
 *   ... the peer DMAs to map->dma_addresses[i] ...
 *   p2plab_p2p_dma_unmap_pages(peer, pt, map)
 *   p2plab_p2p_put_pages(pt)                            unpin
 *
 * Revocation. When the memory goes away while pinned (the allocation is
 * freed with P2PLAB_GPU_IOC_FREE, its owner's file is closed, e.g. at
 * process exit, the GPU gets a function reset, or the driver is unbound),
 * the GPU driver calls free_callback(data) once for every page table still
 * pinned, and reuses the VRAM only after every callback has returned. In
 * the callback the importer must:
 *   1. stop its device's DMA to the pages and wait until none is in flight;
 *      after the callback returns the VRAM may belong to someone else;
 *   2. call p2plab_p2p_free_dma_mapping() on each mapping of the table and
 *      then p2plab_p2p_free_page_table() on the table (not dma_unmap_pages
 *      or put_pages).
 *
 * Context and locking rules:
 * - Every function here may sleep; call them in process context only.
 * - free_callback runs in process context (the thread freeing, exiting,
 *   resetting or unbinding), may sleep, and runs with no p2plab lock held.
 *   It must not call p2plab_p2p_get_pages() on the same GPU (the one being
 *   torn down) and must not wait for a thread that is inside
 *   p2plab_p2p_get_pages() on it.
 * - The callback runs at most once per page table, and never after
 *   p2plab_p2p_put_pages() returned 0 for it.
 * - p2plab_p2p_put_pages() never waits for a callback. If revocation took
 *   the table first it returns -ENOENT, does not free anything, and the
 *   callback runs (or is running) and owns the table. The importer therefore
 *   keeps @data valid until its callback has returned or put_pages returned
 *   0, and must not use a table after calling free_page_table on it.
 *   (A typical importer keeps the table pointer under its own mutex, takes
 *   that mutex in the callback and in its release path, and calls put_pages
 *   while holding it; put_pages is allowed to be called with such a lock
 *   held precisely because it never waits for the callback.)
 * - p2plab_p2p_put_pages() returns -EBUSY while DMA mappings of the table
 *   exist; unmap them first.
 *
 * Addresses. page_table->phys[i] is the CPU physical address of page i
 * (for diagnostics; the peer must not use it). dma_mapping->dma_addresses[i]
 * is what the peer puts in its descriptors, decided like the kernel's own
 * P2PDMA mapping (pci_p2pdma_map_type):
 * - both devices under one PCIe switch (PCI_P2PDMA_MAP_BUS_ADDR): the PCI
 *   bus address of the page in the GPU's VRAM BAR, no IOMMU involved;
 * - through an allowed host bridge (PCI_P2PDMA_MAP_THRU_HOST_BRIDGE): the
 *   address from dma_map_resource() for @peer (IOVA with an IOMMU);
 * - otherwise dma_map_pages fails with -EINVAL and the kernel's reason is in
 *   dmesg (pci_p2pdma_distance_many(..., verbose = true)).
 *
 * Pages are P2PLAB_P2P_PAGE_SIZE (4 KiB). @user_va and @len must be page
 * aligned, @len > 0, and [user_va, user_va + len) must lie in one mmap of
 * /dev/p2plab-gpuN and in one allocation made with P2PLAB_GPU_IOC_ALLOC
 * (the mapping's file offset is the VRAM offset, see p2plab_gpu_uapi.h).
 * get_pages looks up @user_va in current->mm: call it from the thread of the
 * process that owns the mapping (e.g. from an ioctl of the importer).
 *
 * Errors: -EINVAL bad arguments or refused P2P path; -EFAULT @user_va is not
 * in such a mapping/allocation; -ENODEV the GPU is gone or being reset;
 * -ENOMEM; -ENOENT see put_pages above; -EBUSY see put_pages above.
 */
#ifndef P2PLAB_P2P_H
#define P2PLAB_P2P_H

#include <linux/types.h>

struct pci_dev;

#define P2PLAB_P2P_PAGE_TABLE_VERSION	1
#define P2PLAB_P2P_DMA_MAPPING_VERSION	1
#define P2PLAB_P2P_PAGE_SIZE		4096u

/* The pinned pages; read-only for the importer. */
struct p2plab_p2p_page_table {
	u32 version;		/* P2PLAB_P2P_PAGE_TABLE_VERSION */
	u32 page_size;		/* bytes, P2PLAB_P2P_PAGE_SIZE */
	u32 entries;		/* len / page_size */
	u32 reserved;
	u64 *phys;		/* [entries] CPU physical address of each page */
	u64 vram_offset;	/* VRAM offset of page 0 */
	struct pci_dev *gpu;	/* the exporting GPU */
	/* Private to p2plab_gpu from here on. */
	void *priv;
};

/* The addresses @peer uses; read-only for the importer. */
struct p2plab_p2p_dma_mapping {
	u32 version;		/* P2PLAB_P2P_DMA_MAPPING_VERSION */
	u32 entries;		/* same as the page table's */
	u32 page_size;		/* bytes, same as the page table's */
	u32 map_type;		/* enum pci_p2pdma_map_type: BUS_ADDR or THRU_HOST_BRIDGE */
	dma_addr_t *dma_addresses;	/* [entries] address of each page for @peer */
	struct pci_dev *peer;
	/* Private to p2plab_gpu from here on. */
	struct p2plab_p2p_page_table *pt;
	void *priv;
};

int p2plab_p2p_get_pages(u64 user_va, u64 len, struct p2plab_p2p_page_table **page_table,
			 void (*free_callback)(void *data), void *data);
int p2plab_p2p_dma_map_pages(struct pci_dev *peer, struct p2plab_p2p_page_table *page_table,
			     struct p2plab_p2p_dma_mapping **dma_mapping);
int p2plab_p2p_dma_unmap_pages(struct pci_dev *peer, struct p2plab_p2p_page_table *page_table,
			       struct p2plab_p2p_dma_mapping *dma_mapping);
int p2plab_p2p_put_pages(struct p2plab_p2p_page_table *page_table);
/* Only from free_callback, see above. */
int p2plab_p2p_free_page_table(struct p2plab_p2p_page_table *page_table);
int p2plab_p2p_free_dma_mapping(struct p2plab_p2p_dma_mapping *dma_mapping);

#endif /* P2PLAB_P2P_H */
