# SPDX-License-Identifier: GPL-2.0 OR Apache-2.0
#
# What every guest tool's Makefile includes: one C program, TOOL.c, linked
# static so it runs in a minimal initramfs. Set before the include:
#   TOOL        the program's name
#   TOOL_DEPS   the headers it includes (rebuilds when they change)
#   TOOL_CFLAGS extra compiler flags (e.g. -I another driver's folder)
# OUT= puts the binary elsewhere.

CC ?= gcc
CFLAGS ?= -O2 -g
CFLAGS += -std=gnu11 -Wall -Wextra -Werror
OUT ?= .

$(OUT)/$(TOOL): $(TOOL).c $(TOOL_DEPS)
	$(CC) $(CFLAGS) $(TOOL_CFLAGS) -static -o $@ $(TOOL).c

clean:
	rm -f $(OUT)/$(TOOL)

.PHONY: clean
