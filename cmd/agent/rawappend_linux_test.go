package main

import "syscall"

const directFlag = syscall.O_DIRECT
