package crashfs

import "syscall"

// The open flags the log asks for where it writes O_DIRECT.
const (
	oDirect = syscall.O_DIRECT
	oDSync  = syscall.O_DSYNC
)
