package discover

import "testing"

func TestSafeLabel(t *testing.T) {
	for _, tc := range []struct {
		in, want string
		max      int
		changed  bool
	}{
		{"python3", "python3", 64, false},
		{"naïve", "naïve", 64, false},
		{"a\xffb", "a?b", 64, true},
		{"tab\there", "tab?here", 64, true},
		{"abcdef", "abcd", 4, true},
		{"abcé", "abc", 4, true}, // never half a rune
		{"", "", 4, false},
	} {
		got, changed := SafeLabel(tc.in, tc.max)
		if got != tc.want || changed != tc.changed {
			t.Errorf("SafeLabel(%q, %d) = %q, %v; want %q, %v", tc.in, tc.max, got, changed, tc.want, tc.changed)
		}
	}
}
