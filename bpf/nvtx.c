// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)

/*
 * NVTX (--enable-nvtx-tracing). Entry-only probes keep each thread's open
 * ranges as a stack of phase rules; launches read it (launch_phase). One
 * stack per thread across domains: ranges nest LIFO across domains.
 */

/* Whether the name at b (lowercased, zero padded) starts with the n-byte pattern s. */
static __always_inline bool at(const u8 *b, const char *s, u32 n)
{
	u32 k;

#pragma unroll
	for (k = 0; k < 9; k++) {
		if (k >= n)
			break;
		if (b[k] != (u8)s[k])
			return false;
	}
	return true;
}

/* Whether the name contains the n-byte pattern s (n <= 9). */
static __always_inline bool contains(const u8 *buf, const char *s, u32 n)
{
	u32 i;

#pragma clang loop unroll(disable)
	for (i = 0; i < NVTX_NAME_LEN; i++) {
		if (!buf[i])
			return false;
		if (at(&buf[i], s, n))
			return true;
	}
	return false;
}

#define HAS(lit) contains(buf, lit, sizeof(lit) - 1)

/* The phase rule of a lowercased name (docs/INTERFACE.md `phase`, in order). */
static __always_inline u32 name_phase(const u8 *buf)
{
	if (HAS("prefill") || HAS("prompt") || HAS("encode"))
		return PHASE_PREFILL;
	if (HAS("decode") || HAS("generate"))
		return PHASE_DECODE;
	if (HAS("attention") || HAS("attn"))
		return PHASE_ATTENTION;
	if (HAS("mlp") || HAS("ffn") || HAS("expert"))
		return PHASE_MLP;
	if (HAS("norm") || HAS("embed"))
		return PHASE_NORM;
	return PHASE_OTHER;
}

/* Reads a range name into n->buf, lowercased; false if it could not be read. */
static __always_inline bool read_name(struct nvtx_name *n, u64 ptr, bool wide)
{
	u32 i;

	__builtin_memset(n->buf, 0, sizeof(n->buf));
	if (!ptr)
		return false;
	if (!wide) {
		if (bpf_probe_read_user_str(n->buf, NVTX_NAME_LEN, (void *)ptr) <= 0)
			return false;
	} else {
		/*
		 * UTF-32 (wchar_t), read 4 characters at a time so that a name
		 * near the end of a mapping still reads; non-ASCII characters
		 * match no rule.
		 */
		__builtin_memset(n->wide, 0, sizeof(n->wide));
		for (i = 0; i < NVTX_NAME_LEN / 4; i++) {
			if (bpf_probe_read_user(&n->wide[i * 4], 16, (void *)(ptr + i * 16))) {
				if (!i)
					return false;
				break;
			}
			if (!n->wide[i * 4] || !n->wide[i * 4 + 1] || !n->wide[i * 4 + 2] ||
			    !n->wide[i * 4 + 3])
				break;
		}
		for (i = 0; i < NVTX_NAME_LEN - 1; i++) {
			u32 c = n->wide[i];

			if (!c)
				break;
			n->buf[i] = c < 0x80 ? c : 0x7f;
		}
	}
	for (i = 0; i < NVTX_NAME_LEN; i++) {
		u8 c = n->buf[i];

		if (c >= 'A' && c <= 'Z')
			n->buf[i] = c + ('a' - 'A');
	}
	return true;
}

/* nvtxEventAttributes_v2: messageType (int32) at 32, message at 40. */
#define NVTX_ATTR_MESSAGE_TYPE 32
#define NVTX_ATTR_MESSAGE      40
#define NVTX_MESSAGE_ASCII     1
#define NVTX_MESSAGE_UNICODE   2

SEC("uprobe.multi")
int nvtx_push(struct pt_regs *ctx)
{
	u64 cookie = bpf_get_attach_cookie(ctx);
	u64 id = bpf_get_current_pid_tgid();
	struct nvtx_ranges zero = {};
	struct nvtx_ranges *s;
	struct nvtx_name *n;
	u32 key = 0, phase = PHASE_OTHER, d;
	u64 ptr = 0, attr = 0, a1, a2;
	s32 type = 0;
	bool wide = false;

	count_hit(id >> 32);
	if (!hit_flags(ctx, id >> 32, COOKIE_FILE(cookie)))
		return 0;
	/* Both arguments read up front: the verifier refuses a computed ctx offset. */
	a1 = arg(ctx, 1);
	a2 = arg(ctx, 2);
	switch (args_of(COOKIE_OP(cookie))) {
	case ARGS_NVTX_A:
		ptr = a1;
		break;
	case ARGS_NVTX_W:
		ptr = a1;
		wide = true;
		break;
	case ARGS_NVTX_EX:
		attr = a1;
		break;
	case ARGS_NVTX_DOMAIN_EX:
		attr = a2;
		break;
	}
	if (attr &&
	    !bpf_probe_read_user(&type, sizeof(type), (void *)(attr + NVTX_ATTR_MESSAGE_TYPE)) &&
	    (type == NVTX_MESSAGE_ASCII || type == NVTX_MESSAGE_UNICODE) &&
	    !bpf_probe_read_user(&ptr, sizeof(ptr), (void *)(attr + NVTX_ATTR_MESSAGE)))
		wide = type == NVTX_MESSAGE_UNICODE;
	/* A registered string or an unreadable name opens a range of no rule. */
	n = bpf_map_lookup_elem(&nvtx_scratch, &key);
	if (n && ptr && read_name(n, ptr, wide))
		phase = name_phase(n->buf);

	s = bpf_map_lookup_elem(&nvtx_stack, &id);
	if (!s) {
		u32 drop =
		    store_admitted(&nvtx_stack, &id, &zero, id >> 32, QUOTA_NVTX_STACK | NEW_ONLY);

		s = bpf_map_lookup_elem(&nvtx_stack, &id);
		if (!s) {
			if (drop != NO_DROP)
				count_drop(drop);
			return 0;
		}
	}
	d = s->depth;
	if (d < NVTX_DEPTH)
		s->phases[d & (NVTX_DEPTH - 1)] = phase;
	s->depth = d + 1;
	return 0;
}

/* nvtxRangePop, nvtxDomainRangePop: a pop with no range open changes nothing. */
SEC("uprobe.multi")
int nvtx_pop(struct pt_regs *ctx)
{
	u64 id = bpf_get_current_pid_tgid();
	struct nvtx_ranges *s;

	count_hit(id >> 32);
	if (!hit_flags(ctx, id >> 32, COOKIE_FILE(bpf_get_attach_cookie(ctx))))
		return 0;
	s = bpf_map_lookup_elem(&nvtx_stack, &id);
	if (!s || !s->depth)
		return 0;
	if (s->depth == 1)
		delete_admitted(&nvtx_stack, &id, id >> 32, QUOTA_NVTX_STACK);
	else
		s->depth--;
	return 0;
}
