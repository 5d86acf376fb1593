/* SPDX-License-Identifier: GPL-2.0 WITH Linux-syscall-note OR Apache-2.0 */
/*
 * nv_p2p_test: ioctls of /dev/nv-p2p-test, a test module that imports GPU
 * memory through NVIDIA's kernel peer-memory API (nv-p2p.h) the way a
 * third-party driver does, and reports what the API returned. Driven by
 * nv-p2p-test-tool.
 *
 * Pins live in the module, not in the calling process, so a later call
 * can ask what happened to them after the process exited, the allocation
 * was freed, the GPU was reset or unbound.
 */
#ifndef NV_P2P_TEST_UAPI_H
#define NV_P2P_TEST_UAPI_H

#include <linux/ioctl.h>
#include <linux/types.h>

#define NV_P2P_TEST_IOC_MAGIC	0xb9

/*
 * PIN: get_pages (or get_pages_persistent) on [va, va + len) of the
 * caller, then dma_map_pages for peer.
 */
struct nv_p2p_test_pin {
	/* in */
	__u64 va;
	__u64 len;
	char peer[32];		/* PCI name of the peer device, e.g. "0000:02:00.0" */
	__u32 persistent;	/* 1: nvidia_p2p_get_pages_persistent */
	__u32 flags;		/* its flags */
	/* out: the page table */
	__s32 get_ret;
	__s32 map_ret;		/* if get_pages succeeded */
	__u32 id;		/* > 0 when get_pages succeeded */
	__u32 version;
	__u32 page_size;	/* enum nvidia_p2p_page_size_type */
	__u32 entries;
	__u32 pt_flags;
	__u32 pt_compatible;	/* NVIDIA_P2P_PAGE_TABLE_VERSION_COMPATIBLE */
	__u8 uuid[16];
	__u64 phys0;		/* pages[0]->physical_address */
	__u32 phys_contiguous;	/* pages[i] = phys0 + i * 64 KiB for all i */
	/* out: the DMA mapping */
	__u32 dma_version;
	__u32 dma_page_size_type;
	__u32 dma_entries;
	__u32 dma_compatible;	/* NVIDIA_P2P_DMA_MAPPING_VERSION_COMPATIBLE */
	__u32 dma_pci_dev_ok;	/* pci_dev is the peer asked for */
	__u64 dma0;		/* dma_addresses[0] */
	__u32 dma_contiguous;	/* dma_addresses[i] = dma0 + i * 64 KiB for all i */
	__u32 pad;
};

/* STATUS / UNPIN of a pin. */
struct nv_p2p_test_status {
	__u32 id;		/* in */
	__u32 callbacks;	/* out: free callbacks run for this pin */
	__u32 revoked;		/* out: the callback let go of the table */
	__u32 callback_in_task;	/* out: it ran in process context */
	__u32 table_ok_in_callback;	/* out: the table was intact while it ran */
	__s32 free_map_ret;	/* out: nvidia_p2p_free_dma_mapping in the callback */
	__s32 free_table_ret;	/* out: nvidia_p2p_free_page_table in the callback */
	__u32 table_valid;	/* out: a live table still reads as it did at PIN */
	/* out (UNPIN): */
	__s32 unmap_ret;	/* dma_unmap_pages, if still mapped */
	__s32 put_ret;		/* put_pages(_persistent); after a callback, with the old pointer */
};

/*
 * ARGS: what the API answers to bad arguments and misuse, on [va, va +
 * len) (64 KiB-aligned GPU memory of the caller, at least 128 KiB),
 * ram_va (64 KiB-aligned RAM of the caller), peer and other (a second PCI
 * device). Leaves nothing pinned.
 */
struct nv_p2p_test_args {
	/* in */
	__u64 va;
	__u64 len;
	__u64 ram_va;
	char peer[32];
	char other[32];
	/* out: get_pages */
	__s32 get_misaligned_va;	/* va + 4 KiB */
	__s32 get_misaligned_len;	/* len - 4 KiB */
	__s32 get_zero_len;
	__s32 get_no_callback;
	__s32 get_no_data;		/* a callback without data */
	__s32 get_token;		/* p2p_token 1 */
	__s32 get_ram;			/* 64 KiB of RAM */
	__s32 get_twice;		/* a second table of the same range */
	/* out: get_pages_persistent */
	__s32 persistent_misaligned;
	__s32 persistent_bad_flags;	/* flags 2 */
	__s32 persistent_ok;
	__s32 force_bar1_get;		/* NVIDIA_P2P_FLAGS_FORCE_BAR1_MAPPING */
	__s32 force_bar1_map;
	__s32 force_bar1_put;
	/* out: mappings */
	__s32 map_null_peer;
	__s32 map_ok;
	__s32 unmap_other_peer;
	__s32 unmap_ok;
	__s32 unmap_again;		/* the same mapping, released already */
	__s32 map_left;			/* a mapping left for put_pages */
	/* out: put */
	__s32 put_wrong_va;
	__s32 put_persistent_of_plain;	/* put_pages_persistent of a get_pages table */
	__s32 put_plain_of_persistent;	/* put_pages of a persistent table */
	__s32 put_persistent_flags;	/* put_pages_persistent with flags 1 */
	__s32 put_null;
	__s32 put_with_map;		/* the table with map_left still mapped */
	__s32 put_twice_ret;		/* the second table */
	__s32 put_persistent_ok;
	__s32 free_table_null;
	__s32 free_map_null;
};

#define NV_P2P_TEST_IOC_PIN	_IOWR(NV_P2P_TEST_IOC_MAGIC, 0x00, struct nv_p2p_test_pin)
#define NV_P2P_TEST_IOC_STATUS	_IOWR(NV_P2P_TEST_IOC_MAGIC, 0x01, struct nv_p2p_test_status)
#define NV_P2P_TEST_IOC_UNPIN	_IOWR(NV_P2P_TEST_IOC_MAGIC, 0x02, struct nv_p2p_test_status)
#define NV_P2P_TEST_IOC_ARGS	_IOWR(NV_P2P_TEST_IOC_MAGIC, 0x03, struct nv_p2p_test_args)

#endif /* NV_P2P_TEST_UAPI_H */
