package kernelname

import (
	"bytes"
	"debug/elf"
	"encoding/binary"
)

// A tiny hand-built ELF64 shared object, small enough to be a fuzz seed,
// whose one loadable segment maps file offset 0 at virtual address
// tinyBase: file offsets and symbol addresses differ by tinyBase, so
// treating one as the other finds the "decoy" symbol instead.
const (
	tinyBase    = 0x10000
	tinyTextOff = 0x80 // file offset of .text, right after the headers
	tinyTextLen = 0x40
	tinyText    = tinyBase + tinyTextOff // virtual address of .text
)

// tinySym is one symbol of the tiny ELF.
type tinySym struct {
	name  string
	info  byte // elf.ST_INFO(bind, type)
	shndx uint16
	value uint64
	size  uint64
}

var tinySyms = []tinySym{
	{"decoy", elf.ST_INFO(elf.STB_LOCAL, elf.STT_FUNC), 1, tinyTextOff, tinyTextLen},
	{"foo.localalias", elf.ST_INFO(elf.STB_LOCAL, elf.STT_FUNC), 1, tinyText, 0x10},
	{"_Z3fooi", elf.ST_INFO(elf.STB_GLOBAL, elf.STT_FUNC), 1, tinyText, 0x10},
	{"_ZN4vllm25paged_attention_v1_kernelIfEEvPf", elf.ST_INFO(elf.STB_GLOBAL, elf.STT_FUNC), 1, tinyText + 0x10, 0x10},
	{"table", elf.ST_INFO(elf.STB_GLOBAL, elf.STT_OBJECT), 1, tinyText + 0x20, 8},
	{"exact", elf.ST_INFO(elf.STB_GLOBAL, elf.STT_FUNC), 1, tinyText + 0x30, 0},
	{"undef", elf.ST_INFO(elf.STB_GLOBAL, elf.STT_FUNC), uint16(elf.SHN_UNDEF), tinyText + 0x38, 4},
}

// tinyOpts selects a variant of the tiny ELF.
type tinyOpts struct {
	dynsym bool // symbols in .dynsym/.dynstr only, as in a stripped file
}

// tinyELF builds the tiny ELF: header, one PT_LOAD, .text, a symbol table,
// its string table, .shstrtab and the section headers.
func tinyELF(o tinyOpts) []byte {
	le := binary.LittleEndian
	symName, strName, symType := ".symtab", ".strtab", elf.SHT_SYMTAB
	if o.dynsym {
		symName, strName, symType = ".dynsym", ".dynstr", elf.SHT_DYNSYM
	}

	strtab := []byte{0}
	var syms []byte
	syms = append(syms, make([]byte, 24)...) // symbol 0
	for _, s := range tinySyms {
		var e [24]byte
		le.PutUint32(e[0:], uint32(len(strtab)))
		e[4] = s.info
		le.PutUint16(e[6:], s.shndx)
		le.PutUint64(e[8:], s.value)
		le.PutUint64(e[16:], s.size)
		syms = append(syms, e[:]...)
		strtab = append(strtab, s.name...)
		strtab = append(strtab, 0)
	}
	shstr := []byte{0}
	names := map[string]uint32{}
	for _, n := range []string{".text", symName, strName, ".shstrtab"} {
		names[n] = uint32(len(shstr))
		shstr = append(shstr, n...)
		shstr = append(shstr, 0)
	}

	var b bytes.Buffer
	b.Write(make([]byte, tinyTextOff))
	b.Write(bytes.Repeat([]byte{0xcc}, tinyTextLen)) // int3
	symOff := b.Len()
	b.Write(syms)
	strOff := b.Len()
	b.Write(strtab)
	shstrOff := b.Len()
	b.Write(shstr)
	for b.Len()%8 != 0 {
		b.WriteByte(0)
	}
	shOff := b.Len()
	type shdr struct {
		name          string
		typ           elf.SectionType
		flags         elf.SectionFlag
		addr, off, sz uint64
		link, info    uint32
		align, ent    uint64
	}
	shdrs := []shdr{
		{},
		{".text", elf.SHT_PROGBITS, elf.SHF_ALLOC | elf.SHF_EXECINSTR, tinyText, tinyTextOff, tinyTextLen, 0, 0, 16, 0},
		{symName, symType, 0, 0, uint64(symOff), uint64(len(syms)), 3, 3, 8, 24},
		{strName, elf.SHT_STRTAB, 0, 0, uint64(strOff), uint64(len(strtab)), 0, 0, 1, 0},
		{".shstrtab", elf.SHT_STRTAB, 0, 0, uint64(shstrOff), uint64(len(shstr)), 0, 0, 1, 0},
	}
	for _, s := range shdrs {
		var e [64]byte
		if s.name != "" {
			le.PutUint32(e[0:], names[s.name])
		}
		le.PutUint32(e[4:], uint32(s.typ))
		le.PutUint64(e[8:], uint64(s.flags))
		le.PutUint64(e[16:], s.addr)
		le.PutUint64(e[24:], s.off)
		le.PutUint64(e[32:], s.sz)
		le.PutUint32(e[40:], s.link)
		le.PutUint32(e[44:], s.info)
		le.PutUint64(e[48:], s.align)
		le.PutUint64(e[56:], s.ent)
		b.Write(e[:])
	}
	out := b.Bytes()

	// ELF header.
	copy(out, []byte{0x7f, 'E', 'L', 'F', byte(elf.ELFCLASS64), byte(elf.ELFDATA2LSB), byte(elf.EV_CURRENT)})
	le.PutUint16(out[16:], uint16(elf.ET_DYN))
	le.PutUint16(out[18:], uint16(elf.EM_X86_64))
	le.PutUint32(out[20:], uint32(elf.EV_CURRENT))
	le.PutUint64(out[32:], 64) // e_phoff
	le.PutUint64(out[40:], uint64(shOff))
	le.PutUint16(out[52:], 64) // e_ehsize
	le.PutUint16(out[54:], 56) // e_phentsize
	le.PutUint16(out[56:], 1)  // e_phnum
	le.PutUint16(out[58:], 64) // e_shentsize
	le.PutUint16(out[60:], uint16(len(shdrs)))
	le.PutUint16(out[62:], uint16(len(shdrs)-1)) // e_shstrndx

	// The PT_LOAD: file [0, end of .text) at tinyBase.
	ph := out[64:]
	le.PutUint32(ph[0:], uint32(elf.PT_LOAD))
	le.PutUint32(ph[4:], uint32(elf.PF_R|elf.PF_X))
	le.PutUint64(ph[8:], 0)
	le.PutUint64(ph[16:], tinyBase)
	le.PutUint64(ph[24:], tinyBase)
	le.PutUint64(ph[32:], tinyTextOff+tinyTextLen)
	le.PutUint64(ph[40:], tinyTextOff+tinyTextLen)
	le.PutUint64(ph[48:], 0x1000)
	return out
}

// Offsets of ELF64 header fields that the corrupt fuzz seeds patch.
const (
	offShoff = 40
	offPhnum = 56
	offShnum = 60
)

// patched returns a copy of b with the little-endian value v written at
// off in size bytes.
func patched(b []byte, off, size int, v uint64) []byte {
	c := bytes.Clone(b)
	switch size {
	case 2:
		binary.LittleEndian.PutUint16(c[off:], uint16(v))
	case 4:
		binary.LittleEndian.PutUint32(c[off:], uint32(v))
	default:
		binary.LittleEndian.PutUint64(c[off:], v)
	}
	return c
}
