//go:build !linux

package crashfs

// The log asks for neither flag here: it writes buffered and syncs.
const (
	oDirect = 0
	oDSync  = 0
)
