package discover

import "fmt"

// statFields parses the state (field 3) and the start time (field 22) of a
// /proc/PID/stat line. The command name (field 2) may contain spaces and
// parentheses, so fields are counted from the last ')'.
func statFields(b []byte) (state byte, start uint64, err error) {
	end := -1
	for i := len(b) - 1; i >= 0; i-- {
		if b[i] == ')' {
			end = i
			break
		}
	}
	if end < 0 {
		return 0, 0, fmt.Errorf("parse stat: no command name")
	}
	// After ") " come state (field 3) ... starttime (field 22).
	i, field := end+1, 2
	for field < 22 {
		for i < len(b) && b[i] == ' ' {
			i++
		}
		if i >= len(b) || b[i] == '\n' {
			return 0, 0, fmt.Errorf("parse stat: %d fields, want at least 22", field)
		}
		field++
		if field == 3 {
			state = b[i]
		}
		if field == 22 {
			v, _, ok := parseNum(b, i, len(b), 10, 64, ' ')
			if !ok {
				// A last field ends at the newline rather than a space.
				if v, _, ok = parseNum(b, i, len(b), 10, 64, '\n'); !ok {
					return 0, 0, fmt.Errorf("parse stat: bad start time")
				}
			}
			return state, v, nil
		}
		for i < len(b) && b[i] != ' ' && b[i] != '\n' {
			i++
		}
	}
	panic("unreachable")
}
