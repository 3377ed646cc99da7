#!/bin/sh
# The mechanical part of the house style, enforced: lines of at most 110
# columns (tabs count 8), indentation with tabs, no trailing blanks, no
# CR. Prints FILE:LINE: problem for each and exits 1 if any.
awk '
	{
		line = $0
		if (line ~ /\r$/) { printf "%s:%d: carriage return\n", FILENAME, FNR; bad = 1 }
		if (line ~ /[ \t]+$/) { printf "%s:%d: trailing blank\n", FILENAME, FNR; bad = 1 }
		if (line ~ /^        /) { printf "%s:%d: indented with spaces\n", FILENAME, FNR; bad = 1 }
		w = 0
		for (i = 1; i <= length(line); i++) {
			c = substr(line, i, 1)
			if (c == "\t") w = (int(w / 8) + 1) * 8; else w++
		}
		if (w > 110) { printf "%s:%d: %d columns\n", FILENAME, FNR, w; bad = 1 }
	}
	END { exit bad }
' "$@"
