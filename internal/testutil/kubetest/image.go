package kubetest

import (
	"archive/tar"
	"bytes"
	"crypto/sha256"
	"debug/elf"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
)

// ImageFile is one file of an image: From on this machine, at To inside it.
type ImageFile struct {
	From, To string
}

// Image is a single-layer image that WriteImageArchive writes as an OCI
// image layout archive, which `ctr images import` takes without a registry.
type Image struct {
	Name       string // e.g. localhost/profi-workload:test
	Files      []ImageFile
	Entrypoint []string
	Env        []string
}

// WithLibraries adds the shared objects that the ELF files among img's
// files need (DT_NEEDED, recursively, and their interpreter), from this
// machine's C library directories to the same paths in the image: what a
// dynamically linked program needs in a FROM-scratch image. Objects already
// among the files (the stub CUDA libraries) are left to them; libDirs are
// searched first (the image's LD_LIBRARY_PATH on this machine).
func (img *Image) WithLibraries(libDirs ...string) error {
	have := map[string]bool{}
	for _, f := range img.Files {
		have[path.Base(f.To)] = true
	}
	dirs := append(slices.Clone(libDirs), systemLibDirs()...)
	queue := make([]string, 0, len(img.Files))
	for _, f := range img.Files {
		queue = append(queue, f.From)
	}
	for len(queue) > 0 {
		f := queue[0]
		queue = queue[1:]
		ef, err := elf.Open(f)
		if err != nil {
			continue // not an ELF file
		}
		needed, err := ef.ImportedLibraries()
		interp := ""
		for _, p := range ef.Progs {
			if p.Type == elf.PT_INTERP {
				b, rerr := io.ReadAll(p.Open())
				if rerr == nil {
					interp = strings.TrimRight(string(b), "\x00")
				}
			}
		}
		ef.Close()
		if err != nil {
			return fmt.Errorf("image %s: %s: %w", img.Name, f, err)
		}
		if interp != "" && !have[path.Base(interp)] {
			host, err := filepath.EvalSymlinks(interp)
			if err != nil {
				return fmt.Errorf("image %s: interpreter of %s: %w", img.Name, f, err)
			}
			img.Files = append(img.Files, ImageFile{From: host, To: interp})
			have[path.Base(interp)] = true
		}
		for _, lib := range needed {
			if have[lib] {
				continue
			}
			found := ""
			for _, d := range dirs {
				if _, err := os.Stat(filepath.Join(d, lib)); err == nil {
					found = filepath.Join(d, lib)
					break
				}
			}
			if found == "" {
				return fmt.Errorf("image %s: %s (needed by %s) not in %v", img.Name, lib, f, dirs)
			}
			host, err := filepath.EvalSymlinks(found)
			if err != nil {
				return err
			}
			img.Files = append(img.Files, ImageFile{From: host, To: found})
			have[lib] = true
			queue = append(queue, host)
		}
	}
	return nil
}

// systemLibDirs are where this machine's loader finds the C library.
func systemLibDirs() []string {
	triple := map[string]string{"amd64": "x86_64-linux-gnu", "arm64": "aarch64-linux-gnu"}[runtime.GOARCH]
	return []string{"/lib/" + triple, "/usr/lib/" + triple, "/lib64", "/lib"}
}

// WriteImageArchive writes img as an OCI image layout archive at dst.
func WriteImageArchive(dst string, img Image) error {
	var layer bytes.Buffer
	if err := writeLayer(&layer, img.Files); err != nil {
		return fmt.Errorf("image %s: %w", img.Name, err)
	}
	layerDigest := digest(layer.Bytes())
	config, err := json.Marshal(map[string]any{
		"architecture": runtime.GOARCH,
		"os":           "linux",
		"config":       map[string]any{"Entrypoint": img.Entrypoint, "Env": img.Env},
		"rootfs":       map[string]any{"type": "layers", "diff_ids": []string{layerDigest}},
	})
	if err != nil {
		return err
	}
	manifest, err := json.Marshal(map[string]any{
		"schemaVersion": 2,
		"mediaType":     "application/vnd.oci.image.manifest.v1+json",
		"config":        descriptor("application/vnd.oci.image.config.v1+json", config),
		"layers":        []any{descriptor("application/vnd.oci.image.layer.v1.tar", layer.Bytes())},
	})
	if err != nil {
		return err
	}
	md := descriptor("application/vnd.oci.image.manifest.v1+json", manifest)
	md["annotations"] = map[string]string{
		"io.containerd.image.name":          img.Name,
		"org.opencontainers.image.ref.name": img.Name[strings.LastIndex(img.Name, ":")+1:],
	}
	index, err := json.Marshal(map[string]any{"schemaVersion": 2, "manifests": []any{md}})
	if err != nil {
		return err
	}

	out, err := os.Create(dst)
	if err != nil {
		return err
	}
	tw := tar.NewWriter(out)
	entries := []struct {
		name string
		data []byte
	}{
		{"oci-layout", []byte(`{"imageLayoutVersion":"1.0.0"}`)},
		{"index.json", index},
		{blobPath(manifest), manifest},
		{blobPath(config), config},
		{blobPath(layer.Bytes()), layer.Bytes()},
	}
	for _, e := range entries {
		if err := addFile(tw, e.name, 0o644, e.data); err != nil {
			out.Close()
			return err
		}
	}
	if err := tw.Close(); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}

// writeLayer writes files, with their parent directories, as a tar layer.
func writeLayer(w io.Writer, files []ImageFile) error {
	tw := tar.NewWriter(w)
	dirs := map[string]bool{}
	for _, f := range files {
		var parents []string
		for d := path.Dir(f.To); d != "/" && !dirs[d]; d = path.Dir(d) {
			parents = append(parents, d)
			dirs[d] = true
		}
		slices.Reverse(parents)
		for _, d := range parents {
			if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: strings.TrimPrefix(d, "/") + "/", Mode: 0o755}); err != nil {
				return err
			}
		}
		b, err := os.ReadFile(f.From)
		if err != nil {
			return err
		}
		st, err := os.Stat(f.From)
		if err != nil {
			return err
		}
		if err := addFile(tw, strings.TrimPrefix(f.To, "/"), int64(st.Mode().Perm()), b); err != nil {
			return err
		}
	}
	return tw.Close()
}

func addFile(tw *tar.Writer, name string, mode int64, data []byte) error {
	if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: mode, Size: int64(len(data))}); err != nil {
		return err
	}
	_, err := tw.Write(data)
	return err
}

func digest(b []byte) string {
	sum := sha256.Sum256(b)
	return "sha256:" + hex.EncodeToString(sum[:])
}

func blobPath(b []byte) string {
	return "blobs/sha256/" + strings.TrimPrefix(digest(b), "sha256:")
}

func descriptor(mediaType string, b []byte) map[string]any {
	return map[string]any{"mediaType": mediaType, "digest": digest(b), "size": len(b)}
}
