package discover

import (
	"strings"
	"unicode"
	"unicode/utf8"
)

// SafeLabel makes a string a process controls (its comm, a path in its
// maps) fit to be a label value: valid UTF-8, no control characters
// (each invalid byte or control character becomes '?'), at most max
// bytes (cut on a rune boundary). changed reports whether s had to be
// altered, for the counter of rejected label values.
func SafeLabel(s string, max int) (out string, changed bool) {
	clean := utf8.ValidString(s) && len(s) <= max
	if clean {
		for _, r := range s {
			if unicode.IsControl(r) {
				clean = false
				break
			}
		}
	}
	if clean {
		return s, false
	}
	var b strings.Builder
	for i, r := range s {
		if r == utf8.RuneError {
			if _, n := utf8.DecodeRuneInString(s[i:]); n == 1 {
				r = '?'
			}
		}
		if unicode.IsControl(r) {
			r = '?'
		}
		if b.Len()+utf8.RuneLen(r) > max {
			break
		}
		b.WriteRune(r)
	}
	return b.String(), true
}
