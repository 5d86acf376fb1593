/* SPDX-License-Identifier: GPL-2.0 OR Apache-2.0 */
/*
 * p2plab GPU-like device: hardware interface (BAR0 registers, ring entry
 * and completion record layout, status codes).
 *
 * The device's own definitions are in devices/gpu/src (regs.rs, command.rs,
 * status.rs, engine/opcodes.rs); devices/gpu/tests/guest_header/ checks
 * every define and struct field here against them, both ways, so change
 * both together. README.md in devices/gpu documents the semantics.
 */
#ifndef P2PLAB_GPU_HW_H
#define P2PLAB_GPU_HW_H

#include <linux/types.h>

#define P2PLAB_GPU_VENDOR_ID		0x5032
#define P2PLAB_GPU_DEVICE_ID		0x4750

#define P2PLAB_GPU_REGS_BAR		0
#define P2PLAB_GPU_REGS_BAR_SIZE	4096
#define P2PLAB_GPU_VRAM_BAR		2

#define P2PLAB_GPU_ID_MAGIC		0x50324750
#define P2PLAB_GPU_VERSION_MAJOR	1

/* BAR0 registers, 32-bit little-endian. */
#define REG_ID			0x000
#define REG_VERSION		0x004
#define REG_VRAM_SIZE		0x008	/* 64-bit */
#define REG_STATUS		0x010
#define REG_ENGINE_ERROR	0x014
#define REG_SCRATCH		0x01c
#define REG_RING_BASE		0x020	/* 64-bit */
#define REG_RING_SIZE		0x028
#define REG_RING_CTRL		0x02c
#define REG_RING_HEAD		0x030
#define REG_RING_TAIL		0x034
#define REG_DOORBELL		0x038
#define REG_FENCE		0x040	/* 64-bit, read with one 8-byte access */
#define REG_CHECKSUM		0x048
#define REG_INT_STATUS		0x050	/* write 1 to clear */
#define REG_INT_MASK		0x054	/* 1 = masked */
#define REG_JOBS_COMPLETED	0x060
#define REG_JOBS_FAILED		0x064
#define REG_VRAM_ERR_COUNT	0x068
#define REG_VRAM_ERR_ADDR	0x070	/* 64-bit */

#define STATUS_READY		(1u << 0)
#define STATUS_RING_ENABLED	(1u << 1)
#define STATUS_BUSY		(1u << 2)
#define STATUS_HALTED		(1u << 3)
#define STATUS_BUS_MASTER	(1u << 4)

#define RING_CTRL_ENABLE	(1u << 0)
#define RING_CTRL_IN_VRAM	(1u << 1)

#define INT_FENCE		(1u << 0)
#define INT_ERROR		(1u << 1)
#define INT_ALL			(INT_FENCE | INT_ERROR)

#define MIN_RING_ENTRIES	2
#define MAX_RING_ENTRIES	65536

/* Opcodes. */
#define OP_NOP			0x00
#define OP_COPY_TO_VRAM		0x01	/* src = bus address, dst = VRAM offset */
#define OP_COPY_FROM_VRAM	0x02	/* src = VRAM offset, dst = bus address */
#define OP_COPY_VRAM		0x03	/* memmove inside VRAM */
#define OP_FILL			0x04	/* 32-bit pattern repeated from dst */
#define OP_CHECKSUM		0x05	/* CRC32C of [src, src+len) */

#define CMD_FLAG_IRQ		(1u << 0)
#define CMD_FLAG_COMPLETION	(1u << 1)

/* One 64-byte ring entry. */
struct p2plab_gpu_hw_cmd {
	__u8 opcode;
	__u8 flags;
	__le16 reserved0;
	__le32 pattern;
	__le64 fence;
	__le64 src;
	__le64 dst;
	__le64 len;
	__le64 completion_addr;
	__le64 reserved1[2];
};

/* The 16-byte completion record, written before REG_FENCE advances. */
struct p2plab_gpu_hw_completion {
	__le64 fence;
	__le32 status;
	__le32 result;
};

/* Status codes (completion status, REG_ENGINE_ERROR). */
#define HW_STATUS_OK			0x00
#define HW_ERR_BAD_OPCODE		0x01
#define HW_ERR_BAD_COMMAND		0x02
#define HW_ERR_VRAM_RANGE		0x03
#define HW_ERR_HOST_DMA			0x04
#define HW_ERR_NO_BUS_MASTER		0x05
#define HW_ERR_VRAM_IO			0x06
#define HW_ERR_COMPLETION_WRITE		0x07
#define HW_ERR_RING_MISALIGNED		0x10
#define HW_ERR_RING_BAD_SIZE		0x11
#define HW_ERR_RING_RANGE		0x12
#define HW_ERR_RING_FETCH		0x13
#define HW_ERR_BAD_TAIL			0x14

#endif /* P2PLAB_GPU_HW_H */
