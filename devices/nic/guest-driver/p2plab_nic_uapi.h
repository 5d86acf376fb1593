/* SPDX-License-Identifier: GPL-2.0 OR Apache-2.0 */
/*
 * /dev/p2plab-nicN: a small verbs-shaped API of the p2plab_nic driver.
 *
 *   REG_MR     register memory (user RAM, GPU VRAM through the GPU
 *              driver's peer-memory API, or a dma-buf fd); returns a handle
 *   DEREG_MR   forget it (fails with EBUSY while posts use it)
 *   POST_SEND  send [offset, offset+length) of a region as frames
 *   POST_RECV  receive into [offset, offset+length) of a region
 *   POLL_CQ    reap completions (one per post), waiting up to timeout_ms
 *
 * A post is cut into frames at 4 KiB page boundaries of a RAM region, at
 * MTU boundaries of a contiguous VRAM region. The receiver's post must be
 * cut the same way (same kind of region, same offset within a page), as
 * each frame fills one receive descriptor.
 *
 * One open file at a time per device (EBUSY otherwise). A post fails with
 * ENOSPC when the ring has no room for all its frames right now: poll and
 * retry; E2BIG when it needs more frames than the ring has descriptors.
 * A region whose memory was revoked (its GPU memory freed, the GPU driver
 * unbound) fails later posts with ENOLINK; its in-flight posts complete
 * with status P2PLAB_NIC_WC_REVOKED.
 */
#ifndef P2PLAB_NIC_UAPI_H
#define P2PLAB_NIC_UAPI_H

#include <linux/ioctl.h>
#include <linux/types.h>

#define P2PLAB_NIC_SRC_RAM	1	/* addr: user virtual address */
#define P2PLAB_NIC_SRC_GPU	2	/* addr: user VA of an mmap of /dev/p2plab-gpuN */
#define P2PLAB_NIC_SRC_DMABUF	3	/* fd: a dma-buf; addr: offset in it */

struct p2plab_nic_info {
	__u32 mtu;
	__u32 status;		/* NIC_STATUS_* of the hardware header */
	__u32 ring_entries;
	__u32 link_up;
	__u64 tx_frames;	/* frames posted so far */
	__u64 rx_frames;
	__u64 revocations;	/* regions revoked under the driver */
};

struct p2plab_nic_reg_mr {
	__u64 addr;
	__u64 length;		/* multiple of 4096, addr 4096-aligned */
	__u32 source;		/* P2PLAB_NIC_SRC_* */
	__s32 fd;		/* dma-buf fd for SRC_DMABUF, else -1 */
	__u32 handle;		/* out */
	__u32 map_type;		/* out: 0 RAM, else enum pci_p2pdma_map_type */
};

struct p2plab_nic_post {
	__u32 handle;
	__u32 reserved;
	__u64 offset;
	__u64 length;
	__u64 wr_id;		/* returned in the completion */
};

#define P2PLAB_NIC_WC_OK	0
/* Otherwise: the first NIC_DESC_STATUS_* of a frame that failed, or: */
#define P2PLAB_NIC_WC_REVOKED	0x100	/* the region's memory was revoked */
#define P2PLAB_NIC_WC_FLUSHED	0x101	/* the ring was reset or closed */

#define P2PLAB_NIC_WC_SEND	1
#define P2PLAB_NIC_WC_RECV	2

struct p2plab_nic_wc {
	__u64 wr_id;
	__u32 status;		/* P2PLAB_NIC_WC_* */
	__u32 opcode;		/* P2PLAB_NIC_WC_SEND / _RECV */
	__u64 byte_len;
	__u32 frames;
	__u32 reserved;
};

struct p2plab_nic_poll {
	__u64 wcs;		/* user pointer to struct p2plab_nic_wc[max] */
	__u32 max;
	__u32 count;		/* out */
	__u32 timeout_ms;	/* wait this long for at least one */
	__u32 reserved;
};

#define P2PLAB_NIC_IOC_MAGIC	'N'
#define P2PLAB_NIC_IOC_INFO	_IOR(P2PLAB_NIC_IOC_MAGIC, 0x00, struct p2plab_nic_info)
#define P2PLAB_NIC_IOC_REG_MR	_IOWR(P2PLAB_NIC_IOC_MAGIC, 0x01, struct p2plab_nic_reg_mr)
#define P2PLAB_NIC_IOC_DEREG_MR	_IOW(P2PLAB_NIC_IOC_MAGIC, 0x02, __u32)
#define P2PLAB_NIC_IOC_POST_SEND _IOW(P2PLAB_NIC_IOC_MAGIC, 0x03, struct p2plab_nic_post)
#define P2PLAB_NIC_IOC_POST_RECV _IOW(P2PLAB_NIC_IOC_MAGIC, 0x04, struct p2plab_nic_post)
#define P2PLAB_NIC_IOC_POLL_CQ	_IOWR(P2PLAB_NIC_IOC_MAGIC, 0x05, struct p2plab_nic_poll)

#endif /* P2PLAB_NIC_UAPI_H */
