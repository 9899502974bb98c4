package kernelname

import (
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/ianlancetaylor/demangle"
)

// MaxNameLen is the longest `kernel` label value Normalize returns, in
// bytes (docs/INTERFACE.md §5.2).
const MaxNameLen = 64

const (
	// maxDemangleInput bounds what is handed to the demangler: real kernel
	// manglings are a few KiB, and the demangler's cost grows with its input.
	// Longer strings are treated as plain names.
	maxDemangleInput = 16 << 10
	// demangleMaxPow caps the demangler's output at 2^12 bytes, which also
	// bounds the work of printing pathological manglings whose expansion is
	// exponential. The qualified name comes first in the output and is far
	// shorter, so the cap never cuts a name that survives MaxNameLen.
	demangleMaxPow = 12
	// maxPasses bounds the fixed-point loop of Normalize. One pass is enough
	// for real names; more are needed only when a pass uncovers another
	// mangling or cuts a name mid-word (see Normalize). After the first
	// pass the name has at most MaxNameLen bytes, and each uncovered
	// mangling is at least 3 bytes shorter ("_Z" and a length), so 32
	// passes reach the fixed point; the bound only guards against a cycle.
	maxPasses = 32
	// deviceStubPrefix is what nvcc puts before the mangled name of a
	// kernel's host-side launch stub (__device_stub__Z3fooi for _Z3fooi).
	deviceStubPrefix = "__device_stub_"
	// anonNS is how the demangler prints an unnamed namespace. It is a scope,
	// not a parameter list, so its parentheses are kept.
	anonNS = "(anonymous namespace)"
)

// Normalize turns a raw kernel name (a mangled symbol, a demangled
// signature, or a plain C or Triton name) into the `kernel` label value of
// docs/INTERFACE.md §5.2:
//
//  1. trim surrounding white space and demangle with a real Itanium C++
//     (or Rust) demangler; a string that is not a valid mangling is kept
//     as it is. A mangling whose name and template arguments parse but
//     whose parameter types are cut off or corrupt (for example a name
//     truncated by ReadString's cap) still yields its name. nvcc's
//     __device_stub_ prefix is dropped first;
//  2. replace invalid UTF-8 and control characters with U+FFFD;
//  3. strip template arguments <…> (nested, balanced), parameter lists (…)
//     with the cv/ref/noexcept qualifiers after them, and bracketed
//     suffixes such as [abi:cxx11] and [clone .cold]. Namespaces are kept,
//     including "(anonymous namespace)", and so are braced local entities
//     such as {lambda(int)#1} (their parameters tell lambdas apart) and
//     operator names such as operator();
//  4. drop a leading return type or other words before the name (the name
//     is the last space-separated word outside brackets, so special names
//     keep their subject: "vtable for A" → "A");
//  5. trim, drop trailing `_<digits>` suffixes (Triton:
//     triton_poi_fused_add_0 → triton_poi_fused_add), cut to MaxNameLen
//     bytes on a UTF-8 boundary, dropping a {…} entity the cut would leave
//     open and a trailing "::".
//
// The steps are repeated until the result no longer changes, so
// Normalize is idempotent: a cut can leave a trailing
// `_<digits>` or half a bracket, and stripping can uncover another
// mangling. The result is "" when nothing is left.
func Normalize(raw string) string {
	s := raw
	for range maxPasses {
		n := normalizeOnce(s)
		if n == s {
			break
		}
		s = n
	}
	return s
}

// normalizeOnce is one pass of the steps listed on Normalize.
func normalizeOnce(s string) string {
	s = demangleName(strings.TrimSpace(s))
	s = sanitize(s)
	s = stripDecorations(s)
	s = strings.TrimSpace(s)
	s = dropOrdinal(s)
	s = cut(s, MaxNameLen)
	return dropOrdinal(s)
}

// demangleName returns the demangled name of s without template arguments
// and parameters, or s itself if s is not a mangled name.
func demangleName(s string) (name string) {
	m := s
	if rest, ok := strings.CutPrefix(m, deviceStubPrefix); ok && strings.HasPrefix(rest, "_Z") {
		m = rest
	}
	if len(m) > maxDemangleInput || !strings.HasPrefix(m, "_Z") && !strings.HasPrefix(m, "_R") {
		return s
	}
	// The demangler reports errors by panicking internally and recovering;
	// a panic that escapes it is a bug there, and must not take the agent
	// down with it.
	defer func() {
		if recover() != nil {
			name = s
		}
	}()
	// NoParams stops parsing after the name and its template arguments, so
	// it also accepts a mangling whose parameter types are truncated. The
	// return type of a template function goes with the parameters.
	out, err := demangle.ToString(m, demangle.NoParams, demangle.NoTemplateParams,
		demangle.NoEnclosingParams, demangle.MaxLength(demangleMaxPow))
	if err != nil || out == "" {
		return s
	}
	return out
}

// sanitize replaces each run of invalid UTF-8 or control characters with
// one U+FFFD, so the label is valid UTF-8 and prints on one line.
func sanitize(s string) string {
	clean := true
	for _, r := range s {
		if r == utf8.RuneError || unicode.IsControl(r) {
			clean = false
			break
		}
	}
	if clean {
		return s
	}
	var b strings.Builder
	b.Grow(len(s))
	bad := false
	for i := 0; i < len(s); {
		r, size := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && size == 1 || unicode.IsControl(r) {
			if !bad {
				b.WriteRune(utf8.RuneError)
			}
			bad = true
		} else {
			b.WriteString(s[i : i+size])
			bad = false
		}
		i += size
	}
	return b.String()
}

// stripDecorations removes template arguments, parameter lists and their
// qualifiers, and bracketed suffixes, and keeps only the last
// space-separated word outside brackets (dropping a return type or the
// "vtable for" of special names). It works on bytes: every bracket is
// ASCII, and multi-byte runes are copied whole as identifier bytes.
func stripDecorations(s string) string {
	out := make([]byte, 0, len(s))
	// newWord is set by a space outside brackets: the next thing emitted
	// starts a new word, which replaces the words before it.
	newWord := false
	emit := func(p string) {
		if newWord {
			out = out[:0]
			newWord = false
		}
		out = append(out, p...)
	}
	for i := 0; i < len(s); {
		c := s[i]
		switch {
		case c == ' ':
			newWord = len(out) > 0
			i++
		case c == '<' || c == '[':
			i = skipGroup(s, i)
		case c == '(':
			rest := s[i:]
			switch {
			case strings.HasPrefix(rest, anonNS):
				emit(anonNS)
				i += len(anonNS)
			case strings.HasPrefix(anonNS, rest):
				// "(anonymous namespace)" cut by MaxNameLen: keep it, so a
				// second pass does not take it for a parameter list.
				emit(rest)
				i = len(s)
			case isDeclarator(s, i):
				// "void (*fptr(int))(float)": a function returning a
				// function pointer; its name is inside the parentheses.
				j := skipGroup(s, i)
				inner := strings.TrimLeft(strings.TrimSuffix(s[i+1:j], ")"), "*& ")
				newWord = len(out) > 0
				emit(stripDecorations(inner))
				i = skipQualifiers(s, j)
			default:
				i = skipQualifiers(s, skipGroup(s, i))
			}
		case c == '{':
			j := skipGroup(s, i)
			emit(s[i:j])
			i = j
		case isIdentByte(c):
			j := identEnd(s, i)
			if s[i:j] == "operator" {
				j = operatorEnd(s, j)
			}
			emit(s[i:j])
			i = j
		default:
			emit(s[i : i+1])
			i++
		}
	}
	return string(out)
}

// isDeclarator reports whether the parenthesis at s[i] opens a pointer or
// reference declarator with a name, "(*name" or "(&name", rather than a
// parameter list.
func isDeclarator(s string, i int) bool {
	j := i + 1
	if j >= len(s) || s[j] != '*' && s[j] != '&' {
		return false
	}
	for j < len(s) && (s[j] == '*' || s[j] == '&' || s[j] == ' ') {
		j++
	}
	return j < len(s) && isIdentByte(s[j])
}

// isIdentByte reports whether c can be part of an identifier. Bytes of
// multi-byte runes count, so runes are never split.
func isIdentByte(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' ||
		c == '_' || c == '$' || c >= utf8.RuneSelf
}

func identEnd(s string, i int) int {
	for i < len(s) && isIdentByte(s[i]) {
		i++
	}
	return i
}

// operatorEnd returns the end of an operator name whose "operator" keyword
// ends at i: operator() and operator[], symbolic operators such as
// operator<< or operator->*, operator"" suffixes, and word operators such
// as operator new[] or conversions such as operator unsigned long*. Their
// brackets are part of the name, not template arguments or parameters.
func operatorEnd(s string, i int) int {
	rest := s[i:]
	switch {
	case strings.HasPrefix(rest, "()"), strings.HasPrefix(rest, "[]"):
		return i + 2
	case strings.HasPrefix(rest, `""`):
		return identEnd(s, i+2)
	case rest != "" && strings.IndexByte("+-*/%^&|~!=<>,", rest[0]) >= 0:
		j := i
		for j < len(s) && j < i+3 && strings.IndexByte("+-*/%^&|~!=<>,", s[j]) >= 0 {
			j++
		}
		return j
	}
	j := i
	for j+1 < len(s) && s[j] == ' ' && isIdentByte(s[j+1]) {
		j = identEnd(s, j+1)
	}
	if j == i {
		return i
	}
	if strings.HasPrefix(s[j:], "[]") {
		return j + 2
	}
	for j < len(s) && (s[j] == '*' || s[j] == '&') {
		j++
	}
	return j
}

// closerOf maps an opening bracket to its closing one.
func closerOf(c byte) byte {
	switch c {
	case '<':
		return '>'
	case '(':
		return ')'
	case '[':
		return ']'
	}
	return '}'
}

// skipGroup returns the index after the bracketed group that opens at
// s[i], which must be one of "<([{". Brackets nest. A '>' closes only a
// '<' (inside parentheses it is a comparison, as in <(N>0)>); any other
// closer first drops unclosed '<' (taken as less-than signs) and is
// ignored if it matches nothing. An unclosed group runs to the end of s,
// which is what a name cut in its template arguments needs.
func skipGroup(s string, i int) int {
	stack := []byte{closerOf(s[i])}
	for j := i + 1; j < len(s); j++ {
		c := s[j]
		switch c {
		case '<', '(', '[', '{':
			stack = append(stack, closerOf(c))
		case '>', ')', ']', '}':
			top := len(stack) - 1
			if c != '>' {
				for top > 0 && stack[top] == '>' && stack[top] != c {
					top--
				}
			}
			if stack[top] != c {
				continue
			}
			stack = stack[:top]
			if len(stack) == 0 {
				return j + 1
			}
		default:
			if isIdentByte(c) {
				k := identEnd(s, j)
				if s[j:k] == "operator" {
					k = operatorEnd(s, k)
				}
				j = k - 1
			}
		}
	}
	return len(s)
}

// qualifiers are the words that may follow a parameter list in a
// demangled signature: cv- and ref-qualifiers of member functions and
// exception specifications.
var qualifiers = map[string]bool{
	"const": true, "volatile": true, "restrict": true, "__restrict": true,
	"noexcept": true, "throw": true, "transaction_safe": true,
}

// skipQualifiers returns the index after the qualifiers that follow a
// parameter list ending at i (" const", " &&", " noexcept(true)"), or i
// if there are none. Spaces before anything else are left alone, so the
// word after them still starts a new word.
func skipQualifiers(s string, i int) int {
	for {
		j := i
		for j < len(s) && s[j] == ' ' {
			j++
		}
		switch {
		case j < len(s) && s[j] == '&':
			for j < len(s) && s[j] == '&' {
				j++
			}
		case j < len(s) && isIdentByte(s[j]):
			k := identEnd(s, j)
			if !qualifiers[s[j:k]] {
				return i
			}
			j = k
			if k < len(s) && s[k] == '(' {
				j = skipGroup(s, k)
			}
		default:
			return i
		}
		i = j
	}
}

// dropOrdinal removes trailing `_<digits>` suffixes, which Triton (and
// torch.compile) append to make kernel names unique. A suffix is kept when
// it is all that is left, or when it follows "::" (a name of its own).
func dropOrdinal(s string) string {
	for {
		j := len(s)
		for j > 0 && s[j-1] >= '0' && s[j-1] <= '9' {
			j--
		}
		if j == len(s) || j < 2 || s[j-1] != '_' || s[j-2] == ':' {
			return s
		}
		s = s[:j-1]
	}
}

// cut shortens s to at most n bytes without splitting a rune. A braced
// local entity such as {lambda(int)#1} that the cut would leave open is
// dropped whole, and so are the "::" and spaces the cut leaves at the end.
func cut(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	s = s[:n]
	depth, open := 0, -1
	for i := 0; i < len(s); i++ {
		switch s[i] {
		case '{':
			if depth == 0 {
				open = i
			}
			depth++
		case '}':
			if depth > 0 {
				depth--
			}
		}
	}
	if depth > 0 {
		s = s[:open]
	}
	return strings.TrimRight(s, ": ")
}
