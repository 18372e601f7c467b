package main

// int80 makes an i386 system call through int 0x80.
func int80(nr uintptr) uintptr
