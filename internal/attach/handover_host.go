package attach

import (
	"iter"
	"maps"

	"github.com/profi-dev/profi/internal/attach/uprobe"
	"github.com/profi-dev/profi/internal/ops"
)

// The Attacher is the handover's host (handoverHost): it keeps the
// files, the runtime ranges and every link; the handover decides which runtime
// launch probes are linked.

func (a *Attacher) attachedFiles() iter.Seq[*attached] { return maps.Values(a.files) }

func (a *Attacher) runtimeText(pid uint32) (rtRange, bool) { return a.maps.hasText(pid) }

// putRuntimeText writes the handed flags of the registered processes
// (pid_files) and of the unseen ones (file_facts).
func (a *Attacher) putRuntimeText() int {
	return a.maps.putText(a.wantRuntimeText()) + a.maps.putFacts(a.wantFileFacts())
}

// linkLaunch attaches f's runtime launch probe of op again, in every
// link set of f (one per PID filter): the handover takes its launches back
// from the driver. On an error nothing stays attached.
func (a *Attacher) linkLaunch(f *attached, op ops.Op) error {
	lp := f.launches[op]
	made := map[int]*uprobe.Links{}
	for pid := range f.sets {
		l, err := a.reattach(f, []ops.Probe{lp.probe}, pid)
		if err != nil {
			for _, m := range made {
				m.Close()
			}
			return err
		}
		made[pid] = l
	}
	for pid, l := range made {
		ls := f.sets[pid]
		if ls.launches == nil {
			ls.launches = map[ops.Op]*uprobe.Links{}
		}
		ls.launches[op] = l
	}
	return nil
}

// unlinkLaunch detaches f's runtime launch probe of op from every link
// set, one by one: the driver counts its launches now.
func (a *Attacher) unlinkLaunch(f *attached, op ops.Op) {
	for _, ls := range f.sets {
		ls.launches[op].Close()
		delete(ls.launches, op)
	}
}
