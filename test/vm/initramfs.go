// Package vm boots Debian's cloud kernels under qemu (TCG) with a small
// initramfs and runs profi's BPF load tests, `profi check` and an
// end-to-end smoke subset inside: the kernel matrix of docs/KERNELS.md.
// The harness is vm_test.go; this file builds the initramfs.
package vm

import (
	"bufio"
	"debug/elf"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"
)

// initramfs is the file tree of a VM's root: the path inside the VM to
// the host file it is copied from (a "" source is a directory), plus
// files given by content.
type initramfs struct {
	files    map[string]string
	contents map[string][]byte
}

func newInitramfs() *initramfs {
	return &initramfs{files: map[string]string{}, contents: map[string][]byte{}}
}

// add copies host file from to path to inside the VM.
func (r *initramfs) add(to, from string) { r.files[filepath.Clean(to)] = from }

// write puts content at path to inside the VM.
func (r *initramfs) write(to string, content []byte) { r.contents[filepath.Clean(to)] = content }

// addTree copies every regular file under dir to the same path inside the
// VM (the fixtures record their absolute directory in RUNPATH).
func (r *initramfs) addTree(dir string) error {
	return filepath.Walk(dir, func(p string, info os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		if info.Mode().IsRegular() && !strings.HasPrefix(info.Name(), ".") {
			r.add(p, p)
		}
		return nil
	})
}

// addLibraries adds the interpreter and every shared library that the
// ELF files already in r need (transitively), found in r itself (RUNPATH)
// or on the host in libDirs, installed in vmLib, where the VM's dynamic
// loader looks them up.
func (r *initramfs) addLibraries(libDirs []string, vmLib string) error {
	seen := map[string]bool{}
	var queue []string
	for to := range r.files {
		queue = append(queue, to)
	}
	sort.Strings(queue)
	for len(queue) > 0 {
		to := queue[0]
		queue = queue[1:]
		if seen[to] {
			continue
		}
		seen[to] = true
		f, err := elf.Open(r.files[to])
		if err != nil {
			continue // not an ELF file (a script, a fake library)
		}
		var needed []string
		interp := ""
		for _, p := range f.Progs {
			if p.Type == elf.PT_INTERP {
				b, err := io.ReadAll(p.Open())
				if err == nil {
					interp = strings.TrimRight(string(b), "\x00")
				}
			}
		}
		needed, _ = f.ImportedLibraries()
		runpath, _ := f.DynString(elf.DT_RUNPATH)
		rpath, _ := f.DynString(elf.DT_RPATH)
		f.Close()
		if interp != "" {
			if _, ok := r.files[interp]; !ok {
				src, err := hostFile(interp, libDirs)
				if err != nil {
					return fmt.Errorf("%s: interpreter: %w", to, err)
				}
				r.add(interp, src)
			}
			queue = append(queue, interp)
		}
		var dirs []string
		for _, s := range append(runpath, rpath...) {
			dirs = append(dirs, strings.Split(s, ":")...)
		}
	lib:
		for _, n := range needed {
			for _, d := range dirs {
				if _, ok := r.files[filepath.Join(d, n)]; ok {
					queue = append(queue, filepath.Join(d, n))
					continue lib
				}
			}
			found := false
			for _, d := range libDirs {
				p := filepath.Join(d, n)
				if _, err := os.Stat(p); err == nil {
					src, err := filepath.EvalSymlinks(p)
					if err != nil {
						return err
					}
					// Installed where the VM's loader looks.
					in := filepath.Join(vmLib, n)
					r.add(in, src)
					queue = append(queue, in)
					found = true
					break
				}
			}
			if !found {
				return fmt.Errorf("%s needs %s: not found in RUNPATH %v nor in %v", to, n, dirs, libDirs)
			}
		}
	}
	return nil
}

// hostFile resolves an absolute library path (the interpreter) on the host,
// or by its base name in libDirs (a cross architecture's sysroot).
func hostFile(p string, libDirs []string) (string, error) {
	if _, err := os.Stat(p); err == nil {
		return filepath.EvalSymlinks(p)
	}
	for _, d := range libDirs {
		if q := filepath.Join(d, filepath.Base(p)); fileExists(q) {
			return filepath.EvalSymlinks(q)
		}
	}
	return "", fmt.Errorf("%s not found (nor in %v)", p, libDirs)
}

func fileExists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}

// writeCPIO writes r as an uncompressed newc cpio archive (the kernel
// unpacks it as the initramfs; uncompressed, since decompressing under
// emulation costs more than reading the larger file).
func (r *initramfs) writeCPIO(out string) error {
	f, err := os.Create(out)
	if err != nil {
		return err
	}
	w := bufio.NewWriterSize(f, 1<<20)
	// Every parent directory first, then the files, in path order.
	dirs := map[string]bool{}
	var paths []string
	for p := range r.files {
		paths = append(paths, p)
	}
	for p := range r.contents {
		paths = append(paths, p)
	}
	for _, p := range paths {
		for d := filepath.Dir(p); d != "/" && d != "."; d = filepath.Dir(d) {
			dirs[d] = true
		}
	}
	var dirList []string
	for d := range dirs {
		dirList = append(dirList, d)
	}
	sort.Strings(dirList)
	sort.Strings(paths)
	ino := uint32(1)
	header := func(name string, mode uint32, size int) error {
		name = strings.TrimPrefix(name, "/")
		_, err := fmt.Fprintf(w, "070701%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%s\x00",
			ino, mode, 0, 0, 1, 0, size, 0, 0, 0, 0, len(name)+1, 0, name)
		ino++
		if err != nil {
			return err
		}
		return pad(w, 110+len(name)+1)
	}
	for _, d := range dirList {
		if err := header(d, 0o40755, 0); err != nil {
			return err
		}
	}
	for _, p := range paths {
		data, ok := r.contents[p]
		mode := uint32(0o100755)
		if !ok {
			if data, err = os.ReadFile(r.files[p]); err != nil {
				return err
			}
			if info, err := os.Stat(r.files[p]); err == nil && info.Mode()&0o111 == 0 {
				mode = 0o100644
			}
		}
		if err := header(p, mode, len(data)); err != nil {
			return err
		}
		if _, err := w.Write(data); err != nil {
			return err
		}
		if err := pad(w, len(data)); err != nil {
			return err
		}
	}
	if err := header("TRAILER!!!", 0, 0); err != nil {
		return err
	}
	if err := w.Flush(); err != nil {
		return err
	}
	return f.Close()
}

// pad writes zeros up to the next multiple of 4 after n bytes.
func pad(w io.Writer, n int) error {
	_, err := w.Write(make([]byte, (4-n%4)%4))
	return err
}
