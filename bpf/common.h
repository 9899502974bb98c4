/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * Minimal kernel definitions for profi's uprobe programs. A full vmlinux.h
 * is 2.8 MB and clashes with common names; uprobes need only basic types,
 * the map type enum and the register frame (arch/).
 */
#pragma once

typedef unsigned char __u8;
typedef short int __s16;
typedef short unsigned int __u16;
typedef int __s32;
typedef unsigned int __u32;
typedef long long int __s64;
typedef long long unsigned int __u64;
typedef __u8 u8;
typedef __u16 u16;
typedef __s32 s32;
typedef __u32 u32;
typedef __s64 s64;
typedef __u64 u64;
typedef _Bool bool;
#define true 1
#define false 0
/* Used by bpf_helper_defs.h prototypes. */
typedef __u16 __be16;
typedef __u32 __be32;
typedef __u32 __wsum;

enum bpf_map_type {
	BPF_MAP_TYPE_HASH = 1,
	BPF_MAP_TYPE_ARRAY = 2,
	BPF_MAP_TYPE_PERCPU_HASH = 5,
	BPF_MAP_TYPE_PERCPU_ARRAY = 6,
	BPF_MAP_TYPE_LRU_HASH = 9,
	BPF_MAP_TYPE_LRU_PERCPU_HASH = 10,
	BPF_MAP_TYPE_RINGBUF = 27,
	BPF_MAP_TYPE_TASK_STORAGE = 29,
};

enum {
	BPF_ANY = 0,
	BPF_NOEXIST = 1,
	BPF_EXIST = 2,
};

/* Map flags and local storage (task storage) flags, from uapi/linux/bpf.h. */
#define BPF_F_NO_PREALLOC	       (1U << 0)
#define BPF_LOCAL_STORAGE_GET_F_CREATE (1ULL << 0)

/*
 * The register frame and argument access of the target architecture:
 * bpf2go -target amd64 or arm64 defines __TARGET_ARCH_x86 or
 * __TARGET_ARCH_arm64 (bpf_tracing.h reads the same macros).
 */
#if defined(__TARGET_ARCH_x86)
#include "arch/x86_64.h"
#elif defined(__TARGET_ARCH_arm64)
#include "arch/arm64.h"
#else
#error "profi's BPF programs are built for x86-64 or arm64: bpf2go -target amd64 or arm64"
#endif

#include <bpf/bpf_core_read.h>

/* The errors the programs tell apart (the same numbers on x86-64 and arm64). */
#define EBUSY  16
#define EEXIST 17
