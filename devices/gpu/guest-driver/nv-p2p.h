/* SPDX-License-Identifier: GPL-2.0 OR MIT */
/*
 * NVIDIA's kernel peer-memory interface, as p2plab_gpu.ko exports it.
 *
 * A module written for NVIDIA's driver includes "nv-p2p.h" and calls
 * nvidia_p2p_get_pages() and friends; built against this header and
 * p2plab_gpu's Module.symvers, the same source runs against p2plab's GPU.
 * Written for p2plab from the documented declarations of the public
 * nv-p2p.h (NVIDIA open GPU kernel modules, 595 series): every name,
 * argument list, structure field (with its type and position), version
 * number and flag a caller can see is NVIDIA's; the text is ours.
 *
 * How the calls behave here, and the few places where p2plab is stricter
 * than NVIDIA's driver: docs/user-guide/rdma.md, "NVIDIA's peer-memory
 * API". In short:
 *
 *   nvidia_p2p_get_pages(0, 0, va, len, &pt, free_cb, data)
 *       pins [va, va + len) of the calling process, which must lie in one
 *       mmap of one p2plab_gpu VRAM allocation; va and len are multiples
 *       of 64 KiB; pt->pages[i]->physical_address is the CPU physical
 *       address of GPU page i (64 KiB each, page_size
 *       NVIDIA_P2P_PAGE_SIZE_64KB).
 *   nvidia_p2p_dma_map_pages(peer, pt, &map)
 *       map->dma_addresses[i] is what @peer puts in its descriptors for
 *       GPU page i: the PCI bus address behind a common switch, the
 *       kernel's mapping through an allowed host bridge; -ENOTSUPP when
 *       the kernel's P2PDMA refuses the pair (its reason is in dmesg).
 *   nvidia_p2p_dma_unmap_pages(peer, pt, map), nvidia_p2p_put_pages(0, 0,
 *   va, pt)
 *       undo them; put_pages also releases mappings left behind.
 *   free_cb(data)
 *       runs once, in process context, when the memory goes away while
 *       pinned (the allocation freed, its owner gone, a function reset,
 *       unbind). When it returns, the GPU driver frees the table and its
 *       mappings itself: nvidia_p2p_free_dma_mapping() and
 *       nvidia_p2p_free_page_table(), which the callback may call, do
 *       nothing. put_pages waits for a callback in flight and then
 *       returns 0, so it must not be called with a lock the callback
 *       takes.
 *   nvidia_p2p_get_pages_persistent() / nvidia_p2p_put_pages_persistent()
 *       the same without a callback: freeing the allocation leaves the
 *       VRAM pinned until put_pages_persistent.
 *
 * Every call may sleep.
 */
#ifndef P2PLAB_NV_P2P_H
#define P2PLAB_NV_P2P_H

#include <linux/types.h>

struct pci_dev;

/*
 * Versions. The first 32-bit field of every structure the GPU driver hands
 * out is its version: the major number in the upper 16 bits (a layout a
 * caller must be rebuilt for), the minor in the lower 16 (fields added at
 * the end). A caller checks NVIDIA_P2P_*_VERSION_COMPATIBLE(ptr): the same
 * major as the header it was built with, and at least its minor.
 */
#define NVIDIA_P2P_MAJOR_VERSION_MASK	0xffff0000
#define NVIDIA_P2P_MINOR_VERSION_MASK	0x0000ffff
#define NVIDIA_P2P_MAJOR_VERSION(v)	(((v) & NVIDIA_P2P_MAJOR_VERSION_MASK) >> 16)
#define NVIDIA_P2P_MINOR_VERSION(v)	((v) & NVIDIA_P2P_MINOR_VERSION_MASK)
#define NVIDIA_P2P_MAJOR_VERSION_MATCHES(p, v) \
	(NVIDIA_P2P_MAJOR_VERSION((p)->version) == NVIDIA_P2P_MAJOR_VERSION(v))
#define NVIDIA_P2P_VERSION_COMPATIBLE(p, v) \
	(NVIDIA_P2P_MAJOR_VERSION_MATCHES(p, v) && \
	 NVIDIA_P2P_MINOR_VERSION((p)->version) >= NVIDIA_P2P_MINOR_VERSION(v))

#define NVIDIA_P2P_PAGE_TABLE_VERSION	0x00020000
#define NVIDIA_P2P_PAGE_TABLE_VERSION_COMPATIBLE(p) \
	NVIDIA_P2P_VERSION_COMPATIBLE(p, NVIDIA_P2P_PAGE_TABLE_VERSION)

#define NVIDIA_P2P_DMA_MAPPING_VERSION	0x00020003
#define NVIDIA_P2P_DMA_MAPPING_VERSION_COMPATIBLE(p) \
	NVIDIA_P2P_VERSION_COMPATIBLE(p, NVIDIA_P2P_DMA_MAPPING_VERSION)

/* Bytes of nvidia_p2p_page_table.gpu_uuid. */
#define NVIDIA_P2P_GPU_UUID_LEN		16

/* Defined: nvidia_p2p_get_pages_persistent() exists. */
#define NVIDIA_P2P_CAP_GET_PAGES_PERSISTENT_API

/* nvidia_p2p_page_table.flags */
#define NVIDIA_P2P_PAGE_TABLE_FLAGS_CPU_CACHEABLE	0x1	/* never set by p2plab */

/* flags of the persistent calls */
#define NVIDIA_P2P_FLAGS_DEFAULT		0
#define NVIDIA_P2P_FLAGS_FORCE_BAR1_MAPPING	1

/* GPU page sizes; p2plab's tables are always NVIDIA_P2P_PAGE_SIZE_64KB. */
enum nvidia_p2p_page_size_type {
	NVIDIA_P2P_PAGE_SIZE_4KB = 0,
	NVIDIA_P2P_PAGE_SIZE_64KB,
	NVIDIA_P2P_PAGE_SIZE_128KB,
	NVIDIA_P2P_PAGE_SIZE_COUNT
};

/* One GPU page of a page table. */
typedef struct nvidia_p2p_page {
	uint64_t physical_address;	/* CPU physical address of the page in the BAR */
	/* Mailbox registers of Fermi-era peers; zero on p2plab. */
	union nvidia_p2p_request_registers {
		struct {
			uint32_t wreqmb_h;
			uint32_t rreqmb_h;
			uint32_t rreqmb_0;
			uint32_t reserved[3];
		} fermi;
	} registers;
} nvidia_p2p_page_t;

/* What get_pages returns; read-only for the caller. */
typedef struct nvidia_p2p_page_table {
	uint32_t version;		/* NVIDIA_P2P_PAGE_TABLE_VERSION */
	uint32_t page_size;		/* an enum nvidia_p2p_page_size_type */
	struct nvidia_p2p_page **pages;	/* [entries] */
	uint32_t entries;
	uint8_t *gpu_uuid;		/* NVIDIA_P2P_GPU_UUID_LEN bytes */
	uint32_t flags;			/* NVIDIA_P2P_PAGE_TABLE_FLAGS_* */
} nvidia_p2p_page_table_t;

/* What dma_map_pages returns; read-only for the caller. */
typedef struct nvidia_p2p_dma_mapping {
	uint32_t version;		/* NVIDIA_P2P_DMA_MAPPING_VERSION */
	enum nvidia_p2p_page_size_type page_size_type;
	uint32_t entries;		/* the page table's */
	uint64_t *dma_addresses;	/* [entries] address of GPU page i for pci_dev */
	void *private;			/* the GPU driver's */
	struct pci_dev *pci_dev;	/* the peer it was made for */
} nvidia_p2p_dma_mapping_t;

/*
 * Pins GPU memory for third-party DMA and calls @free_callback(@data) if
 * it goes away first. @p2p_token and @va_space are 0 (the token scheme of
 * nvidia_p2p_init_mapping() is gone from NVIDIA's driver too). Returns 0,
 * or -EINVAL (bad argument, no callback, not a 64 KiB multiple, not GPU
 * memory of the caller), -ENOMEM, -EIO (the GPU is gone or resetting).
 */
int nvidia_p2p_get_pages(uint64_t p2p_token, uint32_t va_space,
			 uint64_t virtual_address, uint64_t length,
			 struct nvidia_p2p_page_table **page_table,
			 void (*free_callback)(void *data), void *data);

/*
 * Pins without a callback: the memory stays until
 * nvidia_p2p_put_pages_persistent(), even if its allocation is freed.
 * @flags: NVIDIA_P2P_FLAGS_*; with FORCE_BAR1_MAPPING dma_map_pages
 * refuses the table (-ENOTSUPP), as NVIDIA's does.
 */
int nvidia_p2p_get_pages_persistent(uint64_t virtual_address, uint64_t length,
				    struct nvidia_p2p_page_table **page_table,
				    uint32_t flags);

/*
 * DMA addresses of the pinned pages for @peer. Returns 0, or -EINVAL (bad
 * argument, table not pinned), -ENOTSUPP (the kernel refuses P2P between
 * the GPU and @peer, or FORCE_BAR1_MAPPING), -ENOMEM, -EIO.
 */
int nvidia_p2p_dma_map_pages(struct pci_dev *peer,
			     struct nvidia_p2p_page_table *page_table,
			     struct nvidia_p2p_dma_mapping **dma_mapping);

/* Undoes dma_map_pages; 0 also when the mapping was released already. */
int nvidia_p2p_dma_unmap_pages(struct pci_dev *peer,
			       struct nvidia_p2p_page_table *page_table,
			       struct nvidia_p2p_dma_mapping *dma_mapping);

/*
 * Unpins a table from get_pages, releasing its mappings. 0 also when the
 * free callback took the table (after waiting for it to finish).
 */
int nvidia_p2p_put_pages(uint64_t p2p_token, uint32_t va_space,
			 uint64_t virtual_address,
			 struct nvidia_p2p_page_table *page_table);

/* Unpins a table from get_pages_persistent; @flags must be 0. */
int nvidia_p2p_put_pages_persistent(uint64_t virtual_address,
				    struct nvidia_p2p_page_table *page_table,
				    uint32_t flags);

/* From a free callback; they do nothing (the GPU driver frees both). */
int nvidia_p2p_free_page_table(struct nvidia_p2p_page_table *page_table);
int nvidia_p2p_free_dma_mapping(struct nvidia_p2p_dma_mapping *dma_mapping);

#endif /* P2PLAB_NV_P2P_H */
