// Package elfsym reads function symbols and code bytes out of ELF files
// that tenants control, with every read and allocation bounded whatever
// the headers claim (issue 17, "One crafted file OOM-kills the agent").
//
// It owns:
//
//   - Open: the ELF header, at most MaxProgs program headers (the
//     loadable and executable segments are computed once) and at most
//     MaxSections section headers, each section's range checked against
//     the file's real size and each symbol, string and hash table against
//     an absolute cap (MaxSymtabBytes, MaxStrtabBytes, MaxHashBytes): a
//     sparse file has a small size on disk and any apparent size;
//   - Lookup: the defined functions of .dynsym with the given names only,
//     through .gnu.hash (preferred) or .hash, else a bounded linear scan;
//     string table bytes are read per name, never whole;
//   - Funcs: a bounded iterator over the defined functions of .dynsym or
//     .symtab, with a name filter and a cap on how many it returns;
//   - Offset and Code: an executable virtual address to its file offset
//     (the address uprobes take) and the first bytes of code there.
//
// The reader is pure Go over an io.ReaderAt, for ELF64 little-endian
// shared objects and executables (the x86-64 files profi probes; other
// little-endian ELF64 machines share the layout). It keeps no file
// contents beyond an 8 KiB string window, a 64 KiB symbol read buffer
// and what Lookup and Funcs return. Hostile layouts cost bounded CPU too:
// hash chains stop at MaxChain, and a string table read takes at most
// 1 KiB beyond the name it needs.
// It must not panic on any input (FuzzOpen, FuzzLookup); callers still
// recover, since they run it on hostile files.
package elfsym
