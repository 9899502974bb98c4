package discover

import "fmt"

// procStat holds the fields profi reads from a /proc/PID/stat line.
type procStat struct {
	state        byte   // field 3
	utime, stime uint64 // fields 14 and 15, clock ticks
	start        uint64 // field 22, clock ticks after boot
}

// statFields parses the state (field 3) and the start time (field 22) of a
// /proc/PID/stat line.
func statFields(b []byte) (state byte, start uint64, err error) {
	st, err := parseStat(b)
	return st.state, st.start, err
}

// parseStat parses a /proc/PID/stat line. The command name (field 2) may
// contain spaces and parentheses, so fields are counted from the last ')'.
func parseStat(b []byte) (procStat, error) {
	var st procStat
	end := -1
	for i := len(b) - 1; i >= 0; i-- {
		if b[i] == ')' {
			end = i
			break
		}
	}
	if end < 0 {
		return st, fmt.Errorf("parse stat: no command name")
	}
	i, field := end+1, 2
	for field < 22 {
		for i < len(b) && b[i] == ' ' {
			i++
		}
		if i >= len(b) || b[i] == '\n' {
			return st, fmt.Errorf("parse stat: %d fields, want at least 22", field)
		}
		field++
		var dst *uint64
		switch field {
		case 3:
			st.state = b[i]
		case 14:
			dst = &st.utime
		case 15:
			dst = &st.stime
		case 22:
			dst = &st.start
		}
		if dst != nil {
			v, _, ok := parseNum(b, i, len(b), 10, 64, ' ')
			if !ok {
				// A last field ends at the newline rather than a space.
				if v, _, ok = parseNum(b, i, len(b), 10, 64, '\n'); !ok {
					return st, fmt.Errorf("parse stat: bad field %d", field)
				}
			}
			*dst = v
		}
		for i < len(b) && b[i] != ' ' && b[i] != '\n' {
			i++
		}
	}
	return st, nil
}
