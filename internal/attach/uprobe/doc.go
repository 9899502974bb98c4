// Package uprobe is the ground floor of attach: where to probe a
// function and how to link a probe set. Where: from the file's own bytes,
// by the decoder of its ELF machine (x86.go, arm64.go: the
// instructions each kernel emulates, single-steps or refuses). How: one
// uprobe per function or one uprobe_multi link per program, refused
// addresses left out and, when the bytes do not show them, found by
// trying. It knows nothing of the Attacher's policy: which files, which
// processes, when.
package uprobe
