# Sourced by scripts/fetch-nvidia.sh and scripts/fetch-kernels.sh: sets url
# to the machine's Debian archive (PROFI_DEBIAN_MIRROR overrides it), the
# first URI serving the suite of this release (not -security, -updates,
# -backports), in one-line or deb822 form; deb.debian.org if none.
mirror() {
	local codename
	codename=$(. /etc/os-release 2>/dev/null && echo "${VERSION_CODENAME:-}")
	[ -n "$codename" ] || return 0
	{
		cat /etc/apt/sources.list 2>/dev/null || true
		cat /etc/apt/sources.list.d/*.list 2>/dev/null || true
	} | awk -v s="$codename" '$1 == "deb" { sub(/\[[^]]*\] */, ""); if ($3 == s && $2 ~ /debian\/?$/) { print $2; exit } }'
	cat /etc/apt/sources.list.d/*.sources 2>/dev/null |
		awk -v s="$codename" '
			function flush() {
				if (!done && uris != "" && (" " suites " ") ~ (" " s " ") && uris ~ /debian\/?$/) { split(uris, u, " "); print u[1]; done = 1; exit }
				uris = ""; suites = ""
			}
			/^[ \t]*$/ { flush(); next }
			/^URIs:/ { $1 = ""; uris = $0 }
			/^Suites:/ { $1 = ""; suites = $0 }
			END { flush() }'
}
url=${PROFI_DEBIAN_MIRROR:-$(mirror | head -n 1 | tr -d ' ')}
url=${url:-http://deb.debian.org/debian}
url=${url%/}
