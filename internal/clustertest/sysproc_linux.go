package clustertest

import "syscall"

// ProcAttr runs a server, or any child of a test, as cred (nil: as the
// test), killed with SIGKILL when the test binary dies (a timeout's panic), so that no server outlives its test.
// Go applies Pdeathsig after the credentials, which would otherwise
// clear it.
func ProcAttr(cred *syscall.Credential) *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL, Credential: cred}
}
