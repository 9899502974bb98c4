package bpfobj

import (
	"context"
	"errors"
	"fmt"
	"log/slog"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/ringbuf"
)

// ReadRing hands every record of a BPF ring buffer to fn until ctx ends.
// The record's bytes are reused after fn returns.
func ReadRing(ctx context.Context, m *ebpf.Map, log *slog.Logger, fn func([]byte)) error {
	rd, err := ringbuf.NewReader(m)
	if err != nil {
		return fmt.Errorf("open ring buffer %s: %w", m, err)
	}
	stop := context.AfterFunc(ctx, func() { _ = rd.Close() })
	defer stop()
	var rec ringbuf.Record
	for {
		if err := rd.ReadInto(&rec); err != nil {
			if errors.Is(err, ringbuf.ErrClosed) {
				return nil
			}
			log.Warn("read ring buffer", "map", m.String(), "err", err)
			continue
		}
		fn(rec.RawSample)
	}
}
