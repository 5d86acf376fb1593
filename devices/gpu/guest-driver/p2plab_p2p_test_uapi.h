/* SPDX-License-Identifier: GPL-2.0 WITH Linux-syscall-note OR Apache-2.0 */
/*
 * p2plab_p2p_test: ioctls of /dev/p2plab-p2p-test, the in-tree test module
 * that imports p2plab_gpu memory through the peer-memory API (p2plab_p2p.h)
 * and through dma-buf, the way a NIC driver would, and reports what the
 * API returned. Used by p2plab-gpu-tool's p2p-* commands.
 *
 * Pins and attachments live in the module (not in the calling process), so
 * a later call can ask what happened to them after the process exited, the
 * allocation was freed, the GPU was reset or unbound.
 */
#ifndef P2PLAB_P2P_TEST_UAPI_H
#define P2PLAB_P2P_TEST_UAPI_H

#include <linux/ioctl.h>
#include <linux/types.h>

#define P2PLAB_P2P_TEST_IOC_MAGIC	0xb8

/* PIN: get_pages on [va, va + len) of the caller, then dma_map_pages for peer. */
struct p2plab_p2p_test_pin {
	/* in */
	__u64 va;
	__u64 len;
	char peer[32];		/* PCI name of the peer device, e.g. "0000:02:00.0" */
	/* out */
	__s32 get_ret;		/* p2plab_p2p_get_pages() */
	__s32 map_ret;		/* p2plab_p2p_dma_map_pages(), if get_pages succeeded */
	__u32 id;		/* > 0 when get_pages succeeded */
	__u32 entries;
	__u32 page_size;
	__u32 map_type;		/* enum pci_p2pdma_map_type */
	__u32 dma_contiguous;	/* 1 if dma[i] == dma[0] + i * page_size for all i */
	__u32 phys_contiguous;	/* 1 if phys[i] == phys[0] + i * page_size for all i */
	__u64 dma0;		/* dma_addresses[0] */
	__u64 phys0;		/* phys[0] */
	__u64 vram_offset;
};

/* STATUS / UNPIN of a pin. */
struct p2plab_p2p_test_status {
	__u32 id;		/* in */
	__u32 callbacks;	/* out: free callbacks run for this pin (0 or 1) */
	__u32 revoked;		/* out: the callback freed the table */
	__u32 callback_in_task;	/* out: the callback ran in process context */
	__s32 put_ret;		/* out (UNPIN): dma_unmap_pages, then put_pages */
	__u32 pad;
};

/* DMABUF_ATTACH: a dynamic attachment of a dma-buf fd for peer, mapped once. */
struct p2plab_p2p_test_dmabuf {
	/* in */
	__s32 fd;
	__u32 p2p;		/* 1: allow_peer2peer */
	char peer[32];
	/* out */
	__s32 attach_ret;
	__s32 map_ret;
	__u32 id;		/* > 0 when the attach succeeded */
	__u32 nents;		/* DMA segments of the mapping */
	__u64 dma0;		/* first segment's address */
	__u64 dma_len;		/* total DMA length */
};

/* DMABUF_STATUS: invalidations seen, and whether mapping again works now. */
struct p2plab_p2p_test_dmabuf_status {
	__u32 id;		/* in */
	__u32 invalidations;	/* out: invalidate_mappings calls */
	__s32 remap_ret;	/* out: a fresh map (unmapped again at once) */
	__u32 mapped;		/* out: the attachment still holds a mapping */
};

#define P2PLAB_P2P_TEST_IOC_PIN		_IOWR(P2PLAB_P2P_TEST_IOC_MAGIC, 0x00, struct p2plab_p2p_test_pin)
#define P2PLAB_P2P_TEST_IOC_STATUS	_IOWR(P2PLAB_P2P_TEST_IOC_MAGIC, 0x01, struct p2plab_p2p_test_status)
#define P2PLAB_P2P_TEST_IOC_UNPIN	_IOWR(P2PLAB_P2P_TEST_IOC_MAGIC, 0x02, struct p2plab_p2p_test_status)
#define P2PLAB_P2P_TEST_IOC_DMABUF_ATTACH _IOWR(P2PLAB_P2P_TEST_IOC_MAGIC, 0x03, struct p2plab_p2p_test_dmabuf)
#define P2PLAB_P2P_TEST_IOC_DMABUF_STATUS _IOWR(P2PLAB_P2P_TEST_IOC_MAGIC, 0x04, struct p2plab_p2p_test_dmabuf_status)
#define P2PLAB_P2P_TEST_IOC_DMABUF_DETACH _IOW(P2PLAB_P2P_TEST_IOC_MAGIC, 0x05, __u32)

#endif /* P2PLAB_P2P_TEST_UAPI_H */
