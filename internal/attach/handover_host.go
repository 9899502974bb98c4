package attach

import (
	"iter"
	"maps"

	"github.com/profi-dev/profi/internal/ops"
)

// The Attacher is the handover's host (handoverHost): it keeps the
// files, rt_text and every link; the handover decides which runtime
// launch probes are linked.

func (a *Attacher) attachedFiles() iter.Seq[*attached] { return maps.Values(a.files) }

func (a *Attacher) runtimeText(pid uint32) (rtRange, bool) { return a.maps.hasText(pid) }

func (a *Attacher) putRuntimeText() int { return a.maps.putText(a.wantRuntimeText()) }

// linkLaunch attaches f's runtime launch probe of op again: the handover
// takes its launches back from the driver.
func (a *Attacher) linkLaunch(f *attached, op ops.Op) error {
	lp := f.launches[op]
	links, err := a.reattach(f, []ops.Probe{lp.probe}, a.opts.PID)
	if err != nil {
		return err
	}
	lp.links = links
	return nil
}

// unlinkLaunch detaches f's runtime launch probe of op: the driver counts
// its launches now.
func (a *Attacher) unlinkLaunch(f *attached, op ops.Op) {
	lp := f.launches[op]
	lp.links.Close()
	lp.links = nil
}
